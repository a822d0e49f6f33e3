"""The train command on bad input: one `error:` line that names the file or field
and the fix, a non-zero exit, no half-made run directory and no lost file."""

import contextlib
import gzip
import io

import h5py
import keras
import numpy as np
import pytest

from keras_transformer import cli
from keras_transformer import config as config_lib
from keras_transformer.files import BACKUP_WEIGHTS
from keras_transformer.training import backup as backup_lib
from keras_transformer.training import callbacks as callbacks_lib


def train_error(*arguments):
    """Runs the train command and returns the one error line it exits with."""
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        status = cli.main(["train", *arguments])
    lines = [line for line in stderr.getvalue().splitlines() if line.startswith("error: ")]
    assert status == 2 and len(lines) == 1, stderr.getvalue()
    return lines[0]


def tiny(data_dir, run_dir, *overrides):
    """The arguments of a short tiny run (which the errors tested stop before training)."""
    return ["--preset", "tiny", "--data-dir", str(data_dir), "--run-dir", str(run_dir),
            "--epochs", "1", "--steps-per-epoch", "2", "num_layers=1", *overrides]


def write_corpus(directory, lines_per_file):
    directory.mkdir()
    for name, lines in lines_per_file.items():
        with gzip.open(directory / name, "wt", encoding="utf-8") as file:
            file.write("".join(line + "\n" for line in lines))
    return directory


def test_negative_keep_checkpoints_is_refused_and_checkpoints_survive(
        tmp_path, fixture_corpus_dir):
    checkpoints = tmp_path / "run" / "checkpoints"
    checkpoints.mkdir(parents=True)
    saved = [checkpoints / f"step-{step:08d}.weights.h5" for step in (20, 40)]
    for path in saved:
        path.write_bytes(b"weights")
    message = train_error(*tiny(fixture_corpus_dir, tmp_path / "run", "keep_checkpoints=-1"))
    assert "train.keep_checkpoints=-1" in message and "0 keeps every" in message
    assert all(path.read_bytes() == b"weights" for path in saved)
    with pytest.raises(ValueError, match="keep must be at least 0"):
        callbacks_lib.RollingCheckpoint(checkpoints, every_steps=1, keep=-1)


@pytest.mark.parametrize("kind", ["missing", "directory"])
def test_an_unreadable_config_file_is_named(tmp_path, kind):
    path = tmp_path / "config.json"
    if kind == "directory":
        path.mkdir()
    message = train_error("--config", str(path), "--run-dir", str(tmp_path / "run"))
    assert str(path) in message and "--preset" in message
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("override, field", [
    ("num_heads=3", "hidden_dim=32 is invalid: it must be divisible by num_heads=3"),
    ("num_layers=abc", 'model.num_layers="abc"'),
    ("dropout=abc", 'model.dropout="abc"'),
    ("mixed_precision=bogus", 'train.mixed_precision="bogus"'),
    ("label_smoothing=2", "train.label_smoothing=2"),
    ("checkpoint_every_steps=0", "train.checkpoint_every_steps=0"),
    ("epochs=0", "train.epochs=0"),
    ("steps_per_epoch=-1", "train.steps_per_epoch=-1"),
])
def test_a_bad_config_value_is_named_before_the_run_directory_is_made(
        tmp_path, fixture_corpus_dir, override, field):
    message = train_error(*tiny(fixture_corpus_dir, tmp_path / "run"), override)
    assert field in message
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("override, expected", [
    ("target_language=xx", "Multi30K has no en-xx direction"),
    ("corpus=mine", "DataConfig.train_files"),
])
def test_a_corpus_the_config_cannot_name_is_explained(
        tmp_path, fixture_corpus_dir, override, expected):
    assert expected in train_error(*tiny(fixture_corpus_dir, tmp_path / "run", override))
    assert not (tmp_path / "run").exists()


def test_a_run_directory_with_another_config_is_named(tmp_path, fixture_corpus_dir):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    parser = cli.make_parser()[1]["train"]
    other = config_lib.override(cli.make_config(parser.parse_intermixed_args(
        tiny(fixture_corpus_dir, run_dir)))[0], ["dropout=0.3"])
    other.save(run_dir / "config.json")
    message = train_error(*tiny(fixture_corpus_dir, run_dir))
    assert "holds a run with a different config" in message and "model.dropout" in message
    assert config_lib.Config.load(run_dir / "config.json") == other
    # Refused before a tokenizer is trained into the directory, where the run's own
    # config would later find one made under another config.
    assert [path.name for path in run_dir.iterdir()] == ["config.json"]


