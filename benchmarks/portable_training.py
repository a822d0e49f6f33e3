"""Train a recipe on any Keras backend, on the very batches of TensorFlow's pipeline.

For a GPU machine without TensorFlow (one with JAX alone), where `benchmarks.quality`
cannot train: the run is cut in three steps, the first and the last on a machine with
TensorFlow, which tokenizes the text and exports and scores the model.

    # 1. With TensorFlow: RUN_DIR gets the tokenizer and config.json as `train.py` writes
    #    them; BUNDLE (21 MB for the multi30k preset) the config, the initial weights and
    #    every batch of every pass as pair indices.
    python -m benchmarks.portable_training prepare --data-dir ../shared/data/multi30k \\
        --run-dir runs/quality-gpu --bundle bundle [FIELD=VALUE ...]
    # 2. On the accelerator, any backend: `model.fit` on those batches; OUT gets the
    #    newest checkpoints (weights only) as they are written and a record of the
    #    training after every epoch, so a run killed by a time limit leaves what it
    #    made (`--minutes` ends it in time, with its validation loss).
    KERAS_BACKEND=jax python -m benchmarks.portable_training train --bundle bundle --out OUT
    # 3. With TensorFlow: the checkpoints and record into RUN_DIR; then `quality` averages,
    #    exports and scores them as it does its own runs (it skips a finished training).
    python -m benchmarks.portable_training collect --run-dir runs/quality-gpu --trained OUT
    python -m benchmarks.quality --data-dir ../shared/data/multi30k --run-dir runs/quality-gpu

Kept from `training.train`: the config, the initial weights (built here from the
config's seed, as `training.train` builds them), the batches and their order
(`pass_batch_indices`; padded to one shape that fits them all, or with `--pad
bucket` to their bucket's, with ids of loss weight 0 that attention masks), the
label-smoothed loss, Adam with the warmup schedule and its cooldown, and the rolling
checkpoints. Not kept: the random dropout masks and the arithmetic (the backend's own);
validation each epoch and the BLEU callback (the validation loss is computed once, at
the end), the resumable backup, TensorBoard logs, subword sampling and mixed precision.
"""

import argparse
import dataclasses
import json
import os
import shutil
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks import common  # noqa: E402
from keras_transformer import config as config_lib  # noqa: E402
from keras_transformer import files
from keras_transformer.data import batching
from keras_transformer.data import pairs as pairs_lib
from keras_transformer.training import callbacks as callbacks_lib  # noqa: E402
from keras_transformer.training import runs  # noqa: E402

BUNDLE_CONFIG = "config.json"
BUNDLE_INFO = "bundle.json"
BUNDLE_BATCHES = "batches.npz"
INITIAL_WEIGHTS = "initial.weights.h5"
TRAINED_RECORD = "training.json"
TRAINED_CHECKPOINTS = "checkpoints"
ROW_NAMES = ("source_ids", "target_ids", "targets")



def pass_batch_indices(pairs, *, batch_tokens, max_length, pass_index=0, seed=0,
                       shuffle=True):
    """The batches of one pass of `batch_pairs`, as pair indices and padded shapes.

    For training outside TensorFlow: gathering the rows
    of `pairs` at these indices and padding them to these shapes gives the batches that
    `batch_pairs(pairs, ..., seed=seed, repeat=True, pad_to_bucket=True)` makes of pass
    `pass_index`, in the same order.

    Args:
        pairs: `TokenizedPairs` without segmentation candidates (with subword sampling
            each pass draws new rows, which indices alone cannot say).
        batch_tokens: int. Token budget per batch and side.
        max_length: int. The model's `max_length`.
        pass_index: int. The pass, numbered from 0.
        seed: int. Seed of the permutations.
        shuffle: bool. As for `batch_pairs` (False: the evaluation order, every pair).

    Returns:
        `(batches, shapes)`: a list of int64 arrays of pair indices, one per batch, and an
        int64 array `(batches, 2)` of each batch's padded rows and length (its bucket's).
    """
    import tensorflow as tf  # the prepare step's: `train` runs without TensorFlow
    if pairs.candidates is not None:
        raise ValueError("pass_batch_indices cannot describe passes with subword sampling "
                         "(DataConfig.subword_nbest > 1): each pass draws new rows.")
    boundaries = batching.bucket_boundaries(max_length)
    batch_sizes = batching.bucket_batch_sizes(boundaries, max_length, batch_tokens)
    buckets = batching._buckets(pairs, boundaries)
    batches = batching._batches_of_pass(tf.constant(buckets, tf.int64),
                               tf.constant(batch_sizes, tf.int64),
                               batching._pass_seed(seed, pass_index), shuffle)
    indices = [row.numpy() for row in batches]
    lengths = batching.bucket_lengths(boundaries, max_length)
    shapes = np.array([(batch_sizes[buckets[row[0]]], lengths[buckets[row[0]]])
                       for row in indices], np.int64).reshape(-1, 2)
    return indices, shapes


