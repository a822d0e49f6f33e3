"""Open a translator to call from Python: a run directory, a SavedModel, a `.tflite`
file or a CTranslate2 directory in, a `LoadedTranslator` out (also `kt.load_translator`).

    translate = load_translator("runs/multi30k-en-de")
    translate(["A man rides a bike."])            # ['Ein Mann fährt Fahrrad.']
    translate.n_best(["A man rides a bike."])     # the other signatures: n_best, score,
                                                  # prefix, sample, align

An artifact decodes as it was exported; a run directory as it was chosen on validation,
with its export when that holds what is asked and with its model in memory otherwise.
`translate` streams files and lists of sentences through what this opens.
"""

import os

from keras_transformer import files, formats, runs, translate
from keras_transformer.serving import artifacts, runners


class LoadedTranslator:
    """A translator to call like a function: a list of sentences in, translations out.

    Made by `load_translator`. `decoder` says how it decodes, e.g. `"beam search (beam
    4, length penalty 0.6)"`, and where that comes from when it is a run's choice on
    validation (`chosen_by`, see `runs.Choice`); `artifact` is the file or folder it
    runs (`None` for a run directory's model in memory); `runner` maps a list of
    sentences to the raw outputs (`translations`, `token_ids`, `scores`); `batching`
    holds the batching options of `translate.translate_sentences` (`batch_size`, `batch_tokens`,
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
        return translate.translate_sentences(self.runner, list(sentences), **self.batching)

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
        size, α and n are the artifact's (`export --n-best`), or for a run directory's
        model in memory those `load_translator` was given; sentences with fewer
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
        return [formats.scored(row) for row in self._rows(
            files.SCORE_SIGNATURE, list(sentences), list(translations))]

    def prefix(self, sentences, prefixes):
        """Returns the translations (list of str) of `sentences` that start with the
        target `prefixes` (one per sentence, "" for none), by the artifact's beam search.

        Raises:
            ValueError: not one prefix per sentence.
        """
        return [formats.one_line(row["translations"]) for row in self._rows(
            files.PREFIX_SIGNATURE, list(sentences), list(prefixes))]

    def sample(self, sentences, seed=0):
        """Returns one sampled translation (list of str) of each sentence.

        Each token is drawn among the artifact's `sampling_top_k` most probable at its
        temperature (`export --sampling-topk/--temperature`; a run directory's
        `load_translator` options). A sentence's sample depends on `seed` and its text
        only: the same seed repeats it, and equal sentences get equal samples (give
        another seed for another).

        Args:
            seed: int, or a list of ints, one per sentence.

        Raises:
            ValueError: a list of seeds, not one per sentence.
        """
        sentences = list(sentences)
        seeds = [seed] * len(sentences) if isinstance(seed, int) else list(seed)
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
        of its second inputs), in windows as `translate.output_windows` batches them.

        Raises:
            ValueError: `second` has not one entry per sentence (checked before the
                first window: windows would pair the sentences with others' entries).
        """
        if second is not None and len(second) != len(sentences):
            name = files.SECOND_INPUTS[signature][0]
            raise ValueError(f"{len(sentences)} sentences but {len(second)} {name}: give "
                             "one per sentence.")
        for window in translate.output_windows(self.signature_runner(signature), sentences,
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
            (`translate.translate_sentences`), counted with the run's SentencePiece model
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
    _check_options(beam=beam, beam_size=beam_size, length_penalty=length_penalty,
                   greedy=greedy, batch_size=batch_size, batch_tokens=batch_tokens)
    path = os.fspath(path)
    batching = dict(batch_size=batch_size, batch_tokens=batch_tokens,
                    count_tokens=artifacts.token_counter(path) if batch_tokens else None)
    is_run = files.is_run_dir(path)
    choice = runs.load_choice(path) if is_run and not greedy else None
    chosen_by = None
    if choice is not None:  # what is given overrides the choice
        given = beam_size is not None or length_penalty is not None
        chosen_by = "where not given" if given else choice.chosen_by
        beam_size = choice.beam_size if beam_size is None else beam_size
        if length_penalty is None:
            length_penalty = choice.length_penalty
    exported = _exported_decoder(runs.saved_model_dir(path) if is_run else path, choice)
    if beam_size is None and (beam or length_penalty is not None):
        beam_size = exported.get("beam_size", files.PAPER_BEAM_SIZE)
    if beam_size is not None and length_penalty is None:
        length_penalty = exported.get("length_penalty", files.PAPER_LENGTH_PENALTY)
    decoding = dict(beam_size=beam_size, length_penalty=length_penalty, chosen_by=chosen_by)
    sampling = {name: value for name, value in (("sampling_top_k", sampling_top_k),
                                                ("sampling_temperature", sampling_temperature))
                if value is not None}
    unmet = _unmet_by_export(path, exported, beam_size=beam_size,
                             length_penalty=length_penalty, sampling=sampling, n_best=n_best)
    if is_run and (unmet or (choice is not None and  # or it holds other weights
                             exported.get("weights", choice.weights) != choice.weights)):
        return _model_in_memory(path, choice, decoding, sampling, n_best, batching,
                                exported=exported)
    if unmet:
        raise ValueError(unmet)
    artifact = artifacts.resolve_artifact(path, export_if_missing=is_run and export_if_missing)
    opened = dict(session=session, threads=threads)
    runner = runners.open_runner(artifact, beam=beam_size is not None, **opened)
    return LoadedTranslator(
        runner, artifact=artifact, **decoding, **batching,
        open_signature=lambda name: runners.open_runner(artifact, signature=name, **opened))


def _check_options(*, beam, beam_size, length_penalty, greedy, batch_size, batch_tokens):
    """Raises ValueError on `load_translator` options out of range or excluding each other."""
    if beam_size is not None and beam_size < 1:
        raise ValueError(f"beam_size must be at least 1, got {beam_size}.")
    if greedy and (beam or beam_size is not None or length_penalty is not None):
        raise ValueError("Greedy decoding excludes beam search: give greedy (--greedy) "
                         "or beam, beam_size, length_penalty (--beam, --beam-size, "
                         "--length-penalty), not both.")
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}.")
    if batch_tokens is not None and batch_tokens < 1:
        raise ValueError(f"batch_tokens must be at least 1, got {batch_tokens}.")


