"""Translation quality by the field's rules: the recipe of the package, recorded.

    python -m benchmarks.quality --data-dir ../shared/data/multi30k [--preset multi30k]

Runs `keras_transformer.recipe.run_recipe` (train from scratch, choose the weights, beam
size and α on the validation split, export, then score the exported SavedModel once on
every test split, beam and greedy) and records it: one row in the quality table of
BENCHMARKS.md, and everything (config, command, hardware, times, every validation score
behind each choice, sacreBLEU signatures) in a JSON file in benchmarks/results/, with the
translations of every scored split beside it, gzipped
(`<JSON name>.<split>.<beam|greedy>.<language>.gz`), so that a later row can be compared
with this one sentence by sentence (sacreBLEU's paired bootstrap).

Running the same command again on a run directory whose training finished skips the
training (its recorded time is reused) and redoes the choices, export and scoring.

    python -m benchmarks.quality --rescore benchmarks/results/quality-….json --data-dir DIR

adds the literature's BLEU (lowercased, Moses-tokenized, against Multi30K's `tok/`
references: `evaluation.score_tokenized`) to a row recorded before it was scored, from
the translations kept beside its JSON, and rewrites that JSON and its row.
"""

import argparse
import atexit
import contextlib
import dataclasses
import datetime
import gzip
import json
import os
import sys
import time

from keras_transformer.cli import console  # loads neither Keras nor TensorFlow

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# TensorFlow writes C++ start-up lines to stderr as the imports below load it, before
# any Python setting applies: run as a script, they are filtered from here on, as
# `keras-transformer` filters them (`console.native_stderr_filtered`).
_native_stderr = contextlib.ExitStack()
if __name__ == "__main__":
    _native_stderr.enter_context(console.native_stderr_filtered())
    # Before the interpreter stops its threads, the filter's among them: the traceback
    # of an import that fails below comes through whole.
    atexit.register(_native_stderr.close)

from benchmarks import common  # noqa: E402
from keras_transformer import cli, evaluation, files, recipe  # noqa: E402
from keras_transformer import config as config_lib  # noqa: E402
from keras_transformer.data import corpus, multi30k  # noqa: E402
from keras_transformer.data.text import read_lines  # noqa: E402

RESULTS_FILE = "BENCHMARKS.md"
TABLE_HEADING = "## Translation quality: Multi30K, chosen on validation"
SPLIT_NAMES = {"test_2016_flickr": "test2016", "test_2017_flickr": "test2017",
               "test_2017_mscoco": "mscoco", "test": "test"}
TABLE_INTRODUCTION = """\
Written by `python -m benchmarks.quality` (one row per run, appended by the script): the
recipe chooses the weights (newest checkpoint, mean of the newest 2–5, or the best
validation-BLEU ones), the beam size and α on `val` (1,014 sentences, beam BLEU), then
scores the exported SavedModel once on each test split. Cased sacreBLEU (13a) and chrF,
then BLEU as the literature scores Multi30K (`lc.tok`: lowercased, Moses-normalised and
tokenized, against the dataset's `tok/` references, no further tokenization); cells
read `BLEU beam (greedy) / chrF / lc.tok beam (greedy)`. `recipe`: the preset and its
overrides; `training`: wall-clock minutes, weight updates, epochs. The command, config,
every validation score and the signatures are in the row's JSON in
`benchmarks/results/`, the translations beside it."""
TABLE_HEADER = (
    "| id | date | direction | recipe | hardware | training | chosen on val | val BLEU "
    "| test2016 | test2017 | mscoco | note |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|")


