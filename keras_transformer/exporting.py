"""Export a trained run: SavedModel, TFLite files and a report of what they need.

    python -m export RUN_DIR            # writes RUN_DIR/export/
    python -m export.check RUN_DIR      # then checks every artifact agrees

Layout written under the export directory (names are the constants below):

    saved_model/                         signatures serving_default (greedy), beam_search
    translator.tflite                    same signatures, builtins + tf-text custom ops
    translator_dynamic_range.tflite      the same with int8 weights (optional)
    export_report.json, export_report.md versions, config, sizes, op lists

Every op of every artifact is listed and checked (`export_checks`): an op that TF Serving
or LiteRT would not have fails the export before anything is shipped.
"""

import datetime
import json
import os
import shutil

import tensorflow as tf
import tensorflow_text

from keras_transformer import ensemble as ensemble_lib
from keras_transformer import export_checks, serving

EXPORT_DIR = "export"
SAVED_MODEL = "saved_model"
TFLITE = "translator.tflite"
TFLITE_QUANTIZED = "translator_dynamic_range.tflite"
REPORT_JSON = "export_report.json"
REPORT_MARKDOWN = "export_report.md"


def export_translator(translator, directory, *, quantize=True):
    """Writes the SavedModel and TFLite files of `translator` into `directory`.

    Args:
        translator: `serving.Translator` of the trained model.
        directory: str. Output directory (created; artifacts in it are replaced).
        quantize: bool. Also write the dynamic-range-quantized TFLite file.

    Returns:
        The report (a JSON-ready dict) of what was written; not yet saved.

    Raises:
        export_checks.UnsupportedOpsError: an artifact needs ops its runtime lacks
            (nothing of that artifact is left in `directory`).
    """
    os.makedirs(directory, exist_ok=True)
    saved_model_dir = os.path.join(directory, SAVED_MODEL)
    if os.path.exists(saved_model_dir):
        shutil.rmtree(saved_model_dir)
    serving.save_saved_model(translator, saved_model_dir)
    ops = export_checks.saved_model_ops(saved_model_dir)
    try:
        tf_text_ops = export_checks.check_saved_model_ops(ops)
    except export_checks.UnsupportedOpsError:
        shutil.rmtree(saved_model_dir)
        raise
    report = {
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "versions": _versions(),
        "translator": {"max_source_length": translator.model.max_length,
                       "max_output_length": translator.max_output_length,
                       "extra_length": translator.extra_length,
                       "beam_size": translator.beam_size,
                       "length_penalty": translator.length_penalty,
                       "vocabulary_size": translator.tokenizer.vocabulary_size},
        "saved_model": {"path": SAVED_MODEL, "bytes": _size(saved_model_dir),
                        "signatures": {serving.GREEDY_SIGNATURE: "greedy",
                                       serving.BEAM_SIGNATURE: "beam search"},
                        "tf_text_ops": tf_text_ops, "ops": ops},
    }
    for key, name, quantized in (("tflite", TFLITE, False),
                                 ("tflite_dynamic_range", TFLITE_QUANTIZED, True)):
        if quantized and not quantize:
            continue
        report[key] = _export_tflite(translator, os.path.join(directory, name),
                                     quantized)
    return report


def _export_tflite(translator, path, quantize):
    """Converts, checks and writes one TFLite file; returns its report entry."""
    content = serving.convert_to_tflite(translator, quantize=quantize)
    ops = export_checks.tflite_ops(content)
    custom_ops = export_checks.check_tflite_ops(ops)
    with open(path, "wb") as file:
        file.write(content)
    return {"path": os.path.basename(path), "bytes": len(content),
            "quantization": "dynamic range (int8 weights)" if quantize else None,
            "custom_ops": custom_ops, "ops": ops}


