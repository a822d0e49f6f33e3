"""Training end to end on a tiny corpus: the loss falls, runs resume, bad data leaves nothing."""

import gzip
import math
import os
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorboard.backend.event_processing import event_accumulator

from keras_transformer import config as config_lib
from keras_transformer import files, runs
from keras_transformer.training import backup as backup_lib
from keras_transformer.training import callbacks as callbacks_lib
from keras_transformer.training import fit
from keras_transformer.training.optimization import WarmupInverseSqrtSchedule

STEPS_PER_EPOCH = 6
EPOCHS = 2
INTERRUPT_AT_STEP = 9  # in the second epoch, one step after the backup of step 8
COOLDOWN_FRACTION = 0.25  # the last 3 of the 12 steps, after the interruption


class Interrupted(Exception):
    """Stands for a crash or a kill in the middle of training."""


class Recorder(keras.callbacks.Callback):
    """Notes the update count when fitting starts (after any restore) and every loss."""

    def __init__(self, interrupt_at=None):
        super().__init__()
        self.interrupt_at = interrupt_at
        self.losses = []
        self.epochs = []

    def on_train_begin(self, logs=None):
        self.start_step = int(self.model.optimizer.iterations)

    def on_epoch_begin(self, epoch, logs=None):
        self.epochs.append(epoch)

    def on_train_batch_end(self, batch, logs=None):
        self.losses.append(logs["loss"])
        self.logs = dict(logs)
        if int(self.model.optimizer.iterations) == self.interrupt_at:
            raise Interrupted


def tiny_config(data_dir):
    # One layer each side: building the training graph dominates these tests' time.
    return config_lib.override(config_lib.preset_config("tiny"), [
        f"data_dir={data_dir}", "num_layers=1", f"epochs={EPOCHS}",
        f"steps_per_epoch={STEPS_PER_EPOCH}",
        "checkpoint_every_steps=2", "keep_checkpoints=3", "log_every_steps=2",
        f"cooldown_fraction={COOLDOWN_FRACTION}"])


@pytest.fixture(scope="module")
def interrupted_then_resumed(tmp_path_factory, fixture_corpus_dir):
    """Trains until an interruption at step 9, then runs the same training again."""
    run_dir = str(tmp_path_factory.mktemp("runs") / "tiny-en-de")
    config = tiny_config(fixture_corpus_dir)
    first = Recorder(interrupt_at=INTERRUPT_AT_STEP)
    with pytest.raises(Interrupted):
        fit.train(config, run_dir, callbacks=[first], verbose=0)
    second = Recorder()
    history = fit.train(config, run_dir, callbacks=[second], verbose=0)
    return run_dir, config, first, second, history


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, fixture_corpus_dir):
    """The same training as `interrupted_then_resumed`, never interrupted."""
    run_dir = str(tmp_path_factory.mktemp("runs") / "tiny-en-de")
    recorder = Recorder()
    history = fit.train(tiny_config(fixture_corpus_dir), run_dir,
                             callbacks=[recorder], verbose=0)
    return recorder, history


def test_loss_falls(interrupted_then_resumed):
    _, _, first, second, _ = interrupted_then_resumed
    assert all(math.isfinite(loss) for loss in first.losses + second.losses)
    assert second.losses[-1] < first.losses[0] - 0.2


def test_resumed_run_continues_from_its_last_backup(interrupted_then_resumed):
    _, _, first, second, history = interrupted_then_resumed
    assert first.start_step == 0
    assert len(first.losses) == INTERRUPT_AT_STEP
    # Backups every 2 updates: the one of step 8 is the last before the interruption.
    # The second epoch goes on from its third batch and ends after its sixth, so the
    # resumed run makes the updates that the uninterrupted one makes, no more.
    assert second.start_step == 8
    assert second.epochs == [1]
    assert len(second.losses) == EPOCHS * STEPS_PER_EPOCH - 8
    assert int(history.model.optimizer.iterations) == EPOCHS * STEPS_PER_EPOCH


