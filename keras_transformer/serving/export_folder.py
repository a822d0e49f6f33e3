"""An export folder, all or nothing: written aside, moved into place whole, one id throughout.

`export` writes a new export into a folder of its own beside the old one
(`staging_folder`) and moves it into place in one rename (`publish`), so that the
export folder always holds one complete export: the previous one until the new one is
whole, after a kill at any point (where the system cannot swap two folders in one
step, a kill between its two renames leaves the previous export beside, which
`recover` puts back). Every artifact of an export carries its id
(`new_export_id`), which the report records:

- the SavedModel: a file `export_id` in its folder (SavedModel loaders ignore it);
- each `.tflite` file: a metadata entry of its flatbuffer, `keras_transformer_export_id`;
- each CTranslate2 folder: `export_id` in its `translator.json`;
- the tokenizer beside them, which cannot hold it: its SHA-256, in the report;
- the self-check's report: its `export_id`.

`check_consistent` refuses a folder whose files disagree (an artifact copied in from
another export, say). Nothing here imports TensorFlow: a `.tflite` translator is opened
and checked without it.
"""

import contextlib
import ctypes
import datetime
import hashlib
import json
import os
import secrets
import shutil

from keras_transformer import files

SAVED_MODEL_ID_FILE = "export_id"  # in the SavedModel folder
TFLITE_METADATA = "keras_transformer_export_id"
_TFLITE_FILE_IDENTIFIER = b"TFL3"
# renameat2's flag that swaps two paths in one step (linux/fs.h), and "the current folder".
_RENAME_EXCHANGE, _AT_FDCWD = 2, -100


class ExportMismatchError(ValueError):
    """The files of an export folder come from different exports; the message says which."""


def new_export_id():
    """Returns a new id: the UTC time and 8 random hex digits, `20261203T081500Z-1a2b3c4d`."""
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return f"{now}-{secrets.token_hex(4)}"


def staging_folder(target):
    """Returns an empty folder beside `target` for this process to write an export into.

    Folders that processes no longer running left there (killed mid-export) are removed,
    after an interrupted `publish` is undone (`recover`).
    """
    parent, name = os.path.split(os.path.abspath(target))
    os.makedirs(parent, exist_ok=True)
    recover(target)
    for entry in os.listdir(parent):
        if (entry.endswith((f"-{name}", f"-{name}{_ASIDE}"))
                and files.is_stale_partial(entry)):
            shutil.rmtree(os.path.join(parent, entry), ignore_errors=True)
    staged = os.path.join(parent, files.partial_name(name))
    shutil.rmtree(staged, ignore_errors=True)
    os.makedirs(staged)
    return staged


def publish(staged, target):
    """Moves the complete folder `staged` to `target`, in place of what was there.

    Where the system can (Linux's `renameat2`), the two folders trade places in one
    step and the old export is removed afterwards: a kill at any point leaves `target`
    holding one whole export. Elsewhere the old folder is renamed aside first, and a
    kill between the two renames leaves no `target`, with both exports complete beside
    it (the old one named after this process).
    """
    target = os.path.abspath(target)
    if not os.path.lexists(target):
        os.rename(staged, target)
        return
    if not _exchange(staged, target):
        aside = os.path.join(os.path.dirname(target),
                             files.partial_name(os.path.basename(target)) + _ASIDE)
        os.rename(target, aside)
        os.rename(staged, target)
        staged = aside
    shutil.rmtree(staged, ignore_errors=True)  # now the previous export


_ASIDE = ".previous"  # the old export while `publish` renames the new one in


def recover(target):
    """Puts the previous export back at `target` where a killed `publish` left none."""
    parent, name = os.path.split(os.path.abspath(target))
    if os.path.lexists(target) or not os.path.isdir(parent):
        return
    for entry in sorted(os.listdir(parent)):
        if entry.endswith(f"-{name}{_ASIDE}") and files.is_stale_partial(entry):
            os.rename(os.path.join(parent, entry), target)
            return


def _exchange(first, second):
    """Swaps two paths atomically; returns False where the system cannot."""
    with contextlib.suppress(AttributeError, OSError):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.renameat2(_AT_FDCWD, os.fsencode(first), _AT_FDCWD, os.fsencode(second),
                          _RENAME_EXCHANGE) == 0:
            return True
    return False


def write_saved_model_id(saved_model_dir, export_id):
    files.write_text(os.path.join(saved_model_dir, SAVED_MODEL_ID_FILE), export_id + "\n")


def saved_model_id(saved_model_dir):
    """The export id in a SavedModel folder, or `None` (exported before ids)."""
    path = os.path.join(saved_model_dir, SAVED_MODEL_ID_FILE)
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as file:
        return file.read().strip()


