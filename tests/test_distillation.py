"""Sequence-level distillation: the student's corpus, and carrying on after a failure."""

import dataclasses
import json
import pathlib
import re

import pytest

from keras_transformer import cli, files, runs, translate
from keras_transformer import config as config_lib
from keras_transformer.data import corpus, text
from keras_transformer.serving import runners
from keras_transformer.tools import distillation


def teacher_translation(sentence):
    return f"<{sentence}>"


class Teacher:
    """Stands in for the exported teacher; fails on call `fail_at` (1-based) if set."""

    def __init__(self, fail_at=None):
        self.fail_at = fail_at
        self.translated = []

    def __call__(self, batch):
        if len(self.translated) + 1 == self.fail_at:
            raise RuntimeError("the decoder failed")
        self.translated.append(list(batch))
        return {"translations": [teacher_translation(s).encode() for s in batch]}


@pytest.fixture
def teacher_run(tmp_path, fixture_corpus_dir):
    run = tmp_path / "teacher"
    saved_model = pathlib.Path(runs.saved_model_dir(str(run)))
    saved_model.mkdir(parents=True)
    (saved_model / "saved_model.pb").touch()
    preset = config_lib.preset_config("tiny")
    config = dataclasses.replace(preset, data=dataclasses.replace(
        preset.data, data_dir=str(fixture_corpus_dir)))
    config.save(str(run / "config.json"))
    return run


def use_teacher(monkeypatch, teacher):
    monkeypatch.setattr(runners, "open_runner", lambda artifact, beam: teacher)


def test_student_corpus_is_the_original_pairs_then_the_teacher_translations(
        teacher_run, tmp_path, fixture_corpus_dir, monkeypatch):
    use_teacher(monkeypatch, Teacher())
    output = tmp_path / "distilled"
    count = distillation.distill(str(teacher_run), str(output), verbose=False)

    sources = text.read_lines(fixture_corpus_dir / "train.en.gz")
    targets = text.read_lines(fixture_corpus_dir / "train.de.gz")
    assert count == len(sources) > 0
    assert text.read_lines(output / "train.en.gz") == sources + sources
    assert text.read_lines(output / "train.de.gz") == targets + [
        teacher_translation(s) for s in sources]
    for name in ("val.en.gz", "val.de.gz", "test_2016_flickr.en.gz",
                 "test_2016_flickr.de.gz"):
        assert text.read_lines(output / name) == text.read_lines(
            fixture_corpus_dir / name)
    # Training reads it as it reads Multi30K.
    student_data = config_lib.DataConfig(data_dir=str(output))
    pairs = corpus.load_split(student_data, "train", filter_pairs=False, verbose=False)
    assert len(pairs) == 2 * len(sources)


def distill_failing_at_the_third_window(teacher_run, output, monkeypatch):
    """Distils into `output` with a teacher that fails at its third window of 4."""
    monkeypatch.setattr(translate, "WINDOW_BATCHES", 1)
    use_teacher(monkeypatch, Teacher(fail_at=3))
    with pytest.raises(RuntimeError, match="the decoder failed"):
        distillation.distill(str(teacher_run), str(output), batch_size=4, verbose=False)


def test_distillation_carries_on_from_the_translations_a_failed_run_wrote(
        teacher_run, tmp_path, fixture_corpus_dir, monkeypatch):
    output = tmp_path / "distilled"
    distill_failing_at_the_third_window(teacher_run, output, monkeypatch)
    teacher_file = output / "teacher.train.de"
    sources = text.read_lines(fixture_corpus_dir / "train.en.gz")
    assert text.read_lines(teacher_file) == [teacher_translation(s) for s in sources[:8]]
    assert not (output / "train.de.gz").exists()
    with open(teacher_file, "ab") as file:
        file.write(b"<a line cut sh")  # as a write interrupted mid-line leaves it

    teacher = Teacher()
    use_teacher(monkeypatch, teacher)
    distillation.distill(str(teacher_run), str(output), batch_size=4, verbose=False)
    assert sorted(sum(teacher.translated, [])) == sorted(sources[8:])  # by length per batch
    assert text.read_lines(output / "train.de.gz")[len(sources):] == [
        teacher_translation(s) for s in sources]


def test_distillation_refuses_to_continue_another_teachers_translations(
        teacher_run, tmp_path, monkeypatch):
    use_teacher(monkeypatch, Teacher())
    output = tmp_path / "distilled"
    distillation.distill(str(teacher_run), str(output), verbose=False)
    with pytest.raises(ValueError, match="another teacher"):
        distillation.distill(str(teacher_run), str(output), beam=True, verbose=False)
    saved_model = pathlib.Path(runs.saved_model_dir(str(teacher_run)))
    (saved_model / "saved_model.pb").write_bytes(b"re-exported")
    with pytest.raises(ValueError, match="another teacher"):
        distillation.distill(str(teacher_run), str(output), verbose=False)


def test_distillation_refuses_to_continue_the_translations_of_other_sources(
        teacher_run, tmp_path, fixture_corpus_dir, monkeypatch):
    # Another copy of the corpus with as many lines: translations of the first copy's
    # sources must not be paired with the second's.
    import shutil

    output = tmp_path / "distilled"
    distill_failing_at_the_third_window(teacher_run, output, monkeypatch)
    other = tmp_path / "other_copy"
    shutil.copytree(fixture_corpus_dir, other)
    sources = text.read_lines(other / "train.en.gz")
    files.write_lines(str(other / "train.en.gz"), sources[::-1])
    use_teacher(monkeypatch, Teacher())
    with pytest.raises(ValueError, match="another teacher, decoder or corpus"):
        distillation.distill(str(teacher_run), str(output), data_dir=str(other),
                             batch_size=4, verbose=False)


