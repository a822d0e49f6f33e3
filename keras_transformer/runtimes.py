"""Run an exported translator in each runtime it is made for, from Python.

The same `string[B]` signature is called three ways: through `tf.saved_model.load`
(TensorFlow 2), through the session-based loader that TF Serving and `saved_model_cli`
use (`tf.compat.v1.saved_model.loader.load`), and through LiteRT for the `.tflite` file.
Each runner takes a list of `str` or `bytes` (any bytes: the graph decides what to make
of invalid UTF-8) and returns the signature's outputs as NumPy arrays. Only TensorFlow,
tf-text and LiteRT are imported: the model code is not needed to translate.

Public API:
    - `SavedModelRunner(directory, signature)`, `SessionRunner(directory, signature)`,
      `TFLiteRunner(path_or_content, signature)`: `runner(sentences) -> dict`.
    - `open_runner(path, beam=False, session=False)`: the runner an artifact needs.
    - `translations(outputs)`: the `translations` output as a list of `str`.
"""

import os

import numpy as np

GREEDY_SIGNATURE = "serving_default"
BEAM_SIGNATURE = "beam_search"
INPUT_NAME = "sentences"
_EMPTY_OUTPUTS = {"translations": np.zeros([0], object),
                  "token_ids": np.zeros([0, 0], np.int32), "scores": np.zeros([0], np.float32)}


def encode_sentences(sentences):
    """Returns an object array of bytes; `str` sentences are UTF-8 encoded."""
    encoded = [s.encode("utf-8", "surrogateescape") if isinstance(s, str) else bytes(s)
               for s in sentences]
    return np.array(encoded, dtype=object).reshape([len(encoded)])


class SavedModelRunner:
    """Calls a SavedModel signature loaded with `tf.saved_model.load` (TensorFlow 2).

    Args:
        directory: str. The SavedModel directory.
        signature: str. Signature name.
    """

    def __init__(self, directory, signature=GREEDY_SIGNATURE):
        import tensorflow as tf
        import tensorflow_text  # noqa: F401  registers the tokenizer ops of the graph

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
    """

    def __init__(self, directory, signature=GREEDY_SIGNATURE):
        import tensorflow as tf
        import tensorflow_text  # noqa: F401

        graph = tf.Graph()
        self._session = tf.compat.v1.Session(graph=graph)
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

    Args:
        model: str path of a `.tflite` file, or its bytes.
        signature: str. Signature name.
    """

    def __init__(self, model, signature=GREEDY_SIGNATURE):
        import tensorflow_text
        from ai_edge_litert.interpreter import InterpreterWithCustomOps

        in_memory = isinstance(model, (bytes, bytearray))
        source = ({"model_content": bytes(model)} if in_memory
                  else {"model_path": os.fspath(model)})
        try:
            self._interpreter = InterpreterWithCustomOps(
                custom_op_registerers=tensorflow_text.tflite_registrar.SELECT_TFTEXT_OPS,
                **source)
        except ValueError as error:  # LiteRT's message names no file
            name = "the TFLite model" if in_memory else os.fspath(model)
            raise ValueError(f"{name} is not a TFLite model LiteRT can load ({error}): "
                             "export the run again (python -m export RUN_DIR).") from None
        self._runner = self._interpreter.get_signature_runner(signature)

    def __call__(self, sentences):
        if len(sentences) == 0:
            # The model runs on an empty batch, but LiteRT's Python binding refuses to
            # read back its zero-sized numeric outputs ("Invalid tensor size").
            return {name: value.copy() for name, value in _EMPTY_OUTPUTS.items()}
        # The runner resizes the input to the batch and copies the outputs out.
        return self._runner(**{INPUT_NAME: encode_sentences(sentences)})


def open_runner(path, beam=False, session=False):
    """Returns the runner for the artifact at `path` (SavedModel directory or `.tflite`).

    Args:
        path: str. A SavedModel directory or a `.tflite` file.
        beam: bool. Use the beam-search signature.
        session: bool. Load the SavedModel with the session-based loader.
    """
    signature = BEAM_SIGNATURE if beam else GREEDY_SIGNATURE
    if os.fspath(path).endswith(".tflite"):
        return TFLiteRunner(path, signature)
    return (SessionRunner if session else SavedModelRunner)(path, signature)


def translations(outputs):
    """Returns the `translations` output as a list of `str` (invalid UTF-8 replaced)."""
    return [text.decode("utf-8", "replace") if isinstance(text, bytes) else str(text)
            for text in np.asarray(outputs["translations"]).reshape([-1])]
