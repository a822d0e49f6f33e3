"""One training per run directory, and temporary files that are each process's own."""

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from keras_transformer import cli, files, runs
from tests.conftest import REPOSITORY

# Takes the run directory's lock, says so, and holds it until its input ends or it dies.
HOLDER = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[1])
    from keras_transformer import runs
    with runs.lock_run_dir(sys.argv[2]):
        print("held", flush=True)
        sys.stdin.read()
""")


@pytest.fixture
def holder(tmp_path):
    """A process holding the lock of `tmp_path / "run"`; yields it."""
    process = subprocess.Popen([sys.executable, "-c", HOLDER, str(REPOSITORY),
                                str(tmp_path / "run")], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline() == "held\n"
        yield process
    finally:
        process.kill()
        process.wait()


@pytest.mark.parametrize("verb", ["train", "recipe"])
def test_training_a_directory_in_use_exits_with_one_error_naming_the_holder(
        verb, holder, tmp_path, fixture_corpus_dir, capsys):
    status = cli.main([verb, "--preset", "tiny", "--data-dir", str(fixture_corpus_dir),
                       "--run-dir", str(tmp_path / "run"), "--steps-per-epoch", "2",
                       "--epochs", "1"])
    lines = capsys.readouterr().err.strip().splitlines()
    errors = [line for line in lines if line.startswith("error: ")]
    assert status == 1
    assert errors == lines[-1:], lines  # one, the last
    assert f"process {holder.pid} on " in errors[0] and str(tmp_path / "run") in errors[0]
    assert os.listdir(tmp_path / "run") == [files.LOCK]  # nothing of a run was written


def test_a_lock_left_by_a_process_killed_with_sigkill_is_free_again(holder, tmp_path):
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    run_dir = tmp_path / "run"
    with runs.lock_run_dir(run_dir) as created:
        assert not created
        with open(run_dir / files.LOCK, encoding="utf-8") as file:
            assert json.load(file)["pid"] == os.getpid()


def test_the_lock_is_reentrant_in_its_process_and_refused_to_others(tmp_path):
    run_dir = tmp_path / "run"
    with runs.lock_run_dir(run_dir) as created:
        assert created
        with runs.lock_run_dir(run_dir) as inner_created:  # the recipe, then training
            assert inner_created
        other = subprocess.run([sys.executable, "-c", HOLDER, str(REPOSITORY), str(run_dir)],
                               input="", capture_output=True, text=True)
        assert other.returncode != 0
        assert f"in use: process {os.getpid()} on " in other.stderr
    assert not (run_dir / files.LOCK).exists()  # released and removed with the block
    with runs.lock_run_dir(run_dir):
        pass


def test_temporary_names_are_each_processs_and_only_dead_ones_are_stale(tmp_path):
    other = subprocess.run(
        [sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); "
         "from keras_transformer import files; print(files.partial_name('a.weights.h5'))",
         str(REPOSITORY)], capture_output=True, text=True, check=True).stdout.strip()
    mine = files.partial_name("a.weights.h5")
    assert mine != other and mine.endswith(".weights.h5") and other.endswith(".weights.h5")
    assert not files.is_stale_partial(mine)
    assert files.is_stale_partial(other)  # that process has ended
    assert not files.is_stale_partial("a.weights.h5")
