"""Small training callbacks Keras lacks: throughput, step summaries, rolling checkpoints,
a stop on a non-finite loss, a time budget, a learning-rate cooldown, and a progress
bar headed by what ends the run.

The resumable backup is in `training.backup`, validation BLEU in `training.bleu`.
"""

import logging
import math
import os
import time

import keras

from keras_transformer import files, runs

logger = logging.getLogger(__name__)


class ThroughputLogger(keras.callbacks.Callback):
    """Adds `tokens_per_second` and `learning_rate` to the logs of every training step.

    `learning_rate` is the optimizer's current rate: the one its next update applies.

    Keras callbacks never see batches, so the count comes from the `target_tokens` metric
    (real target tokens since the epoch began; see `metrics.TargetTokens`): the rate is
    its change over the wall time between two logged steps. At the end of an epoch it is
    the epoch's tokens over its training time (validation excluded). Put this callback
    before `TensorBoard` and the progress bar, which then show and record both values.

    Args:
        tokens_key: str. Name of the token-count metric. Defaults to `"target_tokens"`.
    """

    def __init__(self, tokens_key="target_tokens"):
        super().__init__()
        self.tokens_key = tokens_key

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_start = self._last_time = time.perf_counter()
        self._last_tokens = 0.0

    def on_train_batch_end(self, batch, logs=None):
        if logs is None or self.tokens_key not in logs:
            return
        now, tokens = time.perf_counter(), float(logs[self.tokens_key])
        elapsed = now - self._last_time
        if elapsed > 0:
            logs["tokens_per_second"] = (tokens - self._last_tokens) / elapsed
        self._last_time, self._last_tokens = now, tokens
        logs["learning_rate"] = float(keras.ops.convert_to_numpy(
            self.model.optimizer.learning_rate))

    def on_epoch_end(self, epoch, logs=None):
        training_time = self._last_time - self._epoch_start
        if logs is not None and training_time > 0:
            logs["tokens_per_second"] = self._last_tokens / training_time


class StepSummaries(keras.callbacks.Callback):
    """Writes every training log value to TensorBoard every `every_steps` weight updates.

    Tags are `batch_<name>` (Keras's own naming), the step is the optimizer's update
    count, which carries on across a restart from `BackupAndRestore` (Keras's batch
    counter starts again at 0). Use it with `TensorBoard(update_freq="epoch")`: in Keras
    3.15 an integer `update_freq` also gates the epoch summaries by the last batch's
    number, so most epochs would go unrecorded.

    Args:
        log_dir: str. Directory of the event files (e.g. `RUN_DIR/logs/train`).
        every_steps: int. Weight updates between two records.
    """

    def __init__(self, log_dir, every_steps):
        super().__init__()
        self.log_dir = os.fspath(log_dir)
        self.every_steps = every_steps
        self._last_step = None

    def on_train_begin(self, logs=None):
        # Imported here: the other callbacks serve training on any Keras backend, and
        # this one writes TensorFlow's event files.
        import tensorflow as tf
        self._summary = tf.summary
        self._writer = tf.summary.create_file_writer(self.log_dir)

    def on_train_batch_end(self, batch, logs=None):
        step = int(keras.ops.convert_to_numpy(self.model.optimizer.iterations))
        # With gradient accumulation several batches end on the same update.
        if not logs or step % self.every_steps or step == self._last_step:
            return
        self._last_step = step
        with self._writer.as_default(step=step):
            for name, value in logs.items():
                self._summary.scalar(f"batch_{name}", value)

    def on_train_end(self, logs=None):
        self._writer.close()


class RollingCheckpoint(keras.callbacks.Callback):
    """Saves the weights every `every_steps` updates and keeps only the newest `keep`.

    Files are `directory/step-<update>.weights.h5`, numbered by the optimizer's update
    count, which survives a restart from `BackupAndRestore`. Each is written to a
    temporary name and renamed, so a crash never leaves half a checkpoint under a real
    name. A step whose loss is not finite is never saved, so the newest checkpoint is
    always a good one. The state at the end of training is saved too.

    Args:
        directory: str. Where checkpoints go; created when needed.
        every_steps: int. Weight updates between checkpoints.
        keep: int or None. How many of the newest checkpoints to keep; `None` or `0`
            keeps all.
    """

    def __init__(self, directory, every_steps, keep=5):
        super().__init__()
        if every_steps < 1:
            raise ValueError(f"every_steps must be at least 1, got {every_steps}.")
        if keep is not None and keep < 0:
            # `[:-keep]` would be `[:1]`: every save would delete the oldest checkpoint,
            # so that none survives. Refused instead.
            raise ValueError(f"keep must be at least 0 (0 keeps all), got {keep}.")
        self.directory = os.fspath(directory)
        self.every_steps = every_steps
        self.keep = keep

    def on_train_batch_end(self, batch, logs=None):
        step = self._step()
        if step % self.every_steps == 0:
            self._save(step, logs)

    def on_train_end(self, logs=None):
        self._save(self._step(), logs)

    def _step(self):
        return int(keras.ops.convert_to_numpy(self.model.optimizer.iterations))

    def _save(self, step, logs):
        loss = (logs or {}).get("loss")
        if step == 0 or (loss is not None and not math.isfinite(float(loss))):
            return
        path = os.path.join(self.directory, files.CHECKPOINT.format(step=step))
        if os.path.exists(path):
            return
        os.makedirs(self.directory, exist_ok=True)
        files.replace_atomically(path, self.write)
        if self.keep:
            for old in runs.list_checkpoints(self.directory)[:-self.keep]:
                os.remove(old)

    def write(self, path):
        """Writes one checkpoint: the model's weights and its optimizer's state."""
        self.model.save_weights(path, overwrite=True)


