"""Translate text with an exported translator: one line in, one line out, streamed.

    keras-transformer translate RUN_DIR < sentences.txt
    keras-transformer translate RUN_DIR/export/translator.tflite \\
        --input sentences.txt --output translations.txt --batch-size 64

`load_translator(path)` (also `kt.load_translator`) gives a translator to call from
Python: a list of sentences in, a list of translations out.

The artifact is a SavedModel directory, a `.tflite` file or a run directory. Lines are
read as bytes and handed to the artifact as they are (invalid UTF-8 included, with a
warning naming the first such line), so line `i` of the output is always the
translation of line `i` of the input, empty lines included. The input is read a window
of `WINDOW_BATCHES` batches at a time, sorted by length within the window (which saves
padding) and written back in input order, so memory stays flat however long the input
is, and a run that is interrupted or fails keeps every window it finished.
"""

import itertools
import logging
import os
import sys

import tqdm

from keras_transformer import files, formats, runs
from keras_transformer.serving import artifacts, runners

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


class LoadedTranslator:
    """A translator to call like a function: a list of sentences in, translations out.

    Made by `load_translator`. `decoder` says how it decodes, e.g. `"beam search (beam
    4, length penalty 0.6)"`, and where that comes from when it is a run's choice on
    validation (`chosen_by`, see `runs.Choice`); `artifact` is the file or folder it
    runs (`None` for a run directory's model in memory); `runner` maps a list of
    sentences to the raw outputs (`translations`, `token_ids`, `scores`); `batching`
    holds the batching options of `translate_sentences` (`batch_size`, `batch_tokens`,
    `count_tokens`). `n_best`, `score`, `prefix`, `sample` and `align` call the
    artifact's other signatures (`serving.translator`), opened by
    `open_signature(name)` on first use.
    """

    def __init__(self, runner, *, artifact, beam_size, length_penalty, batch_size,
                 batch_tokens=None, count_tokens=None, chosen_by=None,
                 open_signature=None):
        self.runner = runner
        self.artifact = artifact
        self.beam_size = beam_size
        self.length_penalty = length_penalty
        self.chosen_by = chosen_by
        self.batch_size = batch_size
        self.batching = dict(batch_size=batch_size, batch_tokens=batch_tokens,
                             count_tokens=count_tokens)
        self._open_signature = open_signature
        self._signature_runners = {}

    @property
    def decoder(self):
        if self.beam_size is None:
            return "greedy"
        chosen = f"; the run's choice, {self.chosen_by}" if self.chosen_by else ""
        return (f"beam search (beam {self.beam_size}, length penalty "
                f"{self.length_penalty}{chosen})")

    def __call__(self, sentences):
        """Returns the translations (list of str) of `sentences` (list of str or bytes)."""
        return translate_sentences(self.runner, list(sentences), **self.batching)

    def outputs(self, sentences):
        """Returns the raw outputs of one call: `translations`, `token_ids`, `scores`."""
        return self.runner(list(sentences))

    def signature_runner(self, name):
        """Returns the runner of the artifact's signature `name` (`files.SIGNATURES`).

        Raises:
            serving.runners.MissingSignatureError: the artifact has none such.
        """
        if name not in self._signature_runners:
            self._signature_runners[name] = self._open_signature(name)
        return self._signature_runners[name]

    def n_best(self, sentences):
        """Returns the n-best lists of beam search, one list per sentence, best first.

        Each entry is a `formats.Hypothesis` (`translation`, `score`: its log-probability,
        `normalized_score`: that over the length penalty, which ranks them). The beam
        size, α and n are the artifact's (`export --n-best`); sentences with fewer
        hypotheses (an empty one has one) get shorter lists.
        """
        return [formats.hypotheses(row)
                for row in self._rows(files.N_BEST_SIGNATURE, list(sentences))]

    def score(self, sentences, translations):
        """Returns how likely the model finds each given translation of each sentence.

        Forced decoding, as training's targets: one `formats.Scored` (`score`: the sum of the
        tokens' log-probabilities, END included; `tokens` and `token_scores`: each
        piece and its log-probability) per pair.

        Raises:
            ValueError: not one translation per sentence.
        """
        sentences, translations = list(sentences), list(translations)
        if len(sentences) != len(translations):
            raise ValueError(f"{len(sentences)} sentences but {len(translations)} "
                             "translations: give one translation per sentence.")
        return [formats.scored(row)
                for row in self._rows(files.SCORE_SIGNATURE, sentences, translations)]

    def prefix(self, sentences, prefixes):
        """Returns the translations (list of str) of `sentences` that start with the
        target `prefixes` (one per sentence, "" for none), by the artifact's beam search.

        Raises:
            ValueError: not one prefix per sentence.
        """
        sentences, prefixes = list(sentences), list(prefixes)
        if len(sentences) != len(prefixes):
            raise ValueError(f"{len(sentences)} sentences but {len(prefixes)} prefixes: "
                             "give one prefix per sentence.")
        return [formats.one_line(row["translations"])
                for row in self._rows(files.PREFIX_SIGNATURE, sentences, prefixes)]

    def sample(self, sentences, seed=0):
        """Returns one sampled translation (list of str) of each sentence.

        Each token is drawn among the artifact's `sampling_top_k` most probable at its
        temperature (`export --sampling-topk/--temperature`; a run directory's
        `load_translator` options). A sentence's sample depends on `seed` and its text
        only: the same seed repeats it, and equal sentences get equal samples (give
        another seed for another).

        Args:
            seed: int, or a list of ints, one per sentence.
        """
        sentences = list(sentences)
        seeds = [seed] * len(sentences) if isinstance(seed, int) else list(seed)
        if len(seeds) != len(sentences):
            raise ValueError(f"{len(sentences)} sentences but {len(seeds)} seeds: give "
                             "one seed, or one per sentence.")
        return [formats.one_line(row["translations"])
                for row in self._rows(files.SAMPLE_SIGNATURE, sentences, seeds)]

    def align(self, sentences):
        """Returns each sentence's beam-search translation with its word alignment: a
        `formats.Aligned` (`translation`, `alignment`: the sorted (source word,
        translation word) pairs, `attention`: the token-level weights)."""
        return [formats.aligned(row)
                for row in self._rows(files.ALIGN_SIGNATURE, list(sentences))]

    def _rows(self, signature, sentences, second=None):
        """Yields the signature's output row of each sentence (given `second`, the list
        of its second inputs), in windows as `output_windows` batches them."""
        for window in output_windows(self.signature_runner(signature), sentences,
                                     second=second, **self.batching):
            yield from window


