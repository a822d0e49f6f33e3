"""What translators give, as Python values and as the text that commands write.

`Hypothesis` and `Scored` are the values of `LoadedTranslator.n_best` and `.score`.
The other functions take a sentence's number (0-based) and its row of a signature's
outputs (`translate.output_windows`) and return its text, newline(s) included, as
`translate.translate_file`'s `format_output` wants. The formats, one line per sentence
unless said (scores with 4 decimals):

- translations: the translation.
- `translate --scores`: `SCORE<TAB>TRANSLATION`; SCORE is the log-probability of the
  output tokens.
- `translate --n-best N`: Moses's n-best format, up to N lines per sentence, best
  first: `I ||| TRANSLATION ||| log_prob= LP ||| SCORE`. I counts input lines from 0;
  SCORE, which ranks them, is LP over beam search's length penalty.
- `score`: the log-probability of the given translation's tokens and END.
- `score --tokens`: `SCORE<TAB>PIECES<TAB>TOKEN_SCORES`, the pieces and their
  log-probabilities each separated by spaces.
- `translate --alignment`: `TRANSLATION ||| PAIRS` (as Marian's `--alignment`), PAIRS
  the Pharaoh pairs `i-j` of source word i and translation word j (whitespace words,
  from 0), sorted, separated by spaces.
- `translate-corpus --pairs tsv`: `SOURCE<TAB>TRANSLATION<TAB>SCORE`, with backslash,
  tab and carriage return in the text written `\\`, `\\t`, `\\r` (the source's bytes as
  they are, invalid UTF-8 included).
- `translate-corpus --pairs jsonl`: `{"line": I, "source": ..., "translation": ...,
  "score": ...}`, invalid UTF-8 in the source replaced by U+FFFD.
"""

import functools
import json
import typing

import numpy as np

from keras_transformer import files


class Hypothesis(typing.NamedTuple):
    """One entry of an n-best list (`LoadedTranslator.n_best`)."""

    translation: str
    score: float
    normalized_score: float


class Scored(typing.NamedTuple):
    """A scored translation (`LoadedTranslator.score`)."""

    score: float
    tokens: list
    token_scores: list


class Aligned(typing.NamedTuple):
    """A translation with its word alignment (`LoadedTranslator.align`).

    `alignment` holds the `(source word, translation word)` pairs (whitespace words,
    from 0), sorted; `attention` the token-level weights behind them, float32
    `(output tokens, source positions)`: a row per output piece (END included), a
    column per source position (START, the pieces, END).
    """

    translation: str
    alignment: list
    attention: typing.Any


def text(value):
    """Returns a string output's entry (bytes or str) as `str`, invalid UTF-8 replaced."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def one_line(value):
    """Returns a `translations` entry (bytes or str) as one line of `str`: whatever
    characters the detokenizer produced, one translation is one output line."""
    return " ".join(text(value).splitlines())


def hypotheses(row):
    """Returns the `Hypothesis` list of one sentence's `n_best` outputs, without the
    fillers of sentences that have fewer hypotheses than the list's length."""
    return [Hypothesis(one_line(text), float(score), float(normalized))
            for text, score, normalized in zip(row["translations"], row["scores"],
                                               row["normalized_scores"])
            if score > files.FORBIDDEN_SCORE / 2]


def scored(row):
    """Returns the `Scored` of one sentence's `score` outputs, padding cut."""
    tokens = [text(piece) for piece in row["tokens"]]
    length = sum(1 for piece in tokens if piece)
    return Scored(float(row["scores"]), tokens[:length],
                  [float(value) for value in row["token_scores"][:length]])


def translation(number, row):
    """The translation alone."""
    return one_line(row["translations"]) + "\n"


def output_format(n_best=None, scores=False, alignment=False):
    """Returns the formatter of `translate`'s output lines: `n_best` hypotheses, the
    translation with its score or its alignment, or (none given) the translation."""
    if n_best:
        return functools.partial(_n_best, n_best)
    if alignment:
        return aligned_translation
    return scored_translation if scores else translation


