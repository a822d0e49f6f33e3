"""Shared subword vocabulary: train it from text, run it as TF ops, save and load it.

One SentencePiece unigram model (Kudo, 2018) covers source and target, as the paper's
shared source-target vocabulary (Vaswani et al., 2017, §5.1) which lets the model tie its
embeddings. Training uses the `sentencepiece` package; tokenizing and detokenizing use
`tensorflow_text.FastSentencepieceTokenizer`, whose ops have kernels in TensorFlow (so a
SavedModel can hold the tokenizer) and in TFLite (registered by
`tensorflow_text.tflite_registrar.SELECT_TFTEXT_OPS`).

Public API:
    - `PAD_ID`, `UNK_ID`, `START_ID`, `END_ID`: reserved ids 0–3.
    - `add_start_end(pieces)`: START pieces END, the form of every model input.
    - `train_tokenizer(lines, vocabulary_size, ...) -> Tokenizer`.
    - `Tokenizer(model_proto)`: a `tf.Module` with `tokenize`, `detokenize`,
      `vocabulary_size`, `id_to_piece`, `save(directory)` and `Tokenizer.load(directory)`;
      `nbest_tokenize(lines, nbest)` gives other segmentations for subword sampling.
    - `TokenizerFileError`: a saved tokenizer is missing, corrupt or truncated.

Why these SentencePiece options:
    - unigram, not BPE: FastSentencepieceTokenizer runs any model with unigram
      segmentation; on a BPE model its ids differ from SentencePiece's own, so
      `Tokenizer` refuses models of any other type.
    - `nmt_nfkc` normalisation: supported by the fast tokenizer (same ids as SentencePiece),
      and it folds look-alike characters (no-break spaces, full-width forms) together, so
      detokenized text is the NFKC form of the input with runs of spaces collapsed.
    - `character_coverage=1.0`: the corpora are European languages with few characters;
      every character seen in training gets a piece instead of becoming `<unk>`.
    - `add_dummy_prefix` (SentencePiece's default) marks word starts uniformly; the
      detokenizer removes the leading space again only when the first id is a normal
      piece, which is why `detokenize` drops control ids before decoding.
"""

import hashlib
import io
import itertools
import json
import logging
import os
import time

import numpy as np
import sentencepiece
import tensorflow as tf
import tensorflow_text
from google.protobuf import empty_pb2, unknown_fields

from keras_transformer import files

# The reserved ids, defined in `files` for readers of artifacts without TensorFlow.
from keras_transformer.files import END_ID, PAD_ID, START_ID, UNK_ID  # noqa: F401
from keras_transformer.files import TOKENIZER_METADATA as METADATA_FILE
from keras_transformer.files import TOKENIZER_MODEL as MODEL_FILE

logger = logging.getLogger(__name__)

# Where sentencepiece_model.proto keeps the model type: ModelProto.trainer_spec is field
# 2, TrainerSpec.model_type field 3, an enum whose default is UNIGRAM.
TRAINER_SPEC_FIELD = 2
MODEL_TYPE_FIELD = 3
MODEL_TYPES = {1: "UNIGRAM", 2: "BPE", 3: "WORD", 4: "CHAR"}

# More lines than this add seconds of training and almost nothing to the vocabulary.
MAX_TRAINING_LINES = 2_000_000
# Lines per call of SentencePiece's n-best encoder in `Tokenizer.nbest_tokenize`.
NBEST_CHUNK_LINES = 2_000


class TokenizerFileError(ValueError):
    """A saved tokenizer file is corrupt, truncated or inconsistent."""


def train_tokenizer(lines, vocabulary_size, *, character_coverage=1.0, verbose=True):
    """Trains a SentencePiece unigram vocabulary on `lines`.

    Args:
        lines: iterable of str. Training text: source and target sentences together.
        vocabulary_size: int. Largest number of pieces, the four reserved ids included.
            A small corpus may give fewer pieces: size the model with
            `Tokenizer.vocabulary_size`.
        character_coverage: float. Share of characters that get their own piece.
        verbose: bool. Log a line before and after training, with the time taken.

    Returns:
        A `Tokenizer`.
    """
    lines = [line for line in lines if line.strip()]
    if not lines:
        raise ValueError("Cannot train a tokenizer on no text: every line is empty.")
    if vocabulary_size <= END_ID + 1:
        raise ValueError(f"vocabulary_size must exceed the {END_ID + 1} reserved ids, "
                         f"got {vocabulary_size}.")
    if verbose:
        logger.info("Training a SentencePiece vocabulary of up to %d pieces on %d lines...",
                    vocabulary_size, len(lines))
    start = time.perf_counter()
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=model, vocab_size=vocabulary_size,
        hard_vocab_limit=False, model_type="unigram", character_coverage=character_coverage,
        normalization_rule_name="nmt_nfkc", input_sentence_size=MAX_TRAINING_LINES,
        shuffle_input_sentence=True, num_threads=os.cpu_count() or 1,
        pad_id=PAD_ID, unk_id=UNK_ID, bos_id=START_ID, eos_id=END_ID,
        pad_piece="<pad>", unk_piece="<unk>", bos_piece="<s>", eos_piece="</s>",
        minloglevel=2)
    tokenizer = Tokenizer(model.getvalue())
    if verbose:
        logger.info("Trained %d pieces in %.1f s.", tokenizer.vocabulary_size,
                    time.perf_counter() - start)
    return tokenizer


