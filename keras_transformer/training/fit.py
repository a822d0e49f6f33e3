"""Training: `model.compile` with the paper's optimiser and loss, then `model.fit` (§5).

`train(config, run_dir)` checks the data, prepares the run directory (layout in
`files`), and fits with stock Keras callbacks plus small ones of our own. Re-running it
on the same directory resumes from the last backup.
"""

import contextlib
import dataclasses
import json
import logging
import os
import shutil
import sys
import warnings

import keras

from keras_transformer import config as config_lib
from keras_transformer import files, runs
from keras_transformer.data import batching, corpus, pairs
from keras_transformer.data import tokenizer as tokenizer_lib
from keras_transformer.data.text import CorpusError
from keras_transformer.training import backup as backup_lib
from keras_transformer.training import callbacks as callbacks_lib
from keras_transformer.training import distribution
from keras_transformer.training.bleu import BleuCallback, ValidationTranslator
from keras_transformer.training.losses import compile_model, compiles_step
from keras_transformer.training.monitoring import TranslationMonitor
from keras_transformer.training.optimization import make_optimizer, make_schedule

logger = logging.getLogger(__name__)


class RunDirectoryError(ValueError):
    """The run directory holds something else than this run; the message says what."""


# Fields that may differ when an existing run directory is trained again.
_RESUMABLE_CHANGES = {("train", "epochs"), ("train", "time_budget_minutes")}


def train(config, run_dir, *, callbacks=(), verbose="auto"):
    """Trains a Transformer as `config` says and records everything in `run_dir`.

    The config (`config.check_config`) and the run directory's path are checked before
    anything is written, and the corpus is read and validated next: if that (or
    building the tokenizer) fails, a run directory this call created is removed again.
    On an existing run directory the saved tokenizer is reused and training resumes
    from `backup/`; the config must match the saved one (only `train.epochs` and
    `train.time_budget_minutes` may change). One process trains in a run directory at
    a time (`runs.lock_run_dir`): another raises `runs.RunDirectoryInUseError`.

    Args:
        config: `Config`.
        run_dir: str. The run directory (layout in `keras_transformer.files`).
        callbacks: extra Keras callbacks, run after ours. A `BleuCallback` or
            `TranslationMonitor` only where `train.bleu_sentences` or
            `train.monitor_sentences` is 0: those fields add the run's own.
        verbose: passed to `model.fit` (`"auto"`, 0, 1 or 2). `"auto"` is Keras's
            progress bar where someone watches it (a terminal, a notebook), else one
            line per epoch (`progress_verbosity`).

    Returns:
        The `keras.callbacks.History` of `model.fit`; the model is `history.model`.
    """
    config_lib.check_config(config)
    if os.path.exists(run_dir) and not os.path.isdir(run_dir):
        raise RunDirectoryError(f"{run_dir} is a file, not a run directory: train into "
                                "a new --run-dir, or move the file away.")
    _check_translation_callbacks(config.train, callbacks)
    # One training per run directory; only the chief of a cluster writes into it.
    with (runs.lock_run_dir(run_dir) if distribution.is_chief()
          else contextlib.nullcontext(not os.path.exists(run_dir))) as created:
        return _train(config, run_dir, created, callbacks, progress_verbosity(verbose))


def progress_verbosity(verbose):
    """`model.fit`'s verbosity for `verbose`: `"auto"` becomes 1 (the progress bar) on
    a terminal or in a notebook, else 2 (a line per epoch). Keras takes every Linux
    process for a terminal and writes each step's bar into a log file (about 30 kB an
    epoch of Multi30K)."""
    if verbose != "auto":
        return verbose
    stdout_isatty = getattr(sys.stdout, "isatty", lambda: False)
    interactive = stdout_isatty() or "ipykernel" in sys.modules
    return 1 if interactive else 2