def parse_arguments(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.portable_training",
        description=__doc__.split("\n")[0])
    steps = parser.add_subparsers(dest="step", required=True)
    prepare = steps.add_parser("prepare", help="tokenizer, config, initial weights and "
                                               "batches (needs TensorFlow)")
    prepare.add_argument("--preset", default=config_lib.DEFAULT_PRESET,
                         choices=sorted(config_lib.PRESETS))
    prepare.add_argument("--data-dir", default=None, metavar="DIR",
                         help="local Multi30K directory (default: download)")
    prepare.add_argument("--run-dir", required=True, metavar="DIR",
                         help="new run directory, scored later by benchmarks.quality")
    prepare.add_argument("--bundle", required=True, metavar="DIR",
                         help="new directory for what the training step needs")
    prepare.add_argument("overrides", nargs="*", metavar="FIELD=VALUE",
                         help="config overrides, as train.py takes them")
    train = steps.add_parser("train", help="model.fit on the bundle's batches (any backend)")
    train.add_argument("--bundle", required=True, metavar="DIR")
    train.add_argument("--out", required=True, metavar="DIR",
                       help="new directory for the newest checkpoints (weights only) "
                            "and the record, both written as training goes")
    train.add_argument("--pad", choices=("largest", "bucket"), default="largest",
                       help="pad every batch to the largest batch's shape (one XLA "
                            "compilation; default) or to its bucket's (one per bucket)")
    train.add_argument("--minutes", type=float, default=None,
                       help="stop after this many minutes of training even if the epochs "
                            "are not done (the record says so); default: no limit")
    collect = steps.add_parser("collect", help="the trained checkpoints into the run "
                                               "directory, for benchmarks.quality")
    collect.add_argument("--run-dir", required=True, metavar="DIR")
    collect.add_argument("--trained", required=True, metavar="DIR",
                         help="the --out directory of the train step")
    return parser.parse_args(argv)


