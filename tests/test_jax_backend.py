"""Training on Keras's JAX backend through the same `train`: the run trains, validates
with BLEU, writes TensorBoard's scalars, computes TensorFlow's loss, splits batches over
devices without changing the loss, and exports and self-checks under TensorFlow
(resumption: tests/test_jax_fault_tolerance.py). Each JAX run is a subprocess (a process
picks its backend once); the checks of its outputs run here, on TensorFlow."""

import importlib.util
import json
import math
import os

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorboard.backend.event_processing import event_accumulator

from keras_transformer import config as config_lib
from keras_transformer import files
from keras_transformer.data.tokenizer import END_ID, PAD_ID, START_ID
from keras_transformer.model import Transformer
from keras_transformer.serving import export, self_check
from keras_transformer.training.bleu import SUMMARY_TAG as BLEU_TAG
from keras_transformer.training.optimization import make_schedule
from tests.conftest import fixture_corpus
from tests.jax_helpers import distance, model_weights, run_jax, run_python, train_code

pytestmark = [
    pytest.mark.jax,
    pytest.mark.skipif(importlib.util.find_spec("jax") is None,
                       reason="JAX is not installed (pip install -e '.[jax]')"),
]


@pytest.fixture(scope="module")
def jax_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("jax") / "run"
    run_jax(train_code((run_dir, ["epochs=2", "bleu_sentences=8", "monitor_sentences=2"])))
    return run_dir


@pytest.mark.timeout(900)  # the jax_run fixture, one JAX process of at most 600 s: 210 s
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


@pytest.mark.timeout(900)  # export and self-check, 55 s, after jax_run's 210 s if it is first
def test_a_run_trained_on_jax_exports_and_passes_the_self_check(jax_run):
    # The translating signatures alone: what JAX changes is the weights they are traced
    # with, the same for every signature; the others double the export's tracing.
    export_dir, _ = export.export_run(str(jax_run), quantize=False,
                                      signatures=files.TRANSLATING_SIGNATURES)
    checks = self_check.check_run(str(jax_run), export_dir=export_dir, count=20)
    failed = [check for check in checks if check.passed is False]
    assert not failed, self_check.format_table(checks)


def tensorboard_scalars(log_dir):
    """`{tag: [(step, value)]}` of the scalars in the event files under `log_dir`."""
    accumulator = event_accumulator.EventAccumulator(str(log_dir),
                                                     size_guidance={"tensors": 0})
    accumulator.Reload()
    return {tag: [(event.step, float(tf.make_ndarray(event.tensor_proto)))
                  for event in accumulator.Tensors(tag)]
            for tag in accumulator.Tags()["tensors"]
            if accumulator.SummaryMetadata(tag).plugin_data.plugin_name == "scalars"}


@pytest.mark.timeout(900)  # reads jax_run's logs; the fixture (210 s) if this test is first
def test_a_jax_runs_tensorboard_logs_hold_loss_learning_rate_and_bleu(jax_run):
    train = tensorboard_scalars(jax_run / files.LOGS / "train")
    validation = tensorboard_scalars(jax_run / files.LOGS / "validation")
    # Every log_every_steps=3 updates; Keras's epoch summaries by epoch.
    assert [step for step, _ in train["batch_loss"]] == [3, 6, 9, 12]
    assert all(math.isfinite(loss) and loss > 1.0 for _, loss in train["batch_loss"])
    assert [step for step, _ in train["epoch_loss"]] == [0, 1]
    # The rate the optimizer applies next: the schedule at the update count.
    config = config_lib.Config.load(jax_run / files.CONFIG)
    schedule = make_schedule(config.train, config.model.hidden_dim)
    rates = train["batch_learning_rate"]
    assert [step for step, _ in rates] == [3, 6, 9, 12]
    for step, rate in rates:
        assert rate == pytest.approx(float(schedule(step)), rel=1e-6)
    assert [step for step, _ in validation["epoch_loss"]] == [0, 1]
    # Validation BLEU at each epoch's end, as the best checkpoint recorded it.
    bleu = validation[BLEU_TAG]
    assert [step for step, _ in bleu] == [6, 12]
    best = json.loads((jax_run / files.CHECKPOINTS / files.BEST_INFO).read_text())
    best_step, best_bleu = max(bleu, key=lambda entry: (entry[1], -entry[0]))
    assert (best["step"], best["bleu"]) == (best_step, pytest.approx(best_bleu, abs=1e-4))


# The loss of one batch, as `fit` computes it (the compiled run's loss and metrics), of the
# model whose weights are in WEIGHTS; prints it as JSON.
LOSS_CODE = """
import json, keras, numpy as np
from keras_transformer.config import TrainConfig
from keras_transformer.model import Transformer
from keras_transformer.training import losses
model = Transformer.from_preset('tiny', vocabulary_size={vocabulary}, num_layers=2)
model.load_weights({weights!r})
losses.compile_model(model, TrainConfig())
batch = np.load({batch!r})
inputs = {{'source_ids': batch['source_ids'], 'target_ids': batch['target_ids']}}
result = model.evaluate(inputs, batch['targets'], batch_size=len(batch['targets']),
                        verbose=0, return_dict=True)
print(json.dumps({{'backend': keras.backend.backend(), 'loss': float(result['loss'])}}))
"""


