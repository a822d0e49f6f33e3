"""What the config says reaches the objects `model.fit` uses, and training steps made
differently (accumulated, bfloat16, XLA) make the update they stand for."""

import dataclasses
import time

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_transformer import Transformer, cli, runs
from keras_transformer import config as config_lib
from keras_transformer.data import batching
from keras_transformer.data import pairs as pairs_lib
from keras_transformer.data.tokenizer import END_ID, START_ID
from keras_transformer.training import callbacks as callbacks_lib
from keras_transformer.training import distribution, fit, losses
from keras_transformer.training.losses import LabelSmoothedCrossEntropy
from keras_transformer.training.optimization import make_optimizer, make_schedule
from tests.conftest import REPOSITORY

# Compares float computations: also run on Eigen's kernels in CI (tests/numerics.py).
pytestmark = pytest.mark.numerics

STEPS = 16  # batches of each run below
WARMUP = 3  # weight updates
COOLDOWN_FRACTION = 0.5
SCALE = 2.53
SECONDS_PER_BATCH = 60.0  # on the runs' clock (`FakeClock`)
BUDGET_MINUTES = 10.0  # 10 batches: a run with this budget stops before its 16


class ProbedTransformer(Transformer):
    """The Transformer with one more weight, `probe`, added to the loss as it is.

    The probe's gradient is 1 in every micro-batch, so Adam moves it by the learning
    rate of each update: the bias-corrected moments of a constant gradient are both 1,
    and the step is rate · s / (s + ε) with s = √(1 − β₂ᵗ) ≥ 0.22 at the β₂ = 0.95
    below, within 5e-7 of the rate at ε = 1e-7. Its fall at each update is the rate
    the compiled step applied.
    """

    def build(self, inputs_shape=None):
        if not self.built:  # the Transformer builds itself as it is made
            self.probe = self.add_weight(shape=(), initializer="zeros", name="probe")
        super().build(inputs_shape)

    def call(self, inputs, training=None):
        self.add_loss(keras.ops.multiply(self.probe, 1.0))
        return super().call(inputs, training=training)


class FakeClock:
    """The callbacks' `time` module, with a `monotonic` clock that moves only when told."""

    def __init__(self):
        self.now = 0.0
        self.perf_counter = time.perf_counter

    def monotonic(self):
        return self.now


class ProbeRecorder(keras.callbacks.Callback):
    """The probe before training and after every batch; moves `clock` a batch on."""

    def __init__(self, clock):
        super().__init__()
        self.clock = clock
        self.values = []

    def on_train_begin(self, logs=None):
        self.values.append(float(keras.ops.convert_to_numpy(self.model.probe)))

    def on_train_batch_end(self, batch, logs=None):
        self.values.append(float(keras.ops.convert_to_numpy(self.model.probe)))
        self.clock.now += SECONDS_PER_BATCH


def numpy_rate(update, hidden_dim, progress):
    """§5.3's rate at weight update `update` (the paper's step `update + 1`), scaled,
    times the cooldown's linear multiplier at the run's `progress` (0 to 1)."""
    step = update + 1
    rate = SCALE * hidden_dim ** -0.5 * min(step ** -0.5, step * WARMUP ** -1.5)
    return rate * min(1.0, max(0.0, (1 - progress) / COOLDOWN_FRACTION))


def train_with_probe(run_dir, data_dir, monkeypatch, accumulation=1, budget=None):
    """Trains the tiny model with a probe through `fit.train`; returns `(config, model,
    probe values)`."""
    overrides = [
        f"data_dir={data_dir}", "num_layers=1", "epochs=1", f"steps_per_epoch={STEPS}",
        f"warmup_steps={WARMUP}", f"learning_rate_scale={SCALE}",
        f"cooldown_fraction={COOLDOWN_FRACTION}",
        f"gradient_accumulation_steps={accumulation}", "beta_1=0.85", "beta_2=0.95",
        "epsilon=1e-7", "label_smoothing=0.15", "dropout=0.2", "attention_dropout=0.05",
        "checkpoint_every_steps=100"]
    if budget:
        overrides.append(f"time_budget_minutes={budget}")
    config = config_lib.override(config_lib.preset_config("tiny"), overrides)
    clock = FakeClock()
    monkeypatch.setattr(callbacks_lib, "time", clock)
    monkeypatch.setattr(runs, "build_model", lambda config: ProbedTransformer(
        **dataclasses.asdict(config.model)))
    recorder = ProbeRecorder(clock)
    history = fit.train(config, str(run_dir), callbacks=[recorder], verbose=0)
    return config, history.model, recorder.values