def test_a_resumed_run_ends_with_the_uninterrupted_runs_weights(interrupted_then_resumed,
                                                                uninterrupted):
    """Same batches (the data resume at the backup's batch), same dropout masks (the
    random generators are restored), same updates: the same weights, bit for bit on
    this CPU. The tolerance only allows for kernels that sum in another order."""
    _, _, _, _, resumed = interrupted_then_resumed
    recorder, history = uninterrupted
    assert len(recorder.losses) == EPOCHS * STEPS_PER_EPOCH
    assert recorder.epochs == [0, 1]
    resumed_weights = resumed.model.get_weights()
    reference = history.model.get_weights()
    assert len(resumed_weights) == len(reference) > 0
    for resumed_weight, reference_weight in zip(resumed_weights, reference):
        np.testing.assert_allclose(resumed_weight, reference_weight, rtol=0, atol=1e-6)
    for resumed_variable, reference_variable in zip(resumed.model.optimizer.variables,
                                                    history.model.optimizer.variables):
        np.testing.assert_allclose(resumed_variable, reference_variable, rtol=0,
                                   atol=1e-6)


def test_run_directory_holds_everything(interrupted_then_resumed):
    run_dir, _, _, _, _ = interrupted_then_resumed
    for name in (files.CONFIG, files.TOKENIZER, files.BACKUP, files.FINAL_WEIGHTS):
        assert os.path.exists(os.path.join(run_dir, name)), name
    assert os.listdir(os.path.join(run_dir, files.LOGS, "train"))
    checkpoints = runs.list_checkpoints(os.path.join(run_dir, files.CHECKPOINTS))
    assert [os.path.basename(path) for path in checkpoints] == [
        f"step-{step:08d}.weights.h5" for step in (8, 10, 12)]
    assert not [name for name in os.listdir(run_dir) if name.startswith("partial-")]


def test_tensorboard_has_step_and_epoch_summaries(interrupted_then_resumed):
    run_dir, _, _, _, _ = interrupted_then_resumed
    train_logs = event_accumulator.EventAccumulator(
        os.path.join(run_dir, files.LOGS, "train"), size_guidance={"tensors": 0})
    tags = set(train_logs.Reload().Tags()["tensors"])
    assert {"batch_loss", "batch_learning_rate", "batch_tokens_per_second",
            "batch_accuracy", "epoch_loss", "epoch_learning_rate",
            "epoch_tokens_per_second"} <= tags
    # Step summaries are numbered by weight updates, across the restart.
    assert [event.step for event in train_logs.Tensors("batch_loss")] == [
        2, 4, 6, 8, 10, 12]


def test_load_run_restores_the_trained_model(interrupted_then_resumed):
    run_dir, _, _, _, history = interrupted_then_resumed
    config, tokenizer, model = runs.load_run(run_dir, weights="final")
    assert config.model.vocabulary_size == tokenizer.vocabulary_size
    assert model.vocabulary_size == tokenizer.vocabulary_size
    for loaded, trained in zip(model.get_weights(), history.model.get_weights()):
        np.testing.assert_array_equal(loaded, trained)


def test_logs_have_throughput_learning_rate_and_accuracy(interrupted_then_resumed):
    _, config, _, second, history = interrupted_then_resumed
    assert second.logs["tokens_per_second"] > 0
    schedule = WarmupInverseSqrtSchedule(config.model.hidden_dim, config.train.warmup_steps)
    updates = int(history.model.optimizer.iterations)
    # The last step began at progress (updates - 1) / updates, in the cooldown.
    multiplier = (1 - (updates - 1) / updates) / COOLDOWN_FRACTION
    np.testing.assert_allclose(second.logs["learning_rate"],
                               float(schedule(updates)) * multiplier, rtol=1e-6)
    assert 0.0 <= second.logs["accuracy"] <= 1.0
    assert history.history["tokens_per_second"][-1] > 0


def test_a_different_config_does_not_silently_reuse_a_run(interrupted_then_resumed,
                                                          fixture_corpus_dir):
    run_dir, _, _, _, _ = interrupted_then_resumed
    changed = config_lib.override(tiny_config(fixture_corpus_dir), ["dropout=0.3"])
    with pytest.raises(ValueError, match="model.dropout"):
        fit.train(changed, run_dir, verbose=0)
    assert os.path.exists(os.path.join(run_dir, files.CONFIG))


def test_bad_data_leaves_no_run_directory(tmp_path):
    data_dir = tmp_path / "corpus"
    data_dir.mkdir()
    for name, lines in {"train.en.gz": ["a b", "c d", "e f"], "train.de.gz": ["a", "b"],
                        "val.en.gz": ["x"], "val.de.gz": ["y"]}.items():
        with gzip.open(data_dir / name, "wt", encoding="utf-8") as file:
            file.write("\n".join(lines) + "\n")
    run_dir = tmp_path / "runs" / "bad"
    with pytest.raises(ValueError):
        fit.train(tiny_config(data_dir), str(run_dir), verbose=0)
    assert not run_dir.exists()


