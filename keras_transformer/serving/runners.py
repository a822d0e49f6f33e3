"""Run an exported translator in each runtime it is made for, from Python.

Commands that run an exported translator take a SavedModel directory, a `.tflite` file,
a CTranslate2 directory (`export --ctranslate2`), or a run directory, which stands for
the SavedModel that `export RUN_DIR` writes into it (`artifacts.resolve_artifact`).

The same signature is called three ways: through `tf.saved_model.load` (TensorFlow 2),
through the session-based loader that TF Serving and `saved_model_cli` use
(`tf.compat.v1.saved_model.loader.load`), and through LiteRT for the `.tflite` file.
Each runner takes a list of `str` or `bytes` (any bytes: the graph decides what to make
of invalid UTF-8), and for the signatures with a second input (`files.SECOND_INPUTS`:
`score`'s translations, `prefix`'s prefixes, `sample`'s seeds) a second list, and
returns the signature's outputs as NumPy arrays. Only what an
artifact needs is imported: TensorFlow and tf-text for a SavedModel, LiteRT and tf-text's
kernels (not TensorFlow's Python package) for a `.tflite` file, CTranslate2 and
SentencePiece for a CTranslate2 directory; never the model code.

Public API:
    - `SavedModelRunner(directory, signature)`, `SessionRunner(directory, signature)`,
      `TFLiteRunner(path_or_content, signature)`, `CTranslate2Runner(directory, beam)`:
      `runner(sentences) -> dict`, and `runner(sentences, second)` for the signatures
      with a second input.
    - `open_runner(path, beam=False, session=False, signature=None)`: the runner an
      artifact needs; `MissingSignatureError` when it lacks the signature.
    - `signature_names(path)`: the signatures an artifact holds.
    - `translations(outputs)`: the `translations` output as a list of `str`.
    - `ModuleRunner(translator, beam=False, signature=None)`: a runner over a
      `Translator` in memory.
"""

import copy
import logging
import os

import numpy as np

from keras_transformer import files
from keras_transformer.files import (
    ALIGN_SIGNATURE,
    BEAM_SIGNATURE,
    GREEDY_SIGNATURE,
    INPUT_NAME,
    N_BEST_SIGNATURE,
    PREFIX_SIGNATURE,
    SAMPLE_SIGNATURE,
    SCORE_SIGNATURE,
    SECOND_INPUTS,
)
from keras_transformer.serving import artifacts, export_folder, litert

logger = logging.getLogger(__name__)

# CTranslate2's intra-op threads unless asked: the fastest on a 2-core CPU in
# `benchmarks/decode_engines.py` (BENCHMARKS.md).
CTRANSLATE2_DEFAULT_THREADS = 1
# TensorFlow's threads for a SavedModel unless asked (`set_tensorflow_threads`).
SAVED_MODEL_DEFAULT_THREADS = 1



def encode_sentences(sentences):
    """Returns an object array of bytes; `str` sentences are UTF-8 encoded."""
    encoded = [s.encode("utf-8", "surrogateescape") if isinstance(s, str) else bytes(s)
               for s in sentences]
    return np.array(encoded, dtype=object).reshape([len(encoded)])


def signature_inputs(signature, sentences, second=None):
    """Returns the `{input name: array}` of a call of `signature`.

    Args:
        signature: str. The signature called (`files.SIGNATURES`).
        sentences: list of str or bytes.
        second: the second input of the signatures that take one
            (`files.SECOND_INPUTS`): a list with one entry per sentence (strings, or
            ints for `sample`'s seeds); `None` for the others.

    Raises:
        ValueError: `second` is missing, not wanted, has not one entry per sentence
            (which TFLite would not check: its kernels would fail on, or misread, the
            other batch), or holds seeds that are not 32-bit integers.
    """
    inputs = {INPUT_NAME: encode_sentences(sentences)}
    name, dtype = SECOND_INPUTS.get(signature, (None, None))
    if (second is None) != (name is None):
        raise ValueError(f"The {signature!r} signature takes "
                         + (f"a second input, {name}." if name else "sentences alone."))
    if second is None:
        return inputs
    if len(second) != len(sentences):
        raise ValueError(f"{len(sentences)} sentences but {len(second)} {name}: give "
                         "one per sentence.")
    if dtype == "string":
        inputs[name] = encode_sentences(second)
    else:
        inputs[name] = _seeds(second)
    return inputs


