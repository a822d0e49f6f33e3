"""The run directory: one module reads and writes it (its layout is in `files`).

What training wrote (`load_config`, `load_run`, `find_weights`, `list_checkpoints`),
where its export lies (`saved_model_dir`), what was chosen on validation (`Choice`:
the weights, beam size and α that export, translate and evaluate use by default), and
the lock that keeps one training per directory (`lock_run_dir`).

Weight files are Keras `.weights.h5` files of a `Transformer` built from `config.json`;
those written during training also hold the optimizer state, which loading ignores.
Export and evaluation need nothing but this directory. `load_ensemble` loads several
runs trained with one tokenizer as one `decoding.ensemble.Ensemble`.

Importable without TensorFlow (a `.tflite` translator opens run directories too): the
model code is imported by the functions that build a model.
"""

import contextlib
import dataclasses
import datetime
import hashlib
import json
import os
import socket
import sys

from keras_transformer import config as config_lib
from keras_transformer import files


class WeightsFileError(ValueError):
    """A weights file is truncated, corrupt, or of another architecture."""


def default_run_dir(name, config, root="runs"):
    """Returns `root/<name>-<source>-<target>`, e.g. `runs/multi30k-en-de`."""
    return os.path.join(root, f"{name}-{config.data.source_language}-"
                              f"{config.data.target_language}")


def check_run_dir(run_dir):
    """Raises `FileNotFoundError` saying so when `run_dir` holds no run's config."""
    if not os.path.isfile(config_path(run_dir)):
        raise FileNotFoundError(f"{run_dir} is not a run directory (it has no {files.CONFIG}): "
                                "name a directory that train.py wrote (its --run-dir).")


def load_config(run_dir):
    """Returns the `Config` saved in `run_dir` (its `config.json`)."""
    check_run_dir(run_dir)
    return config_lib.Config.load(config_path(run_dir))


def saved_config(run_dir):
    """Returns the `Config` saved in `run_dir`, or `None` when there is none yet."""
    return config_lib.Config.load(config_path(run_dir)) if os.path.exists(
        config_path(run_dir)) else None


def config_path(run_dir):
    """Where the run's `Config` is saved (`--config` of a resumed training)."""
    return os.path.join(run_dir, files.CONFIG)


def list_checkpoints(directory):
    """Returns the paths of the checkpoints in `directory`, oldest (lowest step) first."""
    if not os.path.isdir(directory):
        return []
    found = [(int(match.group(1)), name) for name in os.listdir(directory)
             if (match := files.CHECKPOINT_PATTERN.match(name))]
    return [os.path.join(directory, name) for _, name in sorted(found)]


def saved_model_dir(run_dir):
    """Returns where `export RUN_DIR` writes the run's SavedModel."""
    return os.path.join(run_dir, files.EXPORT_DIR, files.SAVED_MODEL)


def build_model(config):
    """Returns the (built, uncompiled) `Transformer` that `config.model` describes."""
    from keras_transformer.model import Transformer  # Keras: see the module docstring

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
        run_dir: str. Directory that `training.fit.train` wrote.
        weights: which weights to load; see `find_weights`.

    Returns:
        The `Config`, the `Tokenizer`, and a `Transformer` with the weights loaded
        (uncompiled: for decoding, export and evaluation).
    """
    from keras_transformer.data.tokenizer import Tokenizer  # TensorFlow: see above

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


def weights_sha256(path):
    """Returns the SHA-256 of the arrays in the Keras weights file `path`, by name.

    The same weights give the same digest however often they are written: the bytes of
    an HDF5 file written twice differ (averaged.weights.h5, each time the recipe runs).
    """
    import h5py  # Imported here: only exports need it.

    digest = hashlib.sha256()

    def add(name, item):
        if isinstance(item, h5py.Dataset):
            digest.update(f"{name}:{item.dtype.str}:{item.shape};".encode())
            digest.update(item[()].tobytes())

    with h5py.File(path, "r") as file:
        file.visititems(add)  # in name order
    return digest.hexdigest()


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
    from keras_transformer.decoding.ensemble import Ensemble  # Keras: see above

    loaded = [load_run(run_dir, path) for run_dir, path in zip(run_dirs, weight_paths)]
    config, tokenizer, _ = loaded[0]
    return config, tokenizer, Ensemble(model for _, _, model in loaded), weight_paths


@dataclasses.dataclass(frozen=True)
class Choice:
    """What was chosen on the validation split: the run's decoding unless told otherwise.

    Written by the recipe (`record_choice`), read by `export`, `translate`, `evaluate`
    and `kt.load_translator` on the run directory (`load_choice`).

    Attributes:
        weights: str. The chosen weights file, relative to the run directory.
        beam_size: int.
        length_penalty: float. Beam search's α.
        chosen_by: str. Who chose, and on what, e.g. `"recipe: newest checkpoint,
            validation BLEU 35.10 on 1014 sentences"`.
    """

    weights: str
    beam_size: int
    length_penalty: float
    chosen_by: str

    def weights_path(self, run_dir):
        return os.path.join(run_dir, self.weights)


class ChoiceFileError(ValueError):
    """A run's `choice.json` cannot be read; the message names the file and the fix."""


def record_choice(run_dir, *, weights_path, beam_size, length_penalty, chosen_by):
    """Writes the run's `choice.json`, replacing any earlier one; returns the `Choice`.

    Args:
        weights_path: str. The chosen weights file, inside `run_dir`.
        beam_size, length_penalty, chosen_by: as `Choice`'s.
    """
    weights = os.path.relpath(weights_path, run_dir)
    if weights.startswith(os.pardir):
        raise ValueError(f"The chosen weights {weights_path} lie outside {run_dir}: "
                         "choose a weights file of the run.")
    choice = Choice(weights, int(beam_size), float(length_penalty), chosen_by)
    record = {**dataclasses.asdict(choice),
              "recorded": datetime.datetime.now().isoformat(timespec="seconds")}
    files.write_text(os.path.join(run_dir, files.CHOICE),
                     json.dumps(record, indent=2, ensure_ascii=False) + "\n")
    return choice


def load_choice(run_dir):
    """Returns the run's recorded `Choice`, or `None` when nothing was chosen.

    Raises:
        ChoiceFileError: the file is not a choice, or its weights file is gone.
    """
    path = os.path.join(run_dir, files.CHOICE)
    if not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as file:
            record = json.load(file)
        choice = Choice(weights=str(record["weights"]),
                        beam_size=int(record["beam_size"]),
                        length_penalty=float(record["length_penalty"]),
                        chosen_by=str(record.get("chosen_by", "")))
    except (ValueError, KeyError, TypeError) as error:
        raise ChoiceFileError(
            f"{path}: not a choice of weights and decoding ({error!r}). Run the recipe "
            "again to choose, or delete the file to use the defaults.") from None
    if choice.beam_size < 1 or not choice.length_penalty >= 0:
        raise ChoiceFileError(f"{path}: beam_size {choice.beam_size} and length_penalty "
                              f"{choice.length_penalty} are no beam search: run the "
                              "recipe again, or delete the file to use the defaults.")
    if not os.path.isfile(choice.weights_path(run_dir)):
        raise ChoiceFileError(
            f"{path}: the chosen weights {choice.weights_path(run_dir)} are gone. Run the "
            "recipe again to choose, or delete the file to use the defaults.")
    return choice


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
