"""Files from elsewhere: loading never runs code from them, and a broken file is named.

A run directory holds JSON (config, tokenizer metadata), a SentencePiece protobuf and
Keras `.weights.h5` files (HDF5 arrays, no code). The only Keras format that can carry
code is the `.keras` archive, whose loader refuses it in safe mode, the default; the
package never turns safe mode off, nor uses pickle, marshal or eval (checked below).
"""

import ast
import os
import pathlib
import shutil

import keras
import numpy as np
import pytest

from keras_transformer import config as config_lib
from keras_transformer import files, runs
from keras_transformer.data import corpus
from keras_transformer.data.tokenizer import Tokenizer, TokenizerFileError
from keras_transformer.files import TOKENIZER_METADATA as METADATA_FILE
from keras_transformer.files import TOKENIZER_MODEL as MODEL_FILE
from keras_transformer.training import fit
from tests.conftest import REPOSITORY


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory, fixture_corpus_dir):
    """A run directory as training leaves it (untrained weights: only files matter)."""
    run_dir = tmp_path_factory.mktemp("saved") / "run"
    config = config_lib.override(config_lib.preset_config("tiny"), [
        f"data_dir={fixture_corpus_dir}", "num_layers=1"])
    train_text = corpus.load_split(config.data, "train", verbose=False)
    config, _ = fit.prepare_run_dir(config, str(run_dir), train_text)
    runs.build_model(config).save_weights(str(run_dir / files.FINAL_WEIGHTS))
    return run_dir


@pytest.fixture
def run_dir(saved_run, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(saved_run, copy)
    return copy


def truncate(path, fraction=0.5):
    size = os.path.getsize(path)
    with open(path, "r+b") as file:
        file.truncate(int(size * fraction))


def test_an_intact_run_loads(run_dir):
    config, tokenizer, model = runs.load_run(str(run_dir), weights="final")
    assert model.vocabulary_size == tokenizer.vocabulary_size
    assert config.model.vocabulary_size == tokenizer.vocabulary_size


@pytest.mark.parametrize("damage", ["truncated", "empty", "not_hdf5"])
def test_a_broken_weights_file_is_named(run_dir, damage):
    path = run_dir / files.FINAL_WEIGHTS
    if damage == "truncated":
        truncate(path)
    else:
        path.write_bytes(b"" if damage == "empty" else b'{"weights": "elsewhere"}\n')
    with pytest.raises(runs.WeightsFileError, match=f"^{path}: cannot load these weights"):
        runs.load_run(str(run_dir), weights="final")


def test_weights_of_another_architecture_are_named(run_dir):
    config = config_lib.Config.load(run_dir / files.CONFIG)
    other = config_lib.override(config, ["hidden_dim=16", "intermediate_dim=32"])
    path = run_dir / files.FINAL_WEIGHTS
    runs.build_model(other).save_weights(str(path))
    with pytest.raises(runs.WeightsFileError, match=f"^{path}: cannot load"):
        runs.load_run(str(run_dir), weights="final")


def test_a_truncated_config_is_named(run_dir):
    path = run_dir / files.CONFIG
    truncate(path)
    with pytest.raises(ValueError, match=f"^{path}: line \\d+: not valid JSON"):
        runs.load_run(str(run_dir))


def test_config_values_stay_text(run_dir, tmp_path):
    marker = tmp_path / "executed"
    code = f"__import__('pathlib').Path({str(marker)!r}).touch()"
    path = run_dir / files.CONFIG
    path.write_text(path.read_text().replace('"target_language": "de"',
                                             f'"target_language": "{code}"'))
    config = config_lib.Config.load(path)
    assert config.data.target_language == code
    overridden = config_lib.override(config, [f"source_language={code}"])
    assert overridden.data.source_language == code
    assert not marker.exists()


def test_unknown_config_fields_are_refused_by_name(run_dir):
    path = run_dir / files.CONFIG
    text = path.read_text()
    path.write_text(text.replace('"model": {', '"model": {"__class__": "os",', 1))
    with pytest.raises(ValueError, match=f"^{path}: unknown ModelConfig field"):
        config_lib.Config.load(path)


@pytest.mark.parametrize("damage", ["truncated_model", "replaced_model", "broken_metadata"])
def test_a_broken_tokenizer_file_is_named(run_dir, damage):
    directory = run_dir / files.TOKENIZER
    model_path, metadata_path = directory / MODEL_FILE, directory / METADATA_FILE
    if damage == "truncated_model":
        truncate(model_path)
        named = model_path
    elif damage == "replaced_model":
        # Someone who also updates the recorded SHA-256: the protobuf parser decides.
        import hashlib
        import json
        garbage = b"\x08\x96\x01" + os.urandom(64)
        model_path.write_bytes(garbage)
        metadata = json.loads(metadata_path.read_text())
        metadata["sha256"] = hashlib.sha256(garbage).hexdigest()
        metadata_path.write_text(json.dumps(metadata))
        named = model_path
    else:
        truncate(metadata_path)
        named = metadata_path
    with pytest.raises(TokenizerFileError, match=f"^{named}: "):
        Tokenizer.load(directory)
    with pytest.raises(TokenizerFileError):
        runs.load_run(str(run_dir))


def test_a_keras_archive_carrying_code_is_refused(tmp_path, monkeypatch):
    marker = tmp_path / "executed"
    monkeypatch.setenv("KERAS_TRANSFORMER_TEST_MARKER", str(marker))
    # No closure: Keras stores the function's bytecode in the archive's config.
    payload = keras.layers.Lambda(lambda x: x + float(bool(__import__("pathlib").Path(
        __import__("os").environ["KERAS_TRANSFORMER_TEST_MARKER"]).touch())))
    model = keras.Sequential([keras.Input((2,)), payload])
    path = tmp_path / "model.keras"
    model.save(path)
    marker.unlink(missing_ok=True)
    with pytest.raises(ValueError, match="safe_mode"):
        keras.saving.load_model(path)
    assert not marker.exists()
    # The payload is live: with safe mode off, loading runs it.
    keras.saving.load_model(path, safe_mode=False)(np.zeros((1, 2), "float32"))
    assert marker.exists()


UNSAFE_MODULES = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "marshal",
                  "shelve", "joblib", "yaml"}
UNSAFE_CALLS = {"eval", "exec"}


def python_sources():
    roots = [REPOSITORY / "keras_transformer", REPOSITORY / "export"]
    return sorted([*(path for root in roots for path in root.rglob("*.py")),
                   REPOSITORY / "train.py"])


@pytest.mark.parametrize("path", python_sources(),
                         ids=lambda path: str(path.relative_to(REPOSITORY)))
def test_the_package_never_loads_code_from_files(path):
    tree = ast.parse(pathlib.Path(path).read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            assert not {a.name.split(".")[0] for a in node.names} & UNSAFE_MODULES
        elif isinstance(node, ast.ImportFrom):
            assert (node.module or "").split(".")[0] not in UNSAFE_MODULES
        elif isinstance(node, ast.Call):
            assert not (isinstance(node.func, ast.Name) and node.func.id in UNSAFE_CALLS)
            for keyword in node.keywords:
                unsafe = {("safe_mode", False), ("allow_pickle", True)}
                value = getattr(keyword.value, "value", None)
                assert (keyword.arg, value) not in unsafe, ast.unparse(node)
