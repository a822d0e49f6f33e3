"""Commands refuse, before their long work, outputs that would overwrite what they read,
outputs they could not write, and inputs that are not what they need: a clear error, the
user's files unchanged, no traceback."""

import dataclasses

import pytest

from keras_transformer import cli
from keras_transformer import config as config_lib
from keras_transformer.data import text


@pytest.fixture
def texts(tmp_path):
    source, reference = tmp_path / "source.en", tmp_path / "reference.de"
    source.write_text("A dog runs.\nTwo men.\n", encoding="utf-8")
    reference.write_text("Ein Hund rennt.\nZwei Männer.\n", encoding="utf-8")
    return source, reference


# The artifact is never opened: each refusal comes first.
NO_ARTIFACT = "no-such-artifact"


@pytest.mark.parametrize("option", ["--output", "--json"])
@pytest.mark.parametrize("victim", ["source", "reference"])
def test_evaluation_refuses_to_write_over_its_source_or_reference(texts, capsys, option,
                                                                   victim):
    source, reference = texts
    target = source if victim == "source" else reference
    before = target.read_bytes()
    status = cli.main(["evaluate", NO_ARTIFACT, "--source", str(source),
                              "--reference", str(reference), option, str(target)])
    assert status == 2
    error = capsys.readouterr().err
    assert f"{option} {target} is also the {victim}" in error
    assert target.read_bytes() == before