def test_distillation_refuses_a_teacher_of_another_corpus(tmp_path, capsys):
    run = tmp_path / "teacher"
    run.mkdir()
    preset = config_lib.preset_config("tiny")
    dataclasses.replace(preset, data=dataclasses.replace(
        preset.data, corpus="own", train_files=("a.en", "a.de"))).save(str(run / "config.json"))
    with pytest.raises(ValueError, match="corpus='multi30k'"):
        distillation.distill(str(run), str(tmp_path / "out"), verbose=False)
    # The command says so in one line, without a traceback.
    assert cli.main(["distill", str(run), "-o", str(tmp_path / "out")]) == 2
    assert "corpus='multi30k'" in capsys.readouterr().err


def test_an_artifact_exported_from_the_teacher_run_translates_instead_of_its_own(
        teacher_run, tmp_path, monkeypatch, capsys):
    ensemble = tmp_path / "ensemble" / "saved_model"
    ensemble.mkdir(parents=True)
    (ensemble / "saved_model.pb").write_bytes(b"an ensemble")
    opened = []

    def open_runner(artifact, beam):
        opened.append((artifact, beam))
        return Teacher()

    monkeypatch.setattr(runners, "open_runner", open_runner)
    output = tmp_path / "distilled"
    assert cli.main(["distill", str(teacher_run), "-o", str(output), "--artifact",
                     str(ensemble)]) == 0
    assert opened == [(str(ensemble), False)]
    assert (output / "train.de.gz").exists()
    # The run's own SavedModel is another teacher: its translations do not continue these.
    with pytest.raises(ValueError, match="another teacher"):
        distillation.distill(str(teacher_run), str(output), verbose=False)
    # An artifact that is not there: one line saying what was expected, no traceback.
    assert cli.main(["distill", str(teacher_run), "-o", str(tmp_path / "other"), "--artifact",
                              str(tmp_path / "missing")]) == 2
    assert "neither a SavedModel directory" in capsys.readouterr().err


def test_an_artifact_of_another_language_pair_is_refused_before_translating(
        teacher_run, tmp_path, monkeypatch, capsys):
    export_dir = tmp_path / "en-fr"
    (export_dir / "saved_model").mkdir(parents=True)
    (export_dir / "saved_model" / "saved_model.pb").write_bytes(b"an en-fr model")
    report = {"run": {"config": {"data": {"source_language": "en",
                                          "target_language": "fr"}}}}
    (export_dir / files.REPORT_JSON).write_text(json.dumps(report))
    teacher = Teacher()
    use_teacher(monkeypatch, teacher)
    output = tmp_path / "distilled"
    assert cli.main(["distill", str(teacher_run), "-o", str(output), "--artifact",
                              str(export_dir / "saved_model")]) == 2
    assert "translates en→fr" in capsys.readouterr().err
    assert teacher.translated == []
    # The same report naming the run's own pair lets it through.
    report["run"]["config"]["data"]["target_language"] = "de"
    (export_dir / files.REPORT_JSON).write_text(json.dumps(report))
    assert cli.main(["distill", str(teacher_run), "-o", str(output), "--artifact",
                              str(export_dir / "saved_model")]) == 0
    assert teacher.translated


@pytest.mark.parametrize("text, problem", [
    ('{"run": {"config"', "line 1: not valid JSON"),
    ('["en", "fr"]', "expected a JSON object, got list"),
])
def test_an_unreadable_export_report_is_named_with_the_fix(
        teacher_run, tmp_path, monkeypatch, capsys, text, problem):
    export_dir = tmp_path / "export"
    (export_dir / "saved_model").mkdir(parents=True)
    (export_dir / "saved_model" / "saved_model.pb").write_bytes(b"a model")
    report_path = export_dir / files.REPORT_JSON
    report_path.write_text(text)
    teacher = Teacher()
    use_teacher(monkeypatch, teacher)
    assert cli.main(["distill", str(teacher_run), "-o", str(tmp_path / "distilled"), "--artifact",
                              str(export_dir / "saved_model")]) == 2
    error = capsys.readouterr().err
    assert f"{report_path}: {problem}" in error and "keras-transformer export" in error
    assert teacher.translated == []


def test_an_unreadable_teacher_record_is_named_with_the_fix(
        teacher_run, tmp_path, monkeypatch):
    monkeypatch.setattr(translate, "WINDOW_BATCHES", 1)
    use_teacher(monkeypatch, Teacher(fail_at=3))
    output = tmp_path / "distilled"
    with pytest.raises(RuntimeError, match="the decoder failed"):
        distillation.distill(str(teacher_run), str(output), batch_size=4, verbose=False)
    translations = output / distillation.TEACHER_FILE.format(language="de")
    record = pathlib.Path(f"{translations}.teacher.json")
    record.write_text("{truncated")
    use_teacher(monkeypatch, Teacher())
    unreadable = rf"^{re.escape(str(record))}: line 1: not valid JSON .*Delete it"
    with pytest.raises(ValueError, match=unreadable):
        distillation.distill(str(teacher_run), str(output), verbose=False)
