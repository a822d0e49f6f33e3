"""The whole recipe: train, choose on validation, export, then score every test split once.

    keras-transformer recipe [--preset multi30k] [--data-dir DIR]

`run_recipe(config, run_dir)` does, in this order:

1. train (`training.fit.train`; skipped when `run_dir` records a finished training);
2. choose on the validation split, every sentence of it, by BLEU of beam search: which
   weights (the best-validation-BLEU checkpoint, the newest one, or the mean of the
   newest 2, 3, … checkpoints), then the beam size and length penalty α;
3. record the choice in the run directory (`runs.Choice`: what `export`, `translate`
   and `evaluate` then use on it by default), export it, and check the export (kept
   when run again on a run whose export holds this choice and passed: `export.
   matching_export`);
4. score the exported SavedModel (what is served is what is scored) on validation, then
   on each test split of the corpus, beam and greedy, with sacreBLEU's BLEU and chrF.

The test splits are read in step 4 alone, after every choice is made: they are never the
development set. Translations of every scored split are kept in
`run_dir/translations/<split>.<beam|greedy>.<language>`.
"""

import dataclasses
import json
import logging
import os
import time

from keras_transformer import evaluation, files, loading, runs
from keras_transformer.data import corpus
from keras_transformer.serving import export, runners, self_check
from keras_transformer.serving.translator import Translator
from keras_transformer.training import averaging, backup, fit

logger = logging.getLogger(__name__)

# The paper's beam search (§6.1) is always among the candidates.
DEFAULT_LENGTH_PENALTIES = (files.PAPER_LENGTH_PENALTY, 0.8, 1.0)
SAMPLE_COUNT = 3


@dataclasses.dataclass(frozen=True)
class Choices:
    """What `run_recipe` may choose from on validation.

    Attributes:
        average_counts: numbers of newest checkpoints to average (1: the newest alone).
        best_checkpoint: bool. Also try the best-validation-BLEU weights of training.
        beam_sizes: beam sizes to try.
        length_penalties: values of α to try.
    """

    average_counts: tuple = (1, 2, 3, 4, 5)
    best_checkpoint: bool = True
    beam_sizes: tuple = (files.PAPER_BEAM_SIZE,)
    length_penalties: tuple = DEFAULT_LENGTH_PENALTIES


def run_recipe(config, run_dir, *, choices=Choices(), check=True, batch_size=64):
    """Trains (once), chooses on validation, exports and scores the test splits.

    Args:
        config: `Config` to train.
        run_dir: str. The run directory.
        choices: `Choices`.
        check: bool. Run the export's self-check (`export --check`) and fail on it.
        batch_size: int. Sentences per translator call when scoring.

    Returns:
        A JSON-ready dict: `training`, `selection`, `export`, `validation` and `test`
        scores (per split, `beam` and `greedy`, each `evaluation.score`'s dict), and
        `samples` (validation sources with their translations).

    Raises:
        self_check.SelfCheckFailed: the exported artifacts do not translate alike.
    """
    # Held from training to the last score: another recipe or training on this run
    # directory would change the weights being chosen, exported and scored.
    with runs.lock_run_dir(run_dir):
        return _run_recipe(config, run_dir, choices, check, batch_size)


