"""The resumable backup: training resumes exactly where the last backup was taken.

`AtomicBackupAndRestore` (a `keras.callbacks.BackupAndRestore`) writes the backup and
restores it; `read_backup_position` tells where a run resumes, so that its data can
start there, and `read_backup_minutes` how long it has trained, so that a time budget
goes on where it was; `ResumedEpochEnd` ends the resumed epoch after its remaining
batches.
`fit.train` uses the three together (see docs/scaling.md).
"""

import json
import os
import shutil
import time

import h5py
import keras
import numpy as np

from keras_transformer import files


class BackupError(OSError):
    """The backup cannot be read; the message names its folder and the fix."""


def _unreadable(backup_dir, error):
    return BackupError(
        f"{backup_dir}: cannot restore the training backup ({error}). Restore the folder "
        "from a copy, or remove it to train this run again from the start.")


class AtomicBackupAndRestore(keras.callbacks.BackupAndRestore):
    """`keras.callbacks.BackupAndRestore` that resumes exactly where the backup was taken.

    Keras 3.15 restores the weights, the optimizer state and the epoch, then runs the
    interrupted epoch again from its first batch: the batches trained before the backup
    are trained on twice, and the dropout masks start over (a `SeedGenerator`'s state is
    not among the weights that `save_weights` writes). Here the weights file of every
    backup also records the training position, `(epoch, batches_done)` (how many
    batches of that epoch the weights have seen), the minutes of training they took
    (this process's since `fit` began plus those the restored backup held), and the
    state of every random generator of the model. Restoring puts the generators back,
    and:

    - the training data must start at that position: build it from
      `read_backup_position(backup_dir)` before `fit` (see `fit.train`);
    - the resumed epoch must end after its remaining batches: add the callback that
      `resumed_epoch_end()` returns, after every other callback;
    - a time budget and a cooldown by time must count the minutes spent before:
      give them `read_backup_minutes(backup_dir)` (`fit.make_callbacks` does).

    With both, and deterministic ops, a resumed run makes the uninterrupted run's updates
    on the same batches with the same dropout masks, and ends with the same weights.

    Files are never left half-written: Keras 3.15 writes `latest.weights.h5` and
    `training_metadata.json` in place, so a process killed during a write leaves a
    corrupt file (an empty metadata file stops every restart with a JSON error). Here
    each file (and each `.bkp` copy) is written under a temporary name and renamed over
    the old one; the weights file, which holds the position, comes first, so a kill
    between the two renames leaves a consistent (if newer) backup.

    Two fixes to the epoch: Keras 3.15 restores the epoch into the model but not into
    the callback, so backups written after a restart said epoch 0 and a second
    interruption started the run over; and a backup taken at an epoch's last batch
    resumes with the next epoch instead of repeating the finished one.

    Args:
        backup_dir: str. Where the backup lives.
        restore_only: bool. Restore at the start but never write: for the workers of a
            cluster other than the chief, which all restore the chief's backup so that
            every worker resumes from the same state.
        **kwargs: passed to `keras.callbacks.BackupAndRestore`; `save_freq` must be
            `"epoch"` or an integer, as there.
    """

    def __init__(self, backup_dir, restore_only=False, **kwargs):
        super().__init__(backup_dir, **kwargs)
        self.restore_only = restore_only
        self.resumed_at = (0, 0)
        self.resumed_minutes = 0.0
        self._began = None  # this process's start of training, time.monotonic()
        self._batches_done = 0  # of the current epoch, counting those before a restart
        self._first_batch = 0  # batches_done before this process's first batch
        self._ended_epoch_early = False

    def resumed_epoch_end(self):
        """Returns the callback that ends the resumed epoch; put it after every other."""
        return ResumedEpochEnd(self)

    def on_train_begin(self, logs=None):
        if not self.restore_only and os.path.isdir(self.backup_dir):
            for name in os.listdir(self.backup_dir):  # left by a process killed mid-write
                if files.is_stale_partial(name):
                    os.remove(os.path.join(self.backup_dir, name))
        try:
            self._began = time.monotonic()
            expected = read_backup_position(self.backup_dir)
            super().on_train_begin(logs)
            # Keras falls back on the `.bkp` copy when the newest weights do not load;
            # `read_backup_position` does the same, unless only Keras failed to read.
            if read_backup_position(self.backup_dir) != expected:
                raise OSError("the newest backup did not load and the previous one took "
                              "its place; run the same command again to resume from it")
            self.resumed_at = expected
            self.resumed_minutes = read_backup_minutes(self.backup_dir)
            if os.path.exists(self._weights_path):
                # The epoch in the weights file, not the metadata's: a kill between the
                # two renames leaves the metadata one backup behind.
                self.model._initial_epoch = expected[0]
                _restore_random_state(self.model, self._weights_path)
        except BackupError:
            raise
        except (OSError, ValueError) as error:
            raise _unreadable(self.backup_dir, error) from error

    def on_epoch_begin(self, epoch, logs=None):
        self._current_epoch = epoch
        resumed_epoch, resumed_batches = self.resumed_at
        self._first_batch = resumed_batches if epoch == resumed_epoch else 0
        self._batches_done = self._first_batch

    def on_train_batch_end(self, batch, logs=None):
        self._batches_done = self._first_batch + batch + 1
        super().on_train_batch_end(batch, logs)

    def on_epoch_end(self, epoch, logs=None):
        if self._ended_epoch_early:
            # Only the resumed epoch's own end stopped `fit`: go on with the next epoch.
            # Callbacks after this one may still ask for a stop at this epoch's end.
            self.model.stop_training = False
            self._ended_epoch_early = False
        self._batches_done = 0  # Keras's epoch-end save (save_freq="epoch") is of epoch + 1
        super().on_epoch_end(epoch, logs)

    def _steps_per_epoch(self):
        return (self.params or {}).get("steps")

    def _end_resumed_epoch(self):
        """At the resumed epoch's last batch, asks `fit` to stop unless another callback
        already has (see `ResumedEpochEnd`)."""
        resumed_epoch, resumed_batches = self.resumed_at
        if (resumed_batches and self._current_epoch == resumed_epoch
                and self._batches_done == self._steps_per_epoch()
                and not self.model.stop_training):
            self.model.stop_training = True
            self._ended_epoch_early = True

    def _save_model(self):
        if self.restore_only:
            return
        epoch, batches_done = self._current_epoch, self._batches_done
        steps = self._steps_per_epoch()
        if steps and batches_done >= steps:
            epoch, batches_done = epoch + 1, 0  # nothing of the epoch is left to run
        os.makedirs(self.backup_dir, exist_ok=True)
        if self.double_checkpoint:
            for current, previous in ((self._weights_path, self._prev_weights_path),
                                      (self._training_metadata_path,
                                       self._prev_training_metadata_path)):
                if os.path.exists(current):
                    files.replace_atomically(previous,
                                             lambda path: shutil.copyfile(current, path))
        minutes = self.resumed_minutes + (time.monotonic() - self._began) / 60
        files.replace_atomically(self._weights_path, lambda path: _save_training_state(
            self.model, path, (epoch, batches_done), minutes))
        metadata = json.dumps({"epoch": epoch, "batches_done": batches_done})
        files.write_text(self._training_metadata_path, metadata)


