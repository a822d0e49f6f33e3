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

Public API (`CTranslate2Runner` is `ctranslate2_runner`'s; `MissingSignatureError`,
`translations`, `encode_sentences` and `signature_inputs` are `signature_io`'s, which
every runner shares):
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
    N_BEST_SIGNATURE,
    PREFIX_SIGNATURE,
    SAMPLE_SIGNATURE,
    SCORE_SIGNATURE,
)
from keras_transformer.serving import artifacts, ctranslate2_runner, export_folder, litert
from keras_transformer.serving.ctranslate2_runner import (  # this module's API too
    CTranslate2Runner as CTranslate2Runner,
)
from keras_transformer.serving.signature_io import (  # this module's API too
    MissingSignatureError as MissingSignatureError,
)
from keras_transformer.serving.signature_io import (
    encode_sentences as encode_sentences,
)
from keras_transformer.serving.signature_io import (
    signature_inputs as signature_inputs,
)
from keras_transformer.serving.signature_io import translations as translations

logger = logging.getLogger(__name__)

# TensorFlow's threads for a SavedModel unless asked (`set_tensorflow_threads`).
SAVED_MODEL_DEFAULT_THREADS = 1


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
        held = ctranslate2_runner.held_signatures(artifacts.exported_options(path))
    elif path.endswith(".tflite"):
        from ai_edge_litert.interpreter import Interpreter  # here: see SavedModelRunner

        # The signature list needs no kernels: the custom ops are not resolved yet.
        held = Interpreter(model_path=path).get_signature_list()
    else:
        from keras_transformer.serving import rest_api

        held = rest_api.saved_model_signature_defs(path)
    return [name for name in files.SIGNATURES if name in held]


def _tensor(tf, value):
    """A signature input as a tensor: strings from object arrays, else the array's type."""
    return tf.constant(value, tf.string if value.dtype == object else None)


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