def add_start_end(pieces, *, start=True, end=True):
    """Wraps subword ids in START and END: the form in which the model sees a sequence.

    One rule for every sequence the model reads or predicts: training sources (`START
    pieces END`), decoder inputs (`START pieces`, `end=False`) and targets (`pieces
    END`, `start=False`) in `pairs`, and the exported translator's input. Dense rows
    need no ragged op but this, so the translator's graph still converts to TFLite.

    Args:
        pieces: int tensor `(B, P)` of piece ids, each row padded with `PAD_ID` after its
            pieces; or an int `tf.RaggedTensor` `(B, None)`.
        start: bool. Put `START_ID` first.
        end: bool. Put `END_ID` after the last piece of each row.

    Returns:
        int32 ids `(B, P + start + end)`, padded with `PAD_ID` (a `tf.RaggedTensor` for
        ragged `pieces`).
    """
    if isinstance(pieces, tf.RaggedTensor):
        lengths = tf.cast(pieces.row_lengths(), tf.int32) + int(start) + int(end)
        dense = add_start_end(pieces.to_tensor(default_value=PAD_ID), start=start, end=end)
        return tf.RaggedTensor.from_tensor(dense, lengths=lengths)
    pieces = tf.cast(pieces, tf.int32)
    batch = tf.shape(pieces)[0]
    columns = [tf.fill([batch, 1], START_ID)] if start else []
    columns.append(pieces)
    if end:
        columns.append(tf.fill([batch, 1], PAD_ID))
    ids = tf.concat(columns, axis=1)  # (B, P + start + end)
    if end:
        lengths = tf.reduce_sum(tf.cast(pieces != PAD_ID, tf.int32), axis=1)  # (B,)
        width = ids.shape[1] if ids.shape[1] is not None else tf.shape(ids)[1]
        positions = tf.range(width)  # (P + start + 1,)
        ids = tf.where(positions[None, :] == lengths[:, None] + int(start), END_ID, ids)
    return ids