def _seeds(values):
    """Returns int32 `(B,)` seeds; raises ValueError for a value that is not one."""
    seeds = np.asarray(values)
    if seeds.size and (seeds.dtype.kind not in "iu" or seeds.min() < -2**31
                       or seeds.max() >= 2**31):
        raise ValueError(f"seeds must be 32-bit integers, got {list(values)[:3]}...")
    return seeds.astype(np.int32).reshape([len(values)])


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
        self.signature = signature

    def __call__(self, sentences, second=None):
        inputs = {name: _tensor(self._tf, value) for name, value in
                  signature_inputs(self.signature, sentences, second).items()}
        return {name: value.numpy() for name, value in self._function(**inputs).items()}

    def with_signature(self, signature):
        """Returns a runner of `signature` sharing this one's loaded SavedModel (loading
        takes seconds)."""
        runner = copy.copy(self)
        runner._function, runner.signature = self._loaded.signatures[signature], signature
        return runner


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
        self.signature = signature
        self._inputs = {name: info.name for name, info in signature_def.inputs.items()}
        self._outputs = {name: info.name for name, info in signature_def.outputs.items()}

    def __call__(self, sentences, second=None):
        inputs = signature_inputs(self.signature, sentences, second)
        return self._session.run(self._outputs, {self._inputs[name]: value
                                                 for name, value in inputs.items()})

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
                **litert.INTERPRETER_OPTIONS, **source)
        except ValueError as error:  # LiteRT's message names no file
            name = "the TFLite model" if in_memory else os.fspath(model)
            raise ValueError(f"{name} is not a TFLite model LiteRT can load ({error}): "
                             "export the run again (keras-transformer export RUN_DIR).") from None
        self._runner = self._interpreter.get_signature_runner(signature)
        self.signature = signature
        # The model runs on an empty batch, but LiteRT's Python binding refuses to read
        # back its zero-sized numeric outputs ("Invalid tensor size"): what an empty
        # batch gives instead, each output's shape with 0 for the batch and every other
        # unknown size. Read before any call: a call sets string outputs' signatures
        # to the shapes it gave.
        self._empty_outputs = {
            name: np.zeros([max(size, 0) for size in details["shape_signature"]],
                           object if details["dtype"] is np.bytes_ else details["dtype"])
            for name, details in self._runner.get_output_details().items()}

    def __call__(self, sentences, second=None):
        inputs = signature_inputs(self.signature, sentences, second)
        if len(sentences) == 0:
            return {name: value.copy() for name, value in self._empty_outputs.items()}
        # The runner resizes the inputs to the batch and copies the outputs out.
        return self._runner(**inputs)


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

    `n_best` calls `translate_batch` with `num_hypotheses`; CTranslate2 ranks by its
    own length penalty, `log P / length ** α`, not GNMT's `((5 + length) / 6) ** α`
    of the exported beam search, so lists may be ordered differently; their
    `normalized_scores` are CTranslate2's, their `scores` the log-probabilities
    (`score_batch` of each hypothesis). `score` calls `score_batch`, whose softmax is
    the model's whole one, as the exported `score`'s. `prefix` passes `target_prefix`
    to the exported beam search. `sample` passes `sampling_topk` and
    `sampling_temperature`, seeding CTranslate2's own generator
    (`ctranslate2.set_random_seed`) once per distinct seed and length limit of a call,
    so its draws differ from the exported ones and depend on the sentences called
    together; the same call repeats them. A call decodes its sentences together up to
    the longest of their length limits (source length + `extra_length`, capped), then
    again, at their own limit, those whose output ran past it: greedy outputs are each
    sentence's alone; a beam search still searching at a sentence's limit but ending
    with shorter hypotheses (a rare repetition loop) may differ from one stopped there.
    `align` takes the beam search's translations and their `return_attention` from a
    second, forced one-beam search (see `_forced_attention`): the export set the layer
    and averages all its heads, as the exported `align`; CTranslate2 gives no weights
    for START and END, whose columns are 0. Where the scores would be CTranslate2's own
    (`prefix`, `sample`), they are `score_batch`'s.

    Args:
        directory: str. The CTranslate2 model directory.
        beam: bool. Beam search with the exported beam size and α instead of greedy.
        threads: int or `None`. CTranslate2's intra-op threads; `None`: one (see
            `CTRANSLATE2_DEFAULT_THREADS`).
        signature: str or `None`: which signature's outputs to give, instead of
            `beam`'s (`files.SIGNATURES`).
    """

    def __init__(self, directory, beam=False, threads=None, signature=None):
        import ctranslate2  # here: see SavedModelRunner
        import sentencepiece

        directory = os.fspath(directory)
        self.options = artifacts.exported_options(directory)  # names a damaged file
        self._processor = sentencepiece.SentencePieceProcessor(
            model_file=os.path.join(directory, files.TOKENIZER_MODEL))
        self._translator = ctranslate2.Translator(
            directory, device="cpu", inter_threads=1,
            intra_threads=threads or CTRANSLATE2_DEFAULT_THREADS)
        self._ctranslate2 = ctranslate2
        self.signature = signature or (BEAM_SIGNATURE if beam else GREEDY_SIGNATURE)
        if self.signature not in _ctranslate2_signatures(self.options):
            raise MissingSignatureError(
                f"{directory} has no signature {self.signature!r} (it was exported before "
                "there was one): export the run again (keras-transformer export RUN_DIR "
                "--ctranslate2).")
        searching = self.signature in (BEAM_SIGNATURE, N_BEST_SIGNATURE, PREFIX_SIGNATURE,
                                       ALIGN_SIGNATURE)
        self._beam_size = self.options["beam_size"] if searching else 1
        self._length_penalty = self.options["length_penalty"] if searching else 0.0
        self._hypotheses = (self.options.get("n_best", min(4, self._beam_size))
                            if self.signature == N_BEST_SIGNATURE else 1)
        # The reserved ids as the SentencePiece model records them (`data.tokenizer`
        # imports TensorFlow, which this runner must not).
        self._pad_id, self._end_id = self._processor.pad_id(), self._processor.eos_id()
        self._pad = self._processor.id_to_piece(self._pad_id)

    def __call__(self, sentences, second=None):
        inputs = signature_inputs(self.signature, sentences, second)  # checks `second`
        texts = [_text(s) for s in sentences]
        pieces = self._encode(texts)
        if self.signature == SCORE_SIGNATURE:
            return self._score(pieces, [_text(t) for t in second])
        prefixes = (self._encode([_text(p) for p in second])
                    if self.signature == PREFIX_SIGNATURE else None)
        seeds = inputs.get(files.SEEDS_INPUT)
        rows, scores = self._translate(pieces, prefixes, seeds)
        if self.signature != N_BEST_SIGNATURE:
            rows = [hypotheses[0] for hypotheses in rows]
            outputs = {"translations": self._texts(rows),
                       "token_ids": _padded(rows, self._pad_id),
                       "scores": np.array([row[0] for row in scores], np.float32)}
            if self.signature in (PREFIX_SIGNATURE, SAMPLE_SIGNATURE):
                outputs["scores"] = self._score_ids(
                    pieces, [[row] for row in rows]).reshape([len(rows)])
            if self.signature == ALIGN_SIGNATURE:
                outputs.update(self._alignments(pieces, rows,
                                                self._forced_attention(pieces, rows)))
            return outputs
        # Fillers as the exported n_best's: empty, scored FORBIDDEN_SCORE.
        count = self._hypotheses
        rows = [hypotheses + [[]] * (count - len(hypotheses)) for hypotheses in rows]
        flat = [row for hypotheses in rows for row in hypotheses]
        log_probs = self._score_ids(pieces, rows)
        normalized = np.full([len(texts), count], files.FORBIDDEN_SCORE, np.float32)
        for i, row in enumerate(scores):
            # An empty source's one hypothesis, END, was not searched: its length
            # penalty is 1 in both conventions.
            normalized[i, :len(row)] = row if pieces[i] else log_probs[i, :1]
        token_ids = _padded(flat, self._pad_id).reshape([len(texts), count, -1])
        return {"translations": self._texts(flat).reshape([len(texts), count]),
                "token_ids": token_ids, "scores": np.where(
                    normalized == files.FORBIDDEN_SCORE, normalized, log_probs),
                "normalized_scores": normalized}

    def _encode(self, texts):
        """Each text's piece ids, cut so that START and END (added by CTranslate2,
        `add_source_bos/eos`) fit too."""
        return [ids[:self.options["max_source_length"] - 2]
                for ids in self._processor.encode(texts)]

    def _translate(self, pieces, prefixes=None, seeds=None):
        """Returns each sentence's hypotheses (id lists) and CTranslate2's scores."""
        limits = [self._limit(len(ids) + 2) for ids in pieces]
        rows = [[[self._end_id]] for _ in pieces]
        scores = [[0.0] for _ in pieces]
        # An empty source without a prefix translates to END alone, as exported.
        searched = [i for i, ids in enumerate(pieces) if ids or (prefixes and prefixes[i])]
        # One call per seed (after seeding CTranslate2) at the longest limit of its
        # sentences, then one per limit for the sentences whose output ran past their
        # own: cut to it, a hypothesis would keep the scores of the tokens cut off.
        # (Splitting every batch by limit decoded beam search at 0.70x the speed.)
        pending = {}
        for i in searched:
            seed = None if seeds is None else int(seeds[i]) % 2**32
            pending.setdefault((seed, None), []).append(i)
        while pending:
            (seed, limit), group = pending.popitem()
            results = self._translate_group(
                [pieces[i] for i in group],
                [prefixes[i] for i in group] if prefixes is not None else None,
                seed, limit or max(limits[i] for i in group))
            for i, result in zip(group, results):
                hypotheses = [[self._processor.piece_to_id(piece) for piece in hypothesis]
                              for hypothesis in result.hypotheses]
                if limit is None and max(map(len, hypotheses)) > limits[i]:
                    pending.setdefault((seed, limits[i]), []).append(i)
                else:
                    rows[i], scores[i] = hypotheses, list(result.scores)
        return rows, scores

    def _translate_group(self, pieces, prefixes, seed, limit):
        """CTranslate2's results for `pieces` (id lists) decoded with at most `limit`
        output tokens (END included): beam search, or sampling seeded with `seed`."""
        options = dict(beam_size=self._beam_size, length_penalty=self._length_penalty,
                       num_hypotheses=self._hypotheses)
        if seed is not None:
            self._ctranslate2.set_random_seed(seed)
            options = dict(beam_size=1, sampling_topk=self.options["sampling_top_k"],
                           sampling_temperature=self.options["sampling_temperature"])
        if prefixes is not None:
            options["target_prefix"] = [self._pieces(prefix) or None for prefix in prefixes]
        return self._translator.translate_batch(
            [self._pieces(ids) for ids in pieces], max_decoding_length=limit,
            min_decoding_length=1, max_input_length=0, return_end_token=True,
            return_scores=True, suppress_sequences=[[self._pad]], **options)

    def _forced_attention(self, pieces, rows):
        """The attention of each of `rows` after `pieces`, decoded again as the target
        prefix of a one-beam search (`None` for an empty source).

        CTranslate2's beam search (beam size 2 or more) returns other weights for the
        first target token than the same hypothesis decoded alone (later rows agree):
        the chosen hypotheses are decoded again, forced, where its weights are the
        model's.
        """
        attention = [None] * len(rows)
        group = [i for i, ids in enumerate(pieces) if ids]
        if not group:
            return attention
        # The weights of a row do not depend on the token chosen there: the last row
        # (END, or the limit's token) is free to differ.
        results = self._translator.translate_batch(
            [self._pieces(pieces[i]) for i in group],
            target_prefix=[self._pieces(rows[i][:-1]) or None for i in group],
            max_decoding_length=max(len(rows[i]) for i in group), min_decoding_length=1,
            max_input_length=0, return_end_token=True, return_attention=True,
            beam_size=1, suppress_sequences=[[self._pad]])
        for i, result in zip(group, results):
            attention[i] = result.attention[0][:len(rows[i])]
        return attention

    def _alignments(self, pieces, rows, attention):
        """The `align` signature's alignment outputs (`decoding.alignment`'s rules)."""
        sources = [[self._processor.bos_id(), *ids, self._end_id] for ids in pieces]
        source_words = _word_indices(sources, self._word_starts(), self._special_ids())
        target_words = _word_indices(rows, self._word_starts(), self._special_ids())
        weights = np.zeros([len(rows), target_words.shape[1], source_words.shape[1]],
                           np.float32)
        for i, matrix in enumerate(attention):
            if matrix:  # an empty source has none
                # CTranslate2 gives the weights of the pieces alone, not of the START
                # and END it adds: those columns stay 0.
                matrix = np.asarray(matrix, np.float32)
                weights[i, :matrix.shape[0], 1:1 + matrix.shape[1]] = matrix
        masked = np.where(source_words[:, None, :] >= 0, weights, -1.0)
        aligned = np.take_along_axis(source_words, masked.argmax(axis=-1), axis=1)
        return {"attention": weights, "source_words": source_words,
                "target_words": target_words,
                "alignments": np.where(target_words >= 0, aligned, -1).astype(np.int32)}

    def _word_starts(self):
        if not hasattr(self, "_starts"):
            self._starts = np.array([self._processor.id_to_piece(i).startswith("\u2581")
                                     for i in range(self._processor.get_piece_size())])
        return self._starts

    def _special_ids(self):
        return (self._pad_id, self._processor.bos_id(), self._end_id)

    def _score(self, pieces, translations):
        """The `score` signature's outputs of `translations` after `pieces`."""
        targets = [ids[:self.options["max_source_length"] - 2] + [self._end_id]
                   for ids in self._processor.encode(translations)]
        results = self._score_results(pieces, targets)
        token_scores = _padded([result.log_probs for result in results], 0.0, np.float32)
        token_ids = _padded(targets, self._pad_id)
        # Bytes, "" at padding, as the exported signature gives them.
        tokens = np.array([[self._processor.id_to_piece(int(i)).encode("utf-8")
                            if i != self._pad_id else b"" for i in row]
                           for row in token_ids], dtype=object).reshape(token_ids.shape)
        return {"scores": token_scores.sum(axis=1), "token_scores": token_scores,
                "token_ids": token_ids, "tokens": tokens}

    def _score_ids(self, pieces, rows):
        """Log-probabilities `(B, n)` of each sentence's hypotheses (id lists)."""
        sources = [source for source, hypotheses in zip(pieces, rows) for _ in hypotheses]
        targets = [row if row else [self._end_id] for hypotheses in rows for row in hypotheses]
        results = self._score_results(sources, targets)
        # A hypothesis cut at the length limit has no END, which CTranslate2 scores
        # all the same: its last log-probability is not the hypothesis's.
        return np.array([sum(result.log_probs[:None if self._end_id in row else -1])
                         for result, row in zip(results, targets)],
                        np.float32).reshape([len(rows), -1])

    def _score_results(self, sources, targets):
        """CTranslate2's `ScoringResult`s of target id lists (END last) after sources.

        CTranslate2 adds START before each target and reads END as its end: the end
        token is given as a piece of the target, scored as the last token."""
        return self._translator.score_batch(
            [self._pieces(ids) for ids in sources],
            [self._pieces([i for i in ids if i != self._end_id]) for ids in targets],
            max_input_length=0)

    def _pieces(self, ids):
        return [self._processor.id_to_piece(int(i)) for i in ids]

    def _texts(self, rows):
        return np.array(
            [self._processor.decode([j for j in row if j != self._end_id]).encode("utf-8")
             for row in rows], dtype=object).reshape([len(rows)])

    def _limit(self, source_length):
        """Output tokens allowed, END included, for a source of `source_length` ids."""
        limit = min(source_length + self.options["extra_length"],
                    self.options["max_source_length"] - 1)
        if self.options.get("max_output_length"):
            limit = min(limit, self.options["max_output_length"])
        return limit


