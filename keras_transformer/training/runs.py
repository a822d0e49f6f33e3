"""The run directory: `load_run` reads back what training wrote (layout in `files`).

Weight files are Keras `.weights.h5` files of a `Transformer` built from `config.json`;
those written during training also hold the optimizer state, which loading ignores.
Export and evaluation need nothing but this directory. `load_ensemble` loads several
runs trained with one tokenizer as one `decoding.ensemble.Ensemble`.
"""

import contextlib
import dataclasses
import datetime
import json
import os
import socket
import sys

from keras_transformer import config as config_lib
from keras_transformer import files
from keras_transformer.data.tokenizer import Tokenizer
from keras_transformer.decoding.ensemble import Ensemble
from keras_transformer.model import Transformer
from keras_transformer.training.callbacks import list_checkpoints


class WeightsFileError(ValueError):
    """A weights file is truncated, corrupt, or of another architecture."""


def default_run_dir(name, config, root="runs"):
    """Returns `root/<name>-<source>-<target>`, e.g. `runs/multi30k-en-de`."""
    return os.path.join(root, f"{name}-{config.data.source_language}-"
                              f"{config.data.target_language}")


def check_run_dir(run_dir):
    """Raises `FileNotFoundError` saying so when `run_dir` holds no run's config."""
    if not os.path.isfile(os.path.join(run_dir, files.CONFIG)):
        raise FileNotFoundError(f"{run_dir} is not a run directory (it has no {files.CONFIG}): "
                                "name a directory that train.py wrote (its --run-dir).")


def load_config(run_dir):
    """Returns the `Config` saved in `run_dir` (its `config.json`)."""
    check_run_dir(run_dir)
    return config_lib.Config.load(os.path.join(run_dir, files.CONFIG))


def build_model(config):
    """Returns the (built, uncompiled) `Transformer` that `config.model` describes."""
    return Transformer(**dataclasses.asdict(config.model))


def find_weights(run_dir, weights=None):
    """Returns the path of the weights file that `weights` names in `run_dir`.

    Args:
        run_dir: str. A run directory.
        weights: `None` (the most recently written of `averaged.weights.h5`,
            `model.weights.h5` and the newest checkpoint: averaging after training wins,
            training on after averaging wins), `"averaged"`, `"final"`, `"latest"` (the
            newest checkpoint), or the path of a weights file.

    Raises:
        FileNotFoundError: when there is no such file.
    """
    checkpoints = list_checkpoints(os.path.join(run_dir, files.CHECKPOINTS))
    named = {"averaged": os.path.join(run_dir, files.AVERAGED_WEIGHTS),
             "final": os.path.join(run_dir, files.FINAL_WEIGHTS),
             "latest": checkpoints[-1] if checkpoints else None}
    if weights is None:
        present = [path for path in named.values() if path and os.path.exists(path)]
        if present:
            return max(present, key=os.path.getmtime)
    else:
        path = named.get(weights, weights)
        if path and os.path.exists(path):
            return path
    named_weights = f" {weights}" if weights else ""
    raise FileNotFoundError(
        f"No weights{named_weights} in {run_dir!r}: train first (python train.py "
        f"--run-dir {run_dir}), or name a file ('averaged', 'final', 'latest' or a path).")


def load_run(run_dir, weights=None):
    """Returns `(config, tokenizer, model)` restored from a run directory.

    Args:
        run_dir: str. Directory that `training.train` wrote.
        weights: which weights to load; see `find_weights`.

    Returns:
        The `Config`, the `Tokenizer`, and a `Transformer` with the weights loaded
        (uncompiled: for decoding, export and evaluation).
    """
    config = load_config(run_dir)
    tokenizer = Tokenizer.load(os.path.join(run_dir, files.TOKENIZER))
    model = build_model(config)
    load_weights(model, find_weights(run_dir, weights))
    return config, tokenizer, model


def load_weights(model, path):
    """Loads the weights file `path` into `model`; errors name the file.

    Raises:
        WeightsFileError: when the file cannot be read (truncated, corrupt, not HDF5)
            or does not fit the model.
    """
    try:
        model.load_weights(path)
    except (OSError, ValueError, KeyError) as error:
        raise WeightsFileError(
            f"{path}: cannot load these weights ({error}). The file is truncated or "
            "corrupt, or was written by a model of another config: load another one "
            "(weights='latest', 'final', 'averaged' or a path), or train again."
        ) from error


class TokenizerMismatchError(ValueError):
    """Runs named as one ensemble were trained with different tokenizers."""


