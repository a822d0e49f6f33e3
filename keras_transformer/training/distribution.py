"""Where training runs: the `tf.distribute` strategy (or on JAX, Keras's distribution)
and the numeric precision.

Nothing here knows about the model. `choose_strategy` must run before anything else
touches TensorFlow devices, and `set_precision` before the model is built.
"""

import contextlib
import json
import logging
import os

import keras
import tensorflow as tf

from keras_transformer.config import PRECISION_POLICIES
from keras_transformer.training import cpu


def choose_strategy(devices=None):
    """Returns the distribution strategy for this process.

    On the TensorFlow backend, a `tf.distribute` strategy:

    - `TF_CONFIG` set (a cluster of workers): `MultiWorkerMirroredStrategy`.
    - `devices` given: `MirroredStrategy` over exactly those, e.g. `("/gpu:0", "/gpu:1")`.
    - Two or more visible GPUs: `MirroredStrategy` over all of them.
    - Otherwise (one GPU or only the CPU): the default strategy. With one device there is
      nothing to keep in sync, and mirroring would only add copies.

    Args:
        devices: optional sequence of device names.

    On Keras's other backends, Keras's own distribution (`keras_distribution`).

    Returns:
        An object with a `scope()`: build, compile and fit the model inside it.
    """
    if keras.backend.backend() != "tensorflow":
        return keras_distribution(devices)
    if os.environ.get("TF_CONFIG"):
        return _MultiWorkerMirroredStrategy()
    if devices:
        return tf.distribute.MirroredStrategy(list(devices))
    gpus = tf.config.list_logical_devices("GPU")
    if len(gpus) > 1:
        return tf.distribute.MirroredStrategy([gpu.name for gpu in gpus])
    return tf.distribute.get_strategy()


def keras_distribution(devices=None):
    """Returns `keras.distribution.DataParallel` over the local devices, or no-op scope.

    The JAX backend's data parallelism: every device holds the weights and computes on
    its share of each batch (`replica_count` divides the batch's rows), and the
    compiler sums the gradients. One device needs no distribution.

    Args:
        devices: optional sequence of Keras device names (`"gpu:0"`, …); all local
            devices by default.
    """
    if os.environ.get("TF_CONFIG"):
        raise ValueError("TF_CONFIG names a cluster of tf.distribute workers, which train "
                         "on the TensorFlow backend: unset KERAS_BACKEND (or set it to "
                         "tensorflow), or unset TF_CONFIG.")
    devices = list(devices or keras.distribution.list_devices())
    if len(devices) < 2:
        return _OneDevice()
    return keras.distribution.DataParallel(devices=devices)


class _OneDevice:
    """The scope of training on one device: nothing to set up."""

    def scope(self):
        return contextlib.nullcontext()


def fit_scope(strategy):
    """The scope `model.fit` runs in: Keras's distribution shards the batches that fit
    reads only inside its scope; a `tf.distribute` strategy's fit runs outside it (in a
    worker cluster, the checkpoints written inside it would become collectives)."""
    if isinstance(strategy, (keras.distribution.DataParallel, keras.distribution.ModelParallel)):
        return strategy.scope()
    return contextlib.nullcontext()


def replica_count(strategy):
    """Number of devices that share each batch under `strategy` (1 without one)."""
    if isinstance(strategy, keras.distribution.DataParallel):
        return len(strategy.device_mesh.devices.reshape(-1))
    return getattr(strategy, "num_replicas_in_sync", 1)


def has_gpu():
    """Whether the backend computes on a GPU."""
    if keras.backend.backend() == "tensorflow":
        return bool(tf.config.list_logical_devices("GPU"))
    return any(device.startswith("gpu") for device in keras.distribution.list_devices())


