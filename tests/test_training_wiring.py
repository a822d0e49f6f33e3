"""What the config says reaches the objects `model.fit` uses, and training steps made
differently (accumulated, bfloat16, XLA) make the update they stand for."""


import keras
import numpy as np
import pytest

from keras_transformer import cli
from keras_transformer import config as config_lib
from keras_transformer.training import distribution, fit, losses, runs
from keras_transformer.training.losses import LabelSmoothedCrossEntropy
from keras_transformer.training.optimization import make_optimizer, make_schedule
from tests.conftest import REPOSITORY

STEPS = 12
WARMUP = 3
COOLDOWN_FRACTION = 0.25  # the last 3 of the 12 steps
SCALE = 2.53


class RateRecorder(keras.callbacks.Callback):
    """The learning rate each update applies, read as its batch begins.

    It runs after the run's own callbacks (an extra callback), so the cooldown has set
    this step's multiplier already.
    """

    def __init__(self):
        super().__init__()
        self.rates = []

    def on_train_batch_begin(self, batch, logs=None):
        self.rates.append(float(keras.ops.convert_to_numpy(
            self.model.optimizer.learning_rate)))


def numpy_rate(iteration, hidden_dim):
    """§5.3's rate at Keras iteration `iteration` (the paper's step + 1), scaled, with the
    linear cooldown over the last `COOLDOWN_FRACTION` of `STEPS` updates."""
    step = iteration + 1
    rate = SCALE * hidden_dim ** -0.5 * min(step ** -0.5, step * WARMUP ** -1.5)
    return rate * min(1.0, max(0.0, (1 - iteration / STEPS) / COOLDOWN_FRACTION))


@pytest.fixture(scope="module")
def trained(tmp_path_factory, fixture_corpus_dir):
    config = config_lib.override(config_lib.preset_config("tiny"), [
        f"data_dir={fixture_corpus_dir}", "num_layers=1", "epochs=1",
        f"steps_per_epoch={STEPS}", f"warmup_steps={WARMUP}",
        f"learning_rate_scale={SCALE}", f"cooldown_fraction={COOLDOWN_FRACTION}",
        "beta_1=0.85", "beta_2=0.95", "epsilon=1e-7", "label_smoothing=0.15",
        "dropout=0.2", "attention_dropout=0.05", "checkpoint_every_steps=100"])
    recorder = RateRecorder()
    history = fit.train(config, str(tmp_path_factory.mktemp("run")), callbacks=[recorder],
                        verbose=0)
    return config, history.model, recorder.rates


def test_the_rate_of_every_update_is_the_papers_formula_scaled_and_cooled(trained):
    config, model, rates = trained
    assert len(rates) == STEPS
    expected = [numpy_rate(i, model.hidden_dim) for i in range(STEPS)]
    # Step 0, the warmup's end (3), twice the warmup (6) and the cooldown (9-11) included.
    np.testing.assert_allclose(rates, expected, rtol=1e-5)
    assert rates[-1] < rates[-3] < max(rates)


def test_adam_label_smoothing_and_dropout_are_the_configs(trained):
    config, model, _ = trained
    optimizer = model.optimizer
    assert (optimizer.beta_1, optimizer.beta_2, optimizer.epsilon) == (0.85, 0.95, 1e-7)
    assert isinstance(model.loss, LabelSmoothedCrossEntropy)
    assert model.loss.label_smoothing == 0.15
    rates = {}
    for layer in model._flatten_layers():
        if isinstance(layer, keras.layers.Dropout):
            rates.setdefault(layer.rate, []).append(layer.path)
    # Every sub-layer output and embedding at `dropout`, the attention weights at
    # `attention_dropout`: 2 embeddings + 1 encoder layer × 3 + 1 decoder layer × 5.
    assert sorted(rates) == [0.05, 0.2]
    assert len(rates[0.2]) == 1 + 2 + 3 and len(rates[0.05]) == 3


def test_the_train_commands_defaults_are_what_readme_says():
    readme = (REPOSITORY / "README.md").read_text(encoding="utf-8")
    assert "train the default preset (`multi30k`) on Multi30K en→de" in readme
    arguments = cli.make_parser()[1]["train"].parse_intermixed_args([])
    config, run_dir = cli.make_config(arguments)
    assert config == config_lib.preset_config("multi30k")
    assert config_lib.DEFAULT_PRESET == "multi30k"
    assert (config.data.source_language, config.data.target_language) == ("en", "de")
    assert run_dir == "runs/multi30k-en-de"


def _model_and_batch(rows=8, length=6, vocabulary=40, seed=0):
    keras.utils.set_random_seed(seed)
    model = runs.build_model(config_lib.override(config_lib.preset_config("tiny"), [
        f"vocabulary_size={vocabulary}", "num_layers=1", "dropout=0",
        "max_length=16"]))
    rng = np.random.default_rng(seed)
    # Every position a real token: each micro-batch then holds as many tokens as the next.
    ids = rng.integers(4, vocabulary, size=(rows, length)).astype("int32")
    inputs = {"source_ids": ids, "target_ids": ids}
    targets = np.roll(ids, -1, axis=1)
    return model, inputs, targets


def _fit(model, inputs, targets, optimizer, batch_size, jit_compile=False):
    """Fits one pass; returns the weights and the mean loss.

    Plain SGD with the run's schedule: its update is the gradient times the rate, so
    weights compare gradients. (Adam's first update is the gradient's sign, which a
    rounding difference flips wherever a component is near zero.)
    """
    losses.compile_model(model, config_lib.TrainConfig(jit_compile=jit_compile), optimizer)
    history = model.fit(inputs, targets, batch_size=batch_size, epochs=1, shuffle=False,
                        verbose=0)
    return model.get_weights(), history.history["loss"][0]