def open_runner(path, beam=False, session=False, threads=None, signature=None):
    """Returns the runner for the artifact at `path`.

    Args:
        path: str. A SavedModel directory, a `.tflite` file or a CTranslate2 directory.
        beam: bool. Use the beam-search signature.
        session: bool. Load the SavedModel with the session-based loader.
        threads: int or `None` (each runtime's default here). Threads of the runtime.
        signature: str or `None`. The signature to call (`files.SIGNATURES`), instead
            of `beam`'s.

    Raises:
        export_folder.ExportMismatchError: the artifact lies in an export folder whose
            files come from different exports.
        MissingSignatureError: the artifact has no such signature.
    """
    export_folder.check_consistent(export_folder.export_folder_of(path))
    signature = signature or (BEAM_SIGNATURE if beam else GREEDY_SIGNATURE)
    if files.is_ctranslate2_dir(path):
        return CTranslate2Runner(path, threads=threads, signature=signature)
    try:
        if os.fspath(path).endswith(".tflite"):
            return TFLiteRunner(path, signature, threads=threads)
        return (SessionRunner if session else SavedModelRunner)(path, signature, threads)
    except KeyError:  # TensorFlow's loaders
        pass
    except ValueError as error:  # LiteRT's
        if "signature" not in str(error).lower():
            raise
    raise MissingSignatureError(f"{path} has no signature {signature!r} (it was exported "
                                "before there was one, or without it): export the run "
                                "again (keras-transformer export RUN_DIR).")


