"""Training outside TensorFlow on TensorFlow's batches: prepare, train, collect."""

import json
import os

import h5py
import numpy as np
import pytest

from benchmarks import portable_training, quality
from keras_transformer import config as config_lib
from keras_transformer import files, recipe
from keras_transformer.data import batching, corpus
from keras_transformer.data import pairs as pairs_lib
from keras_transformer.data import tokenizer as tokenizer_lib
from keras_transformer.training import averaging, runs
from keras_transformer.training.losses import LabelSmoothedCrossEntropy

OVERRIDES = ["epochs=3", "checkpoint_every_steps=4", "num_layers=1"]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, fixture_corpus_dir):
    """A bundle and its run directory for the tiny preset on the fixture corpus."""
    root = tmp_path_factory.mktemp("portable")
    run_dir, bundle = root / "run", root / "bundle"
    portable_training.main(["prepare", "--preset", "tiny", "--data-dir",
                            str(fixture_corpus_dir), "--run-dir", str(run_dir),
                            "--bundle", str(bundle), *OVERRIDES])
    return run_dir, bundle


def load_bundle(bundle):
    with open(bundle / portable_training.BUNDLE_INFO, encoding="utf-8") as file:
        info = json.load(file)
    return info, dict(np.load(bundle / portable_training.BUNDLE_BATCHES))


@pytest.mark.parametrize("split", ["train", "validation"])
def test_bundle_batches_are_the_pipelines_batches(prepared, split):
    run_dir, bundle = prepared
    config = config_lib.Config.load(run_dir / files.CONFIG)
    info, arrays = load_bundle(bundle)
    assert info["total_steps"] == config.train.epochs * info["steps_per_epoch"]
    pairs = pairs_lib.tokenize_split(corpus.load_split(config.data, split),
                                tokenizer_lib.Tokenizer.load(run_dir / files.TOKENIZER),
                                max_length=config.model.max_length, verbose=False)
    training = split == "train"
    stream = batching.batch_pairs(pairs, batch_tokens=config.data.batch_tokens,
                              max_length=config.model.max_length, seed=config.data.seed,
                              shuffle=training, repeat=training, pad_to_bucket=True)
    by_bucket = portable_training.BundleBatches(arrays, split, config.model.pad_id)
    by_largest = portable_training.BundleBatches(arrays, split, config.model.pad_id)
    by_largest.shape = by_largest.largest_shape()
    # Training: three passes, each in an order of its own; validation: one, in order.
    assert len(by_bucket) == (info["total_steps"] if training else info["validation_steps"])
    expected_batches = list(stream.take(len(by_bucket)).as_numpy_iterator())
    assert len(expected_batches) == len(by_bucket)
    for index, expected in enumerate(expected_batches):
        bucket_batch, largest_batch = by_bucket[index], by_largest[index]
        for name in ("source_ids", "target_ids"):
            np.testing.assert_array_equal(bucket_batch[0][name], expected[0][name])
        np.testing.assert_array_equal(bucket_batch[1], expected[1])
        np.testing.assert_array_equal(bucket_batch[2], expected[2])
        # The larger shape holds the same batch and nothing but padding around it.
        rows, length = expected[1].shape
        assert largest_batch[1].shape == by_largest.shape
        np.testing.assert_array_equal(largest_batch[1][:rows, :length], expected[1])
        assert not largest_batch[1][rows:].any() and not largest_batch[1][:, length:].any()
        assert largest_batch[2].sum() == expected[2].sum()


def test_trains_every_update_and_collects_a_run_that_quality_scores(prepared, tmp_path):
    run_dir, bundle = prepared
    info, _ = load_bundle(bundle)
    out = tmp_path / "trained"
    portable_training.main(["train", "--bundle", str(bundle), "--out", str(out)])
    with open(out / portable_training.TRAINED_RECORD, encoding="utf-8") as file:
        trained = json.load(file)
    # Keras took every batch of the stream once, over all the epochs.
    assert trained["updates"] == info["total_steps"] and trained["finished"]
    assert trained["epochs"] == 3 and len(trained["epoch_seconds"]) == 3
    assert np.isfinite(trained["final_val_loss"])

    portable_training.main(["collect", "--run-dir", str(run_dir), "--trained", str(out)])
    checkpoints = sorted(os.listdir(run_dir / files.CHECKPOINTS))
    assert checkpoints == trained["checkpoints"]
    assert checkpoints[-1] == f"step-{info['total_steps']:08d}.weights.h5"
    # Weights alone: a training checkpoint holds Adam's moments too, 2× the weights.
    with h5py.File(run_dir / files.CHECKPOINTS / checkpoints[-1], "r") as file:
        assert "optimizer" not in file and "encoder" in file
    config = config_lib.Config.load(run_dir / files.CONFIG)
    averaged = averaging.average_run(str(run_dir), last=2)
    assert os.path.exists(averaged)

    # The recipe takes the training as finished, and the quality row names its hardware.
    record = recipe.train_once(None, str(run_dir))
    assert record["updates"] == info["total_steps"]
    assert "Keras" in record["hardware"]
    scores = {"bleu": {"score": 1.0}, "chrf": {"score": 2.0}}
    row = quality.table_row({
        "config": json.loads(config.to_json()), "training": record,
        "machine": {"gpus": [], "cpu": "some CPU", "cores": 2}, "command": "quality",
        "date": "2026-01-01T00:00:00", "note": "",
        "selection": {"weights": "mean of newest 2", "beam_size": 4, "length_penalty": 0.6},
        "validation": {"beam": scores},
        "test": {"test_2016_flickr": {"beam": scores, "greedy": scores}}})
    assert f"| {record['hardware']} |" in row and "some CPU" not in row