def test_nan_stops_training_before_anything_is_written():
    callbacks = fit.make_callbacks(config_lib.TrainConfig(), "unused")
    assert isinstance(callbacks[0], keras.callbacks.TerminateOnNaN)
    with pytest.raises(RuntimeError):
        callbacks[0].on_batch_end(0, {"loss": float("nan")})


def test_checkpoints_skip_non_finite_losses_and_keep_the_newest(tmp_path):
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(), "mse")
    model.optimizer.build(model.trainable_variables)
    checkpoint = callbacks_lib.RollingCheckpoint(tmp_path, every_steps=1, keep=2)
    checkpoint.set_model(model)
    for step, loss in [(1, 1.0), (2, 0.5), (3, float("nan")), (4, 0.4)]:
        model.optimizer.iterations.assign(step)
        checkpoint.on_train_batch_end(step, {"loss": loss})
    names = [os.path.basename(path) for path in runs.list_checkpoints(tmp_path)]
    assert names == ["step-00000002.weights.h5", "step-00000004.weights.h5"]


def test_translation_callbacks_follow_the_config(tmp_path, fixture_corpus_dir):
    from keras_transformer.data import corpus
    from keras_transformer.training.bleu import BleuCallback
    from keras_transformer.training.monitoring import TranslationMonitor

    config = config_lib.override(tiny_config(fixture_corpus_dir), [
        "bleu_sentences=5", "bleu_patience=2", "monitor_sentences=3"])
    validation = corpus.load_split(config.data, "validation", verbose=False)
    bleu, monitor = fit.make_translation_callbacks(config.train, str(tmp_path),
                                                        validation)
    assert isinstance(bleu, BleuCallback) and isinstance(monitor, TranslationMonitor)
    assert bleu.sources == list(validation.source_lines[:5])
    assert bleu.references == list(validation.target_lines[:5])
    assert bleu.patience == 2
    assert monitor.sources == list(validation.source_lines[:3])
    off = config_lib.override(config, ["bleu_sentences=0", "monitor_sentences=0"])
    assert fit.make_translation_callbacks(off.train, str(tmp_path), validation) == []


@pytest.mark.parametrize("field", ["bleu_sentences", "monitor_sentences"])
def test_a_translation_callback_the_config_already_adds_is_refused(
        tmp_path, fixture_corpus_dir, field):
    """A second BLEU callback would keep its best weights in the same checkpoints."""
    from keras_transformer.training.bleu import BleuCallback
    from keras_transformer.training.monitoring import TranslationMonitor

    kind = {"bleu_sentences": BleuCallback, "monitor_sentences": TranslationMonitor}[field]
    run_dir = tmp_path / "run"
    callback = kind.for_run(str(run_dir), ["A man."], ["Ein Mann."])
    config = config_lib.override(tiny_config(fixture_corpus_dir), [f"{field}=2"])
    with pytest.raises(ValueError, match=f"train.{field}=2 already adds a {kind.__name__}"):
        fit.train(config, str(run_dir), callbacks=[callback])
    assert not run_dir.exists()
    # With the config's own callback off, the caller's is accepted.
    off = config_lib.override(config, [f"{field}=0"])
    fit._check_translation_callbacks(off.train, [callback])


