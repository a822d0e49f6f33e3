"""Validation BLEU during training: translate a fixed slice, log it, keep the best weights.

Token accuracy and loss measure teacher-forced prediction; BLEU measures translations.
`ValidationTranslator` translates validation sentences with the model being trained
through the graph that is exported (`serving.translator.Translator.translate`: the run's
tokenizer, greedy decoding, detokenization, all in one `tf.function`; the decoding
compiled with XLA unless asked otherwise), or on Keras's other backends with the same
greedy rule in `keras.ops` (`decoding.portable`): the one way training translates,
shared by `BleuCallback` and `monitoring.TranslationMonitor`. `BleuCallback` scores the
translations with sacreBLEU (detokenized, cased, `13a`), logs the score to TensorBoard
and the console, keeps the best-scoring weights, and can stop training when the score
stops improving. Final scores come from `keras_transformer.evaluation`, on the exported
translator.
"""

import json
import logging
import os

import keras
import numpy as np
import tensorflow as tf
from sacrebleu.metrics import BLEU

from keras_transformer import files
from keras_transformer.data import corpus
from keras_transformer.data.tokenizer import PAD_ID, Tokenizer
from keras_transformer.decoding import portable
from keras_transformer.decoding.common import XLA_SOURCE_WIDTH_STEP
from keras_transformer.serving import translator as translator_lib
from keras_transformer.serving.translator import Translator
from keras_transformer.training import distribution

logger = logging.getLogger(__name__)

SUMMARY_TAG = "bleu"


