"""Interrupted training: backups survive kills, resumption, and a non-finite loss.

The kill -9 test trains through `python train.py` in subprocesses and is slow:
`pytest -m slow tests/test_fault_tolerance.py` (see docs/scaling.md).
"""

import concurrent.futures
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time

import h5py
import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_transformer import config as config_lib
from keras_transformer import files, runs
from keras_transformer.training import backup as backup_lib
from keras_transformer.training import callbacks as callbacks_lib
from keras_transformer.training import fit
from keras_transformer.training.optimization import WarmupInverseSqrtSchedule
from tests.conftest import REPOSITORY, fixture_corpus


class Killed(BaseException):
    """Stands for SIGKILL arriving in the middle of a write."""


def small_model():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(keras.optimizers.Adam(0.1), "mse")
    return model


def small_data(batches=4):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(8 * batches, 3)).astype("float32")
    return x, x[:, :2] * 2.0


def backup_weights(backup_dir):
    model = small_model()
    model.optimizer.build(model.trainable_variables)
    model.load_weights(os.path.join(backup_dir, files.BACKUP_WEIGHTS))
    return model.get_weights()


def test_a_write_killed_midway_leaves_the_previous_backup(tmp_path, monkeypatch):
    model = small_model()
    x, y = small_data()
    backup = backup_lib.AtomicBackupAndRestore(
        tmp_path, save_freq=1, double_checkpoint=True, delete_checkpoint=False)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[backup])
    saved = model.get_weights()
    with open(tmp_path / "training_metadata.json") as file:
        metadata = json.load(file)

    def killed_save(path, overwrite=True):
        with open(path, "wb") as file:
            file.write(b"\x89HDF\r\n\x1a\n" + b"\x00" * 100)  # the start of a file
        raise Killed

    monkeypatch.setattr(model, "save_weights", killed_save)
    with pytest.raises(Killed):  # resumes with epoch 1; killed saving its first batch
        model.fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[backup])
    for current, previous in zip(backup_weights(tmp_path), saved):
        np.testing.assert_array_equal(current, previous)
    monkeypatch.undo()

    def killed_write(path, data):
        with open(path, "wb") as file:  # the temporary file, half written
            file.write(data[:len(data) // 2])
        raise Killed

    real_write_bytes = files.write_bytes

    def write_bytes(path, data):
        files.replace_atomically(path, lambda temporary: killed_write(temporary, data))

    monkeypatch.setattr(files, "write_bytes", write_bytes)
    with pytest.raises(Killed):
        model.fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[backup])
    monkeypatch.setattr(files, "write_bytes", real_write_bytes)
    with open(tmp_path / "training_metadata.json") as file:
        assert json.load(file) == metadata


def test_restart_after_a_restart_keeps_the_epoch(tmp_path):
    """Killed twice in the same epoch, a run must not start over from epoch 0."""
    x, y = small_data(batches=4)
    epochs_seen = []
    recorder = keras.callbacks.LambdaCallback(
        on_epoch_begin=lambda epoch, logs: epochs_seen.append(epoch))

    def interrupt_at(step):
        def stop(batch, logs):
            if int(interrupter.model.optimizer.iterations) == step:
                raise Killed
        interrupter = keras.callbacks.LambdaCallback(on_train_batch_end=stop)
        return interrupter

    for step in (6, 7):  # epoch 1 of 4-batch epochs, twice
        backup = backup_lib.AtomicBackupAndRestore(tmp_path, save_freq=1,
                                                     delete_checkpoint=False)
        with pytest.raises(Killed):
            small_model().fit(x, y, batch_size=8, epochs=3, verbose=0,
                              callbacks=[backup, recorder, interrupt_at(step)])
    with open(tmp_path / "training_metadata.json") as file:
        assert json.load(file)["epoch"] == 1
    assert epochs_seen == [0, 1, 1]


def test_a_backup_at_an_epoch_end_resumes_with_the_next_epoch(tmp_path):
    x, y = small_data(batches=4)
    backup = backup_lib.AtomicBackupAndRestore(tmp_path, save_freq=4,
                                                 delete_checkpoint=False)
    small_model().fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[backup])
    with open(tmp_path / "training_metadata.json") as file:
        assert json.load(file) == {"epoch": 1, "batches_done": 0}
    assert backup_lib.read_backup_position(tmp_path) == (1, 0)