def test_a_truncated_run_config_is_named(tmp_path, fixture_corpus_dir):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.json").write_text('{"model": ')
    message = train_error(*tiny(fixture_corpus_dir, tmp_path / "run"))
    assert f"{tmp_path / 'run' / 'config.json'}: line 1" in message


def truncated_weights(path):
    with h5py.File(path, "w") as file:
        file["weights"] = list(range(1000))
    path.write_bytes(path.read_bytes()[:1000])


@pytest.mark.parametrize("damage", ["both weights files truncated", "corrupt metadata"])
def test_an_unreadable_backup_is_named_with_the_fix(tmp_path, fixture_corpus_dir, damage):
    backup = tmp_path / "run" / "backup"
    backup.mkdir(parents=True)
    if damage == "corrupt metadata":
        h5py.File(backup / BACKUP_WEIGHTS, "w").close()  # no position: read metadata
        (backup / "training_metadata.json").write_text('{"epoch": ')
    else:
        truncated_weights(backup / BACKUP_WEIGHTS)
        truncated_weights(backup / (BACKUP_WEIGHTS + ".bkp"))
    files = {path: path.read_bytes() for path in backup.iterdir()}
    message = train_error(*tiny(fixture_corpus_dir, tmp_path / "run"))
    assert f"{backup}: cannot restore the training backup" in message
    assert "Restore the folder from a copy, or remove it" in message
    assert {path: path.read_bytes() for path in backup.iterdir()} == files


@pytest.mark.parametrize("empty_split, named", [("train", "train.en.gz"),
                                                ("val", "val.en.gz")])
def test_empty_corpus_files_are_named(tmp_path, empty_split, named):
    pairs = {"train": (["a small dog", "a red house"], ["ein kleiner Hund", "ein rotes Haus"]),
             "val": (["a dog"], ["ein Hund"])}
    pairs[empty_split] = ([], [])
    data_dir = write_corpus(tmp_path / "corpus", {
        f"{split}.{language}.gz": lines for split, sides in pairs.items()
        for language, lines in zip(("en", "de"), sides)})
    message = train_error(*tiny(data_dir, tmp_path / "run"))
    assert f"{data_dir / named} and" in message and "are empty" in message
    assert not (tmp_path / "run").exists()


def test_a_run_directory_that_is_a_file_is_refused(tmp_path, fixture_corpus_dir):
    path = tmp_path / "run"
    path.write_text("notes")
    message = train_error(*tiny(fixture_corpus_dir, path))
    assert f"{path} is a file" in message
    assert path.read_text() == "notes"


@pytest.mark.parametrize("option, value", [("--epochs", "0"), ("--epochs", "-1"),
                                           ("--steps-per-epoch", "0"),
                                           ("--steps-per-epoch", "-1"),
                                           ("--steps-per-epoch", "many")])
def test_non_positive_epochs_and_steps_are_refused(capsys, option, value):
    assert cli.main(["train", "--preset", "tiny", option, value]) == 2
    assert f"argument {option}: '{value}' is not a positive integer" in capsys.readouterr().err


def test_overrides_may_come_between_options():
    arguments = cli.make_parser()[1]["train"].parse_intermixed_args(
        ["--preset", "tiny", "num_layers=1", "--run-dir", "elsewhere", "dropout=0.2"])
    assert arguments.overrides == ["num_layers=1", "dropout=0.2"]
    assert arguments.run_dir == "elsewhere"


def test_a_backup_keras_cannot_restore_is_a_user_error(tmp_path):
    def fit(**backup_options):
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        model.compile(keras.optimizers.SGD(), "mse")
        model.fit(np.zeros((8, 2)), np.zeros((8, 1)), batch_size=4, verbose=0, callbacks=[
            backup_lib.AtomicBackupAndRestore(tmp_path, save_freq=1, **backup_options)])

    fit(delete_checkpoint=False)
    (tmp_path / "training_metadata.json").write_text('{"epoch": ')
    with pytest.raises(backup_lib.BackupError, match=f"{tmp_path}: cannot restore the "
                                                     "training backup .*Restore the folder"):
        fit()