@pytest.mark.parametrize("use_fused_attention", [False, True])
def test_bucket_padding_changes_neither_the_loss_nor_the_gradients(use_fused_attention):
    """The PAD rows and positions of `pad_to_bucket` (a wholly padded source row among
    them) leave the loss and every gradient as they were: XLA trains on the same thing."""
    from keras_transformer.model import Transformer
    from keras_transformer.training.losses import LabelSmoothedCrossEntropy
    keras.utils.set_random_seed(0)
    model = Transformer(50, num_layers=1, hidden_dim=16, intermediate_dim=32, num_heads=2,
                        max_length=16, use_fused_attention=use_fused_attention)
    loss_function = LabelSmoothedCrossEntropy(0.1)
    source = np.array([[2, 7, 8, 9, 3, 0], [2, 5, 3, 0, 0, 0], [2, 11, 12, 13, 14, 3]])
    target_ids = np.array([[2, 20, 21, 0, 0], [2, 22, 23, 24, 25], [2, 26, 0, 0, 0]])
    targets = np.array([[20, 21, 3, 0, 0], [22, 23, 24, 25, 3], [26, 3, 0, 0, 0]])

    def loss_and_gradients(rows, length):
        padded = [np.pad(ids, [(0, rows - len(ids)), (0, length - ids.shape[1])])
                  for ids in (source, target_ids, targets)]
        with tf.GradientTape() as tape:
            logits = model({"source_ids": padded[0], "target_ids": padded[1]})
            loss = loss_function(padded[2], logits,
                                 sample_weight=(padded[2] != 0).astype("float32"))
        return loss, tape.gradient(loss, model.trainable_variables)

    loss, gradients = loss_and_gradients(3, 6)
    padded_loss, padded_gradients = loss_and_gradients(5, 9)
    assert np.isfinite(padded_loss)
    np.testing.assert_allclose(padded_loss, loss, rtol=1e-5)
    for gradient, padded_gradient in zip(gradients, padded_gradients):
        np.testing.assert_allclose(keras.ops.convert_to_numpy(padded_gradient),
                                   keras.ops.convert_to_numpy(gradient), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("jit_compile", [False, True])
def test_xla_runs_get_one_batch_shape_per_bucket(fixture_corpus_dir, jit_compile):
    from keras_transformer.data import batching, corpus
    from keras_transformer.data.tokenizer import train_tokenizer
    config = config_lib.override(tiny_config(fixture_corpus_dir),
                                 [f"jit_compile={str(jit_compile).lower()}"])
    splits = {split: corpus.load_split(config.data, split, verbose=False)
              for split in ("train", "validation")}
    tokenizer = train_tokenizer(splits["train"].source_lines + splits["train"].target_lines,
                                300, verbose=False)
    train_data, validation_data, steps = fit.make_datasets(config, tokenizer, splits)
    boundaries = batching.bucket_boundaries(config.model.max_length)
    bucket_shapes = set(zip(
        batching.bucket_batch_sizes(boundaries, config.model.max_length, config.data.batch_tokens),
        batching.bucket_lengths(boundaries, config.model.max_length)))
    for dataset in (train_data.take(steps), validation_data):
        shapes = {tuple(targets.shape) for _, targets, _ in dataset}
        assert shapes <= bucket_shapes if jit_compile else not shapes <= bucket_shapes


def test_subword_sampling_setting_reaches_the_training_data_alone(fixture_corpus_dir):
    from keras_transformer.data import corpus
    from keras_transformer.data.tokenizer import END_ID, PAD_ID, START_ID, train_tokenizer
    config = config_lib.override(tiny_config(fixture_corpus_dir), ["subword_nbest=8"])
    splits = {split: corpus.load_split(config.data, split, verbose=False)
              for split in ("train", "validation")}
    tokenizer = train_tokenizer(splits["train"].source_lines + splits["train"].target_lines,
                                300, verbose=False)
    train_data, validation_data, steps = fit.make_datasets(config, tokenizer, splits)
    for dataset, split, sampled in ((train_data.take(steps), "train", True),
                                    (validation_data, "validation", False)):
        most_likely = set(map(tuple, tokenizer.tokenize(
            list(splits[split].target_lines)).to_list()))
        targets = [tuple(int(i) for i in row if i not in (PAD_ID, START_ID, END_ID))
                   for _, batch, _ in dataset for row in batch.numpy()]
        other = sum(target not in most_likely for target in targets)
        assert (other > 0.3 * len(targets)) if sampled else other == 0, split


def test_mixed_precision_belongs_to_the_run_alone(tmp_path, fixture_corpus_dir):
    """A bfloat16 run trains in bfloat16; what the process builds afterwards is float32."""
    config = config_lib.override(tiny_config(fixture_corpus_dir), [
        "mixed_precision=bfloat16", "epochs=1", "steps_per_epoch=2",
        "bleu_sentences=0", "monitor_sentences=0"])
    history = fit.train(config, str(tmp_path / "run"), verbose=0)
    assert {layer.dtype_policy.name for layer in history.model._flatten_layers()} == {
        "mixed_bfloat16"}  # the model and every sublayer
    assert np.isfinite(history.history["loss"]).all()
    assert keras.mixed_precision.global_policy().name == "float32"
    _, _, model = runs.load_run(str(tmp_path / "run"))
    assert model.dtype_policy.name == "float32"


def test_time_budget_stops_after_the_batch_that_exceeds_it(monkeypatch):
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(), "mse")
    clock = iter(range(0, 10_000, 30))  # every reading of the clock is 30 s later
    monkeypatch.setattr(callbacks_lib.time, "monotonic", lambda: next(clock))
    budget = callbacks_lib.TimeBudget(minutes=2)  # begins at 0 s, batch k ends at 30k s
    features, targets = np.ones((40, 2)), np.ones((40, 1))
    history = model.fit(features, targets, batch_size=4, epochs=3, callbacks=[budget],
                        verbose=0)
    assert budget.stopped_at_step == 4 and int(model.optimizer.iterations) == 4
    assert len(history.epoch) == 1  # the epoch ends, and no other begins