def export_run(run_dir, *, weights=None, output_dir=None, quantize=True, ensemble=(),
               **translator_options):
    """Exports the run in `run_dir` and writes the report beside the artifacts.

    Args:
        run_dir: str. A run directory written by training (see `runs.py`).
        weights: which weights to export (see `runs.find_weights`); newest by default.
        output_dir: str. Where to write; `RUN_DIR/export` by default.
        quantize: bool. Also write the dynamic-range-quantized TFLite file.
        ensemble: run directories of further models, trained with this run's
            tokenizer, whose probabilities the artifact averages with this run's
            (`ensemble.Ensemble`); their weights are chosen by `weights` too.
        **translator_options: passed to `serving.Translator`.

    Returns:
        `(output_dir, report)`.
    """
    from keras_transformer import runs

    if ensemble:
        config, tokenizer, model, weight_paths = ensemble_lib.load_ensemble(
            [run_dir, *ensemble], weights)
    else:
        config, tokenizer, model = runs.load_run(run_dir, weights)
        weight_paths = [runs.find_weights(run_dir, weights)]
    output_dir = output_dir or os.path.join(run_dir, EXPORT_DIR)
    translator = serving.Translator(model, tokenizer, **translator_options)
    report = export_translator(translator, output_dir, quantize=quantize)
    report["run"] = {"run_dir": os.path.abspath(run_dir),
                     "weights": os.path.abspath(weight_paths[0]),
                     "config": json.loads(config.to_json())}
    if ensemble:
        report["run"]["ensemble"] = [
            {"run_dir": os.path.abspath(member), "weights": os.path.abspath(path)}
            for member, path in zip(ensemble, weight_paths[1:])]
    write_report(output_dir, report)
    return output_dir, report


def write_report(directory, report):
    """Writes `report` as `export_report.json` and a readable `export_report.md`."""
    with open(os.path.join(directory, REPORT_JSON), "w", encoding="utf-8") as file:
        json.dump(report, file, indent=2, sort_keys=True)
        file.write("\n")
    with open(os.path.join(directory, REPORT_MARKDOWN), "w", encoding="utf-8") as file:
        file.write(report_markdown(report))


def report_markdown(report):
    """Returns the report as Markdown: artifacts, sizes, versions and ops."""
    versions = report["versions"]
    lines = ["# Export report", "", f"Created {report['created']} with "
             + ", ".join(f"{name} {version}" for name, version in versions.items()) + ".",
             "", "| artifact | size | notes |", "|---|---|---|"]
    saved_model = report["saved_model"]
    lines.append(f"| `{saved_model['path']}/` | {_megabytes(saved_model['bytes'])} | "
                 f"signatures {', '.join(saved_model['signatures'])} |")
    for key in ("tflite", "tflite_dynamic_range"):
        if key in report:
            entry = report[key]
            lines.append(f"| `{entry['path']}` | {_megabytes(entry['bytes'])} | "
                         f"{entry['quantization'] or 'float32'} |")
    lines += ["", "## Serving requirements", "",
              f"tf-text ops in the SavedModel: {', '.join(saved_model['tf_text_ops'])}. "
              f"It was exported with tensorflow-text {versions['tensorflow_text']}; a model "
              "server must link a tf-text with these ops (stock TF Serving 2.20 links "
              "tf-text 2.20, which has them).", ""]
    if "tflite" in report:
        lines += [f"TFLite custom ops (tf-text kernels, register "
                  f"`tensorflow_text.tflite_registrar.SELECT_TFTEXT_OPS`): "
                  f"{', '.join(report['tflite']['custom_ops'])}. No Flex ops.", ""]
    lines += ["## Translator", "", "```json", json.dumps(report["translator"], indent=2),
              "```", "", "## SavedModel ops", "", ", ".join(saved_model["ops"]), ""]
    if "tflite" in report:
        lines += ["## TFLite ops (count over all subgraphs)", "", ", ".join(
            f"{op} ×{count}" for op, count in report["tflite"]["ops"].items()), ""]
    if "run" in report:
        lines += ["## Run", "", f"Weights: `{report['run']['weights']}`", ""]
        members = report["run"].get("ensemble", [])
        if members:
            lines += ["An ensemble: it translates with the mean of the probabilities of "
                      "the model above and of", ""]
            lines += [f"- `{member['weights']}`" for member in members] + [""]
        lines += ["```json",
                  json.dumps(report["run"]["config"], indent=2, sort_keys=True), "```", ""]
    return "\n".join(lines)