def test_a_resumed_epoch_ends_after_its_remaining_batches(tmp_path):
    """Resumed at batch 2 of a 4-batch epoch: 2 more batches, then whole epochs; a stop
    that another callback asks for at that last batch still stops the run."""
    x, y = small_data(batches=4)
    stream = tf.data.Dataset.from_tensor_slices((x, y)).batch(8).repeat()

    def fit(start_batch, *callbacks):
        backup = backup_lib.AtomicBackupAndRestore(tmp_path / "backup", save_freq=1,
                                                   delete_checkpoint=False)
        model = small_model()
        history = model.fit(stream.skip(start_batch), epochs=3, steps_per_epoch=4,
                            shuffle=False, verbose=0,
                            callbacks=[backup, *callbacks, backup.resumed_epoch_end()])
        return model, history

    def interrupt(batch, logs):
        if int(interrupter.model.optimizer.iterations) == 6:
            raise Killed
    interrupter = keras.callbacks.LambdaCallback(on_train_batch_end=interrupt)
    with pytest.raises(Killed):
        fit(0, interrupter)
    position = backup_lib.read_backup_position(tmp_path / "backup")
    assert position == (1, 2)
    shutil.copytree(tmp_path / "backup", tmp_path / "copy")

    model, history = fit(4 * position[0] + position[1])
    assert history.epoch == [1, 2]
    assert int(model.optimizer.iterations) == 12

    shutil.rmtree(tmp_path / "backup")
    shutil.copytree(tmp_path / "copy", tmp_path / "backup")
    def stop(batch, logs):
        if int(stopper.model.optimizer.iterations) == 8:
            stopper.model.stop_training = True
    stopper = keras.callbacks.LambdaCallback(on_train_batch_end=stop)
    model, history = fit(4 * position[0] + position[1], stopper)
    assert history.epoch == [1]
    assert int(model.optimizer.iterations) == 8


def test_a_resumed_time_budget_goes_on_from_the_minutes_its_backup_holds(
        tmp_path, monkeypatch):
    """30 s a batch and a 3-minute budget: 6 updates, whether or not a kill at update 4
    (backed up there, at 2 minutes) splits them between two processes."""
    now = [0.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])  # backup's and the budget's
    tick = keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda batch, logs: now.__setitem__(0, now[0] + 30))
    x, y = small_data(batches=4)
    stream = tf.data.Dataset.from_tensor_slices((x, y)).batch(8).repeat()

    def fit_within_budget(backup_dir, *callbacks):
        spent = backup_lib.read_backup_minutes(backup_dir)
        start_batch = 4 * backup_lib.read_backup_position(backup_dir)[0]
        backup = backup_lib.AtomicBackupAndRestore(backup_dir, save_freq=1,
                                                   delete_checkpoint=False)
        budget = callbacks_lib.TimeBudget(3, spent_minutes=spent)
        cooldown = callbacks_lib.LearningRateCooldown(
            WarmupInverseSqrtSchedule(hidden_dim=4, warmup_steps=2), 0.5, minutes=3,
            spent_minutes=spent)
        model = small_model()
        model.fit(stream.skip(start_batch), epochs=5, steps_per_epoch=4, verbose=0,
                  shuffle=False,
                  callbacks=[tick, cooldown, backup, *callbacks, budget,
                             backup.resumed_epoch_end()])
        return model, budget, cooldown

    model, _, _ = fit_within_budget(tmp_path / "whole")
    assert int(model.optimizer.iterations) == 6

    def interrupt(batch, logs):
        if int(interrupter.model.optimizer.iterations) == 4:
            raise Killed
    interrupter = keras.callbacks.LambdaCallback(on_train_batch_end=interrupt)
    with pytest.raises(Killed):
        fit_within_budget(tmp_path / "split", interrupter)
    assert backup_lib.read_backup_minutes(tmp_path / "split") == 2.0
    model, budget, cooldown = fit_within_budget(tmp_path / "split")
    assert int(model.optimizer.iterations) == 6 and budget.stopped_at_step == 6
    assert budget.elapsed_minutes() == 3.0 and cooldown.progress() == 1.0
    assert backup_lib.read_backup_minutes(tmp_path / "split") == 3.0
    assert backup_lib.read_backup_minutes(tmp_path / "none") == 0.0