class NonFiniteLossError(RuntimeError):
    """Training stopped because the loss became NaN or infinite."""

    exit_status = 1  # the command line's status for a failure (not a usage error)


class TerminateOnNonFiniteLoss(keras.callbacks.TerminateOnNaN):
    """Raises `NonFiniteLossError` at the first training step whose loss is not finite.

    Put it first among the callbacks: it raises before any later callback sees the step,
    so no checkpoint or backup holds the weights of that update (already damaged by its
    gradients), and the newest files on disk are the last good ones. The message names
    the update, the newest checkpoint, and the usual causes.

    Args:
        checkpoint_dir: str or None. Where `RollingCheckpoint` writes, named in the
            message.
    """

    def __init__(self, checkpoint_dir=None):
        super().__init__(raise_error=True)
        self.checkpoint_dir = checkpoint_dir

    def on_batch_end(self, batch, logs=None):
        loss = (logs or {}).get("loss")
        if loss is None or math.isfinite(float(loss)):
            return
        where = f"batch {batch}"
        if self.model is not None and self.model.optimizer is not None:
            step = keras.ops.convert_to_numpy(self.model.optimizer.iterations)
            where = f"weight update {int(step)}"
        newest = runs.list_checkpoints(self.checkpoint_dir)[-1:] if self.checkpoint_dir else []
        raise NonFiniteLossError(
            f"Training stopped at {where}: the loss is {float(loss)}. "
            f"Nothing from this update was saved; the newest checkpoint is "
            f"{newest[0] if newest else 'none yet'}. A loss that grows and then turns "
            "non-finite means too high a learning rate (lower train.learning_rate_scale "
            "or raise train.warmup_steps, in a new run directory); one that is non-finite "
            "from a given batch on points at that batch's data.")


class TimeBudget(keras.callbacks.Callback):
    """Stops training once `minutes` of wall-clock time have passed since it began.

    Checked after every batch, so the overshoot is at most one step plus the end of the
    epoch that Keras then finishes (validation and the epoch-end callbacks such as BLEU):
    a stopped run ends like a finished one, with its final checkpoint and weights. Time
    spent in callbacks counts. Checked again at each epoch's end, so that when that
    epoch's validation and callbacks spend what was left, no further epoch begins (one
    would run a single batch and then repeat all of that work); put it after the
    callbacks whose epoch-end work counts. The clock starts with each `fit` at
    `spent_minutes`: a resumed run passes the minutes its backup holds
    (`backup.read_backup_minutes`), so that the budget spans the whole run and not
    each process that resumed it.

    Args:
        minutes: float. The budget; must be positive.
        spent_minutes: float. Minutes of the budget spent before this `fit`.
    """

    def __init__(self, minutes, spent_minutes=0.0):
        super().__init__()
        if not minutes or minutes <= 0:
            raise ValueError(f"time_budget_minutes must be positive, got {minutes}.")
        self.minutes = float(minutes)
        self.spent_minutes = float(spent_minutes)
        self.stopped_at_step = None
        self._start = None

    def on_train_begin(self, logs=None):
        self._start = time.monotonic()
        self.stopped_at_step = None

    def on_train_batch_end(self, batch, logs=None):
        self._stop_if_spent("finishing this epoch and stopping")

    def on_epoch_end(self, epoch, logs=None):
        self._stop_if_spent("stopping after this epoch")

    def _stop_if_spent(self, what_follows):
        if self.stopped_at_step is None and self.elapsed_minutes() >= self.minutes:
            self.model.stop_training = True
            self.stopped_at_step = int(keras.ops.convert_to_numpy(
                self.model.optimizer.iterations))
            logger.info("Time budget of %g min reached at weight update %d: %s.",
                        self.minutes, self.stopped_at_step, what_follows)

    def elapsed_minutes(self):
        """Minutes spent: `spent_minutes` plus those since this `fit` began."""
        if self._start is None:
            return self.spent_minutes
        return self.spent_minutes + (time.monotonic() - self._start) / 60


