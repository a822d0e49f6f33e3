"""Hostile inputs for an exported translator: every call answers, one string per input.

    keras-transformer fuzz RUN_DIR/export/saved_model RUN_DIR/export/translator.tflite \\
        --inputs 10000 --report fuzz_report.json

Generates sentences no corpus holds — code points from all seventeen Unicode planes
(unassigned, private-use and non-characters included), invalid UTF-8 (stray
continuation bytes, overlong forms, lone surrogates, truncated sequences, random bytes),
control characters, strings of up to 100,000 bytes, empty and whitespace-only
strings — and sends them, in batches of 0 to 512 mixed sentences, through each artifact's
`serving_default` signature (SavedModel: `tf.saved_model.load`; TFLite: LiteRT with
tf-text's kernels). A call passes when it returns, with exactly one `translations` string
and one `token_ids` row per input, within `--max-seconds`. The same `--seed` gives the
same inputs. A native crash ends the command itself (non-zero exit by signal).

Public API:
    - `generate_sentence(rng)`, `generate_batches(seed, inputs, max_batch=512)`.
    - `fuzz(runner, batches, max_seconds)` -> report dict.
"""

import random
import time

MAX_BATCH = 512
LONGEST = 100_000
# Always sent first: the shapes of batch that break translators most often.
EDGE_BATCHES = ([], [b""], [b" "], [b"\xff"], ["\x00"], [""] * 3)
_WHITESPACE = " \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f\x85\xa0\u1680\u2000\u2001\u2007\u200b" \
              "\u2028\u2029\u202f\u205f\u3000\ufeff"
_WORDS = ("A", "man", "rides", "a", "bike", "Ein", "Mann", "fährt", "Fahrrad", "über",
          "die", "Straße", "«", "»", "„", "“", "l'homme", "à", "vélo", ".", "!")
_INVALID_UTF8 = (b"\x80", b"\xbf", b"\xc0\xaf", b"\xe0\x80\xaf", b"\xf0\x80\x80\xaf",
                 b"\xc3", b"\xe2\x82", b"\xf0\x9f\x98", b"\xed\xa0\x80", b"\xed\xbf\xbf",
                 b"\xf4\x90\x80\x80", b"\xf8\x88\x80\x80\x80", b"\xfe", b"\xff")


def _any_code_point(rng):
    """A code point from any plane: BMP, the supplementary planes, private use, ends."""
    plane = rng.choice((0, 0, 0, 1, 2, 3, 14, 15, 16, rng.randrange(4, 14)))
    code = plane * 0x10000 + rng.randrange(0x10000)
    if 0xD800 <= code <= 0xDFFF:
        code = rng.choice((0xFFFE, 0xFFFF, 0xFDD0, 0x10FFFF))  # non-characters instead
    return chr(code)