@pytest.mark.timeout(600)  # two processes of at most 240 s each, one batch each: 54 s
def test_the_same_batch_gives_the_same_loss_on_tensorflow_and_on_jax(tmp_path):
    """The label-smoothed loss has a TensorFlow form (fused kernel) and a `keras.ops` one;
    both, with the same weights, give the same loss on a batch with padding."""
    vocabulary = 60
    keras.utils.set_random_seed(5)
    Transformer.from_preset("tiny", vocabulary_size=vocabulary, num_layers=2).save_weights(
        tmp_path / "model.weights.h5")
    rng = np.random.default_rng(5)
    ids = rng.integers(END_ID + 1, vocabulary, size=(3, 3, 7)).astype("int32")
    lengths = np.array([7, 4, 1])  # padded rows; the last has one real token
    ids[:, np.arange(7)[None, :] >= lengths[:, None]] = PAD_ID
    np.savez(tmp_path / "batch.npz", source_ids=ids[0], target_ids=ids[1], targets=ids[2])
    code = LOSS_CODE.format(vocabulary=vocabulary, weights=str(tmp_path / "model.weights.h5"),
                            batch=str(tmp_path / "batch.npz"))
    tensorflow = run_python(code, {"KERAS_BACKEND": "tensorflow"}, timeout=240)
    jax = run_jax(code, timeout=240)
    assert [json.loads(output.split("\n")[-2])["backend"] for output in (tensorflow, jax)] == [
        "tensorflow", "jax"]
    losses = [json.loads(output.split("\n")[-2])["loss"] for output in (tensorflow, jax)]
    assert losses[0] > 1.0  # an untrained model's loss over 60 tokens, not 0
    assert losses[1] == pytest.approx(losses[0], rel=1e-5)


RDROP_CODE = """
import json, keras, numpy as np
from keras_transformer.config import TrainConfig
from keras_transformer.model import Transformer
from keras_transformer.training import losses
keras.utils.set_random_seed(3)
model = Transformer.from_preset('tiny', vocabulary_size=60, num_layers=1, dropout=0.3,
                                token_dropout=0.1)
rng = np.random.default_rng(3)
ids = rng.integers(4, 60, size=(3, 4, 9)).astype('int32')
inputs = {'source_ids': ids[0], 'target_ids': ids[1]}
state = [v.value for v in model.trainable_variables], [
    v.value for v in model.non_trainable_variables]


def training_loss(alpha):
    # The loss of the JAX trainer's own step function, from the same state and seeds.
    losses.compile_model(model, TrainConfig(rdrop_alpha=alpha))
    model.optimizer.build(model.trainable_variables)
    loss, _ = model.compute_loss_and_updates(
        *state, [v.value for v in model.metrics_variables], inputs, ids[2], None,
        training=True, optimizer_variables=[v.value for v in model.optimizer.variables])
    return float(loss)


plain, rdrop = training_loss(0.0), training_loss(2.0)
history = model.fit(inputs, ids[2], epochs=3, batch_size=3, verbose=0)
print(json.dumps({'plain': plain, 'rdrop': rdrop, 'fit': history.history['loss']}))
"""


@pytest.mark.timeout(600)  # one JAX process of at most 240 s: about 30 s
def test_rdrop_and_word_dropout_train_on_jax_with_a_second_pass_of_its_own_masks():
    result = json.loads(run_jax(RDROP_CODE, timeout=240).split("\n")[-2])
    # Had the second pass drawn the first one's masks, the two losses would be equal
    # and R-Drop's divergence 0.
    assert result["plain"] > 1.0 and result["rdrop"] != pytest.approx(result["plain"])
    assert all(math.isfinite(loss) for loss in result["fit"])


EVALUATE_ON_DEVICES = """
import json, keras
from keras_transformer import config as config_lib
from keras_transformer.data import corpus, tokenizer as tokenizer_lib
from keras_transformer.training import distribution, fit
from keras_transformer import runs
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


@pytest.mark.timeout(900)  # one JAX process of at most 600 s on 2 devices: 159 s
def test_the_loss_is_the_same_on_one_device_and_on_two():
    """The loss divides by the tokens of the whole batch, however many devices share it."""
    output = run_jax(EVALUATE_ON_DEVICES.format(data_dir=fixture_corpus()), devices=2)
    strategy, (one, two) = json.loads(output.split("\n")[-2])
    assert strategy == "DataParallel"
    assert one > 1.0  # an untrained model's loss, not a constant 0
    assert two == pytest.approx(one, rel=1e-5)


@pytest.mark.timeout(900)  # one JAX process of at most 600 s, two runs of an epoch: 136 s
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


@pytest.mark.timeout(300)  # one JAX process of at most 240 s that imports Keras: 15 s
def test_the_mfu_benchmark_records_the_machine_where_tensorflow_is_missing():
    """GPU machines may have JAX and no TensorFlow: `benchmarks.mfu` must run there."""
    code = (
        "import importlib.abc, json, sys\n"
        "class NoTensorFlow(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.partition('.')[0] == 'tensorflow':\n"
        "            raise ImportError(f'No module named {name!r}')\n"
        "sys.meta_path.insert(0, NoTensorFlow())\n"
        "from benchmarks import common, mfu\n"
        "print(json.dumps(common.machine()))\n")
    facts = json.loads(run_jax(code, timeout=240).split("\n")[-2])
    assert facts["keras_backend"] == "jax" and "jax" in facts and "tensorflow" not in facts
    with open("/proc/cpuinfo", encoding="utf-8") as file:
        model = next(line for line in file if line.startswith("model name"))
    assert facts["cpu"] == model.partition(":")[2].strip()


@pytest.mark.timeout(600)  # one JAX process of at most 300 s decoding 3 sentences: 16 s
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
    found = json.loads(run_jax(code, timeout=300).split("\n")[-2])

    def without_padding(rows):
        return [[token for token in row if token != PAD_ID] for row in rows]

    assert without_padding(found) == without_padding(expected.tolist())
    assert without_padding(found)[-1] == [END_ID]
