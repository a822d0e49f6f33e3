"""Two worker processes under TF_CONFIG train like one process on the same global batches.

The workers talk over gRPC on 127.0.0.1 (MultiWorkerMirroredStrategy's ring collectives on
CPU). Each process runs the train command's own argument handling and `fit.train`, then
dumps its final weights and per-step losses. A hang fails the test at the subprocess
timeout instead of blocking the run.
"""

import json
import os
import socket
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from keras_transformer import config as config_lib
from keras_transformer import files, runs
from keras_transformer.training import backup as backup_lib
from keras_transformer.training import callbacks as callbacks_lib
from keras_transformer.training import fit
from tests.conftest import REPOSITORY, fixture_corpus

TIMEOUT_S = 420
# The cluster fixture waits up to TIMEOUT_S for its processes (116 s measured on 2 busy
# cores), in whichever test runs first.
# Also run on Eigen's kernels in CI, as the other float comparisons (tests/numerics.py).
pytestmark = [pytest.mark.timeout(TIMEOUT_S + 180), pytest.mark.numerics]
STEPS = 4
EVERY = 2
COOLDOWN_FRACTION = 0.5
ARGUMENTS = ["--preset", "tiny", "--data-dir", str(fixture_corpus()), "--epochs", "1",
             "--steps-per-epoch", str(STEPS), "num_layers=1", "dropout=0.0",
             f"checkpoint_every_steps={EVERY}", f"log_every_steps={EVERY}",
             f"cooldown_fraction={COOLDOWN_FRACTION}"]

# Trains through the train command's arguments, then writes OUT.npz (weights) and OUT.json.
DRIVER = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, sys.argv[1])
    import keras
    import numpy as np
    import tensorflow as tf
    from keras_transformer import cli
    from keras_transformer.training import fit

    out = sys.argv[2]
    parser = cli.make_parser()[1]["train"]
    config, run_dir = cli.make_config(parser.parse_intermixed_args(sys.argv[3:]))
    losses = []
    recorder = keras.callbacks.LambdaCallback(
        on_train_begin=lambda logs: np.savez(out + "_initial.npz",
                                             *recorder.model.get_weights()),
        on_train_batch_end=lambda batch, logs: losses.append(float(logs["loss"])))
    model = fit.train(config, run_dir, callbacks=[recorder], verbose=0).model
    strategy = model.distribute_strategy
    np.savez(out + ".npz", *model.get_weights())
    with open(out + ".json", "w") as file:
        json.dump({"losses": losses, "replicas": strategy.num_replicas_in_sync,
                   "multi_worker": isinstance(
                       strategy, tf.distribute.MultiWorkerMirroredStrategy),
                   "updates": int(keras.ops.convert_to_numpy(model.optimizer.iterations)),
                   "learning_rate": float(keras.ops.convert_to_numpy(
                       model.optimizer.learning_rate))},
                  file)
""")


def free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    for sock in sockets:
        sock.bind(("127.0.0.1", 0))
    ports = [sock.getsockname()[1] for sock in sockets]
    for sock in sockets:
        sock.close()
    return ports


def start(out, run_dir, tf_config=None, extra=()):
    environment = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""}
    environment.pop("TF_CONFIG", None)
    if tf_config:
        environment["TF_CONFIG"] = json.dumps(tf_config)
    command = [sys.executable, "-c", DRIVER, str(REPOSITORY), str(out),
               "--run-dir", str(run_dir), *ARGUMENTS, *extra]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=environment)


def finish(processes):
    """Waits for every process; kills them all if one hangs or fails."""
    outputs = {}
    try:
        for name, process in processes.items():
            outputs[name] = process.communicate(timeout=TIMEOUT_S)[0]
    except subprocess.TimeoutExpired:
        for process in processes.values():
            process.kill()
        pytest.fail(f"training hung for more than {TIMEOUT_S} s (collective timeout?)")
    for name, process in processes.items():
        assert process.returncode == 0, f"{name} failed:\n{outputs[name][-4000:]}"


def load(out):
    with open(f"{out}.json") as file:
        record = json.load(file)
    for key, suffix in (("weights", ""), ("initial", "_initial")):
        weights = np.load(f"{out}{suffix}.npz")
        record[key] = [weights[f"arr_{i}"] for i in range(len(weights.files))]
    return record


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Worker 0 (the chief) and worker 1 train together; a reference trains alone.

    Worker 1 gets its own run directory, as on a machine with its own disk, so that
    anything it writes would show. The reference runs `MirroredStrategy` over one CPU,
    so that it takes the workers' path through Keras (under a strategy, `fit` builds the
    model from a first batch drawn beforehand); the batches themselves depend only on
    the seed and their place in the stream.
    """
    root = tmp_path_factory.mktemp("cluster")
    ports = free_ports(2)
    workers = [f"127.0.0.1:{port}" for port in ports]
    processes = {
        f"worker {index}": start(root / f"worker{index}", root / f"run{index}", {
            "cluster": {"worker": workers}, "task": {"type": "worker", "index": index}})
        for index in range(2)}
    processes["reference"] = start(root / "reference", root / "reference_run",
                                   extra=['devices=["/cpu:0"]'])
    finish(processes)
    return root, {name: load(root / name.replace(" ", ""))
                  for name in ("worker 0", "worker 1", "reference")}