def test_train_gives_a_resumed_runs_budget_and_cooldown_the_minutes_of_its_backup(
        tmp_path, fixture_corpus_dir, monkeypatch):
    """`fit.train`'s wiring of the test above: killed after update 5 (backed up at 4),
    the run resumes with the minutes its backup holds, in the budget and the cooldown."""
    spent = {"budget": [], "cooldown": []}

    class Budget(callbacks_lib.TimeBudget):
        def __init__(self, *args, **options):
            super().__init__(*args, **options)
            spent["budget"].append(self.spent_minutes)

    class Cooldown(callbacks_lib.LearningRateCooldown):
        def __init__(self, *args, **options):
            super().__init__(*args, **options)
            spent["cooldown"].append(self.spent_minutes)

    monkeypatch.setattr(callbacks_lib, "TimeBudget", Budget)
    monkeypatch.setattr(callbacks_lib, "LearningRateCooldown", Cooldown)
    config = tiny_config(fixture_corpus_dir, "time_budget_minutes=60",
                         "cooldown_fraction=0.5", "epochs=2")
    run_dir = str(tmp_path / "run")

    def interrupt(batch, logs):
        if int(interrupter.model.optimizer.iterations) == 5:
            raise Killed
    interrupter = keras.callbacks.LambdaCallback(on_train_batch_end=interrupt)
    with pytest.raises(Killed):
        fit.train(config, run_dir, callbacks=[interrupter], verbose=0)
    backed_up = backup_lib.read_backup_minutes(os.path.join(run_dir, files.BACKUP))
    assert backed_up > 0
    fit.train(config, run_dir, verbose=0)
    assert spent == {"budget": [0.0, backed_up], "cooldown": [0.0, backed_up]}


def test_an_unreadable_backup_is_named(tmp_path):
    x, y = small_data()
    backup = backup_lib.AtomicBackupAndRestore(tmp_path, save_freq=1,
                                                 delete_checkpoint=False)
    small_model().fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[backup])
    (tmp_path / "training_metadata.json").write_text('{"epoch": ')
    with pytest.raises(OSError, match=f"{tmp_path}: cannot restore the training backup"):
        small_model().fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[
            backup_lib.AtomicBackupAndRestore(tmp_path, save_freq=1)])


# A non-finite loss in a real run.
NAN_STEPS = 6
NAN_EVERY = 2
POISONED_BATCH = 3  # the fourth update: one that saves a checkpoint and a backup


def tiny_config(data_dir, *overrides):
    return config_lib.override(config_lib.preset_config("tiny"), [
        f"data_dir={data_dir}", "num_layers=1", "epochs=1",
        f"steps_per_epoch={NAN_STEPS}", f"checkpoint_every_steps={NAN_EVERY}",
        "keep_checkpoints=10", *overrides])


def test_a_non_finite_loss_stops_training_and_keeps_the_last_good_checkpoint(
        tmp_path, fixture_corpus_dir, monkeypatch):
    """A batch whose loss weights are infinite (a broken data stage) poisons update 4."""
    make_datasets = fit.make_datasets

    def poisoned_datasets(config, tokenizer, splits, position, **options):
        train_data, validation_data, steps = make_datasets(config, tokenizer, splits,
                                                           position, **options)

        def poison(index, batch):
            inputs, targets, weights = batch
            weights = tf.where(index == POISONED_BATCH, weights * math.inf, weights)
            return inputs, targets, weights

        return train_data.enumerate().map(poison), validation_data, steps

    monkeypatch.setattr(fit, "make_datasets", poisoned_datasets)
    run_dir = str(tmp_path / "run")
    with pytest.raises(callbacks_lib.NonFiniteLossError) as raised:
        fit.train(tiny_config(fixture_corpus_dir), run_dir, verbose=0)
    newest = os.path.join(run_dir, files.CHECKPOINTS, "step-00000002.weights.h5")
    assert "weight update 4: the loss is nan" in str(raised.value)
    assert newest in str(raised.value)

    # Nothing of update 4 was written: no later checkpoint or backup, no final weights.
    checkpoints = runs.list_checkpoints(os.path.join(run_dir, files.CHECKPOINTS))
    assert checkpoints[-1] == newest
    assert not os.path.exists(os.path.join(run_dir, files.FINAL_WEIGHTS))
    _, _, model = runs.load_run(run_dir, weights="latest")
    assert all(np.isfinite(weight).all() for weight in model.get_weights())
    with h5py.File(os.path.join(run_dir, files.BACKUP, files.BACKUP_WEIGHTS), "r") as file:
        assert int(file["optimizer/vars/0"][()]) == 2
        backed_up = [np.asarray(file[name]) for name in _weight_datasets(file)]
    assert backed_up and all(np.isfinite(weight).all() for weight in backed_up)


