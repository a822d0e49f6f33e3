"""An export is all or nothing: killed at any point, the folder holds one whole export,
and a folder whose files come from different exports is refused."""

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from keras_transformer import files
from keras_transformer.serving import artifacts, export, export_folder, runners
from tests.conftest import FIXTURES, REPOSITORY

RUN = FIXTURES / "artifacts_v0_1" / "run"  # a trained one-layer tiny run
EXPORTED = {files.TOKENIZER_MODEL, files.SAVED_MODEL, files.TFLITE, files.REPORT_JSON,
            files.REPORT_MARKDOWN}  # without int8 (quantize=False): one conversion less
# The translating signatures alone: the folder's contract is the same for all, and the
# other two cost 40 % more per export.
EXPORT_OPTIONS = dict(quantize=False, signatures=files.TRANSLATING_SIGNATURES)

# Exports RUN_DIR as `export_run(run_dir, **EXPORT_OPTIONS)` does, pausing (writing
# MARKER, then sleeping until killed) at POINT.
DRIVER = textwrap.dedent("""
    import os, sys, time
    sys.path.insert(0, sys.argv[1])
    from keras_transformer import files
    from keras_transformer.serving import export, export_folder
    run_dir, point, marker = sys.argv[2:5]

    def pause():
        open(marker, "w").close()
        time.sleep(600)

    def after(module, name):
        original = getattr(module, name)
        def wrapped(*args, **kwargs):
            result = original(*args, **kwargs)
            pause()
            return result
        setattr(module, name, wrapped)

    if point == "saved_model_written":
        after(export_folder, "write_saved_model_id")
    elif point == "report_written":
        after(export, "write_report")
    elif point == "swapped":
        after(export_folder, "_exchange")
    elif point == "renamed_aside":  # where the system cannot swap two folders
        export_folder._exchange = lambda first, second: False
        rename = os.rename
        def rename_then_pause(source, target):
            rename(source, target)
            if target.endswith(".previous"):
                pause()
        os.rename = rename_then_pause
    export.export_run(run_dir, quantize=False, signatures=files.TRANSLATING_SIGNATURES)
""")


@pytest.fixture(scope="module")
def exported_run(tmp_path_factory):
    """A copy of the fixture run with one export; yields `(run_dir, export id)`."""
    run_dir = tmp_path_factory.mktemp("run") / "run"
    shutil.copytree(RUN, run_dir)
    _, report = export.export_run(str(run_dir), **EXPORT_OPTIONS)
    return run_dir, report["export_id"]


def assert_one_whole_export(export_dir):
    """Asserts the folder holds every file of one export; returns its id."""
    assert set(os.listdir(export_dir)) == EXPORTED
    export_folder.check_consistent(str(export_dir))
    with open(export_dir / files.REPORT_JSON, encoding="utf-8") as file:
        return json.load(file)["export_id"]


def test_every_file_of_an_export_carries_its_id(exported_run):
    run_dir, export_id = exported_run
    export_dir = run_dir / files.EXPORT_DIR
    assert assert_one_whole_export(export_dir) == export_id
    assert export_folder.saved_model_id(export_dir / files.SAVED_MODEL) == export_id
    assert export_folder.tflite_id(export_dir / files.TFLITE) == export_id
    assert export_id in (export_dir / files.REPORT_MARKDOWN).read_text(encoding="utf-8")
    # The stamped .tflite file still runs, as the SavedModel does.
    tflite = runners.open_runner(str(export_dir / files.TFLITE))(["A dog runs."])
    saved = runners.open_runner(str(export_dir / files.SAVED_MODEL))(["A dog runs."])
    assert tflite["token_ids"].tolist() == saved["token_ids"].tolist()


