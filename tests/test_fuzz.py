"""Hostile inputs through the exported SavedModel and TFLite translators.

The default run sends a few hundred generated sentences (a batch of 512 among them)
through each artifact; `pytest -m slow tests/test_fuzz.py` runs the full command on
10,000 sentences per artifact (see docs/scaling.md).
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from keras_transformer.serving import runners
from keras_transformer.tools import fuzzing
from tests.conftest import REPOSITORY
from tests.export_helpers import tiny_export

CI_INPUTS = 600
FULL_INPUTS = 10_000
FULL_RUN_TIMEOUT_S = 900


@pytest.fixture(scope="module")
def exported():
    return tiny_export()


def _is_invalid_utf8(sentence):
    try:
        sentence.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


def test_generator_covers_every_hostile_kind():
    batches = list(fuzzing.generate_batches(seed=0, inputs=FULL_INPUTS))
    sentences = [sentence for batch in batches for sentence in batch]
    assert len(sentences) == FULL_INPUTS
    assert all(isinstance(sentence, bytes) for sentence in sentences)
    assert [] in batches and max(map(len, batches)) == fuzzing.MAX_BATCH
    assert len({len(batch) for batch in batches}) > 20  # mixed batch sizes
    text = [s.decode("utf-8") for s in sentences if not _is_invalid_utf8(s)]
    assert sum(map(_is_invalid_utf8, sentences)) > 100
    assert b"" in sentences
    assert any(t and not t.strip() for t in text)  # whitespace only
    assert any(any(ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 for c in t) for t in text)
    planes = {ord(c) >> 16 for t in text for c in t}
    assert set(range(17)) <= planes
    assert any(0xE000 <= ord(c) <= 0xF8FF for t in text for c in t)  # private use
    assert max(len(s) for s in sentences) > 50_000  # bytes


def test_generator_is_reproducible():
    first = list(fuzzing.generate_batches(seed=3, inputs=2000))
    assert first == list(fuzzing.generate_batches(seed=3, inputs=2000))
    assert first != list(fuzzing.generate_batches(seed=4, inputs=2000))


def test_fuzz_reports_errors_wrong_counts_and_slow_calls(monkeypatch):
    clock = [0.0]  # a fake clock: only a "slow" call takes time
    monkeypatch.setattr(fuzzing.time, "perf_counter", lambda: clock[0])

    def runner(batch):
        if batch and batch[0] == b"raise":
            raise RuntimeError("boom")
        if batch and batch[0] == b"slow":
            clock[0] += 0.05
        count = len(batch) - (batch[:1] == [b"drop"])
        return {"translations": np.array([b"x"] * count, dtype=object),
                "token_ids": np.zeros([count, 2], "int32")}

    report = fuzzing.fuzz(runner, [[b"ok", b"ok"], [b"raise"], [b"drop", b"a"], [b"slow"]],
                          max_seconds=0.04)
    assert (report["inputs"], report["calls"]) == (6, 4)
    assert (report["errors"], report["wrong_counts"], report["too_slow"]) == (1, 1, 1)
    assert not report["passed"]
    assert report["slowest_batch_size"] == 1 and report["max_seconds_per_call"] >= 0.05
    problems = [failure["problem"] for failure in report["failures"]]
    assert problems[0] == "RuntimeError: boom"
    assert problems[1] == "(1,) translations for 2 inputs"
    assert problems[2].startswith("took ")


@pytest.mark.parametrize("artifact", ["saved_model", "tflite"])
def test_exported_translator_answers_every_hostile_batch(exported, artifact):
    runner = runners.open_runner(getattr(exported, artifact))
    # No time limit per call here: a hang fails the test by its timeout instead.
    report = fuzzing.fuzz(runner, fuzzing.generate_batches(seed=1, inputs=CI_INPUTS),
                          max_seconds=float("inf"))
    assert report["inputs"] == CI_INPUTS
    assert report["passed"], json.dumps(report["failures"], indent=2)


# The export (55 s, when no other test process built it first: `tiny_export`) and the
# command on 10,000 inputs per artifact (90 s), measured on 2 busy cores; the command's
# own limit, FULL_RUN_TIMEOUT_S, comes first.
@pytest.mark.timeout(FULL_RUN_TIMEOUT_S + 300)
@pytest.mark.slow
def test_full_fuzz_run(exported, tmp_path):
    report_path = tmp_path / "fuzz_report.json"
    result = subprocess.run(
        [sys.executable, "-m", "keras_transformer", "fuzz", exported.saved_model,
         exported.tflite, "--count", str(FULL_INPUTS), "--seed", "0", "--max-seconds", "inf",
         "--output", str(report_path)],
        cwd=REPOSITORY, capture_output=True, text=True, timeout=FULL_RUN_TIMEOUT_S,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    reports = json.loads(report_path.read_text())
    assert len(reports) == 2
    for report in reports.values():
        assert report["inputs"] == FULL_INPUTS and report["passed"]