def parse_arguments(argv=None):
    """The recipe command's options (`cli.add_recipe_options`), and the row's."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.quality",
        description="Run the recipe (train, choose on validation, export, score every "
                    "test split) and record it in BENCHMARKS.md and a JSON file.")
    cli.add_recipe_options(parser)
    parser.add_argument("--id", default="", help="short id of the row (e.g. 'q3')")
    parser.add_argument("--note", default="", help="what this run tries, for the table")
    parser.add_argument("--results", default=RESULTS_FILE, metavar="FILE",
                        help=f"markdown file whose quality table gets the row (default: "
                             f"{RESULTS_FILE}); 'none' writes no row")
    parser.add_argument("--json", metavar="FILE",
                        help="result JSON (default: benchmarks/results/quality-<UTC time>"
                             ".json)")
    parser.add_argument("--rescore", metavar="JSON",
                        help="add the literature's BLEU to this recorded result from its "
                             "kept translations (with --data-dir: Multi30K with tok/), "
                             "and rewrite its JSON and row; trains nothing")
    return parser.parse_intermixed_args(argv)


def keep_translations(run_dir, result, json_path):
    """Copies the run's translations of every scored split beside `json_path`, gzipped.

    Returns `{split: {decoder: file name}}`, names relative to the JSON's folder. The gzip
    header holds no time stamp or file name, so the same translations give the same bytes.
    """
    stem = os.path.splitext(json_path)[0]
    language = result["config"]["data"]["target_language"]
    splits = {"validation": result["validation"], **result["test"]}
    kept = {}
    for split, decoders in splits.items():
        for decoder in decoders:
            name = f"{split}.{decoder}.{language}"
            source = os.path.join(run_dir, files.TRANSLATIONS, name)
            target = f"{stem}.{name}.gz"
            os.makedirs(os.path.dirname(os.path.abspath(target)), exist_ok=True)
            with open(source, "rb") as file:
                data = gzip.compress(file.read(), mtime=0)
            with open(target, "wb") as file:
                file.write(data)
            kept.setdefault(split, {})[decoder] = os.path.basename(target)
    return kept


def table_row(result):
    """Returns the markdown row of one result."""
    data, record = result["config"]["data"], result["training"]
    selection = result["selection"]
    hardware = record.get("hardware") or common.describe_cpu(result["machine"])
    cells = {SPLIT_NAMES.get(split, split): _cell(scores)
             for split, scores in result["test"].items()}
    chosen = (f"{selection['weights']}, beam {selection['beam_size']}, "
              f"α {selection['length_penalty']:g}")
    return "| " + " | ".join([
        result.get("id") or "", result["date"][:10],
        f"{data['source_language']}→{data['target_language']}",
        recipe_cell(result.get("arguments") or {}), hardware,
        f"{record['minutes']:.1f} min, {record['updates']:,} updates, "
        f"{record['epochs']} epochs", chosen,
        f"{result['validation']['beam']['bleu']['score']:.1f}",
        cells.get("test2016", "–"), cells.get("test2017", "–"), cells.get("mscoco", "–"),
        result.get("note") or ""]) + " |"


def recipe_cell(arguments):
    """The row's recipe: the preset (or config file) and what the command changed; the
    whole command is in the result's JSON."""
    parts = [os.path.basename(arguments["config"]) if arguments.get("config")
             else arguments.get("preset") or config_lib.DEFAULT_PRESET]
    for option in ("epochs", "steps_per_epoch", "time_budget_minutes"):
        if arguments.get(option) is not None:
            parts.append(f"--{option.replace('_', '-')} {arguments[option]:g}")
    return "`" + " ".join([*parts, *(arguments.get("overrides") or [])]) + "`"


def _cell(scores):
    beam, greedy = scores["beam"], scores["greedy"]
    cell = (f"**{beam['bleu']['score']:.1f}** ({greedy['bleu']['score']:.1f}) / "
            f"{beam['chrf']['score']:.1f}")
    if "bleu_tok" in beam and "bleu_tok" in greedy:
        cell += f" / {beam['bleu_tok']['score']:.1f} ({greedy['bleu_tok']['score']:.1f})"
    return cell