def prepare(arguments):
    """Writes the run directory's tokenizer and config, and the bundle."""
    from keras_transformer.data import corpus
    from keras_transformer.training import fit as training  # TensorFlow's
    config = config_lib.override(config_lib.preset_config(arguments.preset),
                                 arguments.overrides)
    if arguments.data_dir is not None:
        config = dataclasses.replace(
            config, data=dataclasses.replace(config.data, data_dir=arguments.data_dir))
    if config.data.subword_nbest > 1:
        raise SystemExit("error: subword sampling (subword_nbest > 1) draws new batches "
                         "in every pass, which a bundle cannot hold: set subword_nbest=1")
    _check_precision(config)
    for path in (arguments.run_dir, arguments.bundle):
        if os.path.exists(path):
            raise SystemExit(f"error: {path} exists: give a new directory")
    splits = {split: corpus.load_split(config.data, split)
              for split in ("train", "validation")}
    config, tokenizer = training.prepare_run_dir(config, arguments.run_dir, splits["train"])
    os.makedirs(arguments.bundle)
    config.save(os.path.join(arguments.bundle, BUNDLE_CONFIG))
    keras.utils.set_random_seed(config.train.seed)  # as training.train, before building
    runs.build_model(config).save_weights(os.path.join(arguments.bundle, INITIAL_WEIGHTS))

    options = dict(batch_tokens=config.data.batch_tokens, max_length=config.model.max_length)
    arrays = {}
    train_pairs = pairs_lib.tokenize_split(splits["train"], tokenizer,
                                      max_length=config.model.max_length)
    steps_per_epoch = (config.train.steps_per_epoch
                       or batching.batches_per_pass(train_pairs, **options))
    total_steps = config.train.epochs * steps_per_epoch
    print(f"Writing the {total_steps:,} batches of {config.train.epochs} epochs...",
          flush=True)
    arrays.update(_split_arrays("train", train_pairs, total_steps, shuffle=True,
                                seed=config.data.seed, options=options))
    validation_pairs = pairs_lib.tokenize_split(splits["validation"], tokenizer,
                                           max_length=config.model.max_length)
    validation_steps = batching.batches_per_pass(validation_pairs, shuffle=False, **options)
    arrays.update(_split_arrays("validation", validation_pairs, validation_steps,
                                shuffle=False, seed=config.data.seed, options=options))
    np.savez_compressed(os.path.join(arguments.bundle, BUNDLE_BATCHES), **arrays)
    info = {"steps_per_epoch": steps_per_epoch, "epochs": config.train.epochs,
            "total_steps": total_steps, "validation_steps": validation_steps,
            "run_dir": arguments.run_dir, **common.header(arguments)}
    common.write_json(os.path.join(arguments.bundle, BUNDLE_INFO), info)
    print(f"Wrote {arguments.bundle} for {arguments.run_dir}: {total_steps:,} training "
          f"batches ({steps_per_epoch} per epoch), {validation_steps} validation batches.")


def _split_arrays(split, pairs, steps, *, shuffle, seed, options):
    """The token ids of a split and its first `steps` batches (pass after pass)."""
    arrays = {}
    for name in ROW_NAMES:
        ragged = getattr(pairs, name)
        arrays[f"{split}_{name}_values"] = ragged.values.numpy().astype(np.int32)
        arrays[f"{split}_{name}_splits"] = ragged.row_splits.numpy().astype(np.int64)
    indices, shapes = [], []
    progress = keras.utils.Progbar(steps, unit_name="batch")
    pass_index = 0
    while len(indices) < steps:
        batches, batch_shapes = pass_batch_indices(
            pairs, pass_index=pass_index, seed=seed, shuffle=shuffle, **options)
        indices += batches
        shapes.append(batch_shapes)
        pass_index += 1
        progress.update(min(len(indices), steps))
    indices = indices[:steps]
    arrays[f"{split}_batch_pairs"] = np.concatenate(indices).astype(np.int32)
    arrays[f"{split}_batch_splits"] = np.cumsum([0] + [len(batch) for batch in indices])
    arrays[f"{split}_batch_shapes"] = np.concatenate(shapes)[:steps]
    return arrays


def _check_precision(config):
    if config.train.mixed_precision not in (None, "float32"):
        raise SystemExit("error: portable training runs in float32; mixed_precision="
                         f"{config.train.mixed_precision!r} is not supported here")