def _unmet_by_export(path, exported, *, beam_size, length_penalty, sampling, n_best):
    """Why the artifact at `path`, exported with the options `exported` records
    (`_exported_decoder`), cannot decode as asked: the error's text, or `None` when it
    can. An option it does not record is taken to be as asked."""
    wanted = {"beam_size": beam_size, "length_penalty": length_penalty}
    if beam_size is not None and any(exported.get(name, value) != value
                                     for name, value in wanted.items()):
        exported = {**wanted, **exported}  # a report may record only one of them
        return (f"{path} was exported with beam size {exported['beam_size']} and length "
                f"penalty {exported['length_penalty']}: translate with those, export the "
                "run again with --beam-size/--length-penalty, or name the run directory, "
                "which translates with any.")
    if any(exported.get(name, value) != value for name, value in sampling.items()):
        exported = {"sampling_top_k": files.SAMPLING_TOP_K,
                    "sampling_temperature": files.SAMPLING_TEMPERATURE, **sampling,
                    **exported}
        return (f"{path} samples among {exported['sampling_top_k'] or 'all'} tokens at "
                f"temperature {exported['sampling_temperature']:g}: sample with those, "
                "export the run again with --sampling-topk/--temperature, or name the run "
                "directory, which samples with any.")
    held = exported.get("n_best")
    if n_best is not None and held is not None and n_best > held:
        return (f"{path} holds n-best lists of {held} hypotheses: ask for at most {held}, "
                f"export the run again with --n-best {n_best} (and a --beam-size of at "
                f"least {n_best}), or name the run directory, which gives any.")
    return None


def _model_in_memory(run_dir, choice, decoding, sampling, n_best, batching, *, exported):
    """A `LoadedTranslator` over the model of `run_dir` in memory (its chosen weights,
    else its newest), which decodes with any beam size, α, sampling and n-best length.

    Greedy decoding keeps a beam search for the n-best lists: the one `exported`
    records (`_exported_decoder`: the run's export, or what `export` would write).
    """
    searched = decoding["beam_size"] or exported.get("beam_size", files.PAPER_BEAM_SIZE)
    alpha = decoding["length_penalty"]
    if alpha is None:
        alpha = exported.get("length_penalty", files.PAPER_LENGTH_PENALTY)
    sampling = dict(sampling)
    if n_best is not None:
        if n_best > searched:
            raise ValueError(
                f"n-best lists of {n_best} need a beam of at least {n_best}, not "
                f"{searched}: give a beam size (--beam-size) of at least {n_best}.")
        sampling["n_best"] = n_best
    weights = choice.weights_path(run_dir) if choice else None
    runner = _run_module_runner(run_dir, weights, beam=decoding["beam_size"] is not None,
                                beam_size=searched, length_penalty=alpha, **sampling)
    return LoadedTranslator(runner, artifact=None, **decoding, **batching,
                            open_signature=runner.with_signature)


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


def _run_module_runner(run_dir, weights, *, beam, **options):
    """A `ModuleRunner` over the model of `run_dir` (`weights`, else its newest), its
    beam search or (not `beam`) greedy decoding, its `Translator` made with `options`
    (`beam_size`, `length_penalty`, sampling, `n_best`)."""
    # Imported here: the model code, which artifacts do not need.
    from keras_transformer.serving.translator import Translator

    _, tokenizer, model = runs.load_run(run_dir, weights)
    return runners.ModuleRunner(Translator(model, tokenizer, **options), beam=beam)
