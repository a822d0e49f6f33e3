"""Which artifact a path names, and what lies beside it: its export report, its tokenizer.

A run directory stands for the SavedModel that `export RUN_DIR` writes into it
(`resolve_artifact`); an artifact of an export directory has the export's report and
SentencePiece model beside it (`export_report`, `tokenizer_model`, `token_counter`).
Nothing here imports TensorFlow.
"""

import json
import logging
import os

from keras_transformer import files, runs
from keras_transformer.serving import export_folder

logger = logging.getLogger(__name__)


def resolve_artifact(path, *, export_if_missing=False, verbose=True):
    """Returns the artifact that `path` names: a run directory means its SavedModel.

    Args:
        path: str. A SavedModel directory, a `.tflite` file, a CTranslate2 directory, or
            a run directory (one with a `config.json`), whose `export/saved_model` is
            used.
        export_if_missing: bool. Export a run directory that has no SavedModel yet (as
            `export RUN_DIR` does, with its chosen or newest weights, but the SavedModel
            alone: what is returned) instead of failing.
        verbose: bool. Log a line when exporting.

    Raises:
        FileNotFoundError: when there is no artifact at `path`; for a run directory,
            with the command that exports it.
    """
    path = os.fspath(path)
    if os.path.isfile(path) and path.endswith(".tflite"):
        return path
    if os.path.isfile(os.path.join(path, "saved_model.pb")) or files.is_ctranslate2_dir(path):
        return path
    if not files.is_run_dir(path):
        raise FileNotFoundError(
            f"{path!r} is neither a SavedModel directory (with saved_model.pb), a .tflite "
            f"file, a CTranslate2 directory (with {files.CTRANSLATE2_MODEL} and "
            f"{files.CTRANSLATE2_OPTIONS}) nor a run directory (with config.json).")
    export_folder.recover(os.path.join(path, files.EXPORT_DIR))
    saved_model = runs.saved_model_dir(path)
    if os.path.isfile(os.path.join(saved_model, "saved_model.pb")):
        return saved_model
    if not export_if_missing:
        raise FileNotFoundError(
            f"Run directory {path!r} has no exported SavedModel at {saved_model!r}: "
            f"export it first with `keras-transformer export {path}`.")
    if verbose:
        logger.info("%s has no export yet: exporting its SavedModel (keras-transformer "
                    "export %s writes the .tflite files too).", path, path)
    # Imported here: exporting needs TensorFlow and the model, translating neither.
    from keras_transformer.serving import export

    # The SavedModel alone: the TFLite files, which translating a run directory never
    # reads, took three quarters of the tiny preset's export (107 s; alone 29 s).
    export.export_run(path, tflite=False)
    return saved_model


def export_report(artifact):
    """Returns the report that `export` wrote beside `artifact`, or `None` without one.

    Args:
        artifact: str. A SavedModel directory or a `.tflite` file of an export directory.

    Raises:
        ValueError: the report is there but not a JSON object (it names the file).
    """
    path = os.path.join(os.path.dirname(os.path.normpath(os.fspath(artifact))),
                        files.REPORT_JSON)
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as file:
            report = json.load(file)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path}: not a valid export report ({error}). Export the run "
                         "again, or delete the report.") from None
    if not isinstance(report, dict):
        raise ValueError(f"{path}: not a valid export report (not a JSON object).")
    return report


def exported_options(artifact):
    """Returns the decoding options `artifact` was exported with (`translator.Translator`'s
    `settings`): a CTranslate2 directory's `translator.json`, else the `translator` of
    the export report beside it; `{}` when neither is there.

    Raises:
        ValueError: the file is there but not a JSON object (it names the file).
    """
    if files.is_ctranslate2_dir(artifact):  # its own: it may have been copied alone
        path = os.path.join(artifact, files.CTRANSLATE2_OPTIONS)
        fix = "Export the run again (keras-transformer export RUN_DIR --ctranslate2)."
        try:
            with open(path, encoding="utf-8") as file:
                options = json.load(file)
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise ValueError(f"{path}: not the options of a CTranslate2 export ({error}). "
                             f"{fix}") from None
        if not isinstance(options, dict):
            raise ValueError(f"{path}: not the options of a CTranslate2 export (not a JSON "
                             f"object). {fix}")
        return options
    return (export_report(artifact) or {}).get("translator") or {}


def tokenizer_model(artifact):
    """Returns the path of the SentencePiece model behind `artifact`, or `None`.

    The model the artifact tokenizes with: `tokenizer.model` in a CTranslate2 directory
    or beside the artifacts of an export directory (`export` writes it there), else the
    run's own (`RUN_DIR/tokenizer/`, for a run directory or for what it exported).
    """
    path = os.path.normpath(os.fspath(artifact))
    folder = path if files.is_ctranslate2_dir(path) else os.path.dirname(path)
    candidates = [os.path.join(folder, files.TOKENIZER_MODEL),
                  os.path.join(os.path.dirname(folder), files.TOKENIZER, files.TOKENIZER_MODEL)]
    if files.is_run_dir(path):
        candidates.insert(0, os.path.join(path, files.TOKENIZER, files.TOKENIZER_MODEL))
    return next((candidate for candidate in candidates if os.path.isfile(candidate)), None)


def token_counter(artifact):
    """Returns `count(sentences) -> list of int`: the source ids `artifact` decodes from.

    Counts SentencePiece pieces plus START and END with the artifact's own tokenizer
    (`tokenizer_model`), in Python: no TensorFlow.

    Raises:
        FileNotFoundError: no tokenizer model was found; the message says where to put it.
    """
    path = tokenizer_model(artifact)
    if path is None:
        raise FileNotFoundError(
            f"Counting tokens needs the tokenizer of {artifact}: put the run's "
            f"{files.TOKENIZER}/{files.TOKENIZER_MODEL} beside it (export writes it "
            "there), or batch by sentences.")
    import sentencepiece  # here: only token counts need it

    processor = sentencepiece.SentencePieceProcessor(model_file=path)

    def count(sentences):
        texts = [s.decode("utf-8", "replace") if isinstance(s, bytes) else str(s)
                 for s in sentences]
        return [len(ids) + 2 for ids in processor.encode(texts)]

    return count