@pytest.mark.parametrize("option", ["--output", "--json"])
def test_evaluation_refuses_an_output_it_cannot_write_before_translating(texts, tmp_path,
                                                                         capsys, option):
    source, reference = texts
    arguments = ["evaluate", NO_ARTIFACT, "--source", str(source),
                 "--reference", str(reference)]
    assert cli.main([*arguments, option, str(tmp_path)]) == 2
    assert f"{option} {tmp_path} is a folder" in capsys.readouterr().err
    missing = tmp_path / "no-such-folder" / "out.txt"
    assert cli.main([*arguments, option, str(missing)]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_evaluation_names_a_source_or_reference_that_is_a_folder_or_missing(texts, tmp_path,
                                                                          capsys):
    source, reference = texts
    assert cli.main(["evaluate", NO_ARTIFACT, "--source", str(tmp_path),
                            "--reference", str(reference)]) == 2
    assert f"The source {tmp_path} is a folder" in capsys.readouterr().err
    missing = tmp_path / "missing.de"
    assert cli.main(["evaluate", NO_ARTIFACT, "--source", str(source),
                            "--reference", str(missing)]) == 2
    assert f"The reference {missing} is missing" in capsys.readouterr().err


def test_evaluation_of_empty_files_is_an_error_not_a_sacrebleu_crash(tmp_path, capsys):
    empty = tmp_path / "empty.txt"
    empty.write_text("", encoding="utf-8")
    status = cli.main(["evaluate", NO_ARTIFACT, "--source", str(empty),
                              "--reference", str(empty)])
    assert status == 2
    assert "hold no lines: nothing to score" in capsys.readouterr().err


def test_translate_refuses_to_write_over_its_input(texts, capsys):
    source, reference = texts
    before = source.read_bytes()
    status = cli.main(["translate", NO_ARTIFACT, "-i", str(source), "-o", str(source)])
    assert status == 2
    assert f"--output {source} is also the --input" in capsys.readouterr().err
    assert source.read_bytes() == before
    prefixes = source.with_name("prefixes.txt")
    prefixes.write_text("Ein\n", encoding="utf-8")
    status = cli.main(["translate", NO_ARTIFACT, "-i", str(source), "--prefix-file",
                       str(prefixes), "-o", str(prefixes)])
    assert status == 2 and "is also the --prefix-file" in capsys.readouterr().err
    assert prefixes.read_text(encoding="utf-8") == "Ein\n"
    model = source.with_name("model.tflite")
    model.write_bytes(b"model")
    pair = ["--source", str(source), "--reference", str(reference)]
    for verb in (["translate", str(model), "-i", str(source), "-o"], ["fuzz", str(model), "-o"],
                 ["score", str(model), "--source", str(source), "--target", str(reference),
                  "-o"], ["evaluate", str(model), *pair, "-o"],
                 ["evaluate", str(model), *pair, "--json"]):
        assert cli.main([*verb, str(model)]) == 2, verb
        assert "is also the artifact" in capsys.readouterr().err
    assert model.read_bytes() == b"model"


def test_an_output_is_refused_when_its_name_until_complete_is_an_input(texts, capsys):
    # `-o FILE` is written as FILE.partial until it is complete.
    source, reference = texts
    output = source.with_name("out.txt")
    partial = source.with_name("out.txt.partial")
    partial.write_bytes(source.read_bytes())
    for verb in (["translate", NO_ARTIFACT, "-i", str(partial)],
                 ["score", NO_ARTIFACT, "--source", str(partial), "--target",
                  str(reference)]):
        assert cli.main([*verb, "-o", str(output)]) == 2, verb
        assert f"written as {partial} until it is complete" in capsys.readouterr().err
    assert partial.read_bytes() == source.read_bytes() and not output.exists()


def test_translate_refuses_to_write_over_its_standard_input(texts):
    # `translate A -o x.txt < x.txt` would replace x.txt with its translations.
    import subprocess
    import sys

    source, _ = texts
    before = source.read_bytes()
    with open(source, "rb") as stdin:
        result = subprocess.run([sys.executable, "-m", "keras_transformer", "translate",
                                 NO_ARTIFACT, "-o", str(source)], stdin=stdin,
                                capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert f"--output {source} is also the standard input" in result.stderr
    assert source.read_bytes() == before


def test_evaluate_refuses_scores_over_its_translations(texts, tmp_path, capsys):
    source, reference = texts
    output = str(tmp_path / "out.de")
    assert cli.main(["evaluate", NO_ARTIFACT, "--source", str(source), "--reference",
                     str(reference), "-o", output, "--json", output]) == 2
    assert "is also the --output" in capsys.readouterr().err


def test_damaged_gzip_input_is_named_before_a_model_loads(tmp_path, capsys):
    import gzip

    data = bytearray(gzip.compress(b"A dog runs.\n" * 50))
    data[10] ^= 0xFF  # a damaged deflate stream: zlib.error, not OSError
    damaged = tmp_path / "damaged.en.gz"
    damaged.write_bytes(bytes(data))
    assert cli.main(["score", NO_ARTIFACT, "--source", str(damaged), "--target",
                     str(damaged)]) == 2
    assert f"{damaged}: corrupt gzip data" in capsys.readouterr().err


def test_translate_reports_a_missing_or_broken_artifact_without_a_traceback(texts, tmp_path,
                                                                            capsys):
    source, _ = texts
    assert cli.main(["translate", NO_ARTIFACT, "-i", str(source)]) == 2
    assert "neither a SavedModel directory" in capsys.readouterr().err
    garbage = tmp_path / "translator.tflite"
    garbage.write_bytes(b"not a flatbuffer" * 8)
    assert cli.main(["translate", str(garbage), "-i", str(source)]) == 2
    assert f"error: {garbage} is not a TFLite model LiteRT can load" in capsys.readouterr().err


def test_distillation_refuses_to_write_into_the_original_corpus_folder(tmp_path,
                                                                       fixture_corpus_dir,
                                                                       capsys):
    teacher = tmp_path / "teacher"
    teacher.mkdir()
    config = config_lib.preset_config("tiny")
    config = dataclasses.replace(config, data=dataclasses.replace(
        config.data, data_dir=str(fixture_corpus_dir)))
    config.save(str(teacher / "config.json"))
    before = {path.name: path.read_bytes() for path in fixture_corpus_dir.iterdir()}
    status = cli.main(["distill", str(teacher), "-o", str(fixture_corpus_dir)])
    assert status == 2
    assert "is also the folder of the original corpus" in capsys.readouterr().err
    assert {path.name: path.read_bytes() for path in fixture_corpus_dir.iterdir()} == before


def test_distillation_names_a_teacher_that_is_not_a_run_or_an_output_that_is_a_file(
        tmp_path, capsys):
    status = cli.main(["distill", str(tmp_path / "nope"), "-o", str(tmp_path / "out")])
    assert status == 2
    assert "is not a run directory (it has no config.json)" in capsys.readouterr().err
    a_file = tmp_path / "a_file"
    a_file.write_text("", encoding="utf-8")
    assert cli.main(["distill", str(tmp_path / "nope"), "-o", str(a_file)]) == 2
    assert f"The output folder {a_file} is a file" in capsys.readouterr().err


def test_averaging_checks_its_output_and_run_before_averaging(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    config_lib.preset_config("tiny").save(str(run / "config.json"))
    cases = {
        (str(run), "--output", str(tmp_path / "averaged.h5")): "end in .weights.h5",
        (str(run), "--output", str(tmp_path / "nope" / "a.weights.h5")): "does not exist",
        (str(tmp_path / "nope"),): "is not a run directory",
    }
    for arguments, message in cases.items():
        assert cli.main(["average", *arguments]) == 2
        assert message in capsys.readouterr().err, arguments


def test_export_checks_its_arguments_before_building_the_model(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    config_lib.preset_config("tiny").save(str(run / "config.json"))
    a_file = tmp_path / "a_file"
    a_file.write_text("", encoding="utf-8")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text('{"model": {', encoding="utf-8")
    cases = {
        (str(tmp_path / "nope"),): "is not a run directory",
        (str(run), "--ensemble", str(tmp_path / "nope")): "is not a run directory",
        (str(broken),): "config.json: line 1",
        (str(run), "--max-output-length", "0"): "--max-output-length: '0' is not a positive",
        (str(run), "--output", str(a_file)): "is a file: name a folder",
    }
    for arguments, message in cases.items():
        assert cli.main(["export", *arguments]) == 2
        assert message in capsys.readouterr().err, arguments


@pytest.fixture
def run_without_weights(tmp_path, fixture_corpus_dir):
    """A run directory with a config and a tokenizer, and no weights yet."""
    from keras_transformer.data.tokenizer import train_tokenizer
    lines = [*text.read_lines(fixture_corpus_dir / "train.en.gz"),
             *text.read_lines(fixture_corpus_dir / "train.de.gz")]
    tokenizer = train_tokenizer(lines, 64, verbose=False)
    config = config_lib.override(config_lib.preset_config("tiny"), [
        f"vocabulary_size={tokenizer.vocabulary_size}", "num_layers=1"])
    run = tmp_path / "run"
    run.mkdir()
    config.save(str(run / "config.json"))
    tokenizer.save(str(run / "tokenizer"))
    return run


def test_export_names_the_run_file_it_cannot_load_and_writes_nothing(run_without_weights,
                                                                     capsys):
    run = run_without_weights
    weights = run / "model.weights.h5"
    tokenizer_model = run / "tokenizer" / "tokenizer.model"
    intact_tokenizer = tokenizer_model.read_bytes()

    def export_failure():
        assert cli.main(["export", str(run), "--no-quantize"]) == 2
        message = capsys.readouterr().err
        assert message.startswith("error: ") and "Traceback" not in message
        assert message.count("\n") == 1  # one line
        assert not (run / "export").exists()
        return message

    message = export_failure()
    assert "No weights in" in message and "train first" in message
    weights.write_bytes(b"\x89HDF\r\n\x1a\n truncated")
    assert f"{weights}: cannot load these weights" in export_failure()
    tokenizer_model.write_bytes(intact_tokenizer[:100])
    assert f"{tokenizer_model}: content does not match the SHA-256" in export_failure()
    tokenizer_model.unlink()
    assert str(tokenizer_model) in export_failure()