def load_translator(path, *, beam=False, beam_size=None, length_penalty=None, greedy=False,
                    batch_size=32, batch_tokens=None, session=False, threads=None,
                    export_if_missing=True, sampling_top_k=None, sampling_temperature=None,
                    n_best=None):
    """Returns a `LoadedTranslator` for a run directory, a SavedModel or a `.tflite` file.

    The one way this package opens a translator to use: `translate`, `evaluate` (the
    verbs and `kt.evaluate`) and the recipe's scoring go through it, with these options.

    An artifact translates as it was exported: greedy by default, or with its exported
    beam search when `beam` (or `beam_size`) is given, which must then be the exported
    beam size (and `length_penalty` the exported α) unless the artifact has no export
    report to tell. A run directory translates by default as it was chosen on
    validation (its `runs.Choice`: weights, beam size and α), greedily when nothing was
    chosen; what is given overrides the choice. It translates with its exported
    SavedModel (exported first if it has none) when that holds what is asked for, and
    with the run's model in memory otherwise, so any beam size and α work there.

    Args:
        path: str. A run directory, a SavedModel directory, a `.tflite` file or a
            CTranslate2 directory (`export --ctranslate2`).
        beam: bool. Beam search as exported (on a run directory: as chosen, else as
            `export` writes it).
        beam_size: int or `None` (greedy decoding, or `beam`'s; on a run directory, its
            choice). Implies `beam`.
        length_penalty: float α of beam search, or `None` for the exported (or the
            run's chosen, or the paper's 0.6) value. Implies `beam`.
        greedy: bool. Greedy decoding, whatever a run directory's choice.
        batch_size: int. Most sentences per call of the artifact.
        batch_tokens: int or `None`. Most source tokens per call, padding included
            (`translate_sentences`), counted with the run's SentencePiece model
            (`artifacts.token_counter`).
        session: bool. Load a SavedModel with the session-based loader of TF Serving.
        threads: int or `None` (the runtime's default). Threads of a `.tflite` file's
            interpreter.
        export_if_missing: bool. Export a run directory that has no export yet.
        sampling_top_k, sampling_temperature: what `sample` draws from (`None`: as
            exported, by default all tokens at temperature 1); on an artifact, the
            exported values.
        n_best: int or `None`. Hypotheses the n-best lists must hold at least (`None`:
            as exported, by default `files.DEFAULT_N_BEST`, at most the beam size). An
            artifact's must hold them already; a run directory whose export holds
            fewer translates with its model in memory, whose beam size must then be at
            least `n_best`.

    Raises:
        ValueError: options that exclude each other, an artifact exported with another
            beam search, or one without the signature asked for.

    Example:
        translate = load_translator("runs/multi30k-en-de", beam_size=4)
        translate(["A man rides a bike."])
        # ['Ein Mann fährt Fahrrad.']
    """
    if beam_size is not None and beam_size < 1:
        raise ValueError(f"beam_size must be at least 1, got {beam_size}.")
    if greedy and (beam or beam_size is not None or length_penalty is not None):
        raise ValueError("Greedy decoding excludes beam search: give greedy (--greedy) "
                         "or beam, beam_size, length_penalty (--beam, --beam-size, "
                         "--length-penalty), not both.")
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}.")
    path = os.fspath(path)
    if batch_tokens is not None and batch_tokens < 1:
        raise ValueError(f"batch_tokens must be at least 1, got {batch_tokens}.")
    batching = dict(batch_size=batch_size, batch_tokens=batch_tokens,
                    count_tokens=artifacts.token_counter(path) if batch_tokens else None)
    is_run = files.is_run_dir(path)
    choice = runs.load_choice(path) if is_run and not greedy else None
    chosen_by = None
    if choice is not None:
        given = beam_size is not None or length_penalty is not None
        chosen_by = "where not given" if given else choice.chosen_by
        beam_size = choice.beam_size if beam_size is None else beam_size
        if length_penalty is None:
            length_penalty = choice.length_penalty
    exported = _exported_decoder(runs.saved_model_dir(path) if is_run else path, choice)
    if beam_size is None and (beam or length_penalty is not None):
        beam_size = exported.get("beam_size", files.PAPER_BEAM_SIZE)
    if beam_size is not None:
        if length_penalty is None:
            length_penalty = exported.get("length_penalty", files.PAPER_LENGTH_PENALTY)
    wanted = {"beam_size": beam_size, "length_penalty": length_penalty}
    same = beam_size is None or all(exported.get(name, value) == value
                                    for name, value in wanted.items())
    sampling = {name: value for name, value in (("sampling_top_k", sampling_top_k),
                                                ("sampling_temperature", sampling_temperature))
                if value is not None}
    same_sampling = all(exported.get(name, value) == value
                        for name, value in sampling.items())
    held = exported.get("n_best")
    enough = n_best is None or held is None or n_best <= held
    if choice is not None:  # and the export holds the chosen weights
        same = same and exported.get("weights", choice.weights) == choice.weights
    if is_run and not (same and same_sampling and enough):
        weights = choice.weights_path(path) if choice else None
        if n_best is not None:  # the model in memory gives any, up to its beam
            searched = beam_size or files.PAPER_BEAM_SIZE
            if n_best > searched:
                raise ValueError(
                    f"n-best lists of {n_best} need a beam of at least {n_best}, not "
                    f"{searched}: give a beam size (--beam-size) of at least {n_best}.")
            sampling["n_best"] = n_best
        runner = _run_module_runner(path, beam_size, length_penalty, weights, **sampling)
        return LoadedTranslator(runner, artifact=None, beam_size=beam_size,
                                length_penalty=length_penalty, chosen_by=chosen_by,
                                open_signature=runner.with_signature, **batching)
    if not same:
        raise ValueError(
            f"{path} was exported with beam size {exported['beam_size']} and length "
            f"penalty {exported['length_penalty']}: translate with those, export the run "
            "again with --beam-size/--length-penalty, or name the run directory, which "
            "translates with any.")
    if not same_sampling:
        raise ValueError(
            f"{path} samples among {exported['sampling_top_k'] or 'all'} tokens at "
            f"temperature {exported['sampling_temperature']:g}: sample with those, export "
            "the run again with --sampling-topk/--temperature, or name the run directory, "
            "which samples with any.")
    if not enough:
        raise ValueError(
            f"{path} holds n-best lists of {held} hypotheses: ask for at most {held}, "
            f"export the run again with --n-best {n_best} (and a --beam-size of at least "
            f"{n_best}), or name the run directory, which gives any.")
    artifact = artifacts.resolve_artifact(path, export_if_missing=is_run and export_if_missing)
    opened = dict(session=session, threads=threads)
    runner = runners.open_runner(artifact, beam=beam_size is not None, **opened)
    return LoadedTranslator(
        runner, artifact=artifact, beam_size=beam_size, length_penalty=length_penalty,
        chosen_by=chosen_by, **batching,
        open_signature=lambda name: runners.open_runner(artifact, signature=name, **opened))


