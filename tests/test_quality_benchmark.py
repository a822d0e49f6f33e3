"""The quality benchmark: the recipe chooses on validation, reads the test splits last,
scores the exported SavedModel on every one of them, and records a row."""

import gzip
import json
import os
import re
import shutil
import subprocess
import sys

import keras
import pytest
import sacrebleu

from benchmarks import quality
from keras_transformer import evaluation, files, recipe
from keras_transformer.data import multi30k
from keras_transformer.data.text import read_lines
from keras_transformer.training import callbacks as callbacks_lib
from tests.conftest import REPOSITORY


def test_append_row_makes_the_table_then_extends_it_in_place(tmp_path):
    path = tmp_path / "RESULTS.md"
    path.write_text("# Results\n\n## Other\n\ntext\n", encoding="utf-8")
    quality.append_row(str(path), "| first |")
    text = path.read_text(encoding="utf-8")
    assert text.index("## Other") < text.index(quality.TABLE_HEADING) < text.index("| first |")
    path.write_text(text + "\n## Later section\n\nmore\n", encoding="utf-8")
    quality.append_row(str(path), "| second |")
    lines = path.read_text(encoding="utf-8").splitlines()
    assert lines.index("| second |") == lines.index("| first |") + 1
    assert lines.index("## Later section") > lines.index("| second |")
    assert "text" in lines and "more" in lines


def test_append_row_extends_the_quality_table_not_a_later_table_of_its_section(tmp_path):
    path = tmp_path / "RESULTS.md"
    quality.append_row(str(path), "| first |")
    path.write_text(path.read_text(encoding="utf-8")
                    + "\nWhat the rows show.\n\n### Ensembles\n\n| a | b |\n|---|---|\n"
                      "| 1 | 2 |\n\nMore.\n", encoding="utf-8")
    quality.append_row(str(path), "| second |")
    lines = path.read_text(encoding="utf-8").splitlines()
    assert lines.index("| second |") == lines.index("| first |") + 1
    assert lines.index("| 1 | 2 |") > lines.index("What the rows show.")


@pytest.fixture
def corpus_without_test_splits(tmp_path, fixture_corpus_dir, monkeypatch):
    """The fixture corpus whose test files appear only when the recipe scores them.

    Reading a test split before every choice is made would then fail on a missing file.
    """
    data_dir = tmp_path / "corpus"
    shutil.copytree(fixture_corpus_dir, data_dir)
    test_files = [path for path in data_dir.iterdir()
                  if path.name.split(".")[0] in multi30k.TEST_SPLITS]
    assert len(test_files) == 9
    # The literature's tokenized references, as a Multi30K copy holds them in tok/.
    (data_dir / multi30k.TOKENIZED_FOLDER).mkdir()
    for split in multi30k.TOKENIZED_SPLITS:
        lines = evaluation.tokenize_as_literature(read_lines(data_dir / f"{split}.de.gz"),
                                                  "de")
        (data_dir / multi30k.TOKENIZED_FOLDER / multi30k.tokenized_file_name(
            split, "de")).write_text("".join(f"{line}\n" for line in lines), "utf-8")
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    for path in test_files:
        path.rename(hidden / path.name)
    score_test_splits = recipe.score_test_splits
    revealed = []

    def reveal_then_score(*args, **kwargs):
        for path in hidden.iterdir():
            shutil.copyfile(path, data_dir / path.name)
        revealed.append(True)
        return score_test_splits(*args, **kwargs)

    monkeypatch.setattr(recipe, "score_test_splits", reveal_then_score)
    return data_dir, revealed


@pytest.fixture
def a_minute_per_update(monkeypatch):
    """A fake clock for the time budget: every weight update takes a minute, however
    fast this machine trains."""
    monkeypatch.setattr(callbacks_lib.TimeBudget, "elapsed_minutes", lambda budget: float(
        keras.ops.convert_to_numpy(budget.model.optimizer.iterations)))