def _run_recipe(config, run_dir, choices, check, batch_size):
    """`run_recipe` under the run directory's lock."""
    record = train_once(config, run_dir)
    config = runs.load_config(run_dir)  # with the tokenizer's vocabulary size
    validation = corpus.load_split(config.data, "validation", filter_pairs=False,
                                   verbose=False)
    selection = choose_on_validation(run_dir, validation, choices)
    # What export, translate and evaluate then use on this run by default.
    runs.record_choice(
        run_dir, weights_path=selection["weights_path"], beam_size=selection["beam_size"],
        length_penalty=selection["length_penalty"],
        chosen_by=f"recipe: {selection['weights']}, validation BLEU "
                  f"{selection['bleu']:.2f} on {selection['sentences']} sentences")
    export_dir = os.path.join(run_dir, files.EXPORT_DIR)
    # A recipe run again (after an interruption while scoring, say) keeps an export that
    # holds its choice and passed its self-check: exporting and checking cost minutes.
    kept = export.matching_export(
        export_dir, run_dir, selection["weights_path"], beam_size=selection["beam_size"],
        length_penalty=selection["length_penalty"], quantize=check)
    checks = self_check.passed_checks(export_dir) if kept and check else None
    if kept and (checks or not check):
        logger.info("Kept export %s in %s: it holds this choice%s.", kept["export_id"],
                    export_dir, " and passed its self-check" if check else "")
    else:
        if check:
            _, _, checks = self_check.export_and_check(run_dir)
        else:
            export.export_run(run_dir, quantize=False)
            logger.info("Exported to %s (no self-check: --no-check)", export_dir)
    result = {"config": json.loads(config.to_json()), "training": record,
              "selection": selection, "export_dir": export_dir}
    if check:
        result["check"] = [check._asdict() for check in checks]
        logger.info("%s", self_check.summary(checks, export_dir))
        self_check.raise_on_failure(checks)
    saved_model = os.path.join(export_dir, files.SAVED_MODEL)
    translations_dir = os.path.join(run_dir, files.TRANSLATIONS)
    os.makedirs(translations_dir, exist_ok=True)
    result["validation"] = score_splits(config, saved_model, ["validation"], ("beam",),
                                        translations_dir, batch_size)["validation"]
    result["test"] = score_test_splits(config, saved_model, translations_dir, batch_size)
    sources = list(validation.source_lines[:SAMPLE_COUNT])
    result["samples"] = list(zip(sources, loading.load_translator(saved_model)(sources)))
    files.write_text(os.path.join(run_dir, files.RECIPE_RESULT),
                     json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    return result


def train_once(config, run_dir):
    """Trains into `run_dir` unless a finished training is recorded there; returns it.

    The record (`training_record.json`) is written only after training returns, so a run
    directory without it holds an interrupted run, which `fit.train` resumes: the
    record's minutes then add those its backup held (each earlier process's up to its
    last backup) to this process's, and its epochs count from the run's first. A
    recorded training is kept only for the same config (`fit.check_same_run`: the
    epochs and time budget may differ); a record that cannot be read is named
    (`ValueError`), not trained over.
    """
    record_path = os.path.join(run_dir, files.TRAINING_RECORD)
    if os.path.exists(record_path):
        # Else another config's recipe would choose, export and score this run's model
        # as its own.
        fit.check_same_run(config, run_dir)
        try:
            with open(record_path, encoding="utf-8") as file:
                record = json.load(file)
            # What the recipe's result and its readers (benchmarks.quality) take from it.
            record = {**record, "minutes": float(record["minutes"]),
                      "updates": int(record["updates"]), "epochs": int(record["epochs"])}
        except (ValueError, KeyError, TypeError) as error:  # edited, truncated
            raise ValueError(
                f"{record_path}: not a training record ({type(error).__name__}: {error}). "
                f"It marks the training in {run_dir} as finished: restore it, or train "
                "into a new --run-dir.") from None
        logger.info("Training already finished in %s (%.1f min, %d updates).", run_dir,
                    record["minutes"], record["updates"])
        return record
    logger.info("Training into %s", run_dir)
    spent_minutes = backup.read_backup_minutes(os.path.join(run_dir, files.BACKUP))
    start = time.monotonic()
    history = fit.train(config, run_dir)
    model = history.model
    record = {"minutes": spent_minutes + (time.monotonic() - start) / 60,
              "epochs": history.epoch[-1] + 1 if history.epoch else 0,
              "updates": int(model.optimizer.iterations.numpy()),
              "parameters": int(model.count_params()),
              "final_loss": history.history.get("loss", [None])[-1],
              "final_val_loss": history.history.get("val_loss", [None])[-1]}
    files.write_text(record_path, json.dumps(record, indent=2) + "\n")
    return record


def candidate_weights(run_dir, choices):
    """Returns `{name: weights path or list of checkpoint paths}` to choose among."""
    checkpoints = runs.list_checkpoints(os.path.join(run_dir, files.CHECKPOINTS))
    if not checkpoints:
        raise FileNotFoundError(f"No checkpoints in {run_dir}: train first.")
    candidates = {}
    for count in sorted(set(choices.average_counts)):
        if count <= len(checkpoints):
            name = "newest checkpoint" if count == 1 else f"mean of newest {count}"
            candidates[name] = checkpoints[-count:]
    best = os.path.join(run_dir, files.CHECKPOINTS, files.BEST_WEIGHTS)
    if choices.best_checkpoint and os.path.exists(best):
        candidates["best validation BLEU"] = [best]
    return candidates


def choose_on_validation(run_dir, validation, choices):
    """Chooses weights, beam size and α by beam-search BLEU on `validation`.

    First the weights, decoded with the paper's beam (4, α 0.6), then beam size and α
    for the chosen weights. Ties go to the candidate tried first (fewer checkpoints, the
    paper's settings). The chosen mean is written as the run's `averaged.weights.h5`.

    Returns:
        A JSON-ready dict of every score and what was chosen (`weights`,
        `weights_path`, `beam_size`, `length_penalty`, `bleu`).
    """
    config, tokenizer, model = runs.load_run(run_dir)
    sources, references = list(validation.source_lines), list(validation.target_lines)

    def bleu(translator):
        runner = runners.ModuleRunner(translator, beam=True)
        hypotheses = evaluation.translate_file_lines(runner, sources, verbose=False)
        return evaluation.score(hypotheses, references)["bleu"]["score"]

    paper = Translator(model, tokenizer, beam_size=files.PAPER_BEAM_SIZE,
                       length_penalty=files.PAPER_LENGTH_PENALTY, jit_compile=True)
    weights_scores = {}
    candidates = candidate_weights(run_dir, choices)
    decoders = [(beam_size, alpha) for beam_size in choices.beam_sizes
                for alpha in choices.length_penalties
                if (beam_size, alpha) != (files.PAPER_BEAM_SIZE, files.PAPER_LENGTH_PENALTY)]
    progress = _Progress(len(candidates) + len(decoders))
    for name, paths in candidates.items():
        averaging.average_weights(model, paths)  # in place: the translator's graph stays
        weights_scores[name] = bleu(paper)
        progress.done(weights_scores[name], f"{name}, beam {files.PAPER_BEAM_SIZE}, α "
                                            f"{files.PAPER_LENGTH_PENALTY:g}")
    chosen = max(weights_scores, key=weights_scores.get)
    averaging.average_weights(model, candidates[chosen])
    decoder_scores = {}
    for beam_size in choices.beam_sizes:
        for alpha in choices.length_penalties:
            if (beam_size, alpha) == (files.PAPER_BEAM_SIZE, files.PAPER_LENGTH_PENALTY):
                score = weights_scores[chosen]
            else:
                score = bleu(Translator(model, tokenizer, beam_size=beam_size,
                                        length_penalty=alpha, jit_compile=True))
                progress.done(score, f"{chosen}, beam {beam_size}, α {alpha:g}")
            decoder_scores[f"beam {beam_size}, α {alpha:g}"] = score
    best_decoder = max(decoder_scores, key=decoder_scores.get)
    beam_size, alpha = next((b, a) for b in choices.beam_sizes
                            for a in choices.length_penalties
                            if f"beam {b}, α {a:g}" == best_decoder)
    paths = candidates[chosen]
    if len(paths) > 1 or paths[0] != os.path.join(run_dir, files.CHECKPOINTS,
                                                   files.BEST_WEIGHTS):
        weights_path = averaging.average_run(run_dir, last=len(paths))
    else:
        weights_path = paths[0]
    return {"sentences": len(sources), "weights_scores": weights_scores,
            "decoder_scores": decoder_scores, "weights": chosen,
            "weights_path": weights_path, "beam_size": beam_size, "length_penalty": alpha,
            "bleu": decoder_scores[best_decoder]}


class _Progress:
    """Logs each candidate scored on validation: which of how many, and the time left at
    the rate so far (the first candidate, which traces the decoder, makes it high)."""

    def __init__(self, total):
        self.total = total
        self.count = 0
        self.start = time.monotonic()

    def done(self, score, candidate):
        self.count += 1
        elapsed = time.monotonic() - self.start
        left = elapsed / self.count * (self.total - self.count)
        logger.info("Choosing on validation %d/%d: BLEU %.2f, %s (%s left)", self.count,
                    self.total, score, candidate,
                    f"{left / 60:.1f} min" if left >= 60 else f"{left:.0f} s")


def score_test_splits(config, saved_model, translations_dir, batch_size=64):
    """Scores `saved_model` on every test split of the corpus, beam and greedy.

    The only place where the recipe reads a test split.

    Returns:
        `{split: {"beam": scores, "greedy": scores}}` (`evaluation.score_files`'s dicts).
    """
    return score_splits(config, saved_model, corpus.test_splits(config.data),
                        ("beam", "greedy"), translations_dir, batch_size)


def score_splits(config, saved_model, splits, decoders, translations_dir, batch_size=64):
    """Scores `saved_model` on `splits` with each of `decoders` ("beam", "greedy").

    Each decoder's signature is loaded once for all the splits, as `evaluate` loads it
    (`loading.load_translator`); the translations go to
    `translations_dir/<split>.<decoder>.<language>`.

    Returns:
        `{split: {decoder: scores}}`.
    """
    results = {}
    for decoder in decoders:
        beam = decoder == "beam"
        translator = loading.load_translator(saved_model, beam=beam,
                                               batch_size=batch_size)
        for split in splits:
            source, reference = corpus.corpus_files(config.data, split)
            logger.info("Scoring %s (%s) on %s", saved_model, decoder, source)
            output = os.path.join(translations_dir,
                                  f"{split}.{decoder}.{config.data.target_language}")
            scores = evaluation.evaluate_splits(
                translator, {split: (source, reference)}, output=output,
                single_output=True, verbose=False)[split]
            scores.update(artifact=saved_model, beam=beam)
            for line in evaluation.format_scores(scores).splitlines():
                logger.info("%s, %s: %s", split, decoder, line)
            results.setdefault(split, {})[decoder] = scores
    return results


def results_table(result):
    """Returns the recipe's scores as a text table: one row per split and decoder."""
    splits = [("validation", result["validation"])] + list(result["test"].items())
    all_scores = [scores for _, by_decoder in splits for scores in by_decoder.values()]
    tokenized = any("bleu_tok" in scores for scores in all_scores)
    rows = [("split", "decoder", "sentences", *evaluation.score_columns(tokenized))]
    for split, by_decoder in splits:
        for decoder, scores in by_decoder.items():
            rows.append((split, decoder, str(scores["sentences"]),
                         *evaluation.score_cells(scores, tokenized)))
    return "\n".join([*evaluation.text_table(rows), "",
                      *evaluation.signatures(all_scores)])