def test_a_folder_mixing_two_exports_is_refused_naming_the_stranger(exported_run, tmp_path):
    run_dir, export_id = exported_run
    other = tmp_path / "other"
    shutil.copytree(RUN, other)
    export.export_run(str(other), **EXPORT_OPTIONS)
    mixed = tmp_path / "mixed"
    shutil.copytree(run_dir / files.EXPORT_DIR, mixed)
    shutil.copyfile(other / files.EXPORT_DIR / files.TFLITE, mixed / files.TFLITE)
    for artifact in (files.SAVED_MODEL, files.TFLITE):  # whichever one is opened
        with pytest.raises(export_folder.ExportMismatchError,
                           match=f"{files.TFLITE} is of export (?!{export_id})"):
            runners.open_runner(str(mixed / artifact))
    (mixed / files.TFLITE).unlink()
    with pytest.raises(export_folder.ExportMismatchError,
                       match=f"{files.TFLITE} is missing"):
        runners.open_runner(str(mixed / files.SAVED_MODEL))
    shutil.copyfile(other / files.EXPORT_DIR / files.TOKENIZER_MODEL,
                    mixed / files.TOKENIZER_MODEL)  # the same tokenizer: that is fine
    shutil.copyfile(run_dir / files.EXPORT_DIR / files.TFLITE, mixed / files.TFLITE)
    export_folder.check_consistent(str(mixed))


def test_an_export_never_replaces_a_folder_of_other_files(exported_run, tmp_path):
    run_dir, _ = exported_run
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="not an export"):
        export.export_run(str(run_dir), output_dir=str(tmp_path), **EXPORT_OPTIONS)
    assert os.listdir(tmp_path) == ["notes.txt"]
    # Nor an earlier export with the user's files beside it, which it would delete.
    earlier = tmp_path / "earlier"
    shutil.copytree(run_dir / files.EXPORT_DIR, earlier)
    assert EXPORTED <= files.EXPORT_MEMBERS  # all an export writes is the export's
    (earlier / "test_2016.de").write_text("Ein Hund.\n")
    before = sorted(os.listdir(earlier))
    with pytest.raises(ValueError, match=r"files that are not the export's \(test_2016.de\)"):
        export.export_run(str(run_dir), output_dir=str(earlier), **EXPORT_OPTIONS)
    assert sorted(os.listdir(earlier)) == before


def kill_export_at(run_dir, point, tmp_path):
    """Runs an export of `run_dir` in a process killed with SIGKILL at `point`."""
    marker = tmp_path / f"{point}.paused"
    process = subprocess.Popen([sys.executable, "-c", DRIVER, str(REPOSITORY), str(run_dir),
                                point, str(marker)], stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    deadline = time.monotonic() + 240
    try:
        while not marker.exists():
            assert process.poll() is None, process.stderr.read()[-3000:]
            assert time.monotonic() < deadline, f"never reached {point}"
            time.sleep(0.2)
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_an_export_killed_at_any_point_leaves_one_whole_export(exported_run, tmp_path):
    run_dir, first_id = exported_run
    export_dir = run_dir / files.EXPORT_DIR
    previous = first_id
    # Staging (two points: after its first artifact, after its last file), the swap, and
    # the fallback's state between its two renames.
    for point, replaced in [("saved_model_written", False), ("report_written", False),
                            ("swapped", True), ("renamed_aside", None)]:
        kill_export_at(run_dir, point, tmp_path)
        if replaced is None:
            # Between the two renames of a system that cannot swap folders: no export
            # folder, both exports whole beside it. Opening the run puts the previous back.
            assert not export_dir.exists()
            runners.open_runner(artifacts.resolve_artifact(str(run_dir)))
            found = assert_one_whole_export(export_dir)
            assert found == previous, point
        else:
            found = assert_one_whole_export(export_dir)
            assert (found != previous) if replaced else (found == previous), point
        previous = found
    # The next export removes what the killed ones left beside the folder.
    _, report = export.export_run(str(run_dir), **EXPORT_OPTIONS)
    assert assert_one_whole_export(export_dir) == report["export_id"]
    assert sorted(name for name in os.listdir(run_dir)
                  if name.startswith(files.PARTIAL_PREFIX)) == []
