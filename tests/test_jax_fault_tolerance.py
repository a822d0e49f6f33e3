"""Resumption on Keras's JAX backend: a run stopped at an epoch's end, or killed in the
middle of one, ends with the uninterrupted run's weights (on TensorFlow:
tests/test_fault_tolerance.py). Each JAX run is a subprocess."""

import importlib.util

import pytest

from keras_transformer import files
from keras_transformer.training import backup as backup_lib
from tests.jax_helpers import RUN, distance, model_weights, run_jax, train_code

pytestmark = [
    pytest.mark.jax,
    pytest.mark.skipif(importlib.util.find_spec("jax") is None,
                       reason="JAX is not installed (pip install -e '.[jax]')"),
]

# Trains like the train command, then dies at once (as a process killed by a signal
# would) after weight update KILL_AFTER, in the middle of the second epoch.
KILL_AFTER = 11
KILLED_CODE = """
import os, keras
from keras_transformer import cli
from keras_transformer.training import fit
make_callbacks = fit.make_callbacks

class Kill(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if int(keras.ops.convert_to_numpy(self.model.optimizer.iterations)) == {step}:
            os._exit(0)

fit.make_callbacks = lambda *args, **kwargs: [*make_callbacks(*args, **kwargs), Kill()]
cli.main(['train', *{arguments!r}])
raise SystemExit('training ended without being killed')
"""


@pytest.fixture(scope="module")
def resumed_runs(tmp_path_factory):
    """Two epochs of 6 updates (backups every 3), trained uninterrupted, in two runs of
    the command (stopped at the end of the first epoch), and killed after update 11,
    then resumed from the backup of update 9, in the middle of the second epoch."""
    root = tmp_path_factory.mktemp("resumed")
    runs = {name: root / name for name in ("uninterrupted", "epoch_end", "mid_epoch")}
    killed = [*RUN, "--run-dir", str(runs["mid_epoch"]), "epochs=2"]
    run_jax(train_code((runs["uninterrupted"], ["epochs=2"]), (runs["epoch_end"], ["epochs=1"]),
                       (runs["epoch_end"], ["epochs=2"]))
            + KILLED_CODE.format(step=KILL_AFTER, arguments=killed), timeout=900)
    backup = runs["mid_epoch"] / files.BACKUP
    killed_at = backup_lib.read_backup_position(str(backup))
    killed_final = (runs["mid_epoch"] / files.FINAL_WEIGHTS).exists()
    run_jax(train_code((runs["mid_epoch"], ["epochs=2"])), timeout=300)
    return runs, killed_at, killed_final


@pytest.mark.timeout(1500)  # resumed_runs: JAX processes of at most 900 s and 300 s; 399 s
def test_a_jax_run_resumed_at_an_epochs_end_ends_with_the_uninterrupted_runs_weights(
        resumed_runs):
    """Dropout is on: the backup must restore the random generators' state as well."""
    runs, _, _ = resumed_runs
    final = model_weights(runs["uninterrupted"] / files.FINAL_WEIGHTS)
    start = model_weights(
        runs["uninterrupted"] / files.CHECKPOINTS / files.CHECKPOINT.format(step=3))
    assert distance(final, start) > 0.1
    again = model_weights(runs["epoch_end"] / files.FINAL_WEIGHTS)
    assert again.keys() == final.keys()
    assert distance(again, final) <= 1e-6 * distance(final, start)


@pytest.mark.timeout(1500)  # resumed_runs, as above, when this test runs first
def test_a_jax_run_killed_mid_epoch_resumes_to_the_uninterrupted_runs_weights(resumed_runs):
    """The resumed run starts at the backup's batch of the second epoch, with its
    dropout generators' state, and makes the uninterrupted run's remaining updates."""
    runs, killed_at, killed_final = resumed_runs
    assert killed_at == (1, 3) and not killed_final  # epoch 2 had made 3 of 6 updates
    final = model_weights(runs["uninterrupted"] / files.FINAL_WEIGHTS)
    start = model_weights(
        runs["uninterrupted"] / files.CHECKPOINTS / files.CHECKPOINT.format(step=3))
    resumed = model_weights(runs["mid_epoch"] / files.FINAL_WEIGHTS)
    assert resumed.keys() == final.keys()
    assert distance(resumed, final) <= 1e-6 * distance(final, start)
    assert backup_lib.read_backup_position(str(runs["mid_epoch"] / files.BACKUP)) == (2, 0)
