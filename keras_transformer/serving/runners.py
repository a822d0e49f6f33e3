"""Run an exported translator in each runtime it is made for, from Python.

Commands that run an exported translator take a SavedModel directory, a `.tflite` file,
a CTranslate2 directory (`export --ctranslate2`), or a run directory, which stands for
the SavedModel that `export RUN_DIR` writes into it (`artifacts.resolve_artifact`).

The same `string[B]` signature is called three ways: through `tf.saved_model.load`
(TensorFlow 2), through the session-based loader that TF Serving and `saved_model_cli`
use (`tf.compat.v1.saved_model.loader.load`), and through LiteRT for the `.tflite` file.
Each runner takes a list of `str` or `bytes` (any bytes: the graph decides what to make
of invalid UTF-8) and returns the signature's outputs as NumPy arrays. Only what an
artifact needs is imported: TensorFlow and tf-text for a SavedModel, LiteRT and tf-text's
kernels (not TensorFlow's Python package) for a `.tflite` file, CTranslate2 and
SentencePiece for a CTranslate2 directory; never the model code.

Public API:
    - `SavedModelRunner(directory, signature)`, `SessionRunner(directory, signature)`,
      `TFLiteRunner(path_or_content, signature)`, `CTranslate2Runner(directory, beam)`:
      `runner(sentences) -> dict`.
    - `open_runner(path, beam=False, session=False)`: the runner an artifact needs.
    - `translations(outputs)`: the `translations` output as a list of `str`.
    - `ModuleRunner(translator, beam=False)`: a runner over a `Translator` in memory.
"""

import json
import logging
import os

import numpy as np

from keras_transformer import files
from keras_transformer.files import BEAM_SIGNATURE, GREEDY_SIGNATURE, INPUT_NAME
from keras_transformer.serving import export_folder, litert

logger = logging.getLogger(__name__)

# CTranslate2's intra-op threads unless asked: the fastest on a 2-core CPU in
# `benchmarks/decode_engines.py` (BENCHMARKS.md).
CTRANSLATE2_DEFAULT_THREADS = 1
# TensorFlow's threads for a SavedModel unless asked (`set_tensorflow_threads`).
SAVED_MODEL_DEFAULT_THREADS = 1

_EMPTY_OUTPUTS = {"translations": np.zeros([0], object),
                  "token_ids": np.zeros([0, 0], np.int32), "scores": np.zeros([0], np.float32)}


def encode_sentences(sentences):
    """Returns an object array of bytes; `str` sentences are UTF-8 encoded."""
    encoded = [s.encode("utf-8", "surrogateescape") if isinstance(s, str) else bytes(s)
               for s in sentences]
    return np.array(encoded, dtype=object).reshape([len(encoded)])


def set_tensorflow_threads(threads=None):
    """Sets TensorFlow's intra- and inter-op threads in this process, if it still can.

    A decoding step is hundreds of small ops run one after the other: spreading them
    over threads costs more than it saves (`SAVED_MODEL_DEFAULT_THREADS`). TensorFlow
    takes the setting only before it runs its first op; a process that already ran some
    (one that trained, say) keeps its threads, with a warning if `threads` was asked for.

    Args:
        threads: int, or `None` for `SAVED_MODEL_DEFAULT_THREADS`.
    """
    import tensorflow as tf  # here: see SavedModelRunner

    count = threads or SAVED_MODEL_DEFAULT_THREADS
    try:
        tf.config.threading.set_intra_op_parallelism_threads(count)
        tf.config.threading.set_inter_op_parallelism_threads(count)
    except RuntimeError:
        if threads and (tf.config.threading.get_intra_op_parallelism_threads(),
                        tf.config.threading.get_inter_op_parallelism_threads()) != (
                            count, count):
            logger.warning("TensorFlow already runs in this process: its threads stay as "
                           "they are (set them before its first op).")


class SavedModelRunner:
    """Calls a SavedModel signature loaded with `tf.saved_model.load` (TensorFlow 2).

    Args:
        directory: str. The SavedModel directory.
        signature: str. Signature name.
        threads: int or `None` (`SAVED_MODEL_DEFAULT_THREADS`). TensorFlow's intra- and
            inter-op threads (`set_tensorflow_threads`).
    """

    def __init__(self, directory, signature=GREEDY_SIGNATURE, threads=None):
        # Imported here, as in every runner: only the runtime an artifact needs loads
        # (a .tflite file needs no TensorFlow).
        import tensorflow as tf
        import tensorflow_text  # noqa: F401  registers the tokenizer ops of the graph

        set_tensorflow_threads(threads)
        self._tf = tf
        self._loaded = tf.saved_model.load(os.fspath(directory))
        self._function = self._loaded.signatures[signature]

    def __call__(self, sentences):
        tensor = self._tf.constant(encode_sentences(sentences), self._tf.string)
        return {name: value.numpy()
                for name, value in self._function(**{INPUT_NAME: tensor}).items()}


