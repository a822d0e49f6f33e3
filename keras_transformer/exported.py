"""Run an exported translator (SavedModel or TFLite) from Python: list of str in, out.

Evaluation scores what is served, so it calls the exported artifact through the same
signatures a server or a phone would: `serving_default` (greedy decoding) or the beam-search
signature, each mapping a `string[B]` tensor of sentences to a `string[B]` tensor of
translations. Nothing here knows about the model; only about the artifact's signatures.
"""

import os

import numpy as np

from keras_transformer.serving import BEAM_SIGNATURE, GREEDY_SIGNATURE

# Where a run directory keeps its export (written by `python -m export RUN_DIR`).
RUN_EXPORT_DIR = os.path.join("export", "saved_model")
# The signatures' output holding the text (they also return token ids and scores).
_OUTPUT_KEY = "translations"


def resolve_artifact(path):
    """Returns the artifact that `path` names: a run directory means its SavedModel.

    Args:
        path: str. A SavedModel directory, a `.tflite` file, or a run directory (one with
            a `config.json`), whose `export/saved_model` is used.

    Raises:
        FileNotFoundError: when there is no artifact at `path`, with the command that
            writes one.
    """
    path = os.fspath(path)
    if os.path.isfile(path) and path.endswith(".tflite"):
        return path
    if os.path.isfile(os.path.join(path, "saved_model.pb")):
        return path
    if os.path.isfile(os.path.join(path, "config.json")):
        saved_model = os.path.join(path, RUN_EXPORT_DIR)
        if os.path.isfile(os.path.join(saved_model, "saved_model.pb")):
            return saved_model
        raise FileNotFoundError(
            f"Run directory {path!r} has no exported SavedModel at {saved_model!r}: "
            f"export it first with `python -m export {path}`, then evaluate again.")
    raise FileNotFoundError(
        f"{path!r} is neither a SavedModel directory (with saved_model.pb), a .tflite file "
        "nor a run directory (with config.json).")


def load_translator(path, beam=False):
    """Returns a function translating a list of str with the artifact at `path`.

    Args:
        path: str. A SavedModel directory or a `.tflite` file (see `resolve_artifact`).
        beam: bool. Use the beam-search signature instead of `serving_default`.

    Returns:
        A callable: list of str -> list of str, one translation per sentence.

    Raises:
        ValueError: when the artifact has no such signature, or it does not map one
            string tensor to string tensors.
    """
    signature = BEAM_SIGNATURE if beam else GREEDY_SIGNATURE
    if os.fspath(path).endswith(".tflite"):
        return _tflite_translator(path, signature)
    return _saved_model_translator(path, signature)


def _saved_model_translator(path, signature):
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  registers the tokenizer ops the graph uses

    loaded = tf.saved_model.load(os.fspath(path))
    _check_signature(path, signature, list(loaded.signatures.keys()))
    function = loaded.signatures[signature]
    input_name = _single_input(path, signature,
                               list(function.structured_input_signature[1]))

    def translate(sentences):
        outputs = function(**{input_name: tf.constant(list(sentences), tf.string)})
        return _decode(_translations(path, signature, outputs))

    # Keeps the loaded object (and its variables) alive as long as the function is.
    translate.loaded = loaded
    return translate


def _tflite_translator(path, signature):
    import tensorflow_text

    try:
        from ai_edge_litert.interpreter import InterpreterWithCustomOps
    except ImportError as error:
        raise ImportError("Running a .tflite file needs LiteRT: pip install ai-edge-litert"
                          ) from error
    # tf-text registers its TFLite kernels (tokenizers, RaggedTensorToTensor) here.
    interpreter = InterpreterWithCustomOps(
        model_path=os.fspath(path),
        custom_op_registerers=tensorflow_text.tflite_registrar.SELECT_TFTEXT_OPS)
    signatures = interpreter.get_signature_list()
    _check_signature(path, signature, list(signatures))
    input_name = _single_input(path, signature, signatures[signature]["inputs"])
    runner = interpreter.get_signature_runner(signature)

    def translate(sentences):
        # The runner resizes its input to the batch at every call.
        encoded = np.array([sentence.encode("utf-8") for sentence in sentences],
                           dtype=object)
        return _decode(_translations(path, signature, runner(**{input_name: encoded})))

    return translate


def _check_signature(path, signature, available):
    if signature not in available:
        raise ValueError(f"{path!r} has no signature {signature!r}; it has "
                         f"{sorted(available)}. Export it again with the current code.")


def _single_input(path, signature, names):
    if len(names) != 1:
        raise ValueError(f"Signature {signature!r} of {path!r} takes inputs {sorted(names)}; "
                         "a translator takes exactly one (the sentences).")
    return names[0]


def _translations(path, signature, outputs):
    if len(outputs) == 1:
        return next(iter(outputs.values()))
    if _OUTPUT_KEY in outputs:
        return outputs[_OUTPUT_KEY]
    raise ValueError(f"Signature {signature!r} of {path!r} returns {sorted(outputs)}; "
                     f"expected a single output or one named {_OUTPUT_KEY!r}.")


def _decode(tensor):
    values = tensor.numpy() if hasattr(tensor, "numpy") else tensor
    # "replace": a byte-level detokenizer may emit broken UTF-8; score it, don't crash.
    return [value.decode("utf-8", errors="replace")
            for value in np.asarray(values).reshape(-1)]