def stamp_tflite(content, export_id):
    """Returns the TFLite flatbuffer `content` with the export id among its metadata."""
    import flatbuffers  # LiteRT's own dependency, as its schema module below
    from ai_edge_litert import schema_py_generated as schema

    model = schema.ModelT.InitFromPackedBuf(bytearray(content), 0)
    buffer = schema.BufferT()
    buffer.data = list(export_id.encode("ascii"))
    model.buffers.append(buffer)
    entry = schema.MetadataT()
    entry.name = TFLITE_METADATA
    entry.buffer = len(model.buffers) - 1
    model.metadata = [*(model.metadata or []), entry]
    builder = flatbuffers.Builder(len(content) + 1024)
    builder.Finish(model.Pack(builder), file_identifier=_TFLITE_FILE_IDENTIFIER)
    return bytes(builder.Output())


def tflite_id(path):
    """The export id in a `.tflite` file's metadata, or `None` (exported before ids)."""
    from ai_edge_litert import schema_py_generated as schema

    with open(path, "rb") as file:
        content = file.read()
    try:
        model = schema.Model.GetRootAs(content, 0)
        for index in range(model.MetadataLength()):
            entry = model.Metadata(index)
            if entry.Name() == TFLITE_METADATA.encode():
                return bytes(model.Buffers(entry.Buffer()).DataAsNumpy()).decode("ascii")
    except Exception:  # noqa: BLE001  not a flatbuffer: LiteRT will say so when it loads
        return None
    return None


def ctranslate2_id(directory):
    """The export id in a CTranslate2 folder's `translator.json`, or `None`."""
    with open(os.path.join(directory, files.CTRANSLATE2_OPTIONS), encoding="utf-8") as file:
        return json.load(file).get("export_id")


def sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check_consistent(folder):
    """Raises `ExportMismatchError` unless every file of the export in `folder` is its own.

    The report (`export_report.json`) gives the export id; every artifact it lists must
    be there and carry that id, the tokenizer must have the recorded SHA-256, and a
    self-check report must be of that export. A folder without a report, or with one
    written before export ids, is not checked.
    """
    report_path = os.path.join(folder, files.REPORT_JSON)
    if not os.path.isfile(report_path):
        return
    with open(report_path, encoding="utf-8") as file:
        try:
            report = json.load(file)
        except json.JSONDecodeError:
            return  # `artifacts.export_report` names the broken file
    export_id = report.get("export_id") if isinstance(report, dict) else None
    if export_id is None:
        return
    problems = []

    def compare(name, found):
        if found != export_id:
            problems.append(f"{name} is of export {found or 'none (no id)'}")

    for name, path, read in _artifacts(folder, report):
        if not os.path.exists(path):
            problems.append(f"{name} is missing")
        else:
            compare(name, read(path))
    tokenizer = report.get("tokenizer_sha256")
    tokenizer_path = os.path.join(folder, files.TOKENIZER_MODEL)
    if tokenizer and os.path.exists(tokenizer_path) and sha256(tokenizer_path) != tokenizer:
        problems.append(f"{files.TOKENIZER_MODEL} is another tokenizer than the export's")
    check_path = os.path.join(folder, files.CHECK_REPORT)
    if os.path.isfile(check_path):
        with open(check_path, encoding="utf-8") as file, contextlib.suppress(ValueError):
            checked = json.load(file)
            compare(files.CHECK_REPORT, checked.get("export_id")
                    if isinstance(checked, dict) else None)
    if problems:
        raise ExportMismatchError(
            f"{folder} mixes files of different exports ({files.REPORT_JSON} is of export "
            f"{export_id}; {'; '.join(problems)}). Export the run again to write the "
            "folder whole (keras-transformer export RUN_DIR).")


def _artifacts(folder, report):
    """`(name, path, read_id)` of each artifact the report lists."""
    found = [(files.SAVED_MODEL, os.path.join(folder, files.SAVED_MODEL), saved_model_id)]
    for key in ("tflite", "tflite_dynamic_range"):
        if key in report:
            name = report[key]["path"]
            found.append((name, os.path.join(folder, name), tflite_id))
    for key in (files.CTRANSLATE2, files.CTRANSLATE2_INT8):
        if key in report.get("ctranslate2", {}):
            found.append((key, os.path.join(folder, key), ctranslate2_id))
    return found


def export_folder_of(artifact):
    """The folder an artifact lies in: its parent (a CTranslate2 folder's too)."""
    return os.path.dirname(os.path.normpath(os.fspath(artifact)))