def test_time_budget_spent_by_an_epoch_end_begins_no_other_epoch(monkeypatch):
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(), "mse")
    clock = iter(range(0, 10_000, 30))  # every reading of the clock is 30 s later
    monkeypatch.setattr(callbacks_lib.time, "monotonic", lambda: next(clock))
    # Begins at 0 s; the 10 batches of an epoch end at 30–300 s, the epoch at 330 s.
    budget = callbacks_lib.TimeBudget(minutes=315 / 60)
    features, targets = np.ones((40, 2)), np.ones((40, 1))
    history = model.fit(features, targets, batch_size=4, epochs=3, callbacks=[budget],
                        verbose=0)
    assert budget.stopped_at_step == 10 and int(model.optimizer.iterations) == 10
    assert len(history.epoch) == 1


def test_the_time_budget_counts_the_epoch_end_work_of_the_extra_callbacks():
    """The BLEU callback comes among the extras: the budget checks after its work."""
    extra = keras.callbacks.Callback()
    callbacks = fit.make_callbacks(config_lib.TrainConfig(time_budget_minutes=5),
                                        "unused", [extra])
    kinds = [type(callback) for callback in callbacks]
    assert (callbacks.index(extra) < kinds.index(callbacks_lib.TimeBudget)
            < kinds.index(backup_lib.ResumedEpochEnd))


def test_progress_heads_each_epoch_with_what_ends_the_run(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(callbacks_lib.time, "monotonic", lambda: now[0])
    progress = callbacks_lib.TrainingProgress()
    progress.set_params({"verbose": 1, "epochs": 10, "steps": 5})
    progress.on_train_begin()
    assert progress.heading(0) == "Epoch 1/10"  # no epoch done yet: no estimate
    progress.on_epoch_begin(0)
    now[0] += 120  # two epochs in two minutes: a minute each, 8 epochs to go
    assert progress.heading(2) == "Epoch 3/10 · 2.0 min so far, about 8 min left"
    # A resumed run counts the epochs this fit trained, not those before it.
    progress.on_train_begin()
    progress.on_epoch_begin(6)
    now[0] += 90
    assert progress.heading(7) == "Epoch 8/10 · 1.5 min so far, about 4 min left"

    budget = callbacks_lib.TimeBudget(60)
    budget.on_train_begin()
    timed = callbacks_lib.TrainingProgress(budget)
    timed.set_params({"verbose": 1, "epochs": 1000, "steps": 5})
    timed.on_train_begin()
    now[0] += 9.8 * 60
    assert timed.heading(2) == ("Epoch 3 · 9.8 of 60 min, 50.2 min left (the time "
                                "budget ends the run)")
    now[0] += 60 * 60
    assert "0.0 min left" in timed.heading(9)


def test_fit_shows_the_run_progress_bar_and_not_keras_own(capsys):
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(), "mse")
    budget = callbacks_lib.TimeBudget(5)
    model.fit(np.zeros((4, 2)), np.zeros((4, 1)), epochs=3, batch_size=2, verbose=1,
              callbacks=[budget, callbacks_lib.TrainingProgress(budget)])
    printed = capsys.readouterr().out
    assert printed.count("of 5 min") == 3 and "Epoch 2/3" not in printed
    assert printed.count("2/2") == 3  # one bar per epoch: Keras added none of its own


class _Stdout:
    def __init__(self, terminal):
        self.terminal = terminal

    def isatty(self):
        return self.terminal