def _versions():
    import keras

    versions = {"tensorflow": tf.__version__, "tensorflow_text": tensorflow_text.__version__,
                "keras": keras.__version__}
    try:
        import ai_edge_litert
        versions["ai_edge_litert"] = getattr(ai_edge_litert, "__version__", "installed")
    except ImportError:
        pass
    return versions


def _size(directory):
    return sum(os.path.getsize(os.path.join(root, name))
               for root, _, names in os.walk(directory) for name in names)


def _megabytes(size):
    return f"{size / 1e6:.2f} MB"


def _argument_problems(args):
    """Yields what is wrong with the runs, folder and numbers that the command names.

    Checked before the export spends minutes building and tracing the model.
    """
    from keras_transformer import config as config_lib
    from keras_transformer import runs
    for run_dir in [args.run_dir, *args.ensemble]:
        try:
            runs.check_run_dir(run_dir)
            config_lib.Config.load(os.path.join(run_dir, runs.CONFIG))
        except (FileNotFoundError, ValueError) as error:  # each names the file
            yield str(error)
    if args.max_output_length is not None and args.max_output_length < 1:
        yield f"--max-output-length must be at least 1, got {args.max_output_length}."
    if args.output_dir and os.path.exists(args.output_dir) and not os.path.isdir(
            args.output_dir):
        yield f"--output-dir {args.output_dir} is a file: name a folder to write into."


def main(argv=None):
    """Command line: `python -m export RUN_DIR`; returns the exit status."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m export",
        description="Export a trained run as a SavedModel (TF Serving) and TFLite "
                    "translator: strings in, strings out.")
    parser.add_argument("run_dir", help="run directory written by train.py")
    parser.add_argument("--weights", help="'averaged', 'final', 'latest' or a weights "
                                          "file (default: the newest)")
    parser.add_argument("--output-dir", help="where to write (default RUN_DIR/export)")
    parser.add_argument("--no-quantize", action="store_true",
                        help="skip the dynamic-range-quantized TFLite file")
    parser.add_argument("--max-output-length", type=int,
                        help="most output tokens (default: the model's max_length - 1)")
    # "extend": `--ensemble b --ensemble c` names both runs; the default "store" would
    # keep only the last flag's and export a smaller ensemble without a word.
    parser.add_argument("--ensemble", nargs="+", action="extend", default=[],
                        metavar="RUN_DIR",
                        help="further runs trained with RUN_DIR's tokenizer (one flag with "
                             "several, or the flag repeated): the artifact translates with "
                             "the mean of all the models' probabilities")
    parser.add_argument("--check", action="store_true",
                        help="run `python -m export.check` on the result")
    args = parser.parse_args(argv)
    problem = next(_argument_problems(args), None)
    if problem:
        parser.error(problem)
    from keras_transformer import runs, tokenizer
    try:
        output_dir, report = export_run(
            args.run_dir, weights=args.weights, output_dir=args.output_dir,
            quantize=not args.no_quantize, ensemble=args.ensemble,
            max_output_length=args.max_output_length)
    # What a run's files can get wrong; any other error keeps its traceback.
    except (export_checks.UnsupportedOpsError, ensemble_lib.TokenizerMismatchError,
            runs.WeightsFileError, tokenizer.TokenizerFileError, FileNotFoundError) as error:
        print(f"Export failed: {error}")
        return 1
    print(f"Exported to {output_dir} (report: {os.path.join(output_dir, REPORT_MARKDOWN)})")
    if not args.check:
        return 0
    from keras_transformer import self_check
    return self_check.main([args.run_dir, "--export-dir", output_dir])
