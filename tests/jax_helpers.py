"""Runs code on Keras's JAX backend in fresh processes (a process picks its backend once)
for the JAX tests, and compares the weights their runs write."""

import math
import os
import subprocess
import sys
import tempfile

import h5py
import numpy as np

from tests.conftest import fixture_corpus

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A tiny run: two epochs of 6 updates, a checkpoint and a backup every 3.
RUN = ["--preset", "tiny", "--data-dir", str(fixture_corpus()), "steps_per_epoch=6",
       "checkpoint_every_steps=3", "log_every_steps=3"]
# XLA's programs, kept on disk across the JAX processes of a test run (and later runs):
# every tiny run compiles the same few batch shapes, which cost a fresh process 14 of its
# 32 s. The cache is keyed by the program and the JAX version, so a hit is the same code.
COMPILATION_CACHE = os.path.join(tempfile.gettempdir(), "keras_transformer_jax_cache")
# Each test's time limit says what it waits for and how long that took on 2 CPU cores
# shared with a training job; every subprocess has a shorter limit of its own.


def run_jax(code, *, devices=1, timeout=600):
    """Runs `code` in a fresh process on the JAX backend (with `devices` CPU devices)."""
    return run_python(code, {
        "KERAS_BACKEND": "jax",
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}",
        "JAX_COMPILATION_CACHE_DIR": COMPILATION_CACHE,
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}, timeout=timeout)


def run_python(code, environment, timeout=600):
    """Runs `code` in a fresh process with `environment` added; returns its stdout."""
    environment = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", **environment}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=timeout, cwd=REPOSITORY, env=environment)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def train_code(*runs):
    """Code that trains each `(run_dir, extra arguments)` with the train command."""
    lines = ["import keras", "assert keras.backend.backend() == 'jax'",
             "from keras_transformer import cli"]
    lines += [f"assert cli.main(['train', *{RUN!r}, '--run-dir', {str(run_dir)!r}, "
              f"*{list(extra)!r}]) == 0" for run_dir, extra in runs]
    return "\n".join(lines) + "\n"


def model_weights(path):
    """The model weights (not the optimizer's) of a Keras weights file, by name."""
    with h5py.File(path, "r") as file:
        names = []
        file.visititems(lambda name, item: names.append(name)
                        if isinstance(item, h5py.Dataset) else None)
        return {name: np.asarray(file[name]) for name in names
                if not name.startswith("optimizer")}


def distance(a, b):
    return math.sqrt(sum(float(np.sum((a[name] - b[name]) ** 2)) for name in a))