def test_a_log_file_gets_a_line_per_epoch_and_a_terminal_the_bar(monkeypatch):
    monkeypatch.delitem(sys.modules, "ipykernel", raising=False)
    monkeypatch.setattr(fit.sys, "stdout", _Stdout(terminal=True))
    assert fit.progress_verbosity("auto") == 1
    monkeypatch.setattr(fit.sys, "stdout", _Stdout(terminal=False))
    assert fit.progress_verbosity("auto") == 2
    assert fit.progress_verbosity(1) == 1 and fit.progress_verbosity(0) == 0
    monkeypatch.setattr(fit.sys, "stdout", None)  # no console at all (pythonw)
    assert fit.progress_verbosity("auto") == 2
    monkeypatch.setitem(sys.modules, "ipykernel", object())
    assert fit.progress_verbosity("auto") == 1  # a notebook shows Keras's bar



def test_time_budget_is_refused_in_a_worker_cluster(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", '{"cluster": {"worker": ["a:1", "b:2"]}, '
                                    '"task": {"type": "worker", "index": 1}}')
    with pytest.raises(ValueError, match="time_budget_minutes"):
        fit.make_callbacks(config_lib.TrainConfig(time_budget_minutes=5), "unused")
    with pytest.raises(ValueError, match="positive"):
        callbacks_lib.TimeBudget(0)


def fit_with_constant_gradient(callbacks, steps, schedule):
    """Trains w (from 0) with SGD on a loss whose gradient is always -1: w = Σ rates."""
    model = keras.Sequential([keras.Input((1,)),
                              keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros")])
    model.compile(keras.optimizers.SGD(schedule), lambda targets, outputs: -outputs)
    model.fit(np.ones((steps, 1)), np.zeros((steps, 1)), batch_size=1, epochs=1,
              callbacks=callbacks, verbose=0)
    return float(model.get_weights()[0][0, 0])


def paper_rate(step, hidden_dim=4, warmup_steps=2):
    """Equation (3) of the paper at its step `step` (counted from 1)."""
    return hidden_dim ** -0.5 * min(step ** -0.5, step * warmup_steps ** -1.5)


def test_cooldown_takes_the_rate_the_step_applies_linearly_to_zero_by_steps():
    schedule = WarmupInverseSqrtSchedule(hidden_dim=4, warmup_steps=2)
    cooldown = callbacks_lib.LearningRateCooldown(schedule, 0.5, total_updates=8)
    weight = fit_with_constant_gradient([cooldown], 8, schedule)
    multipliers = [1, 1, 1, 1, 1, 0.75, 0.5, 0.25]  # progress k / 8 at step k
    expected = sum(m * paper_rate(k + 1) for k, m in enumerate(multipliers))
    np.testing.assert_allclose(weight, expected, rtol=1e-5)


def test_cooldown_follows_the_time_budget_when_it_ends_first(monkeypatch):
    clock = iter(range(0, 10_000, 30))  # every reading of the clock is 30 s later
    monkeypatch.setattr(callbacks_lib.time, "monotonic", lambda: next(clock))
    schedule = WarmupInverseSqrtSchedule(hidden_dim=4, warmup_steps=2)
    cooldown = callbacks_lib.LearningRateCooldown(schedule, 0.5, total_updates=100, minutes=2)
    weight = fit_with_constant_gradient([cooldown], 6, schedule)
    multipliers = [1, 1, 0.5, 0, 0, 0]  # step k begins 30 (k + 1) s into the 120 s
    expected = sum(m * paper_rate(k + 1) for k, m in enumerate(multipliers))
    np.testing.assert_allclose(weight, expected, rtol=1e-5)


def test_cooldown_needs_a_fraction_an_end_and_a_schedule():
    schedule = WarmupInverseSqrtSchedule(hidden_dim=4, warmup_steps=2)
    with pytest.raises(ValueError, match="between 0 and 1"):
        callbacks_lib.LearningRateCooldown(schedule, 1.0, total_updates=10)
    with pytest.raises(ValueError, match="time_budget_minutes"):
        callbacks_lib.LearningRateCooldown(schedule, 0.2)
    with pytest.raises(ValueError, match="schedule"):
        fit.make_callbacks(config_lib.TrainConfig(cooldown_fraction=0.2), "unused",
                                total_updates=10)