def _weight_datasets(file):
    names = []
    file.visititems(lambda name, item: names.append(name)
                    if isinstance(item, h5py.Dataset) else None)
    return sorted(names)


# kill -9 of `python train.py`, then the same command again.
EPOCHS = 3
STEPS = 8
EVERY = 2
FIRST_KILL_AFTER = 10  # update 10 is the second batch of the second epoch
# The backup's files, in the order their writes are killed: the copy of the previous
# weights, the metadata (whose kill leaves it a backup behind the weights, which say where
# to resume), then the weights, so that the last kill leaves both of one backup.
KILLED_WRITES = (files.BACKUP_WEIGHTS + ".bkp", files.BACKUP_METADATA, files.BACKUP_WEIGHTS)
TIMEOUT_S = 900
# The runs_killed fixture's waits end at its TIMEOUT_S deadline, inside this limit (the
# fixture took 303 s on 2 cores shared with a training job).
KILL_TIMEOUT = pytest.mark.timeout(TIMEOUT_S + 120)

# `python train.py ARGUMENTS` that stops in the middle of its COUNT-th write of the backup
# file NAME, once the temporary file is written and before the rename that replaces the
# real one, and then creates the file MARKER: killed there, the process dies during that
# write whatever the machine's speed.
PAUSE_IN_WRITE = """
import os, signal, sys, runpy
from keras_transformer import files
name, count, marker, script = sys.argv[1:5]
replace_atomically, writes = files.replace_atomically, []

def replace_pausing(path, write):
    directory, base = os.path.split(os.fspath(path))
    if base == name and os.path.basename(directory) == files.BACKUP:
        writes.append(path)
        if len(writes) == int(count):
            def write_then_pause(temporary):
                write(temporary)
                files.write_text(marker, os.path.basename(temporary))
                while True:
                    signal.pause()
            return replace_atomically(path, write_then_pause)
    return replace_atomically(path, write)

files.replace_atomically = replace_pausing
sys.argv = sys.argv[4:]
runpy.run_path(script, run_name="__main__")
"""


def train_command(run_dir, every):
    return [sys.executable, str(REPOSITORY / "train.py"), "--preset", "tiny",
            "--data-dir", str(fixture_corpus()), "--run-dir", str(run_dir),
            "--epochs", str(EPOCHS), "--steps-per-epoch", str(STEPS), "num_layers=1",
            f"checkpoint_every_steps={every}", "keep_checkpoints=100",
            f"log_every_steps={every}"]


class Runner:
    """Starts `python train.py` on one run directory, again and again, into one log."""

    def __init__(self, run_dir, every, deadline):
        self.run_dir, self.every, self.deadline = run_dir, every, deadline
        self.log = open(f"{run_dir}.log", "w")
        self.paused = f"{run_dir}.paused"
        self.process = None

    def start(self, pause_in_write=None):
        """Starts the command; with `(backup file name, count)`, one that pauses in that
        write of the file (`PAUSE_IN_WRITE`)."""
        environment = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3",
                       "CUDA_VISIBLE_DEVICES": ""}
        command = train_command(self.run_dir, self.every)
        if pause_in_write:
            if os.path.exists(self.paused):
                os.remove(self.paused)
            name, count = pause_in_write
            command = [command[0], "-c", PAUSE_IN_WRITE, name, str(count), self.paused,
                       *command[1:]]
        self.process = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT,
                                        env=environment)

    def kill(self):
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def finish(self):
        code = self.process.wait(timeout=max(1.0, self.deadline - time.monotonic()))
        self.log.close()
        assert code == 0, f"see {self.run_dir}.log"

    def wait(self, condition):
        """Polls `condition()` until it returns a true value, which it returns."""
        while time.monotonic() < self.deadline:
            assert self.process.poll() is None, f"ended early; see {self.run_dir}.log"
            found = condition()
            if found:
                return found
            time.sleep(0.005)
        self.process.kill()
        pytest.fail(f"timed out waiting on {self.run_dir}")

    def backup_after(self, step):
        def newer():
            found = read_backup(self.run_dir, missing_ok=True)
            return found if found and found[0] > step else None
        return self.wait(newer)

    def log_size(self):
        """Bytes the run's log holds now (restarts append to it)."""
        return os.path.getsize(self.log.name)

    def began_epoch(self, number, since):
        """Waits until the log, past byte `since`, shows epoch `number` (1-based) begun."""
        header = f"Epoch {number}/{EPOCHS}".encode()

        def printed():
            with open(self.log.name, "rb") as log:
                log.seek(since)
                return header in log.read()
        return self.wait(printed)

    def paused_in_write(self):
        """Waits until the process pauses in a write; returns the backup's partial files."""
        self.wait(lambda: os.path.exists(self.paused))
        backup_dir = os.path.join(self.run_dir, files.BACKUP)
        return sorted(name for name in os.listdir(backup_dir)
                      if name.startswith(files.PARTIAL_PREFIX))