def _train(config, run_dir, created, callbacks, verbose):
    """`train` once the run directory is this process's (`created`: by this call)."""
    strategy = distribution.choose_strategy(config.train.devices)
    try:
        splits = _read_corpus(config.data)
        config, tokenizer = prepare_run_dir(config, run_dir, splits["train"])
        # The data and the time budget resume where the backup does; the backup
        # callback restores the rest.
        backup_dir = os.path.join(run_dir, files.BACKUP)
        position = backup_lib.read_backup_position(backup_dir)
        spent_minutes = backup_lib.read_backup_minutes(backup_dir)
        # Under Keras's DataParallel every device takes an equal share of each batch.
        rows_multiple = (distribution.replica_count(strategy)
                         if keras.backend.backend() != "tensorflow" else 1)
        train_data, validation_data, steps_per_epoch = make_datasets(
            config, tokenizer, splits, position, rows_multiple=rows_multiple)
    except BaseException:
        if created:
            shutil.rmtree(run_dir, ignore_errors=True)
        raise
    previous_policy = keras.mixed_precision.global_policy()
    distribution.set_precision(distribution.backend_precision(config.train.mixed_precision))
    try:
        keras.utils.set_random_seed(config.train.seed)
        with strategy.scope():
            model = runs.build_model(config)
            schedule = make_schedule(config.train, model.hidden_dim)
            compile_model(model, config.train, make_optimizer(config.train, schedule=schedule))
        with distribution.fit_scope(strategy), warnings.catch_warnings():
            # The validation batches have no known count, so Keras learns it by reaching
            # their end, and warns that the data "ran out" each time it does.
            warnings.filterwarnings("ignore", message="Your input ran out of data")
            history = model.fit(
                train_data, validation_data=validation_data, epochs=config.train.epochs,
                steps_per_epoch=steps_per_epoch,
                callbacks=make_callbacks(config.train, run_dir, [
                    *make_translation_callbacks(config.train, run_dir, splits["validation"]),
                    *callbacks], schedule=schedule,
                    total_updates=config.train.epochs * steps_per_epoch
                    // config.train.gradient_accumulation_steps,
                    spent_minutes=spent_minutes),
                shuffle=False, verbose=verbose)  # the pipeline shuffles
    finally:
        # The precision is this run's: what the caller builds next in this process
        # (averaging, export, evaluation) is built in the caller's own policy again.
        keras.mixed_precision.set_global_policy(previous_policy)
    if distribution.is_chief():
        files.replace_atomically(os.path.join(run_dir, files.FINAL_WEIGHTS),
                                 lambda path: model.save_weights(path, overwrite=True))
    return history


def make_callbacks(train_config, run_dir, extra=(), *, schedule=None, total_updates=None,
                   spent_minutes=0.0):
    """Returns the callbacks of a run, in the order they must run at each step.

    TerminateOnNaN comes first and raises, so nothing after it writes a bad state and
    the backup survives; ThroughputLogger adds values the later ones record. Step-level
    summaries come from our StepSummaries, epoch-level ones from Keras's TensorBoard.
    Only the chief of a worker cluster writes checkpoints and logs. The backup comes
    before any callback that may stop training at an epoch's end, and the end of the
    epoch it resumes after every callback (see `backup.ResumedEpochEnd`). The time
    budget comes after the `extra` callbacks, so that the time their epoch-end work
    takes (BLEU on validation sentences) counts toward stopping at that epoch's end.

    Args:
        train_config: `TrainConfig`.
        run_dir: str. The run directory.
        extra: callbacks to run after ours and before the resumed epoch's end.
        schedule: the optimizer's `WarmupInverseSqrtSchedule` (`make_schedule`), which
            `train_config.cooldown_fraction` needs.
        total_updates: int or None. Weight updates of the whole run, for the cooldown.
        spent_minutes: float. Minutes the run trained before this `fit`
            (`backup.read_backup_minutes`), for the time budget and the cooldown.
    """
    every = train_config.checkpoint_every_steps
    checkpoint_dir = os.path.join(run_dir, files.CHECKPOINTS)
    callbacks = [callbacks_lib.TerminateOnNonFiniteLoss(checkpoint_dir),
                 callbacks_lib.ThroughputLogger()]
    if train_config.time_budget_minutes is not None:
        if distribution.worker_count() > 1:
            # Each worker would read its own clock, and one stopping before the others
            # leaves them waiting in a collective for ever.
            raise ValueError("train.time_budget_minutes works on one machine only; in a "
                             "worker cluster, limit the run with train.epochs or "
                             "train.steps_per_epoch instead.")
        budget = [callbacks_lib.TimeBudget(train_config.time_budget_minutes,
                                           spent_minutes)]
    else:
        budget = []
    if train_config.cooldown_fraction:
        if schedule is None:
            raise ValueError("train.cooldown_fraction needs the optimizer's schedule "
                             "(make_callbacks(..., schedule=make_schedule(...))).")
        callbacks.append(callbacks_lib.LearningRateCooldown(
            schedule, train_config.cooldown_fraction, total_updates=total_updates,
            minutes=train_config.time_budget_minutes, spent_minutes=spent_minutes))
    if distribution.is_chief():
        callbacks.append(callbacks_lib.RollingCheckpoint(
            checkpoint_dir, every, train_config.keep_checkpoints))
    # Kept after a finished run, so that running the same command again is a no-op.
    # Every worker restores the chief's backup (the run directory must be shared),
    # so that all resume from the same state; only the chief writes it.
    backup = backup_lib.AtomicBackupAndRestore(
        os.path.join(run_dir, files.BACKUP), restore_only=not distribution.is_chief(),
        save_freq=every, double_checkpoint=True, delete_checkpoint=False)
    callbacks.append(backup)
    if distribution.is_chief():
        log_dir = os.path.join(run_dir, files.LOGS)
        callbacks += [
            callbacks_lib.StepSummaries(os.path.join(log_dir, "train"),
                                        train_config.log_every_steps),
            keras.callbacks.TensorBoard(log_dir, update_freq="epoch", write_graph=False)]
    # Last, where Keras puts its own progress bar: it shows what the others logged.
    progress = callbacks_lib.TrainingProgress(budget[0] if budget else None)
    return callbacks + list(extra) + budget + [backup.resumed_epoch_end(), progress]