class ResumedEpochEnd(keras.callbacks.Callback):
    """Ends the epoch that `AtomicBackupAndRestore` resumed once its last batch is done.

    Keras runs `steps_per_epoch` batches in every epoch, the resumed one too, so here
    `fit` is asked to stop after that epoch's remaining batches, and the backup callback
    takes the request back at the epoch's end: validation and the epoch-end callbacks
    run where they ran in the uninterrupted run, and the next epoch follows. Put it
    after every other callback, so that it sees any stop that another one asks for at
    the same batch (then the run stops as asked). The backup callback must come before
    any callback that may stop training at an epoch's end.

    Args:
        backup: the `AtomicBackupAndRestore` of the run.
    """

    def __init__(self, backup):
        super().__init__()
        self.backup = backup

    def on_train_batch_end(self, batch, logs=None):
        self.backup._end_resumed_epoch()


_POSITION = "training_position"
_MINUTES = "training_minutes"
_RANDOM_STATE = "random_state"


def read_backup_position(backup_dir):
    """Returns where the backup in `backup_dir` resumes, as `(epoch, batches_done)`.

    `batches_done` counts the batches of `epoch` that the backed-up weights have seen.
    `(0, 0)` when there is no backup. As Keras does, an unreadable newest weights file
    gives way to the `.bkp` copy. A backup without a recorded position (written by
    `keras.callbacks.BackupAndRestore` itself) resumes at the start of its epoch.

    Args:
        backup_dir: str. The `backup_dir` of an `AtomicBackupAndRestore`.

    Raises:
        BackupError: neither weights file (or the metadata) can be read.
    """
    try:
        return _read_position(backup_dir)
    except (OSError, ValueError, KeyError, TypeError) as error:  # TypeError: not an object
        raise _unreadable(backup_dir, error) from error


