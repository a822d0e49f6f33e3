"""Translation quality: train a recipe from scratch, average, export, score the SavedModel.

    python -m benchmarks.quality --data-dir ../shared/data/multi30k --minutes 60

Trains `--preset` (the Multi30K recipe by default, plus any `FIELD=VALUE` overrides) into
a new run directory for at most `--minutes` of wall-clock time, averages the last
`--average` checkpoints, exports the averaged weights, translates the test split with
the exported SavedModel (beam search, then greedy) and scores it with sacreBLEU. What is
served is what is scored. One row per run is appended to the quality table of
BENCHMARKS.md, and everything (config, command, hardware, times, signatures) goes to a
JSON file in benchmarks/results/, with the test translations beside it, gzipped
(`<JSON name>.test.<beam|greedy>.<language>.gz`): the run directory is rarely kept, and
a later row can only be compared with this one, sentence by sentence (sacreBLEU's
paired bootstrap), through its translations.

Running the same command again on a run directory whose training finished skips the
training (its recorded time is reused) and redoes averaging, export and scoring, so an
interruption after a long training loses nothing.
"""

import argparse
import dataclasses
import datetime
import gzip
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from benchmarks import common  # noqa: E402
from keras_transformer import averaging, corpus, evaluation, exporting, training  # noqa: E402
from keras_transformer import config as config_lib  # noqa: E402

TRAINING_RECORD = "quality_training.json"
RESULTS_FILE = "BENCHMARKS.md"
TABLE_HEADING = "## Translation quality: Multi30K test_2016_flickr"
TABLE_HEADER = (
    "| date (UTC) | direction | recipe | hardware | training | BLEU beam 4 | chrF beam 4 "
    "| BLEU greedy | note |\n"
    "|---|---|---|---|---|---|---|---|---|")
TABLE_INTRODUCTION = """\
Written by `python -m benchmarks.quality` (one row per real run, appended by the script):
train from scratch within a time budget, average the last checkpoints, export, and score
the exported SavedModel on test_2016_flickr with sacreBLEU (cased, detokenized, 13a;
signature in the run's JSON). `training` is wall-clock minutes of `training.train`
(vocabulary, data preparation, validation and the BLEU callback included; the budget
counts from the start of `model.fit`), weight updates and epochs begun. The full
config of each row is in its JSON in `benchmarks/results/`, its test translations
beside it (`<JSON name>.test.<beam|greedy>.<language>.gz`)."""


def parse_arguments(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.quality",
        description="Train a recipe from scratch within a time budget, average the last "
                    "checkpoints, export, and score the SavedModel on the test split.")
    parser.add_argument("--preset", default=config_lib.DEFAULT_PRESET,
                        choices=sorted(config_lib.PRESETS),
                        help=f"recipe to train (default: {config_lib.DEFAULT_PRESET})")
    parser.add_argument("--data-dir", default=None, metavar="DIR",
                        help="local Multi30K directory (default: download)")
    parser.add_argument("--run-dir", default=None, metavar="DIR",
                        help="new run directory (default: runs/quality-<preset>-<source>-"
                             "<target>-<UTC time>); an existing one is only accepted when "
                             "its training finished, which is then not repeated")
    parser.add_argument("--minutes", type=float, default=None,
                        help="training time budget in wall-clock minutes (sets "
                             "train.time_budget_minutes; train.epochs becomes a bound "
                             "that the budget reaches first). Default: the recipe's epochs")
    parser.add_argument("--device", choices=("auto", "cpu", "gpu"), default="auto",
                        help="train on the CPU, on every GPU, or on GPUs when there are "
                             "any (default)")
    parser.add_argument("--average", type=int, default=5, metavar="N",
                        help="average the last N checkpoints (default: 5)")
    parser.add_argument("--note", default="",
                        help="what this run tries, for the table (e.g. 'dropout 0.2')")
    parser.add_argument("--results", default=RESULTS_FILE, metavar="FILE",
                        help=f"markdown file whose quality table gets the row "
                             f"(default: {RESULTS_FILE}); 'none' writes no row")
    parser.add_argument("--json", default=None, metavar="FILE",
                        help="result JSON (default: benchmarks/results/quality-<UTC "
                             "time>.json)")
    parser.add_argument("overrides", nargs="*", metavar="FIELD=VALUE",
                        help="config overrides (as train.py's), e.g. target_language=fr "
                             "dropout=0.2")
    return parser.parse_args(argv)


