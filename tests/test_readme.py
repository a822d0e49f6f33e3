"""README's promises: its quick start runs as written (on the fixture corpus instead of a
download), and CI runs its test command as written."""

import ast
import dataclasses
import os
import re
import shutil
import subprocess
import sys

import pytest

import keras_transformer as kt
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
    assert "All checks passed." in outputs[1]
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
    exec(compile(ast.Module([last], []), "README.md", "exec"), namespace)
    assert namespace["model"].count_params() == 63_082_496