class SessionRunner:
    """Calls a SavedModel signature through the session-based loader.

    This is how TF Serving and `saved_model_cli run` load a model: variables are
    restored by name from the checkpoint, not through the object graph, so this runner
    catches exports whose variables only `tf.saved_model.load` can find.

    Args:
        directory: str. The SavedModel directory.
        signature: str. Signature name.
        threads: int or `None` (`SAVED_MODEL_DEFAULT_THREADS`). The session's intra-
            and inter-op threads (TF Serving sets its own with
            `--tensorflow_intra_op_parallelism` and `--tensorflow_inter_op_parallelism`).
    """

    def __init__(self, directory, signature=GREEDY_SIGNATURE, threads=None):
        import tensorflow as tf  # here: see SavedModelRunner
        import tensorflow_text  # noqa: F401

        threads = threads or SAVED_MODEL_DEFAULT_THREADS
        graph = tf.Graph()
        self._session = tf.compat.v1.Session(graph=graph, config=tf.compat.v1.ConfigProto(
            intra_op_parallelism_threads=threads, inter_op_parallelism_threads=threads))
        with graph.as_default():
            meta_graph = tf.compat.v1.saved_model.loader.load(
                self._session, [tf.saved_model.SERVING], os.fspath(directory))
        signature_def = meta_graph.signature_def[signature]
        self._input = signature_def.inputs[INPUT_NAME].name
        self._outputs = {name: info.name for name, info in signature_def.outputs.items()}

    def __call__(self, sentences):
        return self._session.run(self._outputs, {self._input: encode_sentences(sentences)})

    def close(self):
        self._session.close()


class TFLiteRunner:
    """Calls a `.tflite` translator with LiteRT and tf-text's TFLite kernels.

    TensorFlow's Python package is not imported (see `litert.tf_text_kernels`).

    Args:
        model: str path of a `.tflite` file, or its bytes.
        signature: str. Signature name.
        threads: int or `None` (LiteRT's default). Threads of the interpreter.
    """

    def __init__(self, model, signature=GREEDY_SIGNATURE, threads=None):
        # Here: see SavedModelRunner.
        from ai_edge_litert.interpreter import InterpreterWithCustomOps

        litert.reuse_freed_memory()
        in_memory = isinstance(model, (bytes, bytearray))
        source = ({"model_content": bytes(model)} if in_memory
                  else {"model_path": os.fspath(model)})
        try:
            self._interpreter = InterpreterWithCustomOps(
                custom_op_registerers=litert.tf_text_kernels(), num_threads=threads,
                **source)
        except ValueError as error:  # LiteRT's message names no file
            name = "the TFLite model" if in_memory else os.fspath(model)
            raise ValueError(f"{name} is not a TFLite model LiteRT can load ({error}): "
                             "export the run again (keras-transformer export RUN_DIR).") from None
        self._runner = self._interpreter.get_signature_runner(signature)

    def __call__(self, sentences):
        if len(sentences) == 0:
            # The model runs on an empty batch, but LiteRT's Python binding refuses to
            # read back its zero-sized numeric outputs ("Invalid tensor size").
            return {name: value.copy() for name, value in _EMPTY_OUTPUTS.items()}
        # The runner resizes the input to the batch and copies the outputs out.
        return self._runner(**{INPUT_NAME: encode_sentences(sentences)})