class LearningRateCooldown(keras.callbacks.Callback):
    """Takes the learning rate linearly to 0 over the last `fraction` of a run.

    A run's progress is the larger of its share of weight updates (`total_updates`) and
    its share of the time budget (`minutes`, counted as `TimeBudget` counts them, from
    `spent_minutes` at the start of each `fit`). Until progress reaches `1 - fraction`
    the schedule runs as written; from there its `multiplier` falls linearly and
    reaches 0 where the run ends. The inverse-square-root schedule never decays to 0,
    so a run cut short by a budget otherwise ends at a high rate on noisy weights; a
    cooldown lets the last checkpoints (the ones averaged) settle, as in
    warmup-stable-decay schedules ([Hägele et al., 2024](https://arxiv.org/abs/2405.18392)).

    Args:
        schedule: a schedule with a `multiplier` variable (`WarmupInverseSqrtSchedule`).
        fraction: float in (0, 1). The share of the run spent cooling down.
        total_updates: int or None. Weight updates of the whole run: its batches
            divided by `gradient_accumulation_steps`, since the optimizer's
            `iterations`, which progress is read from, counts updates.
        minutes: float or None. The run's time budget. At least one of the two is needed.
        spent_minutes: float. Minutes of the budget spent before this `fit` (those of
            the backup a run resumes from).
    """

    def __init__(self, schedule, fraction, *, total_updates=None, minutes=None,
                 spent_minutes=0.0):
        super().__init__()
        if not 0 < fraction < 1:
            raise ValueError(f"cooldown_fraction must be between 0 and 1, got {fraction}.")
        if not total_updates and not minutes:
            raise ValueError("A learning-rate cooldown needs to know where the run ends: "
                             "give a time budget (train.time_budget_minutes) or a number "
                             "of epochs with known steps.")
        self.schedule = schedule
        self.fraction = float(fraction)
        self.total_updates = total_updates
        self.minutes = minutes
        self.spent_minutes = float(spent_minutes)
        self._start = None
        self._multiplier = None

    def on_train_begin(self, logs=None):
        self._start = time.monotonic()

    def on_train_batch_begin(self, batch, logs=None):
        multiplier = min(1.0, max(0.0, (1.0 - self.progress()) / self.fraction))
        if multiplier != self._multiplier:
            self.schedule.multiplier.assign(multiplier)
            self._multiplier = multiplier

    def progress(self):
        """The run's progress in [0, ∞): 1 where it is due to end."""
        shares = [0.0]
        if self.total_updates:
            updates = keras.ops.convert_to_numpy(self.model.optimizer.iterations)
            shares.append(int(updates) / self.total_updates)
        if self.minutes and self._start is not None:
            minutes = self.spent_minutes + (time.monotonic() - self._start) / 60
            shares.append(minutes / self.minutes)
        return max(shares)


class TrainingProgress(keras.callbacks.ProgbarLogger):
    """Keras's progress bar, each epoch headed by what ends the run and the time left.

    Keras heads each epoch with `Epoch 3/1000`, which under a time budget is a number
    that ends nothing. This heading says what does, and how long the rest takes:

        Epoch 3/127 · 3.6 min so far, about 225 min left
        Epoch 3 · 9.8 of 60 min, 50.2 min left (the time budget ends the run)

    The estimate of an epoch-bounded run is this `fit`'s minutes per finished epoch
    (validation and epoch-end callbacks included) times the epochs left; a time budget's
    minutes are its own clock's (`TimeBudget.elapsed_minutes`). Given to `model.fit`
    in place of the `ProgbarLogger` Keras would add, so `verbose` works as before.

    Args:
        budget: the run's `TimeBudget`, or None when its epochs bound it.
    """

    def __init__(self, budget=None):
        super().__init__()
        self.budget = budget
        self._start = self._first_epoch = None

    def on_train_begin(self, logs=None):
        super().on_train_begin(logs)
        self._start, self._first_epoch = time.monotonic(), None

    def on_epoch_begin(self, epoch, logs=None):
        self._reset_progbar()
        self._maybe_init_progbar()
        if self._first_epoch is None:
            self._first_epoch = epoch  # a resumed run begins past 0
        if not self.verbose:
            return
        if keras.config.is_interactive_logging_enabled():  # where Keras prints its bar
            print(self.heading(epoch), flush=True)
        else:
            logger.info(self.heading(epoch))

    def heading(self, epoch):
        """The line that heads epoch `epoch` (0-based)."""
        elapsed = (time.monotonic() - self._start) / 60
        if self.budget is not None:
            spent = self.budget.elapsed_minutes()
            return (f"Epoch {epoch + 1} · {spent:.1f} of {self.budget.minutes:g} min, "
                    f"{max(self.budget.minutes - spent, 0.0):.1f} min left (the time "
                    "budget ends the run)")
        heading = f"Epoch {epoch + 1}/{self.epochs}"
        done = epoch - (epoch if self._first_epoch is None else self._first_epoch)
        if done:
            left = elapsed / done * (self.epochs - epoch)
            heading += f" · {elapsed:.1f} min so far, about {left:.0f} min left"
        return heading