@pytest.mark.timeout(900)  # trains, chooses, exports and scores twice: about 4 minutes
def test_chooses_on_validation_scores_every_test_split_last_and_records_one_row(
        tmp_path, corpus_without_test_splits, a_minute_per_update, capsys):
    data_dir, revealed = corpus_without_test_splits
    run_dir, results = tmp_path / "run", tmp_path / "RESULTS.md"
    arguments = ["--preset", "tiny", "--data-dir", str(data_dir),
                 "--run-dir", str(run_dir), "--minutes", "1", "--length-penalties",
                 "0.6", "--results", str(results), "--note", "smoke", "num_layers=1"]
    assert quality.main([*arguments, "--json", str(tmp_path / "first.json")]) == 0
    assert revealed == [True]
    # The recipe's progress shows, as `keras-transformer recipe` shows it.
    progress = capsys.readouterr().err.splitlines()
    assert progress.count(f"Training into {run_dir}") == 1  # once: one handler
    assert any(line.startswith("Choosing on validation 1/") for line in progress), progress
    first = json.loads((tmp_path / "first.json").read_text(encoding="utf-8"))
    assert first["training"]["updates"] == 1  # the budget ends training after one batch
    assert first["config"]["train"]["time_budget_minutes"] == 1
    assert first["config"]["model"]["num_layers"] == 1
    assert first["selection"]["weights"] == "newest checkpoint"
    assert first["selection"]["sentences"] == 29  # every validation sentence
    assert first["validation"]["beam"]["sentences"] == 29

    # Every test split, each decoder, scored as sacreBLEU scores the kept translations.
    assert sorted(first["test"]) == sorted(multi30k.TEST_SPLITS)
    for split, decoders in first["test"].items():
        references = read_lines(data_dir / f"{split}.de.gz")
        for decoder in ("beam", "greedy"):
            scores = decoders[decoder]
            kept = tmp_path / first["translations"][split][decoder]
            assert kept.name == f"first.{split}.{decoder}.de.gz"
            hypotheses = gzip.decompress(kept.read_bytes()).decode("utf-8").splitlines()
            assert len(hypotheses) == len(references)
            bleu = sacrebleu.metrics.BLEU()
            assert scores["bleu"]["score"] == pytest.approx(
                bleu.corpus_score(hypotheses, [references]).score)
            assert scores["bleu"]["signature"] == str(bleu.get_signature())
            tokenized = read_lines(scores["tokenized_reference"])
            assert scores["bleu_tok"]["score"] == pytest.approx(sacrebleu.corpus_bleu(
                evaluation.tokenize_as_literature(hypotheses, "de"), [tokenized],
                tokenize="none").score)
            assert scores["artifact"].endswith("saved_model") and scores["beam"] == (
                decoder == "beam")

    # Again on the finished run: training is not repeated, nor the export, which holds
    # the same choice (the benchmark exports without the self-check); a second row is
    # added.
    def export_id():
        report = run_dir / files.EXPORT_DIR / files.REPORT_JSON
        return json.loads(report.read_text(encoding="utf-8"))["export_id"]

    first_export = export_id()
    assert quality.main([*arguments, "--json", str(tmp_path / "second.json")]) == 0
    second = json.loads((tmp_path / "second.json").read_text(encoding="utf-8"))
    assert second["training"] == first["training"]
    assert export_id() == first_export
    # The same translations give the same bytes: the gzip header holds no time or name.
    name = "test_2017_mscoco"
    assert ((tmp_path / second["translations"][name]["beam"]).read_bytes()
            == (tmp_path / first["translations"][name]["beam"]).read_bytes())
    rows = [line for line in results.read_text(encoding="utf-8").splitlines()
            if line.startswith("| ") and "smoke" in line]
    assert len(rows) == 2 and all(row.count("|") == 13 for row in rows)
    assert "| `tiny --time-budget-minutes 1 num_layers=1` |" in rows[0]  # not the command
    mscoco = first["test"]["test_2017_mscoco"]
    assert (f"{mscoco['beam']['bleu']['score']:.1f}" in rows[0]
            and f" / {mscoco['beam']['bleu_tok']['score']:.1f} "
                f"({mscoco['greedy']['bleu_tok']['score']:.1f}) |" in rows[0])

    # A row recorded before the literature's BLEU existed gets it from its translations.
    for decoders in (first["validation"], *first["test"].values()):
        for scores in decoders.values():
            scores.pop("bleu_tok", None)
    recorded = json.loads((tmp_path / "first.json").read_text(encoding="utf-8"))
    (tmp_path / "first.json").write_text(json.dumps(first), encoding="utf-8")
    assert quality.main(["--rescore", str(tmp_path / "first.json"), "--data-dir",
                         str(data_dir), "--results", "none"]) == 0
    rescored = json.loads((tmp_path / "first.json").read_text(encoding="utf-8"))
    assert rescored["test"] == recorded["test"]
    assert rescored["validation"] == recorded["validation"]


def run_script(*arguments, **environment):
    # A user's shell sets no TF_CPP_MIN_LOG_LEVEL; tracebacks in plain text (Python 3.13
    # colours them where FORCE_COLOR is set).
    environment = {**{key: value for key, value in os.environ.items()
                      if key not in ("TF_CPP_MIN_LOG_LEVEL", "FORCE_COLOR")},
                   "PYTHON_COLORS": "0", **environment}
    return subprocess.run([sys.executable, "-m", "benchmarks.quality", *arguments],
                          capture_output=True, text=True, env=environment, timeout=300,
                          cwd=REPOSITORY)


def test_the_script_drops_tensorflows_start_up_lines():
    # TensorFlow writes them from C++ as the script's imports load it.
    result = run_script("--help")
    assert result.returncode == 0 and "--rescore" in result.stdout
    # absl's lines (`I0000 00:00:…`, `E0000 …`) and its first warning.
    noise = [line for line in result.stderr.splitlines()
             if re.match(r"[IWEF]\d{4} ", line) or "absl::InitializeLog" in line]
    assert noise == []


def test_an_import_that_fails_under_the_filter_shows_its_whole_traceback():
    # Keras fails as it loads; the filter of stderr started before it.
    result = run_script("--help", KERAS_BACKEND="no-such-backend")
    lines = result.stderr.splitlines()
    assert result.returncode == 1 and "Traceback (most recent call last):" in lines
    assert lines[-1].startswith("ValueError:") and "no-such-backend" in lines[-1]