class Tokenizer(tf.Module):
    """SentencePiece tokenizer whose `tokenize`/`detokenize` are TensorFlow ops.

    Being a `tf.Module`, it can be an attribute of a serving module: the model bytes are
    graph constants of every function that uses it, in a SavedModel and in TFLite.

    Args:
        model_proto: bytes. A serialized SentencePiece model, with `<pad>`, `<unk>`,
            `<s>`, `</s>` at ids 0–3 (as `train_tokenizer` makes it).
        name: str. Module name.

    Example:

    >>> tokenizer = train_tokenizer(["Ein Mann läuft.", "A man runs."] * 20, 40,
    ...                             verbose=False)
    >>> ids = tokenizer.tokenize(["A man runs."])  # RaggedTensor, no START/END
    >>> tokenizer.detokenize(ids.to_tensor()).numpy()
    array([b'A man runs.'], dtype=object)
    """

    def __init__(self, model_proto, name="tokenizer"):
        super().__init__(name=name)
        processor = _parse_model(model_proto, "model_proto")
        self._model_proto = bytes(model_proto)
        self._pieces = [processor.id_to_piece(i) for i in range(processor.get_piece_size())]
        self._fast = tensorflow_text.FastSentencepieceTokenizer(self._model_proto)
        self._processor = processor  # Python SentencePiece, for nbest_tokenize

    @property
    def vocabulary_size(self):
        """Number of pieces; ids run from 0 to `vocabulary_size - 1`."""
        return len(self._pieces)

    @property
    def model_proto(self):
        """The serialized SentencePiece model (bytes)."""
        return self._model_proto

    def id_to_piece(self, token_id):
        """Returns the piece (str) of an id, e.g. `"▁Mann"`."""
        return self._pieces[token_id]

    def tokenize(self, strings):
        """Splits text into subword ids, without START/END.

        Args:
            strings: str tensor of shape `(B,)` (or a scalar, giving a 1-D result).

        Returns:
            int32 `tf.RaggedTensor` of shape `(B, None)`.
        """
        return self._fast.tokenize(strings)

    def nbest_tokenize(self, lines, nbest):
        """The `nbest` most likely segmentations of each line, for subword sampling.

        Subword regularisation (Kudo, 2018) trains on segmentations other than the most
        likely one. This runs SentencePiece in Python, not as TF ops: it is for training
        data, which is tokenized once, and tf-text's n-best op flattens its output without
        saying which line each segmentation belongs to. The first segmentation of a
        line is the one `tokenize` gives.

        Args:
            lines: list of str.
            nbest: int ≥ 1. Segmentations per line; a line with fewer gets all it has.

        Returns:
            `(ids, log_probs)`: int32 `tf.RaggedTensor` `(N, None, None)` (line,
            segmentation, piece), most likely first, and float32 `tf.RaggedTensor`
            `(N, None)`, the log-probability of each segmentation under the unigram
            model (the sum of its pieces' scores).
        """
        if nbest < 1:
            raise ValueError(f"nbest must be at least 1, got {nbest}.")
        scores = np.array([self._processor.get_score(i) for i in range(self.vocabulary_size)],
                          np.float32)
        ids, piece_counts, segmentation_counts = [], [], []
        # Chunks keep the Python lists (one object per id) small; the result is NumPy.
        for start in range(0, len(lines), NBEST_CHUNK_LINES):
            chunk = self._processor.nbest_encode_as_ids(
                list(lines[start:start + NBEST_CHUNK_LINES]), nbest_size=nbest)
            segmentation_counts.extend(len(segmentations) for segmentations in chunk)
            segmentations = [pieces for line in chunk for pieces in line]
            piece_counts.extend(len(pieces) for pieces in segmentations)
            ids.append(np.fromiter(itertools.chain.from_iterable(segmentations), np.int32))
        ids = tf.RaggedTensor.from_nested_row_lengths(
            np.concatenate(ids) if ids else np.zeros([0], np.int32),
            [np.array(segmentation_counts, np.int64), np.array(piece_counts, np.int64)])
        log_probs = tf.RaggedTensor.from_row_lengths(
            tf.reduce_sum(tf.gather(scores, ids.values), axis=1),
            ids.row_lengths())  # (N, None)
        return ids, log_probs

    def detokenize(self, ids):
        """Turns ids back into natural text.

        Reading stops at the first `END_ID`; `PAD_ID` and `START_ID` are dropped, and ids
        outside the vocabulary read as `<unk>` (shown as " ⁇ "), so raw decoder output
        can be passed as is.

        For TFLite, give `ids` a static batch size: tf-text's TFLite detokenize kernel
        sizes its output from the static shape (1 when unknown).

        Args:
            ids: integer tensor `(B, L)` padded with `PAD_ID`, a `tf.RaggedTensor`
                `(B, None)`, or a 1-D tensor `(L,)`.

        Returns:
            tf.string tensor of shape `(B,)` (a scalar for 1-D `ids`).
        """
        if isinstance(ids, tf.RaggedTensor):
            ids = ids.to_tensor(default_value=PAD_ID)
        ids = tf.convert_to_tensor(ids)
        if ids.shape.rank == 1:
            return tf.reshape(self.detokenize(ids[tf.newaxis]), [])
        ids = tf.cast(ids, tf.int32)
        ids = tf.where((ids >= 0) & (ids < self.vocabulary_size), ids, UNK_ID)
        ended = tf.cumsum(tf.cast(ids == END_ID, tf.int32), axis=1) > 0
        keep = (ids != PAD_ID) & (ids != START_ID) & ~ended  # (B, L)
        lengths = tf.reduce_sum(tf.cast(keep, tf.int32), axis=1)  # (B,)
        row_splits = tf.concat([tf.zeros([1], tf.int32), tf.cumsum(lengths)], axis=0)
        if ids.shape[0] is not None:
            # A constant shape lets the TFLite converter size the detokenizer's output.
            row_splits = tf.reshape(row_splits, [ids.shape[0] + 1])
        pieces = tf.RaggedTensor.from_row_splits(
            tf.boolean_mask(ids, keep), row_splits, validate=False)
        return self._fast.detokenize(pieces)

    def save(self, directory):
        """Writes `tokenizer.model` and `tokenizer.json` into `directory` (created)."""
        os.makedirs(directory, exist_ok=True)
        metadata = {
            "type": "sentencepiece", "model_file": MODEL_FILE,
            "vocabulary_size": self.vocabulary_size,
            "sha256": hashlib.sha256(self._model_proto).hexdigest(),
            "pad_id": PAD_ID, "unk_id": UNK_ID, "start_id": START_ID, "end_id": END_ID,
        }
        files.write_bytes(os.path.join(directory, MODEL_FILE), self._model_proto)
        files.write_text(os.path.join(directory, METADATA_FILE),
                         json.dumps(metadata, indent=2) + "\n")

    @classmethod
    def load(cls, directory):
        """Reads a tokenizer saved by `save`, checking that its files are intact."""
        metadata_path = os.path.join(directory, METADATA_FILE)
        metadata = _read_metadata(metadata_path)
        model_path = os.path.join(directory, metadata.get("model_file", MODEL_FILE))
        model_proto = _read(model_path)
        expected = metadata.get("sha256")
        if expected != hashlib.sha256(model_proto).hexdigest():
            raise TokenizerFileError(
                f"{model_path}: content does not match the SHA-256 recorded in "
                f"{metadata_path} (truncated or replaced file). Copy the run's tokenizer/ "
                "folder again, or train a new tokenizer.")
        _parse_model(model_proto, model_path)
        tokenizer = cls(model_proto)
        if tokenizer.vocabulary_size != metadata.get("vocabulary_size"):
            raise TokenizerFileError(
                f"{metadata_path}: vocabulary_size {metadata.get('vocabulary_size')} "
                f"differs from the {tokenizer.vocabulary_size} pieces of {model_path}.")
        return tokenizer


