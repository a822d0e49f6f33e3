"""The `/translate` JSON API of `serve`: a request in, one object per sentence out.

    {"sentences": ["A man rides a bike."], "beam": true, "n_best": 3, "alignment": true}
    -> {"translations": [{"source": ..., "translation": ..., "score": ..., "n_best":
        [...], "alignment": [[0, 0], ...], "source_words": [...], "target_words": [...]}],
        "signature": "align"}

`parse_request` checks the fields and says which signature answers them (greedy or
beam search, `prefix`, `sample` or `align`, with `n_best` beside); `response` writes the
answer from the signatures' outputs. TF Serving's own API is `rest_api`; errors are its
`RestError`s (400), which the server answers as TF Serving does.
"""

import json
from typing import NamedTuple

from keras_transformer import files, formats
from keras_transformer.serving import rest_api

FIELDS = ("alignment", "beam", "n_best", "prefixes", "seed", "sentences")


class TranslateRequest(NamedTuple):
    """What a `/translate` request asks: `sentences` (bytes, as the artifact reads
    them) through `signature`, with its `second` input (prefixes or seeds, else
    `None`), and `n_best` hypotheses of the `n_best` signature beside (or `None`)."""

    sentences: list
    signature: str
    second: list | None
    n_best: int | None
    alignment: bool


def parse_request(body, n_best_held=None):
    """Returns the `TranslateRequest` of a `/translate` body (bytes of JSON).

    Args:
        body: bytes.
        n_best_held: int or `None` (unknown). Hypotheses the artifact's n-best lists
            hold: more may not be asked.

    Raises:
        rest_api.RestError: a malformed body, an unknown field, a value of the wrong
            type or range, or fields that exclude each other.
    """
    request = rest_api.parse_json(body)
    unknown = sorted(set(request) - set(FIELDS))
    if unknown:
        raise _bad(f"Unknown field {unknown[0]!r}: /translate takes {', '.join(FIELDS)}.")
    sentences = request.get("sentences")
    if isinstance(sentences, str):
        sentences = [sentences]
    if not isinstance(sentences, list) or not all(isinstance(s, str) for s in sentences):
        raise _bad("'sentences' must be a string or a list of strings.")
    sentences = [rest_api.input_value(s, "DT_STRING", i) for i, s in enumerate(sentences)]
    beam = _option(request, "beam", bool, False)
    alignment = _option(request, "alignment", bool, False)
    n_best = _option(request, "n_best", int, None)
    seed = _option(request, "seed", int, None)
    prefixes = _option(request, "prefixes", list, None)
    if n_best is not None and n_best < 1:
        raise _bad("'n_best' must be at least 1.")
    if n_best is not None and n_best_held is not None and n_best > n_best_held:
        raise _bad(f"'n_best' must be at most {n_best_held}: the artifact's n-best "
                   f"lists hold {n_best_held} hypotheses (export with --n-best "
                   f"{n_best} and a --beam-size of at least {n_best} for more).")
    if seed is not None and (n_best or alignment or prefixes or beam):
        raise _bad("'seed' samples: it excludes 'beam', 'n_best', 'alignment' and "
                   "'prefixes'.")
    if prefixes is not None:
        if len(prefixes) != len(sentences) or not all(isinstance(p, str) for p in prefixes):
            raise _bad("'prefixes' must be a list of strings, one per sentence.")
        if alignment:
            raise _bad("'prefixes' and 'alignment' exclude each other.")
        prefixes = [rest_api.input_value(p, "DT_STRING", i) for i, p in enumerate(prefixes)]
    if seed is not None:
        if not -2**31 <= seed < 2**31:
            raise _bad("'seed' must be a 32-bit integer.")
        return TranslateRequest(sentences, files.SAMPLE_SIGNATURE, [seed] * len(sentences),
                                None, False)
    if prefixes is not None:
        return TranslateRequest(sentences, files.PREFIX_SIGNATURE, prefixes, n_best, False)
    if alignment:
        return TranslateRequest(sentences, files.ALIGN_SIGNATURE, None, n_best, True)
    signature = files.BEAM_SIGNATURE if beam or n_best else files.GREEDY_SIGNATURE
    return TranslateRequest(sentences, signature, None, n_best, False)


def response(request, outputs, n_best_outputs=None):
    """Returns the answer (a JSON-ready dict) to `request` (`TranslateRequest`) from the
    outputs of its signature and, when it asks for `n_best`, of the `n_best` one."""
    answers = []
    for i, source in enumerate(request.sentences):
        row = {name: value[i] for name, value in outputs.items()}
        translation = formats.one_line(row["translations"])
        answer = {"source": formats.text(source), "translation": translation,
                  "score": float(row["scores"])}
        if request.alignment:
            aligned = formats.aligned(row)
            answer.update(alignment=[list(pair) for pair in aligned.alignment],
                          source_words=formats.text(source).split(),
                          target_words=translation.split())
        if request.n_best:
            n_best_row = {name: value[i] for name, value in n_best_outputs.items()}
            answer["n_best"] = [hypothesis._asdict() for hypothesis in
                                formats.hypotheses(n_best_row)[:request.n_best]]
        answers.append(answer)
    return {"translations": answers, "signature": request.signature}


def _option(request, name, kind, default):
    value = request.get(name, default)
    if value is default:
        return value
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise _bad(f"{name!r} must be {'a list' if kind is list else kind.__name__}, "
                   f"got {json.dumps(value)[:50]}.")
    return value


def _bad(message):
    return rest_api.RestError(rest_api.INVALID_ARGUMENT, message)
