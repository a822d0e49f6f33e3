"""Translate text with an exported translator: one line in, one line out, streamed.

    keras-transformer translate RUN_DIR < sentences.txt
    keras-transformer translate RUN_DIR/export/translator.tflite \\
        --input sentences.txt --output translations.txt --batch-size 64

What translates is a runner (`serving.runners`), usually that of a translator opened
by `loading.load_translator` (also `kt.load_translator`) from a run directory, a
SavedModel directory, a `.tflite` file or a CTranslate2 directory. Lines are
read as bytes and handed to the artifact as they are (invalid UTF-8 included, with a
warning naming the first such line), so line `i` of the output is always the
translation of line `i` of the input, empty lines included. The input is read a window
of `WINDOW_BATCHES` batches at a time, sorted by length within the window (which saves
padding) and written back in input order, so memory stays flat however long the input
is, and a run that is interrupted or fails keeps every window it finished.
"""

import itertools
import logging
import sys

import tqdm

from keras_transformer import files, formats

logger = logging.getLogger(__name__)

# Batches per window: sorting by length within 64 batches saves nearly as much padding
# as sorting the whole input, and a failure loses at most one window's work.
WINDOW_BATCHES = 64


def read_sentences(file):
    """Returns the lines of a binary file as bytes, without `\\n` or `\\r\\n`."""
    return list(iter_sentences(file))


def iter_sentences(file):
    """Yields the lines of a binary file as bytes, without `\\n` or `\\r\\n`, one by one."""
    for line in file:
        yield line.removesuffix(b"\n").removesuffix(b"\r")


def warn_if_not_utf8(lines, name):
    """Yields `lines` (bytes), logging a warning at the first one that is not UTF-8.

    Such text is translated as the bytes it is (the artifact replaces what it cannot
    read), which for a Latin-1 file garbles every accented word: the warning names the
    file, the line and the fix, instead of leaving the garbling silent.
    """
    warned = False
    for number, line in enumerate(lines, 1):
        if not warned:
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as error:
                warned = True
                logger.warning(
                    "%s: line %d is not UTF-8 (bytes %r): its accented characters will be "
                    "garbled. Re-encode the file as UTF-8 (e.g. `iconv -f latin1 -t utf-8`).",
                    name, number, line[error.start:error.end])
        yield line


def translate_sentences(runner, sentences, batch_size=32, progress=None, *,
                        batch_tokens=None, count_tokens=None):
    """Returns the translations (list of str) of `sentences`, in their order.

    Args:
        runner: callable, list of sentences -> outputs dict (see `serving.runners`).
        sentences: list of str or bytes.
        batch_size: int. Most sentences per call.
        progress: optional callable, given the number of sentences done after each
            batch.
        batch_tokens: int or `None`. Most source tokens per call, padding included
            (sentences × the longest one's tokens), as training's `batch_tokens`; a
            sentence longer than that is a batch of its own. Needs `count_tokens`.
        count_tokens: callable, list of sentences -> list of their token counts (see
            `artifacts.token_counter`); orders each window by these counts.
    """
    return [translation for window in translation_windows(
                runner, sentences, batch_size, progress, batch_tokens=batch_tokens,
                count_tokens=count_tokens)
            for translation in window]


def translation_windows(runner, sentences, batch_size=32, progress=None, *,
                        batch_tokens=None, count_tokens=None):
    """Yields the translations of consecutive windows of `sentences`, in input order.

    Each window holds `WINDOW_BATCHES` batches' worth of sentences (by `batch_size`),
    batched by length within the window. `sentences` may be any iterable (a file's
    lines): only one window is held at a time. Arguments as `translate_sentences`.
    """
    for window in output_windows(runner, sentences, batch_size, progress,
                                 batch_tokens=batch_tokens, count_tokens=count_tokens):
        yield [formats.one_line(row["translations"]) for row in window]