class CTranslate2Runner:
    """Translates with a CTranslate2 model directory written by `export --ctranslate2`.

    Imports CTranslate2 and SentencePiece only. Tokenizes with the run's SentencePiece
    model beside the weights, truncates and limits as the exported translator does
    (`translator.json`), and returns the outputs of the exported signatures: token ids
    with END where one was emitted, padded with PAD, and scores, the sum of the tokens'
    log-probabilities. PAD may never be chosen, as in the exported translator, which
    keeps PAD's share of each softmax while CTranslate2 takes it out: after label
    smoothing that share is about 0.1/V per token, so scores differ in the third digit.
    A sentence without a piece translates to the empty string (ids `[END]`, score 0)
    without a call.

    Args:
        directory: str. The CTranslate2 model directory.
        beam: bool. Beam search with the exported beam size and α instead of greedy.
        threads: int or `None`. CTranslate2's intra-op threads; `None`: one (see
            `CTRANSLATE2_DEFAULT_THREADS`).
    """

    def __init__(self, directory, beam=False, threads=None):
        import ctranslate2  # here: see SavedModelRunner
        import sentencepiece

        directory = os.fspath(directory)
        with open(os.path.join(directory, files.CTRANSLATE2_OPTIONS), encoding="utf-8") as file:
            self.options = json.load(file)
        self._processor = sentencepiece.SentencePieceProcessor(
            model_file=os.path.join(directory, files.TOKENIZER_MODEL))
        self._translator = ctranslate2.Translator(
            directory, device="cpu", inter_threads=1,
            intra_threads=threads or CTRANSLATE2_DEFAULT_THREADS)
        self._beam_size = self.options["beam_size"] if beam else 1
        self._length_penalty = self.options["length_penalty"] if beam else 0.0
        # The reserved ids as the SentencePiece model records them (`data.tokenizer`
        # imports TensorFlow, which this runner must not).
        self._pad_id, self._end_id = self._processor.pad_id(), self._processor.eos_id()
        self._pad = self._processor.id_to_piece(self._pad_id)

    def __call__(self, sentences):
        texts = [s.decode("utf-8", "replace") if isinstance(s, bytes) else str(s)
                 for s in sentences]
        # START and END (added by CTranslate2, `add_source_bos/eos`) must fit too.
        pieces = [ids[:self.options["max_source_length"] - 2]
                  for ids in self._processor.encode(texts)]
        limits = [self._limit(len(ids) + 2) for ids in pieces]
        rows = [[self._end_id] for _ in texts]
        scores = np.zeros([len(texts)], np.float32)
        nonempty = [i for i, ids in enumerate(pieces) if ids]
        if nonempty:
            results = self._translator.translate_batch(
                [[self._processor.id_to_piece(j) for j in pieces[i]] for i in nonempty],
                beam_size=self._beam_size, length_penalty=self._length_penalty,
                max_decoding_length=max(limits[i] for i in nonempty),
                min_decoding_length=1, max_input_length=0, return_end_token=True,
                return_scores=True, suppress_sequences=[[self._pad]])
            for i, result in zip(nonempty, results):
                # One limit for the batch: cut each output to its own, as the exported
                # translator stops each sentence at its own (greedy prefixes agree).
                rows[i] = [self._processor.piece_to_id(piece)
                           for piece in result.hypotheses[0]][:limits[i]]
                scores[i] = result.scores[0]
        width = max((len(row) for row in rows), default=0)
        token_ids = np.full([len(texts), width], self._pad_id, np.int32)
        for i, row in enumerate(rows):
            token_ids[i, :len(row)] = row
        translations = np.array(
            [self._processor.decode([j for j in row if j != self._end_id]).encode("utf-8")
             for row in rows], dtype=object).reshape([len(texts)])
        return {"translations": translations, "token_ids": token_ids, "scores": scores}

    def _limit(self, source_length):
        """Output tokens allowed, END included, for a source of `source_length` ids."""
        limit = min(source_length + self.options["extra_length"],
                    self.options["max_source_length"] - 1)
        if self.options.get("max_output_length"):
            limit = min(limit, self.options["max_output_length"])
        return limit


def open_runner(path, beam=False, session=False, threads=None):
    """Returns the runner for the artifact at `path`.

    Args:
        path: str. A SavedModel directory, a `.tflite` file or a CTranslate2 directory.
        beam: bool. Use the beam-search signature.
        session: bool. Load the SavedModel with the session-based loader.
        threads: int or `None` (each runtime's default here). Threads of the runtime.

    Raises:
        export_folder.ExportMismatchError: the artifact lies in an export folder whose
            files come from different exports.
    """
    export_folder.check_consistent(export_folder.export_folder_of(path))
    signature = BEAM_SIGNATURE if beam else GREEDY_SIGNATURE
    if os.fspath(path).endswith(".tflite"):
        return TFLiteRunner(path, signature, threads=threads)
    if files.is_ctranslate2_dir(path):
        return CTranslate2Runner(path, beam=beam, threads=threads)
    return (SessionRunner if session else SavedModelRunner)(path, signature, threads)


def translations(outputs):
    """Returns the `translations` output as a list of `str` (invalid UTF-8 replaced)."""
    return [text.decode("utf-8", "replace") if isinstance(text, bytes) else str(text)
            for text in np.asarray(outputs["translations"]).reshape([-1])]


class ModuleRunner:
    """A runner over a `serving.translator.Translator` in memory: what its export would do.

    Args:
        translator: a `Translator`.
        beam: bool. Use its beam search instead of greedy decoding.
    """

    def __init__(self, translator, beam=False):
        import tensorflow as tf  # here: a Translator is TensorFlow's; artifacts need not be

        self._tf = tf
        self.translator = translator
        self._function = translator.translate_beam if beam else translator.translate

    def __call__(self, sentences):
        tensor = self._tf.constant(encode_sentences(sentences), self._tf.string)
        return {name: value.numpy() for name, value in self._function(tensor).items()}
