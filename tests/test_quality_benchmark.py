"""The quality benchmark: trains, averages, exports, scores the SavedModel, records a row."""

import gzip
import json
import os

import pytest
import sacrebleu

from benchmarks import quality
from keras_transformer import corpus


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


def test_trains_exports_scores_the_saved_model_and_records_one_row(tmp_path,
                                                                    fixture_corpus_dir):
    run_dir, results = tmp_path / "run", tmp_path / "RESULTS.md"
    arguments = ["--preset", "tiny", "--data-dir", str(fixture_corpus_dir),
                 "--run-dir", str(run_dir), "--minutes", "0.001", "--average", "2",
                 "--results", str(results), "--note", "smoke", "num_layers=1"]
    assert quality.main([*arguments, "--json", str(tmp_path / "first.json")]) == 0
    first = json.loads((tmp_path / "first.json").read_text(encoding="utf-8"))
    assert first["training"]["updates"] == 1  # the budget ends training after one batch
    assert first["config"]["train"]["time_budget_minutes"] == 0.001
    assert first["config"]["model"]["num_layers"] == 1

    # The scores are those of the SavedModel's translations, written beside the run.
    _, reference_path = corpus.corpus_files(quality.make_config(
        quality.parse_arguments(arguments)).data, "test")
    references = corpus.read_lines(reference_path)
    for decoder in ("beam", "greedy"):
        hypotheses = (run_dir / f"test.{decoder}.de").read_text(encoding="utf-8").splitlines()
        assert len(hypotheses) == len(references)
        expected = sacrebleu.corpus_bleu(hypotheses, [references]).score
        assert first["scores"][decoder]["bleu"]["score"] == pytest.approx(expected)
        assert first["scores"][decoder]["artifact"].endswith(os.path.join("export",
                                                                          "saved_model"))
    assert first["scores"]["beam"]["beam"] and not first["scores"]["greedy"]["beam"]
    # Kept beside the JSON, for comparing a later row with this one sentence by sentence.
    for decoder in ("beam", "greedy"):
        kept = tmp_path / first["translations"][decoder]
        assert kept.name == f"first.test.{decoder}.de.gz"
        assert gzip.decompress(kept.read_bytes()) == (run_dir / f"test.{decoder}.de").read_bytes()
    assert len(first["averaged"]["checkpoints"]) >= 1

    # Again on the finished run: training is not repeated, and a second row is added.
    assert quality.main([*arguments, "--json", str(tmp_path / "second.json")]) == 0
    second = json.loads((tmp_path / "second.json").read_text(encoding="utf-8"))
    assert second["training"] == first["training"]
    # The same translations give the same bytes: the gzip header holds no time or name.
    assert ((tmp_path / second["translations"]["beam"]).read_bytes()
            == (tmp_path / first["translations"]["beam"]).read_bytes())
    rows = [line for line in results.read_text(encoding="utf-8").splitlines()
            if line.startswith("| 20")]
    assert len(rows) == 2 and all("smoke" in row and "1 updates" in row for row in rows)
    assert f"**{first['scores']['beam']['bleu']['score']:.1f}**" in rows[0]


def test_refuses_a_run_directory_with_an_unfinished_training(tmp_path):
    (tmp_path / "run").mkdir()
    with pytest.raises(SystemExit, match="holds no finished quality run"):
        quality.train_once(None, str(tmp_path / "run"))