def load_ensemble(run_dirs, weights=None):
    """Returns `(config, tokenizer, ensemble, weight_paths)` of two or more run directories.

    The config and tokenizer are the first run's; every other run must have been
    trained with the same tokenizer (the same SentencePiece model, byte for byte).

    Args:
        run_dirs: sequence of str, run directories that `fit.train` wrote.
        weights: which weights of each run (see `find_weights`).

    Raises:
        ValueError: fewer than two runs.
        TokenizerMismatchError: a run with another tokenizer.
    """
    if len(run_dirs) < 2:
        raise ValueError("An ensemble needs two or more run directories, got "
                         f"{list(run_dirs)}.")

    def tokenizer_path(run_dir):
        return os.path.join(run_dir, files.TOKENIZER, files.TOKENIZER_MODEL)

    def tokenizer_bytes(run_dir):
        with open(tokenizer_path(run_dir), "rb") as file:
            return file.read()

    first = tokenizer_bytes(run_dirs[0])
    for run_dir in run_dirs[1:]:
        if tokenizer_bytes(run_dir) != first:
            raise TokenizerMismatchError(
                f"{tokenizer_path(run_dir)} differs from {tokenizer_path(run_dirs[0])}: "
                "ensemble members exchange token ids, so they must share one tokenizer. "
                "Train the other members with the first run's (copy its tokenizer/ folder "
                "into their run directories before training).")
    # Resolved once, so that the paths returned (which a report records) are the files
    # loaded even when `weights=None` picks the newest file of a run still being written.
    weight_paths = [find_weights(run_dir, weights) for run_dir in run_dirs]
    loaded = [load_run(run_dir, path) for run_dir, path in zip(run_dirs, weight_paths)]
    config, tokenizer, _ = loaded[0]
    return config, tokenizer, Ensemble(model for _, _, model in loaded), weight_paths


class RunDirectoryInUseError(RuntimeError):
    """Another process trains in the run directory; the message names it."""


_held_locks = {}  # real path of a lock file -> [open file, depth, created], this process's


@contextlib.contextmanager
def lock_run_dir(run_dir):
    """Holds the run directory's lock while the block runs: one training at a time.

    Two trainings in one directory would write one another's checkpoints, backup and
    logs. The lock is an `flock` on `RUN_DIR/train.lock`, which the system releases
    when its process ends, however it ends: a lock left by a process killed with
    SIGKILL is free again at once. The file names the holder (process id, machine,
    command, start time) for the message of the next process that tries, and is
    removed when the block ends. Re-entrant in one process (the recipe holds it around
    training).

    Creates `run_dir` when it is missing and yields whether it did (for the outermost
    hold, also to inner ones), so that the caller may remove what it created.

    Raises:
        RunDirectoryInUseError: another process holds the lock.
    """
    import fcntl  # here: POSIX only, and only training needs it

    created = not os.path.exists(run_dir)
    os.makedirs(run_dir, exist_ok=True)
    path = os.path.realpath(os.path.join(run_dir, files.LOCK))
    held = _held_locks.get(path)
    if held is not None:
        held[1] += 1
        try:
            yield held[2]
        finally:
            held[1] -= 1
        return
    file = open(path, "a+", encoding="utf-8")
    try:
        fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        file.seek(0)
        holder = _describe_holder(file.read())
        file.close()
        raise RunDirectoryInUseError(
            f"{run_dir} is in use: {holder} trains there. Wait for it to finish (or "
            "stop it), or train into another --run-dir.") from None
    file.seek(0)
    file.truncate()
    file.write(json.dumps({
        "pid": os.getpid(), "host": socket.gethostname(), "command": " ".join(sys.argv),
        "since": datetime.datetime.now().isoformat(timespec="seconds")}) + "\n")
    file.flush()
    _held_locks[path] = [file, 1, created]
    try:
        yield created
    finally:
        del _held_locks[path]
        # Removed while still held, so that a finished run leaves nothing behind: a
        # process that opened the file before cannot have locked it, and one that
        # opens it after makes a new one. (A killed process leaves its file, unlocked.)
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)
        file.close()  # releases the lock


def _describe_holder(text):
    """`process 123 on host (command, since 2026-12-03T07:20:00)`, from a lock file."""
    try:
        holder = json.loads(text)
        return (f"process {holder['pid']} on {holder['host']} ({holder['command']}, since "
                f"{holder['since']})")
    except (ValueError, KeyError, TypeError):
        return "another process"