@pytest.fixture(scope="module")
def trained(tmp_path_factory, fixture_corpus_dir):
    with pytest.MonkeyPatch.context() as monkeypatch:
        return train_with_probe(tmp_path_factory.mktemp("run"), fixture_corpus_dir,
                                monkeypatch)


@pytest.mark.parametrize("accumulation, budget", [(1, None), (2, None), (2, BUDGET_MINUTES)],
                         ids=["every-batch", "accumulated", "accumulated-with-budget"])
def test_each_update_applies_the_papers_rate_scaled_and_cooled(
        accumulation, budget, trained, tmp_path, fixture_corpus_dir, monkeypatch):
    if (accumulation, budget) == (1, None):
        config, model, probe = trained
    else:
        config, model, probe = train_with_probe(tmp_path, fixture_corpus_dir, monkeypatch,
                                                accumulation, budget)
    batches = len(probe) - 1
    # With the budget, the run stops at the batch that ends its 10 minutes.
    assert batches == (int(budget * 60 / SECONDS_PER_BATCH) if budget else STEPS)
    total_updates = STEPS // accumulation
    applied, expected = [], []
    for batch in range(batches):
        moved = probe[batch] - probe[batch + 1]
        if (batch + 1) % accumulation:  # a micro-batch that only accumulates
            assert moved == 0.0, batch
            continue
        update = (batch + 1) // accumulation - 1
        # The cooldown set this update's multiplier as its last micro-batch began:
        # progress is the larger share of updates done and of minutes spent.
        minutes = batch * SECONDS_PER_BATCH / 60
        progress = max(update / total_updates, minutes / budget if budget else 0.0)
        applied.append(moved)
        expected.append(numpy_rate(update, model.hidden_dim, progress))
    assert len(applied) == batches // accumulation
    # Warmup, its peak (update 2), decay and the cooldown to its last update included.
    # The probe reaches about -2, where float32 rounds to 2.4e-7: atol is 4 of those.
    np.testing.assert_allclose(applied, expected, rtol=1e-5, atol=1e-6)
    assert 0 < applied[-1] < 0.5 * max(applied)


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


def _random_pairs(count=60, vocabulary=40, seed=0):
    """Tokenized pairs of 1 to 12 random words, the target a copy of the source."""
    rng = np.random.default_rng(seed)
    words = [rng.integers(4, vocabulary, size=n).tolist()
             for n in rng.integers(1, 13, size=count)]
    return pairs_lib.TokenizedPairs(
        source_ids=tf.ragged.constant([[START_ID, *w, END_ID] for w in words], tf.int32),
        target_ids=tf.ragged.constant([[START_ID, *w] for w in words], tf.int32),
        targets=tf.ragged.constant([[*w, END_ID] for w in words], tf.int32),
        num_too_long=0)


def _union(batches):
    """One batch holding the rows of `batches`, padded to the widest of each input."""
    def stack(arrays):
        width = max(array.shape[1] for array in arrays)
        return np.concatenate([np.pad(array, [(0, 0), (0, width - array.shape[1])])
                               for array in arrays])

    inputs = {name: stack([x[name].numpy() for x, _, _ in batches])
              for name in ("source_ids", "target_ids")}
    return (inputs, stack([y.numpy() for _, y, _ in batches]),
            stack([w.numpy() for _, _, w in batches]))