def make_config(arguments):
    """Returns the `Config` the run trains: preset, overrides, then the options."""
    config = config_lib.override(config_lib.preset_config(arguments.preset),
                                 arguments.overrides)
    data = config.data
    if arguments.data_dir is not None:
        data = dataclasses.replace(data, data_dir=arguments.data_dir)
    train = config.train
    if arguments.minutes is not None:
        # The budget ends the run; the epoch count only has to be out of its way.
        train = dataclasses.replace(train, time_budget_minutes=arguments.minutes,
                                    epochs=max(train.epochs, 1000))
    if arguments.device != "auto":
        train = dataclasses.replace(train, devices=_devices(arguments.device))
    return dataclasses.replace(config, data=data, train=train)


def _devices(kind):
    import tensorflow as tf
    if kind == "cpu":
        return ("/cpu:0",)
    gpus = tf.config.list_logical_devices("GPU")
    if not gpus:
        raise SystemExit("error: --device gpu, but TensorFlow sees no GPU on this machine")
    return tuple(gpu.name for gpu in gpus)


def train_once(config, run_dir):
    """Trains into `run_dir` unless a finished training is recorded there; returns it.

    The record (`quality_training.json`) is written only after training returns, so a
    directory without it holds an interrupted or foreign run, which is refused rather
    than silently resumed with a clock that would not count its first part.
    """
    record_path = os.path.join(run_dir, TRAINING_RECORD)
    if os.path.exists(record_path):
        record = _read_json(record_path)
        print(f"Training already finished in {run_dir} ({record['minutes']:.1f} min, "
              f"{record['updates']} updates); averaging, exporting and scoring again.",
              flush=True)
        return record
    if os.path.exists(run_dir):
        raise SystemExit(
            f"error: {run_dir} exists but holds no finished quality run ({TRAINING_RECORD} "
            "is missing): give a new --run-dir, or delete it to train again from scratch")
    print(f"Training into {run_dir}", flush=True)
    start = time.monotonic()
    history = training.train(config, run_dir)
    minutes = (time.monotonic() - start) / 60
    model = history.model
    record = {"minutes": minutes, "epochs": len(history.epoch),
              "updates": int(model.optimizer.iterations.numpy()),
              "parameters": int(model.count_params()),
              "final_loss": history.history.get("loss", [None])[-1],
              "final_val_loss": history.history.get("val_loss", [None])[-1]}
    with open(record_path, "w", encoding="utf-8") as file:
        json.dump(record, file, indent=2)
    return record


def score_export(config, run_dir, average):
    """Averages, exports and scores; returns `(averaged_weights, scores_by_decoder)`."""
    averaged = averaging.average_run(run_dir, last=average)
    export_dir, _ = exporting.export_run(run_dir, weights=averaged, quantize=False)
    saved_model = os.path.join(export_dir, exporting.SAVED_MODEL)
    source, reference = corpus.corpus_files(config.data, "test")
    scores = {}
    for decoder, beam in (("beam", True), ("greedy", False)):
        print(f"Scoring {saved_model} ({decoder}) on {source}", flush=True)
        scores[decoder] = evaluation.evaluate(
            saved_model, source, reference, beam=beam, export_if_missing=False,
            output=translations_path(run_dir, decoder, config.data.target_language))
        print(evaluation.format_scores(scores[decoder]), flush=True)
    return averaged, scores


def translations_path(run_dir, decoder, language):
    """The file of the run's test translations by `decoder` ("beam" or "greedy")."""
    return os.path.join(run_dir, f"test.{decoder}.{language}")


