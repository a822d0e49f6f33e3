"""Export a trained run: SavedModel, TFLite files and a report of what they need.

    keras-transformer export RUN_DIR            # writes RUN_DIR/export/
    keras-transformer export RUN_DIR --check    # then checks every artifact agrees

The export directory's layout is in `keras_transformer.files`. Every op of every
artifact is listed and checked (`op_checks`): an op that TF Serving or LiteRT would not
have fails the export before anything is shipped. An export is all or nothing, every
file of it carrying one export id (`export_folder`).
"""

import dataclasses
import datetime
import importlib.metadata
import json
import logging
import os
import shutil

import ai_edge_litert
import keras
import tensorflow as tf
import tensorflow_text

from keras_transformer import files, runs
from keras_transformer.files import (
    REPORT_JSON,
    REPORT_MARKDOWN,
    SAVED_MODEL,
    TFLITE,
    TFLITE_QUANTIZED,
)
from keras_transformer.serving import export_folder, op_checks
from keras_transformer.serving import translator as translator_lib

logger = logging.getLogger(__name__)

# What each signature does, as the report says it (every artifact has the same ones).
SIGNATURE_SUMMARIES = {
    files.GREEDY_SIGNATURE: "greedy",
    files.BEAM_SIGNATURE: "beam search",
    files.N_BEST_SIGNATURE: "beam search's n best hypotheses",
    files.SCORE_SIGNATURE: "log-probabilities of given translations",
    files.PREFIX_SIGNATURE: "beam search after given target prefixes",
    files.SAMPLE_SIGNATURE: "seeded sampling",
    files.ALIGN_SIGNATURE: "beam search with word alignments",
}


def export_translator(translator, directory, *, tflite=True, quantize=True, ctranslate2=False,
                      run=None):
    """Writes the SavedModel, TFLite files and report of `translator` into `directory`.

    All or nothing: the export is written into a folder of its own beside `directory`
    and moved into place once complete (`export_folder`), so `directory` holds the
    previous export until then, whatever interrupts this one. Every artifact carries
    one export id, which the report records.

    Args:
        translator: `translator.Translator` of the trained model.
        directory: str. Output directory: new, empty, or an earlier export (replaced).
        tflite: bool. Write the TFLite files; without them, the SavedModel alone.
        quantize: bool. Also write the dynamic-range-quantized TFLite file.
        ctranslate2: bool. Also write CTranslate2 model directories, float32 and int8
            (`ctranslate2_export`; needs the `ctranslate2` extra).
        run: JSON-ready dict or `None`. What was exported, recorded as the report's
            `run` (see `export_run`).

    Returns:
        The report (a JSON-ready dict), as written to `export_report.json` and `.md`.

    Raises:
        op_checks.UnsupportedOpsError: an artifact needs ops its runtime lacks
            (`directory` is left as it was).
        ValueError: `directory` holds files that are not an export.
    """
    # Checked first: a missing extra or a wrong folder should not cost a whole export.
    ctranslate2_export = _ctranslate2_export() if ctranslate2 else None
    _check_replaceable(directory)
    staged = export_folder.staging_folder(directory)
    try:
        report = _write_artifacts(translator, staged, export_folder.new_export_id(),
                                  tflite, quantize, ctranslate2_export)
        if run is not None:
            report["run"] = run
        write_report(staged, report)
        export_folder.publish(staged, directory)
    finally:
        shutil.rmtree(staged, ignore_errors=True)  # what is left of a failed export
    return report


def _check_replaceable(directory):
    """Refuses to replace a folder that is neither empty nor an earlier export, or an
    export that holds files of the user's too (translations kept beside it, say)."""
    if (os.path.isdir(directory) and os.listdir(directory)
            and not os.path.isfile(os.path.join(directory, REPORT_JSON))):
        raise ValueError(f"{directory} holds files that are not an export, which exporting "
                         "there would replace: name a new or empty folder, or an earlier "
                         "export's.")
    others = sorted(set(os.listdir(directory)) - files.EXPORT_MEMBERS
                    ) if os.path.isdir(directory) else []
    if others:
        raise ValueError(f"{directory} holds an earlier export and files that are not the "
                         f"export's ({', '.join(others[:5])}{', ...' if others[5:] else ''}"
                         "), which exporting there would delete with it: move them out "
                         "first, or export into another folder (--output).")
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise ValueError(f"{directory} is a file: name a folder to export into.")