class ValidationTranslator:
    """Translates sentences greedily with the model being trained, as the export would.

    Builds one `Translator` over the model on first use and keeps it: the traced (and
    XLA-compiled) graph is reused for every later call, with the weights of the moment.
    Sentences are sorted by length into batches, which keeps padding low; padding never
    changes an output.

    Args:
        tokenizer: the run's `Tokenizer`, or the directory of a saved one (read on first
            use, so a callback can be made before `training.fit.train` has written the
            run's tokenizer).
        batch_size: int. Sentences decoded together.
        max_length: int or `None`. Most output tokens per sentence.
        jit_compile: bool. Decode with XLA (`Translator`'s `jit_compile`): the same
            translations, in less of the training time (BENCHMARKS.md).
    """

    def __init__(self, tokenizer, *, batch_size=64, max_length=None, jit_compile=True):
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.max_length = max_length
        self.jit_compile = jit_compile
        self._translator = None  # a Translator, on TensorFlow
        self._portable = None  # (model, compiled decoder), on other backends

    def translator(self, model):
        """Returns the `Translator` of `model` (made on the first call; TensorFlow)."""
        if self._translator is None or self._translator.model is not model:
            self._translator = Translator(model, self.load_tokenizer(),
                                          max_output_length=self.max_length,
                                          jit_compile=self.jit_compile)
        return self._translator

    def translate(self, model, sentences):
        """Returns `(translations, token_ids)`: a list of str and a list of int arrays."""
        translate_batch = (self.translator(model).translate
                           if keras.backend.backend() == "tensorflow"
                           else self._portable_translator(model))
        order = sorted(range(len(sentences)), key=lambda index: len(sentences[index]))
        translations, token_ids = [None] * len(sentences), [None] * len(sentences)
        for start in range(0, len(order), self.batch_size):
            chosen = order[start:start + self.batch_size]
            outputs = translate_batch(tf.constant([sentences[i] for i in chosen]))
            for index, text, ids in zip(chosen, np.asarray(outputs["translations"]),
                                        np.asarray(outputs["token_ids"])):
                translations[index] = text.decode("utf-8", errors="replace")
                token_ids[index] = ids
        return translations, token_ids

    def source_ids(self, model, sentences):
        """Returns the int32 source ids `(B, S)` (NumPy) that `model` translates."""
        return translator_lib.source_ids(self.load_tokenizer(), tf.constant(sentences),
                                         model.max_length).numpy()

    def load_tokenizer(self):
        """Returns the `Tokenizer`, reading it from its directory on the first call."""
        if isinstance(self.tokenizer, (str, os.PathLike)):
            self.tokenizer = Tokenizer.load(self.tokenizer)
        return self.tokenizer

    def _portable_translator(self, model):
        """`translate(sentences)` for a model on another backend than TensorFlow.

        The exported graph cannot hold that backend's weights: the tokenizer runs as
        TensorFlow ops, the decoding as `decoding.portable` (compiled, one program per
        shape), so batches are padded to `batch_size` rows and to a multiple of
        `XLA_SOURCE_WIDTH_STEP` columns.
        """
        if self._portable is None or self._portable[0] is not model:
            self._portable = (model, portable.compiled_greedy_ids(
                model, max_length=self.max_length))
        decode, tokenizer = self._portable[1], self.load_tokenizer()

        def translate_batch(sentences):
            ids = self.source_ids(model, sentences)  # (B, S)
            rows, width = ids.shape
            padded_width = min(max(width, model.max_length),
                               -(-width // XLA_SOURCE_WIDTH_STEP) * XLA_SOURCE_WIDTH_STEP)
            padded = np.full((max(rows, self.batch_size), padded_width), PAD_ID, np.int32)
            padded[:rows, :width] = ids
            output_ids = decode(padded)[:rows]  # (B, C)
            return {"translations": tokenizer.detokenize(output_ids).numpy(),
                    "token_ids": output_ids}
        return translate_batch


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
        tokenizer: the run's `Tokenizer`, the directory of a saved one, or a
            `ValidationTranslator` to share with a `TranslationMonitor`.
        log_dir: str or `None`. TensorBoard directory, e.g. `RUN_DIR/logs/validation`.
        checkpoint_dir: str or `None`. Where the best weights go, e.g. `RUN_DIR/checkpoints`.
        every_steps: int or `None`. Score every this many weight updates; `None` scores
            at the end of every epoch.
        patience: int or `None`. Stop training after this many scores in a row without
            improvement; `None` never stops. Scores before the first non-zero BLEU do
            not count (early in training every score is 0).
        min_delta: float. Smallest BLEU gain that counts as an improvement.
        batch_size, max_length, jit_compile: as for `ValidationTranslator` (unless
            `tokenizer` is one).
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
        self.translator = (tokenizer if isinstance(tokenizer, ValidationTranslator)
                           else ValidationTranslator(tokenizer, batch_size=batch_size,
                                                     max_length=max_length,
                                                     jit_compile=jit_compile))
        self.log_dir = os.fspath(log_dir) if log_dir is not None else None
        self.checkpoint_dir = os.fspath(checkpoint_dir) if checkpoint_dir is not None else None
        self.every_steps, self.patience, self.min_delta = every_steps, patience, min_delta
        self.score_function, self.verbose = score_function, verbose
        self.best, self.best_step, self.wait = float("-inf"), None, 0
        self.hypotheses, self.signature = None, None
        self._writer, self._epoch = None, 0

    @classmethod
    def for_run(cls, run_dir, sources, references, translator=None, **kwargs):
        """Returns a callback for a run directory (layout in `keras_transformer.files`).

        It reads the run's `tokenizer/` (unless `translator`, a `ValidationTranslator`,
        is given), writes summaries to `run_dir/logs/validation` (next to Keras's
        validation scalars) and the best weights to `run_dir/checkpoints`. `kwargs` are
        the other arguments of `BleuCallback`. `training.fit.train` adds one itself when
        `train.bleu_sentences` is set; pass your own only with that field at 0.

        Example:
            sources, references = validation_slice(config.data, 500)
            fit.train(config, run_dir, callbacks=[
                BleuCallback.for_run(run_dir, sources, references, patience=5)])
        """
        return cls(sources, references,
                   translator or os.path.join(run_dir, files.TOKENIZER),
                   log_dir=os.path.join(run_dir, files.LOGS, "validation"),
                   checkpoint_dir=os.path.join(run_dir, files.CHECKPOINTS), **kwargs)

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
        return self.translator.translate(self.model, sources)[0]

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
        if distribution.is_chief():
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
            logger.info("Validation BLEU %.2f at step %d (best %.2f at step %s; %d "
                        "sentences, greedy)%s", bleu, step, self.best, self.best_step,
                        len(self.sources), f" {self.signature}" if self.signature else "")

    def _step(self):
        return int(keras.ops.convert_to_numpy(self.model.optimizer.iterations))


def validation_slice(data_config, num_sentences=500):
    """Returns `(sources, references)`: the first `num_sentences` validation pairs.

    The first ones, not a sample, so that every run of a corpus scores the same
    sentences. Reads the split as `data.corpus.load_split` does (no pair is dropped).
    """
    split = corpus.load_split(data_config, "validation", verbose=False)
    return (list(split.source_lines[:num_sentences]),
            list(split.target_lines[:num_sentences]))


def save_best(model, directory, info):
    """Writes `model`'s weights and `info` as `best.weights.h5` / `best.json` atomically."""
    os.makedirs(directory, exist_ok=True)
    files.replace_atomically(os.path.join(directory, files.BEST_WEIGHTS),
                             lambda path: model.save_weights(path, overwrite=True))
    # After the weights: a best.json never describes weights that are not on disk.
    files.write_text(os.path.join(directory, files.BEST_INFO),
                     json.dumps(info, indent=2) + "\n")


def read_best_info(directory):
    """Returns the dict of `directory/best.json`, or `None` when there is none."""
    path = os.path.join(directory, files.BEST_INFO)
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as file:
        return json.load(file)