def test_a_killed_training_leaves_its_last_epoch_for_collect(prepared, tmp_path,
                                                            monkeypatch):
    run_dir, bundle = prepared
    info, _ = load_bundle(bundle)
    kill_at = info["steps_per_epoch"] + 5  # inside the second epoch, past a checkpoint
    checkpoint_step_end = portable_training.WeightsOnlyCheckpoint.on_train_batch_end

    def killed_after(self, batch, logs=None):
        checkpoint_step_end(self, batch, logs)
        if self._step() == kill_at:
            raise KeyboardInterrupt  # as a hard time limit would end the process

    monkeypatch.setattr(portable_training.WeightsOnlyCheckpoint, "on_train_batch_end",
                        killed_after)
    out = tmp_path / "trained"
    with pytest.raises(KeyboardInterrupt):
        portable_training.main(["train", "--bundle", str(bundle), "--out", str(out)])
    with open(out / portable_training.TRAINED_RECORD, encoding="utf-8") as file:
        trained = json.load(file)
    # The record of the first epoch; the checkpoints up to the kill.
    assert trained["epochs"] == 1 and trained["updates"] == info["steps_per_epoch"]
    assert not trained["finished"] and trained["final_val_loss"] is None
    on_disk = sorted(os.listdir(out / portable_training.TRAINED_CHECKPOINTS))
    every = config_lib.Config.load(run_dir / files.CONFIG).train.checkpoint_every_steps
    assert on_disk[-1] == f"step-{kill_at // every * every:08d}.weights.h5"

    collected = tmp_path / "run"
    collected.mkdir()
    (collected / files.CONFIG).write_bytes((run_dir / files.CONFIG).read_bytes())
    portable_training.main(["collect", "--run-dir", str(collected), "--trained", str(out)])
    assert sorted(os.listdir(collected / files.CHECKPOINTS)) == on_disk

    with pytest.raises(SystemExit, match="holds a training already"):
        portable_training.main(["train", "--bundle", str(bundle), "--out", str(out)])


def test_collect_refuses_a_training_of_another_config(prepared, tmp_path):
    run_dir, _ = prepared
    trained = tmp_path / "trained"
    trained.mkdir()
    other = config_lib.override(config_lib.preset_config("tiny"), ["dropout=0.5"])
    (trained / portable_training.TRAINED_RECORD).write_text(
        json.dumps({"config": json.loads(other.to_json())}), encoding="utf-8")
    with pytest.raises(SystemExit, match="trained with another config"):
        portable_training.main(["collect", "--run-dir", str(run_dir),
                                "--trained", str(trained)])


def test_prepare_refuses_subword_sampling_and_an_existing_directory(tmp_path,
                                                                   fixture_corpus_dir):
    common = ["prepare", "--preset", "tiny", "--data-dir", str(fixture_corpus_dir),
              "--bundle", str(tmp_path / "bundle")]
    with pytest.raises(SystemExit, match="subword_nbest=1"):
        portable_training.main([*common, "--run-dir", str(tmp_path / "a"),
                                "subword_nbest=4"])
    (tmp_path / "b").mkdir()
    with pytest.raises(SystemExit, match="exists"):
        portable_training.main([*common, "--run-dir", str(tmp_path / "b")])


def test_validation_loss_is_the_mean_per_target_token_whatever_the_padding(prepared):
    run_dir, bundle = prepared
    config = config_lib.Config.load(run_dir / files.CONFIG)
    _, arrays = load_bundle(bundle)
    model = runs.build_model(config)
    smoothing = config.train.label_smoothing
    model.compile(loss=LabelSmoothedCrossEntropy(smoothing, pad_id=model.pad_id))
    by_bucket = portable_training.BundleBatches(arrays, "validation", model.pad_id)
    by_largest = portable_training.BundleBatches(arrays, "validation", model.pad_id)
    by_largest.shape = by_largest.largest_shape()

    # NumPy: smoothed cross-entropy of every real target token, then their plain mean.
    losses = []
    for inputs, targets, weights in by_bucket.stream():
        logits = np.asarray(model(inputs, training=False), np.float64)  # (B, T, V)
        log_probs = logits - logits.max(-1, keepdims=True)
        log_probs -= np.log(np.exp(log_probs).sum(-1, keepdims=True))
        vocabulary = logits.shape[-1]
        labels = np.eye(vocabulary)[targets] * (1 - smoothing) + smoothing / vocabulary
        losses.append(-(labels * log_probs).sum(-1)[weights > 0])
    expected = np.concatenate(losses).mean()

    assert portable_training.token_mean_loss(model, by_bucket) == pytest.approx(expected,
                                                                                rel=1e-4)
    assert portable_training.token_mean_loss(model, by_largest) == pytest.approx(expected,
                                                                                 rel=1e-4)
