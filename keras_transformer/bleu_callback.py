"""Validation BLEU during training: translate a fixed slice, log it, keep the best weights.

Token accuracy and loss measure teacher-forced prediction; BLEU measures translations.
`BleuCallback` translates a fixed set of validation sentences with the model being
trained through the graph that is exported (`serving.Translator.translate`: the run's
tokenizer, `decoding.greedy_decode`, detokenization, all in one `tf.function`; the
decoding compiled with XLA unless asked otherwise) and scores them with sacreBLEU
(detokenized, cased, `13a`). It logs the score to TensorBoard and the console, keeps the
best-scoring weights, and can stop training when the score stops improving. Final
scores come from `keras_transformer.evaluation`, on the exported translator.
"""

import json
import os

import keras
import tensorflow as tf
from sacrebleu.metrics import BLEU

from keras_transformer import corpus, runs, serving
from keras_transformer.tokenizer import Tokenizer

BEST_WEIGHTS = "best.weights.h5"
BEST_INFO = "best.json"
SUMMARY_TAG = "bleu"


class BleuCallback(keras.callbacks.Callback):
    """Scores greedy translations of validation sentences with sacreBLEU while training.

    Scores at the end of every epoch, or every `every_steps` weight updates. Each score
    goes to TensorBoard (scalar `bleu` in `log_dir`, step = weight updates), to the
    console, and in epoch mode to the epoch's logs as `val_bleu` (so `History` and later
    callbacks see it). When the score beats the best so far by more than `min_delta`, the
    weights are saved to `checkpoint_dir/best.weights.h5` (written under a temporary name
    and renamed) and `best.json` records `bleu`, `step`, `epoch` (1-based) and the
    sacreBLEU signature. A `best.json` already there (a resumed run) sets the bar.

    Under `tf.distribute`, every worker translates and scores (the same weights give the
    same score, so all workers stop together), but only the chief writes files,
    summaries and console lines.

    Args:
        sources: list of str. Source sentences, e.g. the first few hundred of the
            validation set (a fixed slice, so scores are comparable across evaluations).
        references: list of str. One reference translation per source sentence.
        tokenizer: the run's `Tokenizer`, or the directory of a saved one (read when
            training begins, so the callback can be made before `training.train` has
            written the run's tokenizer).
        log_dir: str or `None`. TensorBoard directory, e.g. `RUN_DIR/logs/validation`.
        checkpoint_dir: str or `None`. Where the best weights go, e.g. `RUN_DIR/checkpoints`.
        every_steps: int or `None`. Score every this many weight updates; `None` scores
            at the end of every epoch.
        patience: int or `None`. Stop training after this many scores in a row without
            improvement; `None` never stops. Scores before the first non-zero BLEU do
            not count (early in training every score is 0).
        min_delta: float. Smallest BLEU gain that counts as an improvement.
        batch_size: int. Sentences decoded together.
        max_length: int or `None`. Most output tokens per sentence (see `greedy_decode`).
        jit_compile: bool. Decode with XLA (`serving.Translator`'s `jit_compile`): the
            same translations, in less of the training time (BENCHMARKS.md).
        score_function: `None` for sacreBLEU's corpus BLEU, or a callable
            `(hypotheses, references) -> float` (tests use it to script scores).
        verbose: bool. Print a line per score (chief only).
    """

    def __init__(self, sources, references, tokenizer, *, log_dir=None, checkpoint_dir=None,
                 every_steps=None, patience=None, min_delta=0.0, batch_size=64,
                 max_length=None, jit_compile=True, score_function=None, verbose=True):
        super().__init__()
        if len(sources) != len(references) or not sources:
            raise ValueError(f"BleuCallback needs as many references as sources (at least "
                             f"one): got {len(sources)} sources, {len(references)} "
                             "references.")
        if every_steps is not None and every_steps < 1:
            raise ValueError(f"every_steps must be at least 1, got {every_steps}.")
        self.sources, self.references = list(sources), list(references)
        self.tokenizer = tokenizer
        self.log_dir = os.fspath(log_dir) if log_dir is not None else None
        self.checkpoint_dir = os.fspath(checkpoint_dir) if checkpoint_dir is not None else None
        self.every_steps, self.patience, self.min_delta = every_steps, patience, min_delta
        self.batch_size, self.max_length = batch_size, max_length
        self.jit_compile = jit_compile
        self.score_function, self.verbose = score_function, verbose
        self.best, self.best_step, self.wait = float("-inf"), None, 0
        self.hypotheses, self.signature = None, None
        self._translator, self._writer, self._epoch = None, None, 0

    @classmethod
    def for_run(cls, run_dir, sources, references, **kwargs):
        """Returns a callback for a run directory (layout in `keras_transformer.runs`).

        It reads the run's `tokenizer/`, writes summaries to `run_dir/logs/validation`
        (next to Keras's validation scalars) and the best weights to
        `run_dir/checkpoints`. `kwargs` are the other arguments of `BleuCallback`.
        `training.train` adds one itself when `train.bleu_sentences` is set; pass your
        own only with that field at 0.

        Example:
        >>> sources, references = validation_slice(config.data, 500)
        >>> training.train(config, run_dir, callbacks=[
        ...     BleuCallback.for_run(run_dir, sources, references, patience=5)])
        """
        return cls(sources, references, os.path.join(run_dir, runs.TOKENIZER),
                   log_dir=os.path.join(run_dir, runs.LOGS, "validation"),
                   checkpoint_dir=os.path.join(run_dir, runs.CHECKPOINTS), **kwargs)

    def on_train_begin(self, logs=None):
        self.wait = 0
        info = read_best_info(self.checkpoint_dir) if self.checkpoint_dir else None
        if info is not None and info["bleu"] > self.best:
            self.best, self.best_step = info["bleu"], info["step"]

    def on_train_batch_end(self, batch, logs=None):
        if self.every_steps and self._step() % self.every_steps == 0:
            self.score_and_record(self._epoch)

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_epoch_end(self, epoch, logs=None):
        if self.every_steps is None:
            bleu = self.score_and_record(epoch)
            if logs is not None:
                logs["val_bleu"] = bleu

    def on_train_end(self, logs=None):
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def translate(self, sources):
        """Returns greedy translations (list of str) of `sources` by the current model."""
        if self._translator is None:
            if isinstance(self.tokenizer, (str, os.PathLike)):
                self.tokenizer = Tokenizer.load(self.tokenizer)
            # The exported translator's own graph: tokenize, greedy decoding, detokenize.
            self._translator = serving.Translator(
                self.model, self.tokenizer, max_output_length=self.max_length,
                jit_compile=self.jit_compile)
        # Sorted by length, batches carry little padding; padding never changes outputs.
        order = sorted(range(len(sources)), key=lambda index: len(sources[index]))
        translations = [None] * len(sources)
        for start in range(0, len(order), self.batch_size):
            chosen = order[start:start + self.batch_size]
            batch = tf.constant([sources[index] for index in chosen], tf.string)
            texts = self._translator.translate(batch)["translations"].numpy()
            for index, text in zip(chosen, texts):
                translations[index] = text.decode("utf-8", errors="replace")
        return translations

    def score_and_record(self, epoch):
        """Translates, scores, logs, keeps the best weights; returns the BLEU score."""
        self.hypotheses = self.translate(self.sources)
        if self.score_function is None:
            metric = BLEU()
            bleu = metric.corpus_score(self.hypotheses, [self.references]).score
            self.signature = str(metric.get_signature())
        else:
            bleu = float(self.score_function(self.hypotheses, self.references))
        step = self._step()
        improved = bleu > self.best + self.min_delta
        if improved:
            self.best, self.best_step, self.wait = bleu, step, 0
        elif self.best > 0:
            # A model that has not scored yet is warming up, not on a plateau.
            self.wait += 1
        if is_chief(self.model.distribute_strategy):
            self._record(bleu, step, epoch, improved)
        if self.patience is not None and self.wait >= self.patience:
            self.model.stop_training = True
        return bleu

    def _record(self, bleu, step, epoch, improved):
        if self.log_dir:
            if self._writer is None:
                self._writer = tf.summary.create_file_writer(self.log_dir)
            with self._writer.as_default():
                tf.summary.scalar(SUMMARY_TAG, bleu, step=step)
            self._writer.flush()
        if improved and self.checkpoint_dir:
            save_best(self.model, self.checkpoint_dir, {
                "bleu": bleu, "step": step, "epoch": epoch + 1,
                "sentences": len(self.sources), "signature": self.signature})
        if self.verbose:
            print(f"\nValidation BLEU {bleu:.2f} at step {step} (best {self.best:.2f} at "
                  f"step {self.best_step}; {len(self.sources)} sentences, greedy)"
                  + (f" {self.signature}" if self.signature else ""), flush=True)

    def _step(self):
        return int(keras.ops.convert_to_numpy(self.model.optimizer.iterations))