def signature_names(path):
    """Returns the names of the signatures the artifact at `path` holds, in
    `files.SIGNATURES` order (a `.tflite` file's and CTranslate2 directory's without
    TensorFlow)."""
    path = os.fspath(path)
    if files.is_ctranslate2_dir(path):
        held = _ctranslate2_signatures(artifacts.exported_options(path))
    elif path.endswith(".tflite"):
        from ai_edge_litert.interpreter import Interpreter  # here: see SavedModelRunner

        # The signature list needs no kernels: the custom ops are not resolved yet.
        held = Interpreter(model_path=path).get_signature_list()
    else:
        from keras_transformer.serving import rest_api

        held = rest_api.saved_model_signature_defs(path)
    return [name for name in files.SIGNATURES if name in held]


def _ctranslate2_signatures(options):
    """The signatures a CTranslate2 export's options (`files.CTRANSLATE2_OPTIONS`)
    hold: exports older than `sample` and `align` lack their options."""
    needs = {SAMPLE_SIGNATURE: "sampling_top_k", ALIGN_SIGNATURE: "alignment_layer"}
    return [name for name in files.SIGNATURES
            if needs.get(name, "max_source_length") in options]


class MissingSignatureError(ValueError):
    """An artifact lacks the signature asked for; the message says what to do."""