class _MultiWorkerMirroredStrategy(tf.distribute.MultiWorkerMirroredStrategy):
    """`MultiWorkerMirroredStrategy` accepting the two reduces that Keras 3's `fit` makes.

    Keras 3.15's TensorFlow trainer asks for two reductions across workers that
    `MultiWorkerMirroredStrategy.reduce` refuses, so `fit` on two or more workers fails:

    - Before the first step, `reduce("MEAN", batch, axis=None)` on the whole first
      batch, a nested structure, only to read its shapes. The collective all-reduce
      takes one tensor ("Attempt to convert a value ({'source_ids': PerReplica...").
      Here a nested structure gives back this worker's own batch.
    - After every step, `reduce("MEAN", value, axis=0)` on each logged scalar, meaning
      the mean over replicas (what Keras computes on one worker), but a scalar has no
      axis 0 ("Invalid reduction dimension 0"). Here scalars are averaged over replicas.

    Every other reduction is the strategy's own.
    """

    def reduce(self, reduce_op, value, axis):
        if isinstance(value, (dict, list, tuple)):
            return tf.nest.map_structure(
                lambda leaf: self.experimental_local_results(leaf)[0], value)
        if axis is not None and self.experimental_local_results(value)[0].shape.rank == 0:
            axis = None
        return super().reduce(reduce_op, value, axis)


def is_chief():
    """Whether this process writes the run directory (always, unless in a worker cluster).

    In a `TF_CONFIG` cluster the chief is the task of type `"chief"`, or worker 0 when the
    cluster has no chief; the other workers train but leave the files to it.
    """
    tf_config = _tf_config()
    task = tf_config.get("task") or {}
    if not task:
        return True
    if tf_config.get("cluster", {}).get("chief"):
        return task.get("type") == "chief"
    return task.get("type") == "worker" and worker_index() == 0


def worker_count():
    """Number of training processes in the `TF_CONFIG` cluster (chief included); 1 outside."""
    cluster = _tf_config().get("cluster") or {}
    return max(1, len(cluster.get("chief", [])) + len(cluster.get("worker", [])))


def worker_index():
    """Index of this task in its `TF_CONFIG` cluster; 0 outside a cluster."""
    return int((_tf_config().get("task") or {}).get("index", 0))


def _tf_config():
    return json.loads(os.environ.get("TF_CONFIG") or "{}")


def backend_precision(mixed_precision):
    """Returns `train.mixed_precision`, where `None` means the backend's default.

    `None` is float32, except on the JAX backend with a GPU, where it is bfloat16: JAX
    runs there because the whole step compiles (XLA), and bfloat16 matmuls are what
    makes that fast (BENCHMARKS.md, rows m1 and m2).
    """
    if mixed_precision is None and keras.backend.backend() == "jax" and has_gpu():
        return "bfloat16"
    return mixed_precision


def set_precision(mixed_precision):
    """Sets Keras's global dtype policy; the model must be built after this call.

    Args:
        mixed_precision: `None` or `"float32"` (full precision), `"bfloat16"` or
            `"float16"` (compute in that type, keep float32 weights; Keras adds loss
            scaling for float16 by itself).

    Returns:
        The name of the policy set, e.g. `"mixed_bfloat16"`.
    """
    if mixed_precision not in PRECISION_POLICIES:
        raise ValueError(f"mixed_precision={mixed_precision!r} is not one of "
                         "None, 'float32', 'bfloat16', 'float16'.")
    policy = PRECISION_POLICIES[mixed_precision]
    if policy != "float32" and not has_gpu():
        if policy == "mixed_bfloat16" and cpu.has_bfloat16():
            # oneDNN runs bfloat16 matmuls natively on these: training is faster (1.45x
            # on a 2-core AVX-512 bf16 CPU, BENCHMARKS.md).
            logging.info("mixed_precision=%s on a CPU with bfloat16 instructions.",
                         mixed_precision)
        else:
            # Runs, but without those instructions each half-precision matmul is
            # converted to float32 and back or emulated: slower, not faster.
            logging.warning("mixed_precision=%s on this CPU will be slower than float32: "
                            "half precision is fast on a CPU only as bfloat16, with "
                            "AVX-512 BF16 or AMX instructions.", mixed_precision)
    keras.mixed_precision.set_global_policy(policy)
    return policy
