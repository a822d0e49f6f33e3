"""Training on Keras's JAX backend through the same `train`: the run trains, validates
with BLEU, resumes exactly, splits batches over devices without changing the loss, and
exports and self-checks under TensorFlow. Each JAX run is a subprocess (a process picks
its backend once); the checks of its outputs run here, on TensorFlow."""

import importlib.util
import json
import math
import os
import subprocess
import sys

import h5py
import keras
import numpy as np
import pytest

from keras_transformer import files
from keras_transformer.data.tokenizer import END_ID, PAD_ID, START_ID
from keras_transformer.model import Transformer
from keras_transformer.serving import export, self_check
from tests.conftest import fixture_corpus

pytestmark = [
    pytest.mark.jax,
    pytest.mark.skipif(importlib.util.find_spec("jax") is None,
                       reason="JAX is not installed (pip install -e '.[jax]')"),
]

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A tiny run: two epochs of 6 updates, a checkpoint and a backup every 3.
RUN = ["--preset", "tiny", "--data-dir", str(fixture_corpus()), "steps_per_epoch=6",
       "checkpoint_every_steps=3", "log_every_steps=3"]


def run_jax(code, *, devices=1, timeout=600):
    """Runs `code` in a fresh process on the JAX backend (with `devices` CPU devices)."""
    environment = {**os.environ, "KERAS_BACKEND": "jax", "TF_CPP_MIN_LOG_LEVEL": "3",
                   "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=timeout, cwd=REPOSITORY, env=environment)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def train_code(*runs):
    """Code that trains each `(run_dir, extra arguments)` with the train command."""
    lines = ["import keras", "assert keras.backend.backend() == 'jax'",
             "from keras_transformer import cli"]
    lines += [f"assert cli.main(['train', *{RUN!r}, '--run-dir', {str(run_dir)!r}, "
              f"*{list(extra)!r}]) == 0" for run_dir, extra in runs]
    return "\n".join(lines) + "\n"


def model_weights(path):
    """The model weights (not the optimizer's) of a Keras weights file, by name."""
    with h5py.File(path, "r") as file:
        names = []
        file.visititems(lambda name, item: names.append(name)
                        if isinstance(item, h5py.Dataset) else None)
        return {name: np.asarray(file[name]) for name in names
                if not name.startswith("optimizer")}


def distance(a, b):
    return math.sqrt(sum(float(np.sum((a[name] - b[name]) ** 2)) for name in a))


@pytest.fixture(scope="module")
def jax_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("jax") / "run"
    run_jax(train_code((run_dir, ["epochs=2", "bleu_sentences=8", "monitor_sentences=2"])))
    return run_dir


@pytest.mark.timeout(900)
def test_a_run_trained_on_jax_has_everything_a_tensorflow_run_has(jax_run):
    for name in (files.CONFIG, files.FINAL_WEIGHTS, files.TOKENIZER, files.BACKUP):
        assert (jax_run / name).exists(), name
    checkpoints = sorted(os.listdir(jax_run / files.CHECKPOINTS))
    assert checkpoints == [files.BEST_INFO, files.BEST_WEIGHTS,
                           *(files.CHECKPOINT.format(step=step) for step in (3, 6, 9, 12))]
    best = json.loads((jax_run / files.CHECKPOINTS / files.BEST_INFO).read_text())
    assert best["step"] in (6, 12) and best["bleu"] >= 0  # BLEU at both epochs' ends
    for log in ("train", "validation"):
        assert os.listdir(jax_run / files.LOGS / log), log


@pytest.mark.timeout(900)
def test_a_run_trained_on_jax_exports_and_passes_the_self_check(jax_run):
    export_dir, _ = export.export_run(str(jax_run), quantize=False)
    checks = self_check.check_run(str(jax_run), export_dir=export_dir, count=20)
    failed = [check for check in checks if check.passed is False]
    assert not failed, self_check.format_table(checks)


@pytest.mark.timeout(900)
def test_a_resumed_jax_run_ends_with_the_uninterrupted_runs_weights(tmp_path):
    """Dropout is on: the backup must restore the random generators' state as well."""
    uninterrupted, resumed = tmp_path / "uninterrupted", tmp_path / "resumed"
    run_jax(train_code((uninterrupted, ["epochs=2"]), (resumed, ["epochs=1"]),
                       (resumed, ["epochs=2"])))
    final = model_weights(uninterrupted / files.FINAL_WEIGHTS)
    start = model_weights(uninterrupted / files.CHECKPOINTS / files.CHECKPOINT.format(step=3))
    assert distance(final, start) > 0.1
    again = model_weights(resumed / files.FINAL_WEIGHTS)
    assert again.keys() == final.keys()
    assert distance(again, final) <= 1e-6 * distance(final, start)


EVALUATE_ON_DEVICES = """
import json, keras
from keras_transformer import config as config_lib
from keras_transformer.data import corpus, tokenizer as tokenizer_lib
from keras_transformer.training import distribution, fit, runs
config = config_lib.override(config_lib.preset_config("tiny"), ["data_dir={data_dir}"])
splits = {{split: corpus.load_split(config.data, split, verbose=False)
          for split in ("train", "validation")}}
tokenizer = tokenizer_lib.train_tokenizer(
    splits["train"].source_lines + splits["train"].target_lines, 300, verbose=False)
config = config_lib.override(config, [f"vocabulary_size={{tokenizer.vocabulary_size}}"])
_, validation, _ = fit.make_datasets(config, tokenizer, splits, rows_multiple=2)
keras.utils.set_random_seed(0)
losses = []
weights = None
for devices in (["cpu:0"], None):
    strategy = distribution.keras_distribution(devices)
    with strategy.scope():
        model = runs.build_model(config)
        if weights is not None:
            model.set_weights(weights)
        weights = model.get_weights()
        fit.compile_model(model, config.train)
        losses.append(model.evaluate(validation, verbose=0, return_dict=True)["loss"])
print(json.dumps([type(strategy).__name__, losses]))
"""


@pytest.mark.timeout(900)
def test_the_loss_is_the_same_on_one_device_and_on_two():
    """The loss divides by the tokens of the whole batch, however many devices share it."""
    output = run_jax(EVALUATE_ON_DEVICES.format(data_dir=fixture_corpus()), devices=2)
    strategy, (one, two) = json.loads(output.split("\n")[-2])
    assert strategy == "DataParallel"
    assert one > 1.0  # an untrained model's loss, not a constant 0
    assert two == pytest.approx(one, rel=1e-5)


@pytest.mark.timeout(900)
def test_two_devices_train_like_one(tmp_path):
    """The same batches split over two devices: the same training, up to the order of
    float sums (which Adam's normalised steps carry into every weight)."""
    one, two = tmp_path / "one", tmp_path / "two"
    code = train_code((one, ["epochs=1", "dropout=0", 'devices=["cpu:0"]']),
                      (two, ["epochs=1", "dropout=0"]))
    run_jax(code, devices=2)
    a, b = (model_weights(run / files.FINAL_WEIGHTS) for run in (one, two))
    start = model_weights(one / files.CHECKPOINTS / files.CHECKPOINT.format(step=3))
    assert distance(a, start) > 0.01
    assert distance(a, b) <= 1e-2 * distance(a, start)


@pytest.mark.timeout(600)
def test_the_portable_greedy_decoder_on_jax_gives_the_tensorflow_decoders_ids(tmp_path):
    from keras_transformer import decoding

    keras.utils.set_random_seed(3)
    model = Transformer.from_preset("tiny", vocabulary_size=60, num_layers=2)
    weights = tmp_path / "model.weights.h5"
    model.save_weights(weights)
    source_ids = np.array([[START_ID, 5, 6, 7, 8, END_ID], [START_ID, 9, END_ID, 0, 0, 0],
                           [START_ID, END_ID, 0, 0, 0, 0]], np.int32)
    expected = decoding.greedy_decode(model, source_ids, extra_length=7).ids.numpy()
    code = (
        "import json, numpy as np\n"
        "from keras_transformer.model import Transformer\n"
        "from keras_transformer.decoding import portable\n"
        "model = Transformer.from_preset('tiny', vocabulary_size=60, num_layers=2)\n"
        f"model.load_weights({str(weights)!r})\n"
        "decode = portable.compiled_greedy_ids(model, extra_length=7)\n"
        f"ids = decode(np.array({source_ids.tolist()}))\n"
        "print(json.dumps(ids.tolist()))\n")
    found = json.loads(run_jax(code).split("\n")[-2])

    def without_padding(rows):
        return [[token for token in row if token != PAD_ID] for row in rows]

    assert without_padding(found) == without_padding(expected.tolist())
    assert without_padding(found)[-1] == [END_ID]