class BundleBatches:
    """The batches of one split of a bundle, as `(inputs, targets, loss_weights)` arrays.

    Args:
        arrays: the bundle's arrays (`batches.npz`).
        split: `"train"` or `"validation"`.
        pad_id: int. The padding id.
        shape: `(rows, length)` to pad every batch to, at least `largest_shape()`; None
            pads each to its bucket's shape, as `batching.batch_pairs(pad_to_bucket=True)`.
    """

    def __init__(self, arrays, split, pad_id, shape=None):
        self.rows = [(arrays[f"{split}_{name}_values"], arrays[f"{split}_{name}_splits"])
                     for name in ROW_NAMES]
        self.pairs = arrays[f"{split}_batch_pairs"]
        self.splits = arrays[f"{split}_batch_splits"]
        self.shapes = arrays[f"{split}_batch_shapes"]
        self.pad_id = pad_id
        self.shape = shape

    def __len__(self):
        return len(self.shapes)

    def largest_shape(self):
        """The most rows and the longest length of any batch: one shape that fits all."""
        return tuple(int(value) for value in self.shapes.max(axis=0))

    def __getitem__(self, index):
        pairs = self.pairs[self.splits[index]:self.splits[index + 1]]
        size, length = (int(value) for value in (self.shape or self.shapes[index]))
        positions = np.arange(length)
        padded = []
        for values, row_splits in self.rows:
            starts = row_splits[pairs]
            inside = positions < (row_splits[pairs + 1] - starts)[:, None]  # (B, L)
            ids = values[np.where(inside, starts[:, None] + positions, 0)]
            matrix = np.full((size, length), self.pad_id, np.int32)
            matrix[:len(pairs)] = np.where(inside, ids, self.pad_id)
            padded.append(matrix)
        source_ids, target_ids, targets = padded
        return ({"source_ids": source_ids, "target_ids": target_ids}, targets,
                (targets != self.pad_id).astype(np.float32))

    def stream(self):
        """Every batch once, in order: what `model.fit` consumes over all its epochs."""
        for index in range(len(self)):
            yield self[index]


def train(arguments):
    """Fits the bundle's model on its batches; writes checkpoints and a record to --out."""
    from keras_transformer.training.losses import LabelSmoothedCrossEntropy
    from keras_transformer.training.optimization import make_optimizer, make_schedule
    checkpoint_dir = os.path.join(arguments.out, TRAINED_CHECKPOINTS)
    record_path = os.path.join(arguments.out, TRAINED_RECORD)
    if os.path.exists(record_path) or callbacks_lib.list_checkpoints(checkpoint_dir):
        raise SystemExit(f"error: {arguments.out} holds a training already: give a new "
                         "--out")
    result = common.header(arguments)
    config = config_lib.Config.load(os.path.join(arguments.bundle, BUNDLE_CONFIG))
    _check_precision(config)
    with open(os.path.join(arguments.bundle, BUNDLE_INFO), encoding="utf-8") as file:
        info = json.load(file)
    arrays = dict(np.load(os.path.join(arguments.bundle, BUNDLE_BATCHES)))
    keras.utils.set_random_seed(config.train.seed)
    model = runs.build_model(config)
    runs.load_weights(model, os.path.join(arguments.bundle, INITIAL_WEIGHTS))
    schedule = make_schedule(config.train, model.hidden_dim)
    model.compile(
        optimizer=make_optimizer(config.train, schedule=schedule),
        loss=LabelSmoothedCrossEntropy(config.train.label_smoothing, pad_id=model.pad_id),
        # JAX always compiles; TensorFlow as the config says.
        jit_compile=keras.backend.backend() == "jax" or bool(config.train.jit_compile))
    training_batches = BundleBatches(arrays, "train", model.pad_id)
    validation_batches = BundleBatches(arrays, "validation", model.pad_id)
    if arguments.pad == "largest":
        # XLA compiles the step once per input shape: on an H100 the multi30k preset's
        # 17 bucket shapes took its first epoch to 402 s (≈24 s a compilation), the
        # next epochs 1.2–2.1 s each. With one shape the step also computes padding rows
        # and positions (loss weight 0 and masked, so the updates are the same): for
        # that preset 819 × 35 ids per side against a budget of 8,192.
        for batches in (training_batches, validation_batches):
            batches.shape = batches.largest_shape()

    result.update(config=json.loads(config.to_json()), bundle=info,
                  parameters=int(model.count_params()), gpu_models=common.gpu_names())
    # The record and the checkpoints are brought up to date as training goes, so that a
    # run killed by a hard time limit leaves what it made, ready for `collect`.
    record = TrainingRecord(record_path, result, checkpoint_dir, info["total_steps"])
    callbacks = [callbacks_lib.TerminateOnNonFiniteLoss(checkpoint_dir)]
    if config.train.cooldown_fraction:
        callbacks.append(callbacks_lib.LearningRateCooldown(
            schedule, config.train.cooldown_fraction, total_steps=info["total_steps"]))
    callbacks.append(WeightsOnlyCheckpoint(
        config, checkpoint_dir, config.train.checkpoint_every_steps,
        config.train.keep_checkpoints))
    callbacks.append(record)  # after the checkpoints, so that it lists the newest
    if arguments.minutes:
        callbacks.append(callbacks_lib.TimeBudget(arguments.minutes))
    model.fit(training_batches.stream(), epochs=info["epochs"],
              steps_per_epoch=info["steps_per_epoch"], callbacks=callbacks,
              shuffle=False, verbose=2)  # the batches come in their order
    validation_loss = token_mean_loss(model, validation_batches)
    record.write(final_val_loss=validation_loss,
                 accelerator_peak_memory_mb=common.accelerator_peak_memory_mb(),
                 load_average_end=common.load_average())
    print(f"Trained {result['updates']:,} of {info['total_steps']:,} updates in "
          f"{result['minutes']:.1f} min; final loss {result['final_loss']:.3f}, "
          f"validation loss {validation_loss:.3f}; {len(result['checkpoints'])} "
          f"checkpoints in {checkpoint_dir}")