def read_backup(run_dir, missing_ok=False):
    """Returns `(update count, metadata)` of the backup; raises if a file is unreadable."""
    backup_dir = os.path.join(run_dir, files.BACKUP)
    try:
        with h5py.File(os.path.join(backup_dir, files.BACKUP_WEIGHTS), "r") as file:
            step = int(file["optimizer/vars/0"][()])
        with open(os.path.join(backup_dir, "training_metadata.json")) as file:
            return step, json.load(file)
    except FileNotFoundError:
        if missing_ok:
            return None
        raise


def weights_of(path):
    """The model weights (not the optimizer state) of a Keras weights file, by name."""
    with h5py.File(path, "r") as file:
        return {name: np.asarray(file[name]) for name in _weight_datasets(file)
                if not name.startswith("optimizer")}


@pytest.fixture(scope="module")
def runs_killed(tmp_path_factory):
    """Three runs of the same training at once.

    - uninterrupted: never killed.
    - mid_epoch (a backup every 2 updates): killed writing the backup after update 10's,
      then during a write of each of the backup's files (`KILLED_WRITES`), then finished.
    - epoch_end (a backup at every epoch's end): killed in the middle of the second and
      of the third epoch, then finished.
    """
    root = tmp_path_factory.mktemp("kill9")
    deadline = time.monotonic() + TIMEOUT_S
    uninterrupted = Runner(root / "uninterrupted", EVERY, deadline)
    mid_epoch = Runner(root / "mid_epoch", EVERY, deadline)
    epoch_end = Runner(root / "epoch_end", STEPS, deadline)
    uninterrupted.start()
    # Paused writing the backup after update 10's, so that update 10's is the newest.
    mid_epoch.start(pause_in_write=(files.BACKUP_WEIGHTS, FIRST_KILL_AFTER // EVERY + 1))
    epoch_end.start()
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        mid_epoch_record = pool.submit(kill_mid_epoch, mid_epoch)
        epoch_end_kills = pool.submit(kill_after_epoch_ends, epoch_end)
        record = {**mid_epoch_record.result(), "epoch_end_kills": epoch_end_kills.result()}
    for runner in (uninterrupted, mid_epoch, epoch_end):
        runner.finish()
    return root, record


def kill_mid_epoch(runner):
    """Kills while the backup after update 10's is written, then in the second backup of
    each restart, during the write of each file of `KILLED_WRITES`."""
    runner.paused_in_write()
    runner.kill()
    record = {"first_backup": read_backup(runner.run_dir), "events": []}
    for name in KILLED_WRITES:
        restored = read_backup(runner.run_dir)
        runner.start(pause_in_write=(name, 2))
        first_new = runner.backup_after(restored[0])
        in_progress = runner.paused_in_write()
        writer = runner.process.pid
        runner.kill()
        record["events"].append({"restored": restored, "first_new_backup": first_new[0],
                                 "file": name, "killed_while_writing": in_progress,
                                 "writer": writer,
                                 "after_kill": read_backup(runner.run_dir)})
    record["last_restored"] = read_backup(runner.run_dir)
    runner.start()
    return record


def kill_after_epoch_ends(runner):
    """Kills in the middle of the second and of the third epoch; returns the backups."""
    kills = []
    for epoch, boundary in ((2, STEPS), (3, 2 * STEPS)):
        since = runner.log_size()
        runner.backup_after(boundary - 1)
        # Keras prints the header as the next epoch begins: a kill now lands in that
        # epoch, before its end's backup, however fast the machine trains.
        runner.began_epoch(epoch, since)
        runner.kill()
        kills.append(read_backup(runner.run_dir)[0])
        runner.start()
    return kills


@KILL_TIMEOUT
@pytest.mark.slow
def test_restarts_resume_from_the_newest_backup(runs_killed):
    root, record = runs_killed
    assert record["first_backup"][0] == FIRST_KILL_AFTER
    for event in record["events"]:
        # Resumed from the backup, not from update 0: the next backup is one interval
        # on, so what a kill loses is the updates since the last backup.
        assert event["first_new_backup"] == event["restored"][0] + EVERY
    # Each restart goes on from the backup's batch of its epoch, so the run makes the
    # uninterrupted run's updates, no more.
    last_step, last_metadata = record["last_restored"]
    assert last_step == last_metadata["epoch"] * STEPS + last_metadata["batches_done"]
    assert read_backup(root / "mid_epoch")[0] == EPOCHS * STEPS


@KILL_TIMEOUT
@pytest.mark.slow
def test_kills_during_writes_never_leave_an_unreadable_backup(runs_killed):
    root, record = runs_killed
    assert [event["file"] for event in record["events"]] == list(KILLED_WRITES)
    for event in record["events"]:  # read_backup would have raised on a broken file
        assert event["killed_while_writing"] == [
            files.partial_name(event["file"], pid=event["writer"])]
        # Killed in the restart's second backup: only the metadata's kill comes after the
        # newer weights' rename, and leaves the metadata of the backup before them.
        step, metadata = event["after_kill"]
        newer = event["file"] == files.BACKUP_METADATA
        assert step == event["first_new_backup"] + (EVERY if newer else 0)
        assert (metadata["epoch"] * STEPS + metadata["batches_done"]
                == event["first_new_backup"])
    assert os.path.exists(root / "mid_epoch" / files.FINAL_WEIGHTS)


@KILL_TIMEOUT
@pytest.mark.slow
def test_the_restored_state_is_the_uninterrupted_runs_state(runs_killed):
    """Training is deterministic: up to the first backup both runs are bit-identical."""
    root, record = runs_killed
    checkpoint = f"step-{record['first_backup'][0]:08d}.weights.h5"
    killed = weights_of(root / "mid_epoch" / files.CHECKPOINTS / checkpoint)
    uninterrupted = weights_of(root / "uninterrupted" / files.CHECKPOINTS / checkpoint)
    assert killed.keys() == uninterrupted.keys() and killed
    for name in killed:
        np.testing.assert_array_equal(killed[name], uninterrupted[name], err_msg=name)


@KILL_TIMEOUT
@pytest.mark.slow
def test_resumed_runs_end_with_the_uninterrupted_runs_weights(runs_killed):
    """Restarted four times mid-epoch, or twice at epoch ends: the same final weights.

    Each restart restores the weights, the optimizer state and the random generators'
    state (the dropout masks), and its data start at the backup's batch of the same
    seeded stream, so every update is the uninterrupted run's. On this CPU the weights
    are bit-identical; the tolerance, a millionth of how far training moved them, only
    allows for kernels that sum in another order from one process to the next.
    """
    root, record = runs_killed
    assert record["epoch_end_kills"] == [STEPS, 2 * STEPS]
    checkpoints = root / "uninterrupted" / files.CHECKPOINTS
    start = weights_of(checkpoints / f"step-{EVERY:08d}.weights.h5")
    uninterrupted = weights_of(root / "uninterrupted" / files.FINAL_WEIGHTS)
    moved = distance(uninterrupted, start)
    assert moved > 1.0
    for name in ("mid_epoch", "epoch_end"):
        assert read_backup(root / name)[0] == EPOCHS * STEPS
        resumed = weights_of(root / name / files.FINAL_WEIGHTS)
        assert resumed.keys() == uninterrupted.keys()
        assert distance(resumed, uninterrupted) <= 1e-6 * moved, name


def distance(a, b):
    """Euclidean distance between two sets of weights, taken as one vector."""
    return math.sqrt(sum(float(np.sum((a[name] - b[name]) ** 2)) for name in a))
