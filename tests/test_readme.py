"""README's promises: its quick start, Python API and own-data commands run as written
(on the fixture corpus instead of a download), and CI runs its test command as written."""

import ast
import dataclasses
import gzip
import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest

import keras_transformer as kt
from keras_transformer import cli, files
from keras_transformer.data import multi30k
from tests.conftest import REPOSITORY

README = (REPOSITORY / "README.md").read_text(encoding="utf-8")


def code_block(heading):
    """The lines of the bash blocks under the `## heading` of README, in order."""
    section = README.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return [line for block in re.findall(r"```bash\n(.*?)```", section, re.S)
            for line in block.splitlines() if line.strip()]


def test_ci_runs_the_test_command_as_written():
    test_command = code_block("The two commands")[1]
    assert test_command.endswith("python -m pytest")
    assert test_command in (REPOSITORY / ".ci" / "run").read_text(encoding="utf-8")


def test_the_main_job_is_one_short_command():
    main_job = code_block("The two commands")[0]
    assert main_job.endswith("&& keras-transformer recipe")


@pytest.mark.timeout(900)  # trains 60 steps, exports to both formats with the self-check
@pytest.mark.skipif(shutil.which("keras-transformer") is None,
                    reason="the keras-transformer command is installed by pip install -e .")
def test_the_quick_start_runs_as_written(tmp_path, fixture_corpus_dir):
    lines = code_block("Quick start")
    assert [line.split()[1] for line in lines if line.startswith("keras-transformer")] == [
        "train", "export", "evaluate"]
    environment = {**os.environ, "PATH": f"{os.path.dirname(sys.executable)}:"
                                         f"{os.environ['PATH']}"}
    outputs = []
    for line in lines:
        command = line.split("  #")[0]  # without its comment
        if " train " in command:  # a local corpus instead of the download
            command += f" --data-dir {fixture_corpus_dir}"
        result = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=environment,
                                capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, f"{command}\n{result.stdout[-2000:]}{result.stderr[-2000:]}"
        outputs.append(result.stdout)
    assert re.search(r"self-check (\d+)/\1 passed", outputs[1]), outputs[1]
    assert "align attention: TFLite = SavedModel" in outputs[1]  # the table covers every signature
    assert len(outputs[2].splitlines()) == 1  # one translation for the one sentence
    rows = [line.split()[0] for line in outputs[3].splitlines() if line.startswith("test_")]
    assert rows == list(multi30k.TEST_SPLITS)


def python_block(heading):
    """The code of the python blocks under the `## heading` of README."""
    section = README.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return "\n".join(re.findall(r"```python\n(.*?)```", section, re.S))


@pytest.mark.timeout(600)  # trains the tiny preset for an epoch, builds paper_base
def test_the_python_api_runs_as_written(tmp_path, fixture_corpus_dir, monkeypatch):
    code = python_block("Python API")
    assert len([line for line in code.splitlines() if line.strip()]) <= 5
    # Presets read the fixture corpus instead of downloading Multi30K.
    original = kt.preset_config
    monkeypatch.setattr(kt, "preset_config", lambda name: dataclasses.replace(
        original(name), data=dataclasses.replace(original(name).data,
                                                 data_dir=str(fixture_corpus_dir))))
    monkeypatch.chdir(tmp_path)
    *statements, last = ast.parse(code).body
    namespace = {}
    exec(compile(ast.Module(statements, []), "README.md", "exec"), namespace)
    translations = namespace["translate"](["A man is riding a bicycle."])
    assert len(translations) == 1 and isinstance(translations[0], str)
    assert (tmp_path / "runs" / "tiny-api" / "model.weights.h5").exists()
    # Exported on the way, as a run without an export is: the SavedModel it translates
    # with, without the TFLite files (`export` writes those).
    export_dir = tmp_path / "runs" / "tiny-api" / files.EXPORT_DIR
    assert sorted(path.name for path in export_dir.iterdir()) == sorted([
        files.SAVED_MODEL, files.TOKENIZER_MODEL, files.REPORT_JSON, files.REPORT_MARKDOWN])
    exec(compile(ast.Module([last], []), "README.md", "exec"), namespace)
    assert namespace["model"].count_params() == 63_082_496


@pytest.mark.timeout(600)  # trains 3 steps of the tiny preset, evaluates with beam search
def test_training_on_your_own_text_runs_as_written(tmp_path, fixture_corpus_dir, monkeypatch,
                                                   capsys):
    """README's own-data commands on the fixture corpus, renamed as README names it."""
    words = shlex.split(" ".join(code_block("Train on your own parallel text")).replace(
        "\\", " "))
    starts = [i for i, word in enumerate(words) if word == "keras-transformer"]
    train, evaluate = (words[start + 1:end] for start, end in zip(starts, starts[1:] + [None]))
    assert (train[0], evaluate[0]) == ("train", "evaluate")

    def values(command, option, count):
        index = command.index(option)
        return command[index + 1:index + 1 + count]

    renamed = {**dict(zip(values(train, "--train-files", 2), ["train.en.gz", "train.de.gz"])),
               **dict(zip(values(train, "--validation-files", 2), ["val.en.gz", "val.de.gz"])),
               values(evaluate, "--source", 1)[0]: "test_2016_flickr.en.gz",
               values(evaluate, "--reference", 1)[0]: "test_2016_flickr.de.gz"}
    for name, fixture in renamed.items():
        (tmp_path / name).write_bytes(gzip.decompress((fixture_corpus_dir / fixture).read_bytes()))
    monkeypatch.chdir(tmp_path)
    # A few steps of the tiny preset instead of the default preset's 127 epochs.
    assert cli.main(train + ["--preset", "tiny", "--epochs", "1", "--steps-per-epoch", "3",
                             "num_layers=1"]) == 0
    run_dir = tmp_path / values(train, "--run-dir", 1)[0]
    config = kt.Config.load(str(run_dir / files.CONFIG))
    assert config.data.corpus == "files"
    assert [config.data.source_language, config.data.target_language] == [
        values(train, "--source-language", 1)[0], values(train, "--target-language", 1)[0]]
    assert config.data.train_files == tuple(values(train, "--train-files", 2))
    capsys.readouterr()
    assert cli.main(evaluate) == 0
    output = capsys.readouterr().out
    source = values(evaluate, "--source", 1)[0]
    sentences = len((tmp_path / source).read_text(encoding="utf-8").splitlines())
    # One row for the test file: its sentence count, then BLEU and chrF.
    assert re.search(rf"^{re.escape(source)}\s+{sentences}\s+[\d.]+\s+[\d.]+$", output,
                     re.M), output