def _write_artifacts(translator, directory, export_id, tflite, quantize, ctranslate2_export):
    """Writes every artifact into the empty `directory`; returns the report."""
    # The tokenizer inside the artifacts, for who counts tokens without them.
    tokenizer_path = os.path.join(directory, files.TOKENIZER_MODEL)
    files.write_bytes(tokenizer_path, translator.tokenizer.model_proto)
    saved_model_dir = os.path.join(directory, SAVED_MODEL)
    translator_lib.save_saved_model(translator, saved_model_dir)
    ops = op_checks.saved_model_ops(saved_model_dir)
    tf_text_ops = op_checks.check_saved_model_ops(ops)
    export_folder.write_saved_model_id(saved_model_dir, export_id)
    report = {
        "export_id": export_id,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "versions": library_versions(),
        "translator": dict(translator.settings(),
                           vocabulary_size=translator.tokenizer.vocabulary_size),
        "tokenizer_sha256": export_folder.sha256(tokenizer_path),
        "saved_model": {"path": SAVED_MODEL, "bytes": _size(saved_model_dir),
                        "signatures": {name: SIGNATURE_SUMMARIES[name]
                                       for name in translator.exported_signatures},
                        "tf_text_ops": tf_text_ops, "ops": ops},
    }
    wanted = [(key, name, quantized) for key, name, quantized in (
        ("tflite", TFLITE, False), ("tflite_dynamic_range", TFLITE_QUANTIZED, True))
        if tflite and (quantize or not quantized)]
    contents = translator_lib.convert_to_tflite_models(
        translator, [quantized for _, _, quantized in wanted]) if wanted else []
    for (key, name, quantized), content in zip(wanted, contents):
        report[key] = _export_tflite(translator, content, os.path.join(directory, name),
                                     quantized, export_id)
    if ctranslate2_export is not None:
        report["ctranslate2"] = ctranslate2_export.export_ctranslate2(
            translator, directory, export_id=export_id)
        report["versions"]["ctranslate2"] = importlib.metadata.version("ctranslate2")
    return report


def _ctranslate2_export():
    """Returns the `ctranslate2_export` module, or says how to install what it needs."""
    try:
        # Imported here: CTranslate2 is an optional extra.
        from keras_transformer.serving import ctranslate2_export
    except ImportError as error:
        raise ImportError(f"--ctranslate2 needs CTranslate2 ({error}): pip install "
                          "'keras-transformer-mt[ctranslate2]'.") from None
    return ctranslate2_export


def _export_tflite(translator, content, path, quantize, export_id):
    """Checks and writes the TFLite flatbuffer `content`; returns its report entry."""
    ops = op_checks.tflite_ops(content)
    custom_ops = op_checks.check_tflite_ops(ops)
    content = export_folder.stamp_tflite(content, export_id)
    with open(path, "wb") as file:
        file.write(content)
    return {"path": os.path.basename(path), "bytes": len(content),
            "signatures": list(translator.exported_signatures),
            "quantization": "dynamic range (int8 weights)" if quantize else None,
            "custom_ops": custom_ops, "ops": ops}


def export_run(run_dir, *, weights=None, beam_size=None, length_penalty=None,
               output_dir=None, tflite=True, quantize=True, ensemble=(), ctranslate2=False,
               on_exported=None, **translator_options):
    """Exports the run in `run_dir` and writes the report beside the artifacts.

    What is not given comes from the run's choice on validation (`runs.Choice`, which
    the recipe records), else from the defaults: the newest weights, the paper's beam
    search. An ensemble uses no choice (it was made for one model).

    Args:
        run_dir: str. A run directory written by training (layout in `files`).
        weights: which weights to export (see `runs.find_weights`).
        beam_size: int. Beam size of the beam_search signature.
        length_penalty: float. Its α.
        output_dir: str. Where to write; `RUN_DIR/export` by default. An ensemble
            needs another: no member's export folder (it would pass for that run).
        tflite: bool. Write the TFLite files; without them, the SavedModel alone.
        quantize: bool. Also write the dynamic-range-quantized TFLite file.
        ensemble: run directories of further models, trained with this run's
            tokenizer, whose probabilities the artifact averages with this run's
            (`decoding.ensemble.Ensemble`); their weights are chosen by `weights` too.
        ctranslate2: bool. Also write the CTranslate2 directories (not for an ensemble).
        on_exported: called as `on_exported(translator)` once the export is in place,
            with the `translator.Translator` it was written from, whose functions are
            traced already (`self_check.export_and_check` checks with it).
        **translator_options: passed to `translator.Translator`.

    Returns:
        `(output_dir, report)`.
    """
    if ensemble and ctranslate2:
        raise ValueError("An ensemble has no CTranslate2 form (CTranslate2 decodes one "
                         "model): export without --ctranslate2, or export each run alone.")
    run_export = os.path.join(run_dir, files.EXPORT_DIR)
    # A run's export folder is its own model to translate, evaluate and the recipe: an
    # ensemble there would replace the recipe's export and pass for the run.
    clash = files.own_export_at(output_dir, [run_dir, *ensemble]) if ensemble else None
    if clash:
        raise ValueError(f"An ensemble needs a folder of its own (--output DIR): "
                         f"{clash[1]} holds {clash[0]}'s own export.")
    choice = None if ensemble else runs.load_choice(run_dir)
    given = (beam_size, length_penalty, weights)
    if choice is not None and weights is None:
        weights = choice.weights_path(run_dir)
    defaults = (choice.beam_size, choice.length_penalty) if choice else (
        files.PAPER_BEAM_SIZE, files.PAPER_LENGTH_PENALTY)
    beam_size = defaults[0] if beam_size is None else beam_size
    length_penalty = defaults[1] if length_penalty is None else length_penalty
    if ensemble:
        config, tokenizer, model, weight_paths = runs.load_ensemble(
            [run_dir, *ensemble], weights)
    else:
        config, tokenizer, model = runs.load_run(run_dir, weights)
        weight_paths = [runs.find_weights(run_dir, weights)]
    output_dir = output_dir or run_export
    if choice is None:
        source = "defaults"
    elif given == (None, None, None):
        source = f"the run's choice, {choice.chosen_by}"
    else:
        source = "the run's choice where not given"
    logger.info("Exporting %s with beam %d, α %g (%s)", weight_paths[0], beam_size,
                length_penalty, source)
    translator = translator_lib.Translator(model, tokenizer, beam_size=beam_size,
                                           length_penalty=length_penalty,
                                           **translator_options)
    run = {"run_dir": os.path.abspath(run_dir), "weights": os.path.abspath(weight_paths[0]),
           "weights_sha256": runs.weights_sha256(weight_paths[0]),
           "config": json.loads(config.to_json())}
    if choice is not None:
        run["choice"] = dataclasses.asdict(choice)
    if ensemble:
        run["ensemble"] = [
            {"run_dir": os.path.abspath(member), "weights": os.path.abspath(path)}
            for member, path in zip(ensemble, weight_paths[1:])]
    report = export_translator(translator, output_dir, tflite=tflite, quantize=quantize,
                               ctranslate2=ctranslate2, run=run)
    if on_exported is not None:
        on_exported(translator)
    return output_dir, report