def _train_on(model, batches, optimizer):
    """One `train_on_batch` per batch (Keras's compiled step); returns the weights."""
    losses.compile_model(model, config_lib.TrainConfig(), optimizer)
    for inputs, targets, loss_weights in batches:
        model.train_on_batch(inputs, targets, sample_weight=loss_weights)
    return model.get_weights()


def test_micro_batches_of_unequal_tokens_make_the_update_of_their_union():
    k = 3
    pairs = _random_pairs()
    options = dict(batch_tokens=48, max_length=16, shuffle=True, seed=3)
    weighted = list(batching.batch_pairs(pairs, accumulation=k, **options).take(k))
    plain = list(batching.batch_pairs(pairs, **options).take(k))
    tokens = [float(np.sum(loss_weights)) for _, _, loss_weights in plain]
    assert max(tokens) > 1.5 * min(tokens), tokens  # what Keras's plain mean gets wrong
    model, _, _ = _model_and_batch()
    start = model.get_weights()
    union = _train_on(model, [_union(plain)], _sgd(model))
    model.set_weights(start)
    accumulated = _train_on(model, weighted, _sgd(model, k))
    assert int(model.optimizer.iterations) == 1
    moved = _max_difference(union, start)
    assert moved > 1e-2
    assert _max_difference(accumulated, union) <= 1e-5 * moved
    # Without the pipeline's weights, Keras's mean of the micro-batches' means is far off.
    model.set_weights(start)
    averaged = _train_on(model, plain, _sgd(model, k))
    assert _max_difference(averaged, union) > 1e-2 * moved


def test_a_resumed_stream_weighs_its_micro_batches_as_the_whole_one():
    # A run resumed in the middle of an update gets the weights of the stream that
    # started at 0: its windows are counted from the stream's first batch.
    pairs = _random_pairs()
    options = dict(batch_tokens=48, max_length=16, shuffle=True, seed=3, repeat=True,
                   accumulation=3)
    whole = list(batching.batch_pairs(pairs, **options).take(12))
    for start in (4, 5, 9):
        resumed = list(batching.batch_pairs(pairs, start_batch=start, **options).take(3))
        for (_, expected_targets, expected), (_, targets, found) in zip(whole[start:],
                                                                         resumed):
            np.testing.assert_array_equal(targets.numpy(), expected_targets.numpy())
            np.testing.assert_array_equal(found.numpy(), expected.numpy())


def test_the_configured_optimizer_accumulates_as_asked():
    optimizer = make_optimizer(config_lib.TrainConfig(gradient_accumulation_steps=4,
                                                      warmup_steps=10), hidden_dim=64)
    assert optimizer.gradient_accumulation_steps == 4
    assert optimizer.get_config()["learning_rate"]["config"]["gradient_accumulation_steps"] == 4
    assert optimizer.beta_2 == 0.98 and optimizer.epsilon == 1e-9  # §5.3


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


def test_mixed_bfloat16_computes_every_sublayer_in_bfloat16_on_float32_weights():
    model, inputs, _ = _model_and_batch()
    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        half_model, _, _ = _model_and_batch()
    finally:
        keras.mixed_precision.set_global_policy(previous)
    half_model.set_weights(model.get_weights())
    in_float32 = [layer.path for layer in half_model._flatten_layers()
                  if layer.compute_dtype != "bfloat16"]
    assert not in_float32, f"computing in float32 under mixed_bfloat16: {in_float32}"
    assert {weight.dtype for weight in half_model.weights} == {"float32"}
    source_ids = inputs["source_ids"]
    assert half_model.encode(source_ids).dtype == "bfloat16"
    # The numbers are bfloat16's: 8 bits of mantissa (rounding 2^-9 ≈ 2e-3) leave the
    # logits about 1 % from float32's, where float32 alone would differ by ~1e-7.
    full, half = model(inputs).numpy(), half_model(inputs).numpy()
    assert half.dtype == np.float32  # the logits, for the loss
    relative = np.linalg.norm(half - full) / np.linalg.norm(full)
    assert 1e-4 < relative < 5e-2, relative


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