def _sgd(model, accumulation=1):
    train_config = config_lib.TrainConfig(warmup_steps=2, learning_rate_scale=50.0,
                                          gradient_accumulation_steps=accumulation)
    return keras.optimizers.SGD(make_schedule(train_config, model.hidden_dim),
                                gradient_accumulation_steps=accumulation
                                if accumulation > 1 else None)


def _max_difference(weights, others):
    return max(float(np.abs(a - b).max()) for a, b in zip(weights, others))


def test_accumulated_micro_batches_make_the_updates_of_batches_as_big():
    k = 4
    model, inputs, targets = _model_and_batch(rows=16)
    start = model.get_weights()
    big, _ = _fit(model, inputs, targets, _sgd(model), batch_size=8)  # 2 updates
    model.set_weights(start)
    accumulated, _ = _fit(model, inputs, targets, _sgd(model, k), batch_size=2)
    assert int(model.optimizer.iterations) == 2  # 8 micro-batches, 2 weight updates
    moved = _max_difference(big, start)
    assert moved > 1e-2
    # The second update too: the schedule counts weight updates, not micro-batches.
    assert _max_difference(accumulated, big) <= 1e-5 * moved


def test_the_configured_optimizer_accumulates_as_asked():
    optimizer = make_optimizer(config_lib.TrainConfig(gradient_accumulation_steps=4,
                                                      warmup_steps=10), hidden_dim=64)
    assert optimizer.gradient_accumulation_steps == 4
    assert optimizer.get_config()["learning_rate"]["config"]["gradient_accumulation_steps"] == 4


def test_an_xla_step_makes_the_graph_steps_update():
    model, inputs, targets = _model_and_batch()
    start = model.get_weights()
    graph, graph_loss = _fit(model, inputs, targets, _sgd(model), batch_size=8)
    model.set_weights(start)
    xla, xla_loss = _fit(model, inputs, targets, _sgd(model), batch_size=8, jit_compile=True)
    assert xla_loss == pytest.approx(graph_loss, rel=1e-5)
    assert _max_difference(xla, graph) <= 1e-5 * _max_difference(graph, start)


def test_a_bfloat16_step_is_the_float32_step_to_bfloat16_precision():
    model, inputs, targets = _model_and_batch()
    start = model.get_weights()
    full, full_loss = _fit(model, inputs, targets, _sgd(model), batch_size=8)
    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        half_model, _, _ = _model_and_batch()
    finally:
        keras.mixed_precision.set_global_policy(previous)
    half_model.set_weights(start)
    half, half_loss = _fit(half_model, inputs, targets, _sgd(half_model), batch_size=8)
    # bfloat16 keeps 8 bits of mantissa (relative rounding 2^-9) in every product of the
    # computation; weights and loss stay float32. A ReLU whose input is near 0 may switch
    # (one feed-forward kernel's update differs by 40 % on this batch), so the stated
    # tolerance is on the whole step: the loss within 2 %, and the update of all weights
    # together within 5 % of its norm (3.3 % measured).
    assert half_loss == pytest.approx(full_loss, rel=2e-2)
    difference = sum(float(np.sum((h - f) ** 2)) for h, f in zip(half, full))
    update = sum(float(np.sum((f - s) ** 2)) for f, s in zip(full, start))
    assert (difference / update) ** 0.5 <= 0.05


@pytest.fixture(params=["tensorflow", "jax"])
def backend_with_a_gpu(request, monkeypatch):
    """Makes `distribution` and `fit` see this backend with a GPU; yields the backend."""
    monkeypatch.setattr(keras.backend, "backend", lambda: request.param)
    monkeypatch.setattr(distribution, "has_gpu", lambda: True)
    return request.param


@pytest.mark.parametrize("asked, on_jax_gpu, elsewhere", [
    (None, "bfloat16", None), ("float32", "float32", "float32"),
    ("float16", "float16", "float16"), ("bfloat16", "bfloat16", "bfloat16")])
def test_jax_on_a_gpu_trains_in_bfloat16_unless_told_otherwise(
        backend_with_a_gpu, monkeypatch, asked, on_jax_gpu, elsewhere):
    expected = on_jax_gpu if backend_with_a_gpu == "jax" else elsewhere
    assert distribution.backend_precision(asked) == expected
    monkeypatch.setattr(distribution, "has_gpu", lambda: False)  # a CPU: as TensorFlow
    assert distribution.backend_precision(asked) == elsewhere


@pytest.mark.parametrize("jit_compile", [False, True])
def test_the_jax_step_always_compiles_and_tensorflows_as_configured(
        backend_with_a_gpu, monkeypatch, jit_compile):
    train_config = config_lib.TrainConfig(jit_compile=jit_compile)
    expected = jit_compile or backend_with_a_gpu == "jax"
    assert losses.compiles_step(train_config) is expected
    monkeypatch.setattr(distribution, "has_gpu", lambda: False)  # on a CPU as well
    assert losses.compiles_step(train_config) is expected
    compiled = []
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(2)])
    model.pad_id, model.hidden_dim = 0, 2  # what compile_model reads from a Transformer
    monkeypatch.setattr(model, "compile", lambda **options: compiled.append(options))
    losses.compile_model(model, train_config)
    assert compiled[0]["jit_compile"] is expected