def token_mean_loss(model, batches):
    """The loss per target token over all `batches`, whatever their padding.

    `model.evaluate` averages the batches' losses weighted by their rows, padding rows
    included, so its value would depend on how the batches are padded.
    """
    total = tokens = 0.0
    for inputs, targets, weights in batches.stream():
        count = float(weights.sum())
        total += float(model.test_on_batch(inputs, targets, sample_weight=weights)) * count
        tokens += count
    return total / tokens


class WeightsOnlyCheckpoint(callbacks_lib.RollingCheckpoint):
    """`RollingCheckpoint` without the optimizer's state, which averaging and export never
    read (Adam's moments would make each file 3× as large).

    `save_weights` writes a model's optimizer too: a twin model of the same config,
    never compiled, holds a copy of the weights for writing.
    """

    def __init__(self, config, directory, every_steps, keep):
        super().__init__(directory, every_steps, keep)
        self._twin = runs.build_model(config)

    def write(self, path):
        self._twin.set_weights(self.model.get_weights())
        self._twin.save_weights(path, overwrite=True)


class TrainingRecord(keras.callbacks.Callback):
    """Writes the train step's record at the start, after every epoch and at the end.

    It holds the updates made, the training minutes (from the start of `fit` to the last
    epoch's end), each epoch's seconds (the first holds the compilations), the last
    epoch's loss and the checkpoints on disk. Written to a temporary name and renamed, so
    a killed run leaves the record of its last whole epoch.

    Args:
        path: str. The record's path.
        result: dict. What the record holds besides; updated in place.
        checkpoint_dir: str. Where the checkpoints are, listed in the record.
        total_steps: int. The updates of the whole run (the record says whether all were
            made).
    """

    def __init__(self, path, result, checkpoint_dir, total_steps):
        super().__init__()
        self.path = path
        self.result = result
        self.checkpoint_dir = checkpoint_dir
        self.total_steps = total_steps
        self._fit_start = self._epoch_start = None

    def on_train_begin(self, logs=None):
        self._fit_start = time.monotonic()
        self.result.update(epoch_seconds=[], final_loss=None, final_val_loss=None)
        self._record_progress()

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_start = time.monotonic()

    def on_epoch_end(self, epoch, logs=None):
        self.result["epoch_seconds"].append(round(time.monotonic() - self._epoch_start, 3))
        if (logs or {}).get("loss") is not None:
            self.result["final_loss"] = float(logs["loss"])
        self._record_progress()

    def on_train_end(self, logs=None):
        self._record_progress()  # the final checkpoint, written at the end of training

    def _record_progress(self):
        updates = int(keras.ops.convert_to_numpy(self.model.optimizer.iterations))
        checkpoints = callbacks_lib.list_checkpoints(self.checkpoint_dir)
        self.write(minutes=(time.monotonic() - self._fit_start) / 60,
                   epochs=len(self.result["epoch_seconds"]), updates=updates,
                   finished=updates == self.total_steps,
                   checkpoints=[os.path.basename(path) for path in checkpoints])

    def write(self, **fields):
        """Adds `fields` to the record and writes it."""
        self.result.update(fields)
        temporary = self.path + ".partial"
        common.write_json(temporary, self.result)
        os.replace(temporary, self.path)


