"""Two small training callbacks Keras lacks: throughput logging and rolling checkpoints."""

import math
import os
import re
import time

import keras

CHECKPOINT_PATTERN = re.compile(r"^step-(\d+)\.weights\.h5$")


class ThroughputLogger(keras.callbacks.Callback):
    """Adds `tokens_per_second` and `learning_rate` to the logs of every training step.

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
        path = os.path.join(self.directory, f"step-{step:08d}.weights.h5")
        if os.path.exists(path):
            return
        os.makedirs(self.directory, exist_ok=True)
        temporary = os.path.join(self.directory, f"partial-step-{step:08d}.weights.h5")
        self.model.save_weights(temporary, overwrite=True)
        os.replace(temporary, path)
        if self.keep:
            for old in list_checkpoints(self.directory)[:-self.keep]:
                os.remove(old)


def list_checkpoints(directory):
    """Returns the paths of the checkpoints in `directory`, oldest (lowest step) first."""
    if not os.path.isdir(directory):
        return []
    found = [(int(match.group(1)), name) for name in os.listdir(directory)
             if (match := CHECKPOINT_PATTERN.match(name))]
    return [os.path.join(directory, name) for _, name in sorted(found)]