def test_train_py_uses_multi_worker_mirrored_strategy(cluster):
    _, records = cluster
    for name in ("worker 0", "worker 1"):
        assert records[name]["multi_worker"], name
        assert records[name]["replicas"] == 2
        assert records[name]["updates"] == STEPS
    assert not records["reference"]["multi_worker"]
    assert records["reference"]["replicas"] == 1


def test_workers_finish_with_identical_weights(cluster):
    _, records = cluster
    first, second = records["worker 0"]["weights"], records["worker 1"]["weights"]
    assert len(first) == len(second) > 0
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a, b)
    assert records["worker 0"]["losses"] == records["worker 1"]["losses"]


def test_two_workers_match_one_process_on_the_same_global_batches(cluster):
    # Each worker computes half of every global batch: only if the batches are split
    # (not handed out whole to alternating workers) do the numbers match.
    _, records = cluster
    cluster_losses = records["worker 0"]["losses"]
    reference_losses = records["reference"]["losses"]
    assert len(cluster_losses) == len(reference_losses) == STEPS
    # Losses near 6.9 differed by 1e-6 at most under three kernel sets (oneDNN with
    # AVX-512 or AVX2, Eigen); 2e-5 of their size is 140 float32 ulps.
    np.testing.assert_allclose(cluster_losses, reference_losses, rtol=2e-5)
    for a, b in zip(records["worker 0"]["initial"], records["reference"]["initial"]):
        np.testing.assert_array_equal(a, b)
    # Summation order differs (all-reduce of two halves against one sum), and Adam's
    # first steps are about the gradient's sign: a weight with a near-zero gradient
    # may step the other way. The largest single difference was 3.2-4.7 % of the
    # largest move across the kernel sets (6.9 % on a CPU without AVX-512), so the
    # weights are compared as a whole: the norm of their difference was 0.07-0.10 %
    # of the norm of the update.
    def norm(arrays):
        return float(np.sqrt(sum(np.sum(np.square(array)) for array in arrays)))

    reference, initial = records["reference"]["weights"], records["reference"]["initial"]
    moved = norm([w - i for w, i in zip(reference, initial)])
    differ = norm([w - r for w, r in zip(records["worker 0"]["weights"], reference)])
    assert moved > 1e-2
    assert differ < 0.01 * moved


def test_the_cooldown_takes_the_rate_down_alike_on_every_worker(cluster):
    # The last update began at progress (STEPS - 1) / STEPS = 3/4, half-way through the
    # cooldown: the schedule's multiplier is 1/2 there on every worker.
    _, records = cluster
    tiny = config_lib.preset_config("tiny")
    formula = float(fit.make_schedule(tiny.train, tiny.model.hidden_dim)(STEPS))
    multiplier = (1 - (STEPS - 1) / STEPS) / COOLDOWN_FRACTION
    for name in ("worker 0", "worker 1", "reference"):
        assert records[name]["learning_rate"] == pytest.approx(multiplier * formula), name


def test_only_the_chief_writes(cluster):
    root, _ = cluster
    chief_dir = root / "run0"
    for name in (files.CONFIG, files.TOKENIZER, files.FINAL_WEIGHTS, files.LOGS):
        assert (chief_dir / name).exists(), name
    assert sorted(os.listdir(chief_dir / files.BACKUP)) == [
        files.BACKUP_WEIGHTS, files.BACKUP_WEIGHTS + ".bkp",
        "training_metadata.json", "training_metadata.json.bkp"]
    checkpoints = runs.list_checkpoints(chief_dir / files.CHECKPOINTS)
    assert [os.path.basename(path) for path in checkpoints] == [
        f"step-{step:08d}.weights.h5" for step in range(EVERY, STEPS + 1, EVERY)]
    assert not (root / "run1").exists()


def test_other_workers_restore_the_chief_backup_and_write_nothing(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", json.dumps({
        "cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 1}}))
    callbacks = fit.make_callbacks(config_lib.TrainConfig(), "run")
    # No checkpoints, no TensorBoard: the backup, restored but never written, is all.
    assert [type(callback) for callback in callbacks] == [
        callbacks_lib.TerminateOnNonFiniteLoss, callbacks_lib.ThroughputLogger,
        backup_lib.AtomicBackupAndRestore, backup_lib.ResumedEpochEnd,
        callbacks_lib.TrainingProgress]
    backup = callbacks[-3]
    assert callbacks[-2].backup is backup
    assert backup.restore_only
    assert backup.backup_dir == os.path.join("run", files.BACKUP)