def make_translation_callbacks(train_config, run_dir, validation_text):
    """Returns the callbacks that translate validation sentences during training.

    BLEU on the first `bleu_sentences` pairs (best weights kept, optional early stop)
    and sample translations with attention maps in TensorBoard for the first
    `monitor_sentences`: fixed slices, so every evaluation scores the same sentences.
    Both translate with one `ValidationTranslator`, so its graph is traced once.
    """
    sources, references = validation_text.source_lines, validation_text.target_lines
    translator = ValidationTranslator(os.path.join(run_dir, files.TOKENIZER))
    callbacks = []
    if train_config.bleu_sentences:
        count = train_config.bleu_sentences
        callbacks.append(BleuCallback.for_run(
            run_dir, sources[:count], references[:count], translator,
            every_steps=train_config.bleu_every_steps, patience=train_config.bleu_patience))
    if train_config.monitor_sentences:
        count = train_config.monitor_sentences
        callbacks.append(TranslationMonitor.for_run(run_dir, sources[:count],
                                                    references[:count], translator))
    return callbacks


def _check_translation_callbacks(train_config, callbacks):
    """Refuses a BLEU callback or translation monitor that the config already adds.

    Two BLEU callbacks of one run keep their best weights in the same checkpoint
    directory, each by its own slice of sentences, and log the same TensorBoard tags.
    """
    for kind, field in ((BleuCallback, "bleu_sentences"),
                        (TranslationMonitor, "monitor_sentences")):
        if getattr(train_config, field) and any(isinstance(callback, kind)
                                                for callback in callbacks):
            raise ValueError(
                f"train.{field}={getattr(train_config, field)} already adds a "
                f"{kind.__name__} to the run, and `callbacks` holds another: set "
                f"train.{field}=0 to use your own, or leave it out of `callbacks`.")


def prepare_run_dir(config, run_dir, train_text):
    """Writes (or checks) `config.json` and the tokenizer; returns `(config, tokenizer)`.

    The returned config has `model.vocabulary_size` equal to the tokenizer's.
    """
    tokenizer_dir = os.path.join(run_dir, files.TOKENIZER)
    saved = runs.saved_config(run_dir)
    if os.path.isdir(tokenizer_dir):
        tokenizer = tokenizer_lib.Tokenizer.load(tokenizer_dir)
    else:
        if saved is not None:
            # A run's config without its tokenizer: refuse a differing config before
            # training a tokenizer into that run's directory. The vocabulary size is
            # checked below, once the tokenizer says what it is.
            check_same_run(config, run_dir)
        # §3.4: one vocabulary shared by both languages, as the tied embeddings need.
        lines = train_text.source_lines + train_text.target_lines
        tokenizer = tokenizer_lib.train_tokenizer(lines, config.model.vocabulary_size)
        if distribution.is_chief():
            os.makedirs(run_dir, exist_ok=True)
            partial = os.path.join(run_dir, files.partial_name(files.TOKENIZER))
            shutil.rmtree(partial, ignore_errors=True)
            tokenizer.save(partial)
            os.replace(partial, tokenizer_dir)
    if tokenizer.vocabulary_size != config.model.vocabulary_size:
        logger.warning("The tokenizer has %d pieces (%d asked for): the model uses %d.",
                        tokenizer.vocabulary_size, config.model.vocabulary_size,
                        tokenizer.vocabulary_size)
        config = dataclasses.replace(config, model=dataclasses.replace(
            config.model, vocabulary_size=tokenizer.vocabulary_size))
    if saved is not None:
        _check_same_run(config, saved, run_dir)
    if distribution.is_chief():
        config.save(runs.config_path(run_dir))
    return config, tokenizer