def _text(rng, length):
    return " ".join(rng.choice(_WORDS) for _ in range(max(1, length // 5)))[:length]


def _unicode(rng, length):
    return "".join(_any_code_point(rng) for _ in range(length))


def _control(rng, length):
    controls = [chr(code) for code in (*range(0x20), *range(0x7F, 0xA0))]
    return "".join(rng.choice(controls) if rng.random() < 0.5 else rng.choice("ab Mann .")
                   for _ in range(length))


def _invalid_utf8(rng, length):
    parts = []
    while sum(map(len, parts)) < length:
        kind = rng.random()
        if kind < 0.4:
            parts.append(rng.choice(_INVALID_UTF8))
        elif kind < 0.7:
            parts.append(bytes(rng.randrange(256) for _ in range(rng.randint(1, 8))))
        else:
            parts.append(_text(rng, rng.randint(1, 12)).encode("utf-8"))
    return b"".join(parts)


def _whitespace(rng, length):
    return "".join(rng.choice(_WHITESPACE) for _ in range(length))


_KINDS = {"text": _text, "unicode": _unicode, "control": _control,
          "invalid_utf8": _invalid_utf8, "whitespace": _whitespace}


def generate_sentence(rng):
    """Returns one hostile sentence as bytes (what a client may send: any bytes)."""
    roll = rng.random()
    if roll < 0.04:
        return b""
    length = rng.randint(1, 200)
    if rng.random() < 0.25:  # a mix of kinds in one sentence
        pieces = [_KINDS[rng.choice(list(_KINDS))](rng, max(1, length // 3))
                  for _ in range(3)]
    else:
        pieces = [_KINDS[rng.choice(list(_KINDS))](rng, length)]
    sentence = b"".join(piece if isinstance(piece, bytes) else piece.encode("utf-8")
                        for piece in pieces)
    if roll > 0.97:  # one in thirty-three: up to LONGEST bytes, by repetition
        sentence = (sentence * (rng.randint(1, LONGEST) // len(sentence) + 1))[:LONGEST]
    return sentence


def generate_batches(seed, inputs, max_batch=MAX_BATCH):
    """Yields lists of bytes holding `inputs` sentences in all (the edge batches first).

    Batch sizes are mostly small, sometimes up to `max_batch`; one batch of exactly
    `max_batch` comes early whenever `inputs` allows it.
    """
    rng = random.Random(seed)
    left = inputs
    for batch in EDGE_BATCHES:
        batch = [s.encode("utf-8") if isinstance(s, str) else s for s in batch][:left]
        left -= len(batch)
        yield batch
    if left >= max_batch:
        left -= max_batch
        yield [generate_sentence(rng) for _ in range(max_batch)]
    while left > 0:
        size = min(left, rng.choice((1, 2, 3, 8, 16, 32, rng.randint(1, max_batch))))
        left -= size
        yield [generate_sentence(rng) for _ in range(size)]


def fuzz(runner, batches, max_seconds):
    """Sends every batch through `runner`; returns a JSON-ready report.

    Args:
        runner: callable, list of bytes -> outputs dict (see `serving.runners`).
        batches: iterable of lists of bytes.
        max_seconds: float. A call taking longer counts as a failure.

    Returns:
        A dict: `inputs`, `calls`, `errors` (exceptions), `wrong_counts` (calls without
        one string and one id row per input), `too_slow`, `max_seconds_per_call`,
        `mean_seconds_per_call`, `slowest_batch_size`, `passed`, and `failures` (the
        first ten, described).
    """
    report = {"inputs": 0, "calls": 0, "errors": 0, "wrong_counts": 0, "too_slow": 0,
              "max_seconds_per_call": 0.0, "mean_seconds_per_call": 0.0,
              "slowest_batch_size": 0, "failures": []}
    total_time = 0.0
    for batch in batches:
        start = time.perf_counter()
        try:
            outputs = runner(batch)
            problem = _count_problem(outputs, len(batch))
            report["wrong_counts"] += bool(problem)
        except Exception as error:  # any exception is a failure to report, not to stop on
            problem = f"{type(error).__name__}: {str(error)[:300]}"
            report["errors"] += 1
        elapsed = time.perf_counter() - start
        if elapsed > max_seconds:
            report["too_slow"] += 1
            problem = problem or f"took {elapsed:.1f} s > {max_seconds} s"
        if problem and len(report["failures"]) < 10:
            report["failures"].append({"batch_size": len(batch), "problem": problem,
                                       "first_inputs": [repr(s[:80]) for s in batch[:3]]})
        report["calls"] += 1
        report["inputs"] += len(batch)
        total_time += elapsed
        if elapsed > report["max_seconds_per_call"]:
            report["max_seconds_per_call"] = elapsed
            report["slowest_batch_size"] = len(batch)
    report["mean_seconds_per_call"] = total_time / max(report["calls"], 1)
    report["passed"] = not any(report[key]
                               for key in ("errors", "wrong_counts", "too_slow"))
    return report


def _count_problem(outputs, count):
    translations, token_ids = outputs["translations"], outputs["token_ids"]
    if getattr(translations, "shape", None) != (count,):
        return f"{getattr(translations, 'shape', None)} translations for {count} inputs"
    if not all(isinstance(text, bytes) for text in translations):
        return "a translation is not a string"
    if token_ids.shape[0] != count:
        return f"{token_ids.shape[0]} rows of token ids for {count} inputs"
    return None