def collect(arguments):
    """Puts a trained bundle's checkpoints and record where `benchmarks.quality` reads them."""
    from keras_transformer import recipe
    with open(os.path.join(arguments.trained, TRAINED_RECORD), encoding="utf-8") as file:
        trained = json.load(file)
    config_path = os.path.join(arguments.run_dir, files.CONFIG)
    if not os.path.exists(config_path):
        raise SystemExit(f"error: {config_path} is missing: collect into the --run-dir "
                         "that `prepare` wrote")
    saved = json.loads(config_lib.Config.load(config_path).to_json())
    if saved != trained["config"]:
        raise SystemExit(f"error: {arguments.trained} was trained with another config "
                         f"than {config_path}: collect into the run directory its bundle "
                         "was prepared for")
    # The directory, not the record, says which checkpoints there are: a run killed
    # between a checkpoint and the next epoch's record has one more, or one fewer.
    made = callbacks_lib.list_checkpoints(os.path.join(arguments.trained,
                                                       TRAINED_CHECKPOINTS))
    if not made:
        raise SystemExit(f"error: {arguments.trained} holds no checkpoint: the training "
                         f"stopped before its first (update "
                         f"{trained['config']['train']['checkpoint_every_steps']})")
    if not trained["finished"]:
        print(f"warning: the training stopped at update {trained['updates']:,} of "
              f"{trained['bundle']['total_steps']:,} (--minutes, or killed); scoring "
              "what it made", flush=True)
    if trained["final_val_loss"] is None:
        print("warning: the training was killed before its validation loss was "
              "computed; the record has none", flush=True)
    checkpoint_dir = os.path.join(arguments.run_dir, files.CHECKPOINTS)
    os.makedirs(checkpoint_dir, exist_ok=True)
    for path in made:
        shutil.copy2(path, os.path.join(checkpoint_dir, os.path.basename(path)))
    machine = trained["machine"]
    gpus = trained["gpu_models"] or machine.get("gpus") or []
    backend = machine["keras_backend"]
    versions = f"Keras {machine['keras']}, " + (
        f"JAX {machine['jax']}" if backend == "jax" else f"{backend} backend")
    record = {"minutes": trained["minutes"], "epochs": trained["epochs"],
              "updates": trained["updates"], "parameters": trained["parameters"],
              "final_loss": trained["final_loss"],
              "final_val_loss": trained["final_val_loss"],
              "hardware": f"{', '.join(gpus) or common.describe_cpu(machine)} ({versions})",
              "trained_by": trained["command"]}
    common.write_json(os.path.join(arguments.run_dir, recipe.TRAINING_RECORD), record)
    common.write_json(os.path.join(arguments.run_dir, TRAINED_RECORD), trained)
    print(f"Collected {len(made)} checkpoints into {checkpoint_dir}; "
          f"score them with python -m benchmarks.quality --run-dir {arguments.run_dir} "
          "(and the --data-dir, --preset and overrides of prepare)")


def main(argv=None):
    arguments = parse_arguments(argv)
    {"prepare": prepare, "train": train, "collect": collect}[arguments.step](arguments)
    return 0


if __name__ == "__main__":
    sys.exit(main())