def read_backup_minutes(backup_dir):
    """Returns the minutes of training that the backup in `backup_dir` holds.

    The wall-clock minutes from the start of training to the backup, summed over the
    processes that resumed it (epoch-end work such as validation included, as a time
    budget counts it); the work of a process after its last backup is lost with it, so
    not counted. 0 when there is no backup or it records no minutes (written before
    they were recorded, or by `keras.callbacks.BackupAndRestore` itself).

    Args:
        backup_dir: str. The `backup_dir` of an `AtomicBackupAndRestore`.

    Raises:
        BackupError: neither weights file can be read.
    """
    try:
        return float(_read_attributes(backup_dir).get(_MINUTES, 0.0))
    except (OSError, ValueError, TypeError) as error:
        raise _unreadable(backup_dir, error) from error


def _read_position(backup_dir):
    position = _read_attributes(backup_dir).get(_POSITION)
    if position is not None:
        return tuple(int(value) for value in position)
    metadata_path = os.path.join(backup_dir, files.BACKUP_METADATA)
    if not os.path.exists(metadata_path):
        return (0, 0)
    with open(metadata_path, encoding="utf-8") as file:
        return (int(json.load(file)["epoch"]), 0)


def _read_attributes(backup_dir):
    """The attributes of the backup's weights file, or of its `.bkp` copy where the
    newest does not open (as Keras falls back); {} when there is no backup."""
    path = os.path.join(backup_dir, files.BACKUP_WEIGHTS)
    if not os.path.exists(path):
        return {}
    try:
        with h5py.File(path, "r") as file:
            return dict(file.attrs)
    except OSError as error:
        if not os.path.exists(path + ".bkp"):
            raise OSError(f"{files.BACKUP_WEIGHTS}: {error}") from error
        try:
            with h5py.File(path + ".bkp", "r") as file:
                return dict(file.attrs)
        except OSError as copy_error:
            raise OSError(f"neither {files.BACKUP_WEIGHTS} nor its .bkp copy can be read: "
                          f"{copy_error}") from error


def _random_state_variables(model):
    """The `SeedGenerator` states of `model`: the variables that are not its weights."""
    weights = {id(weight) for weight in model.weights}
    return [variable for variable in model.variables if id(variable) not in weights]


def _save_training_state(model, path, position, minutes):
    """Saves the weights and optimizer state, then adds the position, the minutes of
    training and the random state."""
    model.save_weights(path, overwrite=True)
    variables = _random_state_variables(model)
    with h5py.File(path, "a") as file:
        file.attrs[_POSITION] = np.asarray(position, np.int64)
        file.attrs[_MINUTES] = float(minutes)
        file.attrs[_RANDOM_STATE] = np.asarray(
            [keras.ops.convert_to_numpy(variable) for variable in variables],
            np.int64).reshape(len(variables), 2)  # a SeedGenerator's state: 2 ints


def _restore_random_state(model, path):
    """Puts back the `SeedGenerator` states that `_save_training_state` recorded."""
    with h5py.File(path, "r") as file:
        if _RANDOM_STATE not in file.attrs:
            return
        states = np.asarray(file.attrs[_RANDOM_STATE])
    # In model order, as the weights: names carry per-process counters and may differ.
    variables = _random_state_variables(model)
    if len(states) != len(variables):
        raise ValueError(f"{path} holds {len(states)} random generator states; the model "
                         f"has {len(variables)}")
    for variable, state in zip(variables, states):
        variable.assign(state.astype(variable.dtype))