def output_windows(runner, sentences, batch_size=32, progress=None, *, batch_tokens=None,
                   count_tokens=None, second=None):
    """Yields the outputs of consecutive windows of `sentences`, in input order.

    What `translation_windows` does, for any signature: each window is a list with one
    `{output name: that sentence's row}` per sentence (a NumPy scalar or array).

    Args:
        second: iterable with one entry per sentence, or `None`: the second input of
            the signatures that take one (`files.SECOND_INPUTS`: translations to
            score, prefixes, seeds), passed beside each batch's sentences.
        The rest: as `translate_sentences`.

    Raises:
        ValueError: `second` ends before `sentences`, or after.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}.")
    if batch_tokens is not None and (batch_tokens < 1 or count_tokens is None):
        raise ValueError(f"batch_tokens={batch_tokens} needs to be at least 1, and a "
                         "count_tokens function.")
    sentences = iter(sentences)
    pairs = sentences if second is None else _strict_pairs(sentences, second)
    done = 0
    while window := list(itertools.islice(pairs, batch_size * WINDOW_BATCHES)):
        sources = window if second is None else [pair[0] for pair in window]
        lengths = count_tokens(sources) if count_tokens else [len(line) for line in sources]
        results = [None] * len(window)
        finished = 0
        for indices in length_batches(lengths, batch_size, batch_tokens):
            inputs = [[sources[i] for i in indices]]
            if second is not None:
                inputs.append([window[i][1] for i in indices])
            outputs = runner(*inputs)
            for position, index in enumerate(indices):
                results[index] = {name: value[position] for name, value in outputs.items()}
            finished += len(indices)
            if progress:
                progress(done + finished)
        done += len(window)
        yield results


def decoding_runner(translator, *, n_best=None, alignment=False, seed=None):
    """Returns the runner (list of sentences -> outputs) of `translator`'s signature for
    the outputs asked for: its n-best lists (`n_best`), its word alignments, its samples
    (every sentence drawn with `seed`), or (none given) its translations."""
    if n_best:
        return translator.signature_runner(files.N_BEST_SIGNATURE)
    if alignment:
        return translator.signature_runner(files.ALIGN_SIGNATURE)
    if seed is not None:
        runner = translator.signature_runner(files.SAMPLE_SIGNATURE)
        return lambda sentences: runner(sentences, [seed] * len(sentences))
    return translator.runner


def _strict_pairs(sentences, second):
    """Yields `(sentence, entry of second)`; raises ValueError if one is longer."""
    for number, pair in enumerate(itertools.zip_longest(sentences, second), 1):
        if pair[0] is None or pair[1] is None:
            longer = "lines on the second side" if pair[0] is None else "sentences"
            raise ValueError(f"there are more {longer} than the other side's "
                             f"{number - 1}: give one line on each side per sentence.")
        yield pair


def length_batches(lengths, batch_size, batch_tokens=None):
    """Returns batches (lists of indices) of sentences of `lengths`, shortest first.

    Sentences sorted by length (stably) are cut into runs of at most `batch_size`, and,
    with `batch_tokens`, of at most `batch_tokens` padded tokens: a batch's size times
    its longest length, which is what a call decodes. A sentence longer than
    `batch_tokens` alone is one batch.
    """
    batches, batch, longest = [], [], 0
    for index in sorted(range(len(lengths)), key=lambda i: lengths[i]):
        wider = max(longest, lengths[index])
        if batch and (len(batch) == batch_size or (
                batch_tokens is not None and wider * (len(batch) + 1) > batch_tokens)):
            batches.append(batch)
            batch, wider = [], lengths[index]
        batch.append(index)
        longest = wider
    if batch:
        batches.append(batch)
    return batches


def translate_file(runner, sentences, output, *, batch_size=32, progress=None,
                   batch_tokens=None, count_tokens=None, format_output=None,
                   second=None):
    """Translates `sentences` into the binary stream `output`, one line each.

    Each window's translations are written (UTF-8, one per line) and flushed as soon as
    they are done.

    Args:
        runner: callable, list of sentences -> outputs dict (see `serving.runners`).
        sentences: iterable of str or bytes, e.g. `iter_sentences(file)`.
        output: a binary file object.
        batch_size: int. Most sentences per call.
        progress: optional callable, given the number of sentences done.
        batch_tokens, count_tokens: as in `translate_sentences`.
        format_output: callable `(number, row) -> str` or `None` (the translation and
            a newline): the text written for sentence `number` (0-based) from its row
            of outputs (see `output_windows`), newline(s) included (`formats`).
        second: as in `output_windows` (the second input of `score`, `prefix`,
            `sample`).

    Returns:
        The number of lines translated.

    Raises:
        TranslationInterrupted: when translating fails or is interrupted; it says how
            many lines were written, and its `__cause__` is the original error.
    """
    format_output = format_output or formats.translation
    done = 0
    try:
        for window in output_windows(runner, sentences, batch_size, progress,
                                     batch_tokens=batch_tokens, count_tokens=count_tokens,
                                     second=second):
            output.write("".join(format_output(done + number, row)
                                 for number, row in enumerate(window)).encode("utf-8"))
            output.flush()
            done += len(window)
    except (Exception, KeyboardInterrupt) as error:
        raise TranslationInterrupted(done) from error
    return done


class TranslationInterrupted(Exception):
    """Translating a file stopped; `lines_written` lines of output are complete."""

    def __init__(self, lines_written):
        super().__init__(f"stopped after {lines_written} lines: the output holds the "
                         f"translations of the first {lines_written} input lines")
        self.lines_written = lines_written


def progress_bar(total=None, unit="sentence"):
    """Returns an update function (given the count done) of a progress bar on stderr.

    tqdm's, not Keras's: Keras loads its backend (TensorFlow), which translating with a
    `.tflite` file does not need, and writes to stdout, which may carry the translations.

    Args:
        total: int or `None` (unknown: a count done and a rate).
        unit: str. What is counted.
    """
    bar = tqdm.tqdm(total=total, unit=f" {unit}s", file=sys.stderr, dynamic_ncols=True)

    def update(done):
        bar.update(done - bar.n)
        if total is not None and done >= total:
            bar.close()

    return update