def scored_translation(number, row):
    """`SCORE<TAB>TRANSLATION`."""
    return f"{float(row['scores']):.4f}\t{one_line(row['translations'])}\n"


def n_best(count):
    """Returns the Moses n-best formatter of at most `count` hypotheses a sentence."""
    return functools.partial(_n_best, count)


def _n_best(count, number, row):
    return "".join(f"{number} ||| {hypothesis.translation} ||| log_prob= "
                   f"{hypothesis.score:.4f} ||| {hypothesis.normalized_score:.4f}\n"
                   for hypothesis in hypotheses(row)[:count])


def score(number, row):
    """The score of a given translation."""
    return f"{float(row['scores']):.4f}\n"


def token_scores(number, row):
    """`SCORE<TAB>PIECES<TAB>TOKEN_SCORES`."""
    result = scored(row)
    return (f"{result.score:.4f}\t{' '.join(result.tokens)}\t"
            + " ".join(f"{value:.4f}" for value in result.token_scores) + "\n")


def aligned(row):
    """Returns the `Aligned` of one sentence's `align` outputs, padding cut."""
    length = int(np.count_nonzero(np.asarray(row["token_ids"]) != files.PAD_ID))
    attention = np.asarray(row["attention"], np.float32)[:length]
    # Padding columns carry no weight (they are masked): cut them.
    columns = np.flatnonzero(attention.sum(axis=0) > 0)
    width = int(columns[-1]) + 1 if columns.size else 0
    return Aligned(one_line(row["translations"]), alignment_pairs(row),
                   attention[:, :width])


def alignment_pairs(row):
    """Returns the sorted `(source word, translation word)` pairs of `align` outputs."""
    return sorted({(int(source), int(target)) for source, target in
                   zip(row["alignments"], row["target_words"])
                   if source >= 0 and target >= 0})


def pharaoh(pairs):
    """Returns `pairs` `[(i, j), ...]` as Pharaoh text: `i-j` separated by spaces."""
    return " ".join(f"{i}-{j}" for i, j in pairs)


def parse_pharaoh(line):
    """Returns the `(i, j)` pairs of a line of Pharaoh text (the inverse of `pharaoh`).

    Raises:
        ValueError: an entry is not `i-j` with i, j ≥ 0, naming it.
    """
    pairs = []
    for entry in line.split():
        source, dash, target = entry.partition("-")
        if not (dash and source.isdigit() and target.isdigit()):
            raise ValueError(f"{entry!r} is not a Pharaoh pair i-j (word numbers from 0).")
        pairs.append((int(source), int(target)))
    return pairs


def aligned_translation(number, row):
    """`TRANSLATION ||| PAIRS`."""
    return f"{one_line(row['translations'])} ||| {pharaoh(alignment_pairs(row))}\n"


def pair_tsv(number, source, row):
    """`SOURCE<TAB>TRANSLATION<TAB>SCORE` of sentence `source` (bytes or str)."""
    source = source if isinstance(source, bytes) else str(source).encode("utf-8")
    translation = one_line(row["translations"]).encode("utf-8")
    return (b"\t".join([_tsv_escaped(source), _tsv_escaped(translation),
                        f"{float(row['scores']):.4f}".encode()]) + b"\n").decode(
        "utf-8", "surrogateescape")


def _tsv_escaped(field):
    return field.replace(b"\\", b"\\\\").replace(b"\t", b"\\t").replace(b"\r", b"\\r")


def pair_jsonl(number, source, row):
    """A JSON line of sentence `number`, its `source` and its row's translation and score."""
    return json.dumps({"line": number, "source": text(source),
                       "translation": one_line(row["translations"]),
                       "score": round(float(row["scores"]), 4)}, ensure_ascii=False) + "\n"