def _tensor(tf, value):
    """A signature input as a tensor: strings from object arrays, else the array's type."""
    return tf.constant(value, tf.string if value.dtype == object else None)


def translations(outputs):
    """Returns the `translations` output as a list of `str` (invalid UTF-8 replaced)."""
    return [text.decode("utf-8", "replace") if isinstance(text, bytes) else str(text)
            for text in np.asarray(outputs["translations"]).reshape([-1])]


def _text(sentence):
    return sentence.decode("utf-8", "replace") if isinstance(sentence, bytes) else str(sentence)


def _word_indices(rows, word_starts, special_ids):
    """NumPy's `decoding.alignment.word_indices` of id lists: int32 `(B, longest)`,
    -1 at special ids and padding."""
    ids = _padded(rows, special_ids[0])
    real = ~np.isin(ids, special_ids)
    opens = (word_starts[ids] | (np.cumsum(real, axis=1) == 1)) & real
    return np.where(real, np.cumsum(opens, axis=1) - 1, -1).astype(np.int32)


def _padded(rows, value, dtype=np.int32):
    """Returns the lists `rows` as one `(len(rows), longest)` array padded with `value`."""
    width = max((len(row) for row in rows), default=0)
    array = np.full([len(rows), width], value, dtype)
    for i, row in enumerate(rows):
        array[i, :len(row)] = row
    return array