def add_tokenized_scores(result, json_path, data_dir=None):
    """Adds `bleu_tok` (`evaluation.score_tokenized`) to every scored split of `result`.

    The translations are those kept beside `json_path` (`keep_translations`); the
    references are the corpus's (`data_dir` instead of the recorded one, if given),
    whose `tok/` files must be there (`multi30k.tokenized_reference`).
    """
    data = config_lib.Config.from_json(json.dumps(result["config"])).data
    if data_dir is not None:
        data = dataclasses.replace(data, data_dir=data_dir)
    folder = os.path.dirname(os.path.abspath(json_path))
    splits = {"validation": result["validation"], **result["test"]}
    for split, decoders in splits.items():
        reference = corpus.corpus_files(data, split)[1]
        tokenized = multi30k.tokenized_reference(reference)
        if tokenized is None:
            raise SystemExit(f"error: {reference} has no tokenized text beside it "
                             f"({multi30k.TOKENIZED_FOLDER}/): give --data-dir a Multi30K "
                             "copy with its tok/ folder")
        references = read_lines(tokenized)
        for decoder, scores in decoders.items():
            name = os.path.join(folder, result["translations"][split][decoder])
            scores["bleu_tok"] = evaluation.score_tokenized(
                read_lines(name), references, data.target_language,
                hypotheses_name=name, references_name=tokenized)
            scores["tokenized_reference"] = tokenized
    return result


def replace_row(path, row_id, row):
    """Replaces the quality table's row whose id is `row_id` by `row` in the file `path`."""
    with open(path, encoding="utf-8") as file:
        lines = file.read().splitlines()
    start = lines.index(TABLE_HEADING)
    found = [index for index in range(start, len(lines))
             if lines[index].startswith(f"| {row_id} |")]
    if not found:
        raise SystemExit(f"error: {path} has no quality row {row_id!r} to rewrite")
    lines[found[0]] = row
    temporary = f"{path}.partial"
    with open(temporary, "w", encoding="utf-8") as file:
        file.write("\n".join(lines) + "\n")
    os.replace(temporary, path)


def rescore(arguments):
    """`--rescore JSON`: the literature's BLEU added to a recorded result and its row."""
    with open(arguments.rescore, encoding="utf-8") as file:
        result = json.load(file)
    add_tokenized_scores(result, arguments.rescore, arguments.data_dir)
    common.write_json(arguments.rescore, result)
    print(f"Result: {arguments.rescore}")
    if arguments.results != "none" and result.get("id"):
        replace_row(arguments.results, result["id"], table_row(result))
        print(f"Row {result['id']} rewritten in {arguments.results}")
    return 0


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
        # The first table of the section is the quality table; its subsections may hold
        # tables of their own further down.
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


def main(argv=None):
    # The recipe's progress (training's epochs, the choices on val, the export) on
    # stderr, each message once, as `keras-transformer recipe` shows it.
    with console.console(verbose=False):
        return _main(argv)


def _main(argv):
    arguments = parse_arguments(argv)
    if arguments.rescore:
        return rescore(arguments)
    try:
        config, _ = cli.recipe_config(arguments)
    except ValueError as error:
        raise SystemExit(f"error: {error}") from None
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    data = config.data
    preset = arguments.preset or config_lib.DEFAULT_PRESET
    run_dir = arguments.run_dir or os.path.join(
        "runs", f"quality-{preset}-{data.source_language}-{data.target_language}-{stamp}")
    json_path = arguments.json or os.path.join("benchmarks", "results",
                                               f"quality-{stamp}.json")
    result = common.header(arguments)
    start = time.monotonic()
    measured = recipe.run_recipe(config, run_dir, choices=cli.recipe_choices(arguments),
                                 check=False)
    # The whole recipe (training, the choices on val, export, scoring), what a user of
    # `keras-transformer recipe` waits for; a resumed run counts this process alone.
    result.update(measured, run_dir=run_dir, id=arguments.id, note=arguments.note,
                  recipe_minutes=(time.monotonic() - start) / 60,
                  load_average_end=common.load_average())
    result["translations"] = keep_translations(run_dir, result, json_path)
    common.write_json(json_path, result)
    print(f"Result: {json_path}")
    if arguments.results != "none":
        append_row(arguments.results, table_row(result))
        print(f"Row appended to {arguments.results}")
    return 0


if __name__ == "__main__":
    with _native_stderr:
        sys.exit(main())
