"""The run directory: what training writes, and `load_run` to read it back.

Layout (names are the constants below):

    RUN_DIR/
      config.json             the full Config; model.vocabulary_size is the tokenizer's
      tokenizer/              trained once from the training text, reused on restart
      checkpoints/            step-<update>.weights.h5, the newest `keep_checkpoints`
      backup/                 backup.AtomicBackupAndRestore state (weights, optimizer,
                              random generators, epoch and batch): re-running the same
                              command resumes from it, on the batch where it stopped
      logs/train, logs/validation   TensorBoard event files
      model.weights.h5        weights when training finished
      averaged.weights.h5     written by `python -m keras_transformer.averaging RUN_DIR`

Weight files are Keras `.weights.h5` files of a `Transformer` built from `config.json`;
those written during training also hold the optimizer state, which loading ignores.
Export and evaluation need nothing but this directory.
"""

import dataclasses
import os

from keras_transformer import callbacks as callbacks_lib
from keras_transformer import config as config_lib

CONFIG = "config.json"
TOKENIZER = "tokenizer"
CHECKPOINTS = "checkpoints"
BACKUP = "backup"
LOGS = "logs"
FINAL_WEIGHTS = "model.weights.h5"
AVERAGED_WEIGHTS = "averaged.weights.h5"


class WeightsFileError(ValueError):
    """A weights file is truncated, corrupt, or of another architecture."""


def default_run_dir(name, config, root="runs"):
    """Returns `root/<name>-<source>-<target>`, e.g. `runs/multi30k-en-de`."""
    return os.path.join(root, f"{name}-{config.data.source_language}-"
                              f"{config.data.target_language}")


def check_run_dir(run_dir):
    """Raises `FileNotFoundError` saying so when `run_dir` holds no run's config."""
    if not os.path.isfile(os.path.join(run_dir, CONFIG)):
        raise FileNotFoundError(f"{run_dir} is not a run directory (it has no {CONFIG}): "
                                "name a directory that train.py wrote (its --run-dir).")


def build_model(config):
    """Returns the (built, uncompiled) `Transformer` that `config.model` describes."""
    from keras_transformer.model import Transformer
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
    checkpoints = callbacks_lib.list_checkpoints(os.path.join(run_dir, CHECKPOINTS))
    named = {"averaged": os.path.join(run_dir, AVERAGED_WEIGHTS),
             "final": os.path.join(run_dir, FINAL_WEIGHTS),
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
    from keras_transformer.tokenizer import Tokenizer
    config = config_lib.Config.load(os.path.join(run_dir, CONFIG))
    tokenizer = Tokenizer.load(os.path.join(run_dir, TOKENIZER))
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
