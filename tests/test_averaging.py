"""Checkpoint averaging gives the element-wise mean of the newest checkpoints."""

import os
import shutil
import time

import keras
import numpy as np
import pytest

from keras_transformer import cli, files, runs
from keras_transformer import config as config_lib
from keras_transformer.training import averaging


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory):
    """A run directory with config.json and four checkpoints holding known weights."""
    tmp_path = tmp_path_factory.mktemp("run")
    config = config_lib.preset_config("tiny")
    config.save(str(tmp_path / files.CONFIG))
    model = runs.build_model(config)
    # Files written during training hold the optimizer state too: do the same.
    model.compile(keras.optimizers.Adam(), "mse")
    model.optimizer.build(model.trainable_variables)
    (tmp_path / files.CHECKPOINTS).mkdir()
    saved = {}
    for index, step in enumerate((20, 40, 60, 100)):
        weights = [np.full(w.shape, index + 1.0, w.dtype) * (1 + np.arange(w.size).reshape(
            w.shape) % 3) for w in model.get_weights()]
        model.set_weights(weights)
        model.save_weights(str(tmp_path / files.CHECKPOINTS / f"step-{step:08d}.weights.h5"))
        saved[step] = weights
    return tmp_path, config, saved


@pytest.fixture
def run_with_checkpoints(saved_run, tmp_path):
    """A fresh copy of `saved_run` for each test."""
    source, config, saved = saved_run
    shutil.copytree(source, tmp_path / "run")
    return tmp_path / "run", config, saved


def test_average_of_the_last_checkpoints_is_their_mean(run_with_checkpoints):
    run_dir, config, saved = run_with_checkpoints
    path = averaging.average_run(str(run_dir), last=2)
    assert path == str(run_dir / files.AVERAGED_WEIGHTS)
    model = runs.build_model(config)
    model.load_weights(path)
    for got, newest, before in zip(model.get_weights(), saved[100], saved[60]):
        np.testing.assert_allclose(got, (newest + before) / 2, rtol=1e-6)
    assert (run_dir / "averaged.json").read_text().count("step-") == 2


def test_checkpoints_are_ordered_by_step_not_by_name_length(run_with_checkpoints):
    run_dir, _, _ = run_with_checkpoints
    names = [os.path.basename(path) for path in runs.list_checkpoints(run_dir / files.CHECKPOINTS)]
    assert names == [f"step-{step:08d}.weights.h5" for step in (20, 40, 60, 100)]


def test_command_line_and_fewer_checkpoints_than_asked(run_with_checkpoints, capsys):
    run_dir, config, saved = run_with_checkpoints
    output = run_dir / "mean.weights.h5"
    assert cli.main(["average", str(run_dir), "--last", "10", "--output", str(output)]) == 0
    assert str(output) in capsys.readouterr().out
    model = runs.build_model(config)
    model.load_weights(str(output))
    want = [sum(weights[i] for weights in saved.values()) / 4 for i in range(len(saved[20]))]
    for got, expected in zip(model.get_weights(), want):
        np.testing.assert_allclose(got, expected, rtol=1e-6)


def test_find_weights_prefers_the_newest_file(run_with_checkpoints):
    run_dir, _, _ = run_with_checkpoints
    assert runs.find_weights(str(run_dir)).endswith("step-00000100.weights.h5")
    averaged = averaging.average_run(str(run_dir), last=3)
    later = time.time() + 5
    os.utime(averaged, (later, later))
    assert runs.find_weights(str(run_dir)) == averaged
    assert runs.find_weights(str(run_dir), "latest").endswith("step-00000100.weights.h5")
    with pytest.raises(FileNotFoundError):
        runs.find_weights(str(run_dir), "final")


def test_no_checkpoints_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="is not a run directory"):
        averaging.average_run(str(tmp_path))
    config_lib.preset_config("tiny").save(str(tmp_path / files.CONFIG))
    with pytest.raises(FileNotFoundError, match="No checkpoints in .*: train first"):
        averaging.average_run(str(tmp_path))


def test_a_truncated_checkpoint_is_named_in_the_error(run_with_checkpoints, capsys):
    run_dir, _, _ = run_with_checkpoints
    damaged = runs.list_checkpoints(run_dir / files.CHECKPOINTS)[-2]
    with open(damaged, "r+b") as file:
        file.truncate(os.path.getsize(damaged) // 2)
    assert cli.main(["average", str(run_dir), "--last", "3"]) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: ") and damaged in error
    assert not os.path.exists(run_dir / files.AVERAGED_WEIGHTS)


def test_an_average_never_replaces_what_is_not_an_earlier_average(run_with_checkpoints,
                                                                  capsys):
    run_dir, _, _ = run_with_checkpoints
    checkpoint = run_dir / files.CHECKPOINTS / "step-00000040.weights.h5"
    best = run_dir / files.CHECKPOINTS / files.BEST_WEIGHTS
    shutil.copy(checkpoint, best)
    (run_dir / files.CHECKPOINTS / files.BEST_INFO).write_text('{"bleu": 30.1}')
    mine = run_dir / "teacher.weights.h5"  # the user's: free, but its record is not
    (run_dir / "teacher.json").write_text('{"notes": "mine"}')
    before = {path: path.read_bytes() for path in run_dir.rglob("*") if path.is_file()}
    for output in (checkpoint, best, mine, run_dir / "config.weights.h5"):
        assert cli.main(["average", str(run_dir), "--output", str(output)]) == 2
        assert "is not an earlier average" in capsys.readouterr().err
    assert {path: path.read_bytes() for path in run_dir.rglob("*")
            if path.is_file()} == before
    # An earlier average is replaced, as the default output always is.
    output = run_dir / "mean.weights.h5"
    for _ in range(2):
        assert cli.main(["average", str(run_dir), "--output", str(output)]) == 0


def test_the_average_the_recipe_chose_is_not_replaced(run_with_checkpoints, capsys):
    run_dir, _, _ = run_with_checkpoints
    averaged = averaging.average_run(str(run_dir), last=3)
    runs.record_choice(str(run_dir), weights_path=averaged, beam_size=4, length_penalty=1.0,
                       chosen_by="recipe: mean of newest 3")
    before = (run_dir / files.AVERAGED_WEIGHTS).read_bytes()
    assert cli.main(["average", str(run_dir), "--last", "5"]) == 2
    assert "holds the weights the recipe chose on validation (recipe: mean of newest 3)" in \
        capsys.readouterr().err
    assert (run_dir / files.AVERAGED_WEIGHTS).read_bytes() == before
    assert cli.main(["average", str(run_dir), "--output",
                     str(run_dir / "five.weights.h5")]) == 0