class ModuleRunner:
    """A runner over a `serving.translator.Translator` in memory: what its export would do.

    Args:
        translator: a `Translator`.
        beam: bool. Use its beam search instead of greedy decoding.
        signature: str or `None`. The signature whose function to call, instead of
            `beam`'s (`files.SIGNATURES`).
    """

    def __init__(self, translator, beam=False, signature=None):
        import tensorflow as tf  # here: a Translator is TensorFlow's; artifacts need not be

        self._tf = tf
        self.translator = translator
        signature = signature or (BEAM_SIGNATURE if beam else GREEDY_SIGNATURE)
        self.signature = signature
        self._function = {GREEDY_SIGNATURE: translator.translate,
                          BEAM_SIGNATURE: translator.translate_beam,
                          N_BEST_SIGNATURE: translator.translate_n_best,
                          SCORE_SIGNATURE: translator.score,
                          PREFIX_SIGNATURE: translator.translate_prefix,
                          SAMPLE_SIGNATURE: translator.sample,
                          ALIGN_SIGNATURE: translator.align}[signature]

    def __call__(self, sentences, second=None):
        inputs = [_tensor(self._tf, value) for value in
                  signature_inputs(self.signature, sentences, second).values()]
        return {name: value.numpy() for name, value in self._function(*inputs).items()}

    def with_signature(self, signature):
        """Returns a `ModuleRunner` of the same translator calling `signature`."""
        return ModuleRunner(self.translator, signature=signature)