def keep_translations(run_dir, language, json_path):
    """Copies the run's test translations beside `json_path`, gzipped.

    Returns `{decoder: file name}`, the names relative to the JSON's directory. The
    gzip header holds no time stamp or file name, so the same translations give the
    same bytes.
    """
    stem = os.path.splitext(json_path)[0]
    kept = {}
    for decoder in ("beam", "greedy"):
        target = f"{stem}.test.{decoder}.{language}.gz"
        os.makedirs(os.path.dirname(os.path.abspath(target)), exist_ok=True)
        with open(translations_path(run_dir, decoder, language), "rb") as source, \
                open(target, "wb") as raw, \
                gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as packed:
            packed.write(source.read())
        kept[decoder] = os.path.basename(target)
    return kept


def table_row(result):
    """Returns the markdown row of one result."""
    config, record, scores = result["config"], result["training"], result["scores"]
    data = config["data"]
    machine = result["machine"]
    # A training made elsewhere (`benchmarks.portable_training`) names its own hardware.
    hardware = record.get("hardware") or (
        ", ".join(machine["gpus"]) if machine["gpus"] and result["device"] != "cpu"
        else common.describe_cpu(machine))
    recipe = f"`{result['command']}`"
    training_text = (f"{record['minutes']:.1f} min, {record['updates']:,} updates, "
                     f"{record['epochs']} epochs")
    return (f"| {result['date'][:16].replace('T', ' ')} | "
            f"{data['source_language']}→{data['target_language']} | {recipe} | {hardware} | "
            f"{training_text} | **{scores['beam']['bleu']['score']:.1f}** | "
            f"{scores['beam']['chrf']['score']:.1f} | "
            f"{scores['greedy']['bleu']['score']:.1f} | {result['note'] or ''} |")


def append_row(path, row):
    """Appends `row` to the quality table of the markdown file `path` (made if missing).

    The file is rewritten under a temporary name and renamed, so an interruption never
    leaves it half-written.
    """
    text = ""
    if os.path.exists(path):
        with open(path, encoding="utf-8") as file:
            text = file.read()
    lines = text.splitlines()
    if TABLE_HEADING not in lines:
        if lines and lines[-1].strip():
            lines.append("")
        lines += [TABLE_HEADING, "", TABLE_INTRODUCTION, "", TABLE_HEADER, row]
    else:
        start = lines.index(TABLE_HEADING) + 1
        end = next((index for index in range(start, len(lines))
                    if lines[index].startswith("## ")), len(lines))
        # The first table of the section is the quality table; its subsections (the
        # ensembles, say) may hold tables of their own further down.
        first = next((index for index in range(start, end)
                      if lines[index].startswith("|")), None)
        if first is None:
            lines[end:end] = [TABLE_HEADER, row]
        else:
            insert_at = first
            while insert_at < end and lines[insert_at].startswith("|"):
                insert_at += 1
            lines.insert(insert_at, row)
    temporary = f"{path}.partial"
    with open(temporary, "w", encoding="utf-8") as file:
        file.write("\n".join(lines) + "\n")
    os.replace(temporary, path)


def _read_json(path):
    with open(path, encoding="utf-8") as file:
        return json.load(file)


def main(argv=None):
    arguments = parse_arguments(argv)
    try:
        config = make_config(arguments)
    except ValueError as error:
        raise SystemExit(f"error: {error}") from None
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    data = config.data
    run_dir = arguments.run_dir or os.path.join(
        "runs", f"quality-{arguments.preset}-{data.source_language}-"
                f"{data.target_language}-{stamp}")
    json_path = arguments.json or os.path.join("benchmarks", "results",
                                               f"quality-{stamp}.json")
    result = common.header(arguments)
    try:
        record = train_once(config, run_dir)
        averaged, scores = score_export(config, run_dir, arguments.average)
    except training.USER_ERRORS as error:
        raise SystemExit(f"error: {error}") from None
    result.update(config=json.loads(config.to_json()), run_dir=run_dir, device=arguments.device,
                  note=arguments.note, training=record,
                  averaged=_read_json(averaging.record_path(averaged)),
                  scores=scores, load_average_end=common.load_average(),
                  translations=keep_translations(run_dir, data.target_language, json_path))
    common.write_json(json_path, result)
    print(f"Result: {json_path}")
    if arguments.results != "none":
        append_row(arguments.results, table_row(result))
        print(f"Row appended to {arguments.results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