def _parse_model(model_proto, source):
    """Returns a SentencePieceProcessor, or raises an error naming `source`."""
    processor = sentencepiece.SentencePieceProcessor()
    try:
        processor.LoadFromSerializedProto(bytes(model_proto))
    except (RuntimeError, OSError, TypeError) as error:
        raise TokenizerFileError(
            f"{source}: not a valid SentencePiece model ({error}). Copy it again, or "
            "train a new tokenizer with train_tokenizer().") from None
    kind = model_type(model_proto)
    if kind != "UNIGRAM":
        # FastSentencepieceTokenizer segments every model as a unigram model: a BPE
        # model would be split into other (and more) pieces than it was trained with.
        raise TokenizerFileError(
            f"{source}: a SentencePiece {kind} model; only unigram models tokenize "
            "correctly with tf-text's FastSentencepieceTokenizer. Train one with "
            "train_tokenizer() (or SentencePiece's --model_type=unigram).")
    reserved = {PAD_ID: "<pad>", UNK_ID: "<unk>", START_ID: "<s>", END_ID: "</s>"}
    found = {i: processor.id_to_piece(i) for i in reserved
             if i < processor.get_piece_size()}
    if found != reserved:
        raise TokenizerFileError(
            f"{source}: reserved ids must be {reserved}, found {found}. Train the model "
            "with train_tokenizer() so that ids match the model's pad_id=0.")
    return processor


def model_type(model_proto):
    """The type of a serialized SentencePiece model: "UNIGRAM", "BPE", "WORD" or "CHAR".

    Read with protobuf's generic parser rather than sentencepiece's generated
    `sentencepiece_model_pb2`, which is tied to one protobuf major version
    (sentencepiece 0.2.3's refuses to import on protobuf 6, which Apache Beam needs).
    As protobuf merges a field given twice, the last value wins.
    """
    found = 1  # UNIGRAM, the field's default
    for trainer_spec in _fields(bytes(model_proto), TRAINER_SPEC_FIELD):
        for value in _fields(trainer_spec, MODEL_TYPE_FIELD):
            found = value
    return MODEL_TYPES.get(found, f"type {found}")


def _fields(message, number):
    """The values of field `number` of a serialized protobuf message, in order."""
    parsed = empty_pb2.Empty.FromString(message)  # every field is an unknown one
    return [field.data for field in unknown_fields.UnknownFieldSet(parsed)
            if field.field_number == number]


def _read_metadata(path):
    """Returns the JSON object in `path`, or raises an error naming it."""
    try:
        metadata = json.loads(_read(path).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise TokenizerFileError(
            f"{path}: not valid JSON ({error}). Copy the run's tokenizer/ folder again, "
            "or train a new tokenizer.") from None
    if not isinstance(metadata, dict):
        raise TokenizerFileError(f"{path}: expected a JSON object.")
    return metadata


def _read(path):
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"{path}: no such file. A saved tokenizer is a folder holding {MODEL_FILE} and "
            f"{METADATA_FILE}, written by Tokenizer.save().")
    with open(path, "rb") as file:
        return file.read()