def make_datasets(config, tokenizer, splits, position=(0, 0), *, rows_multiple=1):
    """Returns the training and validation data, and the number of steps per epoch.

    Training data is one endless stream of batches, pass after pass over the data, each
    pass shuffled by `(data.seed, pass)` alone (see `batching.batch_pairs`): an epoch is the
    next `steps_per_epoch` batches, `train.steps_per_epoch` or one pass. A resumed run
    starts the stream at the batch where the uninterrupted run's epoch `epoch` had got
    to, so both train on the same batches.

    Args:
        config: `Config` (with the tokenizer's vocabulary size).
        tokenizer: `Tokenizer`.
        splits: dict of `ParallelText` with keys `"train"` and `"validation"`.
        position: `(epoch, batches_done)` where training resumes (see
            `backup.read_backup_position`).
        rows_multiple: int. Pad the rows of compiled steps' batches to a multiple of
            this (the devices of a `keras.distribution.DataParallel`).

    Returns:
        `(train_data, validation_data, steps_per_epoch)`; the datasets are of
        `(inputs, targets, loss_weights)`.
    """
    options = dict(batch_tokens=config.data.batch_tokens, max_length=config.model.max_length)
    train_pairs = pairs.tokenize_split(splits["train"], tokenizer,
                                max_length=config.model.max_length,
                                nbest=config.data.subword_nbest)
    steps_per_epoch = (config.train.steps_per_epoch
                       or batching.batches_per_pass(train_pairs, **options))
    epoch, batches_done = position
    # XLA compiles the step anew for each input shape it meets: one shape per bucket.
    if compiles_step(config.train):
        options.update(pad_to_bucket=True, rows_multiple=rows_multiple)
    train_data = batching.batch_pairs(
        train_pairs, shuffle=True, seed=config.data.seed, repeat=True,
        start_batch=epoch * steps_per_epoch + batches_done,
        subword_alpha=config.data.subword_alpha,
        accumulation=config.train.gradient_accumulation_steps, **options)
    validation_data = batching.make_dataset(splits["validation"], tokenizer, shuffle=False,
                                            **options)
    return train_data, validation_data, steps_per_epoch


def _read_corpus(data_config):
    """Reads and validates the training and validation text (raises on bad data)."""
    splits = {split: corpus.load_split(data_config, split)
              for split in ("train", "validation")}
    for split, text in splits.items():
        if not len(text):  # train drops empty pairs, so its files may hold only those
            stats = text.stats
            problem = "are empty" if not stats.read else (
                f"hold no usable pair ({stats.empty} of {stats.read} empty, "
                f"{stats.too_long} too long)")
            raise CorpusError(
                f"{text.source_file} and {text.target_file} ({split}) {problem}: give "
                "line-aligned sentences in both, or point DataConfig at other files.")
    return splits


def check_same_run(config, run_dir):
    """Raises `RunDirectoryError` unless `config` is that of the run in `run_dir` (if it
    holds one) where a resumed run must keep it: any field but those of
    `_RESUMABLE_CHANGES` and the vocabulary size, which the run's tokenizer settled."""
    saved = runs.saved_config(run_dir)
    if saved is not None:
        _check_same_run(dataclasses.replace(config, model=dataclasses.replace(
            config.model, vocabulary_size=saved.model.vocabulary_size)), saved, run_dir)


def _check_same_run(config, saved, run_dir):
    """Raises unless `config` only differs from the run's saved config where allowed."""
    new, old = json.loads(config.to_json()), json.loads(saved.to_json())
    changed = sorted(f"{section}.{name}" for section in new for name in new[section]
                     if new[section][name] != old[section].get(name)
                     and (section, name) not in _RESUMABLE_CHANGES)
    if changed:
        raise RunDirectoryError(
            f"{run_dir} holds a run with a different config ({', '.join(changed)} differ). "
            f"Resume it with --config {runs.config_path(run_dir)}, or train "
            "into a new --run-dir.")