def validation_slice(data_config, num_sentences=500):
    """Returns `(sources, references)`: the first `num_sentences` validation pairs.

    The first ones, not a sample, so that every run of a corpus scores the same
    sentences. Reads the split as `corpus.load_split` does (no pair is dropped).
    """
    split = corpus.load_split(data_config, "validation", verbose=False)
    return (list(split.source_lines[:num_sentences]),
            list(split.target_lines[:num_sentences]))


def is_chief(strategy):
    """Whether this process writes files under `strategy` (always, outside a cluster).

    The chief is the task of type `"chief"`, or worker 0 of a cluster without one.
    """
    resolver = getattr(strategy, "cluster_resolver", None)
    task_type = getattr(resolver, "task_type", None)
    if not task_type:
        return True
    if task_type == "chief":
        return True
    has_chief = "chief" in resolver.cluster_spec().as_dict()
    return task_type == "worker" and not has_chief and int(resolver.task_id or 0) == 0


def save_best(model, directory, info):
    """Writes `model`'s weights and `info` as `best.weights.h5` / `best.json` atomically."""
    os.makedirs(directory, exist_ok=True)
    temporary = os.path.join(directory, "partial-" + BEST_WEIGHTS)
    model.save_weights(temporary, overwrite=True)
    os.replace(temporary, os.path.join(directory, BEST_WEIGHTS))
    # After the weights: a best.json never describes weights that are not on disk.
    path = os.path.join(directory, BEST_INFO)
    with open(f"{path}.tmp", "w", encoding="utf-8") as file:
        json.dump(info, file, indent=2)
        file.write("\n")
    os.replace(f"{path}.tmp", path)


def read_best_info(directory):
    """Returns the dict of `directory/best.json`, or `None` when there is none."""
    path = os.path.join(directory, BEST_INFO)
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as file:
        return json.load(file)
