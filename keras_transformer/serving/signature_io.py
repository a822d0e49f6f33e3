"""How every runner is called and answers: a signature's inputs from Python lists, its
`translations` output as `str`, and the error of a signature an artifact lacks.

Shared by the runners of each runtime (`runners`, `ctranslate2_runner`), which export
these names to their callers through `runners`.
"""

import numpy as np

from keras_transformer.files import INPUT_NAME, SECOND_INPUTS


class MissingSignatureError(ValueError):
    """An artifact lacks the signature asked for; the message says what to do."""


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


def translations(outputs):
    """Returns the `translations` output as a list of `str` (invalid UTF-8 replaced)."""
    return [text.decode("utf-8", "replace") if isinstance(text, bytes) else str(text)
            for text in np.asarray(outputs["translations"]).reshape([-1])]