def matching_export(directory, run_dir, weights_path, *, beam_size, length_penalty,
                    quantize=True):
    """Returns the report of the export in `directory` if it holds what `export_run`
    would write there now, else `None`.

    That is: a whole export (`export_folder.check_consistent`) of `run_dir`'s model with
    the weights of `weights_path` (the same values: `runs.weights_sha256`), the run's
    config, this beam size and α and the other decoding options at their defaults
    (`translator.default_settings`), every signature, the TFLite files (`quantize`: the
    int8 one too) and no others, written with the versions of TensorFlow, tf-text, Keras
    and LiteRT installed now.
    """
    try:
        with open(os.path.join(directory, REPORT_JSON), encoding="utf-8") as file:
            report = json.load(file)
        export_folder.check_consistent(directory)
        run, translator = report["run"], report["translator"]
        config = runs.load_config(run_dir)
        same = (run["weights"] == os.path.abspath(weights_path)
                and run.get("weights_sha256") == runs.weights_sha256(weights_path)
                and run["config"] == json.loads(config.to_json())
                and not run.get("ensemble") and "ctranslate2" not in report
                and {name: value for name, value in translator.items()
                     if name != "vocabulary_size"} == translator_lib.default_settings(
                    config.model.max_length, config.model.num_layers,
                    beam_size=beam_size, length_penalty=length_penalty)
                and sorted(report["saved_model"]["signatures"]) == sorted(files.SIGNATURES)
                and "tflite" in report and ("tflite_dynamic_range" in report) == quantize
                and report["versions"] == library_versions())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None  # none, broken, or of another form
    return report if same else None


def write_report(directory, report):
    """Writes `report` as `export_report.json` and a readable `export_report.md`."""
    files.write_text(os.path.join(directory, REPORT_JSON),
                     json.dumps(report, indent=2, sort_keys=True) + "\n")
    files.write_text(os.path.join(directory, REPORT_MARKDOWN), report_markdown(report))


def report_markdown(report):
    """Returns the report as Markdown: artifacts, sizes, versions and ops."""
    versions = report["versions"]
    lines = ["# Export report", "", f"Export {report.get('export_id', '(no id)')}, "
             f"created {report['created']} with "
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
    for key in (files.CTRANSLATE2, files.CTRANSLATE2_INT8):
        if key in report.get("ctranslate2", {}):
            entry = report["ctranslate2"][key]
            lines.append(f"| `{entry['path']}/` | {_megabytes(entry['bytes'])} | "
                         f"CTranslate2, {entry['quantization']} |")
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


def library_versions():
    """The versions of the libraries an export was written with, as its report keeps them."""
    return {"tensorflow": tf.__version__, "tensorflow_text": tensorflow_text.__version__,
            "keras": keras.__version__,
            "ai_edge_litert": getattr(ai_edge_litert, "__version__", "installed")}


def _size(directory):
    return sum(os.path.getsize(os.path.join(root, name))
               for root, _, names in os.walk(directory) for name in names)


def _megabytes(size):
    return f"{size / 1e6:.2f} MB"
