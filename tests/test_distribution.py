"""Strategy choice, and the same numbers on one device and on two mirrored replicas."""

import json
import logging
import os
import subprocess
import sys
import textwrap

import pytest
import tensorflow as tf

from keras_transformer.training import cpu, distribution

# Compares float computations: also run on Eigen's kernels in CI (tests/numerics.py).
pytestmark = pytest.mark.numerics

# Runs in a fresh process: logical devices must be set before TensorFlow starts.
REPLICA_SCRIPT = textwrap.dedent("""
    import dataclasses, json, os
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    import keras
    import numpy as np
    from keras_transformer import config as config_lib
    from keras_transformer import runs
    from keras_transformer.training.losses import compile_model

    config = config_lib.override(config_lib.preset_config("tiny"), ["dropout=0.0"])
    rng = np.random.default_rng(0)
    source_ids = rng.integers(4, 1000, size=(4, 9)).astype("int32")
    target_ids = rng.integers(4, 1000, size=(4, 8)).astype("int32")
    target_ids[2:, 2:] = 0  # the second replica's half has far fewer real tokens
    inputs = {"source_ids": source_ids, "target_ids": target_ids}
    targets = np.roll(target_ids, -1, axis=1) * (target_ids != 0)
    batch = (inputs, targets, (targets != 0).astype("float32"))
    dataset = tf.data.Dataset.from_tensors(batch).repeat(2)
    initial = runs.build_model(config).get_weights()

    def fit(strategy):
        with strategy.scope():
            model = runs.build_model(config)
            model.set_weights(initial)
            compile_model(model, config.train,
                          optimizer=keras.optimizers.SGD(learning_rate=1.0))
        history = model.fit(dataset, epochs=1, verbose=0, shuffle=False,
                            callbacks=[keras.callbacks.LambdaCallback(
                                on_train_batch_end=lambda b, logs: losses.append(logs["loss"]))])
        return model.get_weights()

    losses = []
    single = fit(tf.distribute.get_strategy())
    single_losses, losses = losses, []
    mirrored_strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    mirrored = fit(mirrored_strategy)
    print(json.dumps({
        "replicas": mirrored_strategy.num_replicas_in_sync,
        "single_losses": single_losses, "mirrored_losses": losses,
        "weight_difference": max(float(np.abs(a - b).max()) for a, b in zip(single, mirrored)),
        "weight_change": max(float(np.abs(a - b).max()) for a, b in zip(single, initial)),
    }))
""")


@pytest.fixture(scope="module")
def replica_comparison():
    environment = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run([sys.executable, "-c", REPLICA_SCRIPT], capture_output=True,
                            text=True, env=environment, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_loss_is_the_same_on_one_and_two_replicas(replica_comparison):
    assert replica_comparison["replicas"] == 2
    single, mirrored = replica_comparison["single_losses"], replica_comparison["mirrored_losses"]
    assert len(single) == len(mirrored) == 2
    for single_loss, mirrored_loss in zip(single, mirrored):
        assert abs(single_loss - mirrored_loss) < 1e-5


def test_updates_are_the_same_on_one_and_two_replicas(replica_comparison):
    assert replica_comparison["weight_change"] > 1e-3  # the step did move the weights
    assert replica_comparison["weight_difference"] < 1e-5


def test_cpu_only_machine_uses_the_default_strategy(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    monkeypatch.setattr(tf.config, "list_logical_devices", lambda kind=None: [])
    strategy = distribution.choose_strategy()
    assert strategy is tf.distribute.get_strategy()
    assert strategy.num_replicas_in_sync == 1


def test_several_gpus_are_mirrored(monkeypatch):
    class Device:
        def __init__(self, name):
            self.name = name

    monkeypatch.delenv("TF_CONFIG", raising=False)
    monkeypatch.setattr(tf.config, "list_logical_devices",
                        lambda kind=None: [Device("/gpu:0"), Device("/gpu:1")])
    monkeypatch.setattr(tf.distribute, "MirroredStrategy", lambda devices=None: devices)
    assert distribution.choose_strategy() == ["/gpu:0", "/gpu:1"]


def test_given_devices_are_mirrored(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    monkeypatch.setattr(tf.distribute, "MirroredStrategy", lambda devices=None: devices)
    assert distribution.choose_strategy(("/cpu:0",)) == ["/cpu:0"]


def test_tf_config_selects_multi_worker(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", json.dumps(
        {"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 1}}))
    # A real one would wait for the other worker of the cluster.
    monkeypatch.setattr(distribution, "_MultiWorkerMirroredStrategy", lambda: "multi-worker")
    assert distribution.choose_strategy() == "multi-worker"
    assert not distribution.is_chief()
    assert distribution.worker_index() == 1


@pytest.mark.parametrize("tf_config, chief", [
    (None, True),
    ({"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 0}}, True),
    ({"cluster": {"chief": ["c:0"], "worker": ["a:1"]},
      "task": {"type": "worker", "index": 0}}, False),
    ({"cluster": {"chief": ["c:0"], "worker": ["a:1"]},
      "task": {"type": "chief", "index": 0}}, True),
])
def test_only_the_chief_writes(monkeypatch, tf_config, chief):
    if tf_config is None:
        monkeypatch.delenv("TF_CONFIG", raising=False)
    else:
        monkeypatch.setenv("TF_CONFIG", json.dumps(tf_config))
    assert distribution.is_chief() is chief


def test_precision_policies():
    try:
        assert distribution.set_precision("bfloat16") == "mixed_bfloat16"
        assert distribution.set_precision("float16") == "mixed_float16"
        assert distribution.set_precision(None) == "float32"
        with pytest.raises(ValueError):
            distribution.set_precision("float8")
    finally:
        distribution.set_precision(None)


@pytest.mark.skipif(bool(tf.config.list_logical_devices("GPU")),
                    reason="the warning is about training on a CPU")
@pytest.mark.parametrize("precision, has_bfloat16, warns", [
    ("bfloat16", False, True),   # emulated: slower than float32
    ("bfloat16", True, False),   # AVX-512 BF16 or AMX: faster
    ("float16", True, True),     # bfloat16 instructions do not multiply float16
])
def test_half_precision_on_a_cpu_warns_unless_the_cpu_multiplies_it(
        monkeypatch, caplog, precision, has_bfloat16, warns):
    monkeypatch.setattr(cpu, "has_bfloat16", lambda: has_bfloat16)
    try:
        with caplog.at_level(logging.INFO):
            distribution.set_precision(precision)
    finally:
        distribution.set_precision(None)
    warnings = [record.getMessage() for record in caplog.records
                if record.levelno >= logging.WARNING]
    assert any("slower than float32" in message for message in warnings) is warns


@pytest.mark.parametrize("flags, expected", [
    ("fpu avx2 avx512f avx512_bf16 avx512_vnni", True),
    ("fpu avx2 amx_tile amx_bf16", True),
    ("fpu avx2 avx512f avx512_vnni", False),
    (None, False),  # no /proc/cpuinfo
])
def test_cpu_has_bfloat16_reads_the_cpu_flags(monkeypatch, flags, expected):
    monkeypatch.setattr(cpu, "info", lambda: {} if flags is None else {"flags": flags})
    assert cpu.has_bfloat16() is expected