def beam_size_of(path, beam_size=None):
    """Returns the beam size `load_translator(path, beam=True, beam_size=beam_size)`
    searches with: the one given, else a run directory's choice, else the exported one,
    else the paper's."""
    if beam_size is not None:
        return beam_size
    is_run = files.is_run_dir(path)
    choice = runs.load_choice(path) if is_run else None
    if choice is not None:
        return choice.beam_size
    exported = _exported_decoder(runs.saved_model_dir(path) if is_run else path)
    return exported.get("beam_size", files.PAPER_BEAM_SIZE)


def _exported_decoder(artifact, choice=None):
    """The beam size and α recorded for `artifact`'s beam signature, the length of its
    n-best lists and what its `sample` signature draws from (`artifacts.exported_options`),
    and for a run's export, the weights file (relative to the run) it holds; `{}` when
    unknown.

    For a run's export that is not there yet: what `export` would write, the run's
    `choice` or the paper's beam search.
    """
    if not os.path.exists(artifact):
        sampling = {"sampling_top_k": files.SAMPLING_TOP_K,
                    "sampling_temperature": files.SAMPLING_TEMPERATURE}
        beam_size = choice.beam_size if choice is not None else files.PAPER_BEAM_SIZE
        found = {"beam_size": beam_size, "n_best": min(files.DEFAULT_N_BEST, beam_size),
                 **sampling}
        if choice is not None:
            return {**found, "length_penalty": choice.length_penalty,
                    "weights": choice.weights}
        return {**found, "length_penalty": files.PAPER_LENGTH_PENALTY}
    report = artifacts.export_report(artifact) or {}
    recorded = artifacts.exported_options(artifact)
    found = {name: recorded[name] for name in ("beam_size", "length_penalty", "n_best",
                                               "sampling_top_k", "sampling_temperature")
             if name in recorded}
    run = report.get("run", {})
    if "weights" in run and "run_dir" in run:
        found["weights"] = os.path.relpath(run["weights"], run["run_dir"])
    return found


def _run_module_runner(run_dir, beam_size, length_penalty, weights=None, **options):
    """A `ModuleRunner` over the model of `run_dir` (`weights`, else its newest), with
    the `sampling_top_k`, `sampling_temperature` and `n_best` in `options` if given."""
    # Imported here: the model code, which artifacts do not need.
    from keras_transformer.serving.translator import Translator

    _, tokenizer, model = runs.load_run(run_dir, weights)
    # Greedy translation keeps the paper's beam search for the n-best lists.
    translator = Translator(model, tokenizer, beam_size=beam_size or files.PAPER_BEAM_SIZE,
                            length_penalty=files.PAPER_LENGTH_PENALTY
                            if length_penalty is None else length_penalty, **options)
    return runners.ModuleRunner(translator, beam=beam_size is not None)
