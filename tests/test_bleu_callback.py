"""BleuCallback: scores what greedy decoding translates, logs it, keeps the best weights."""

import json
import os
import types

import keras
import numpy as np
import pytest
import sacrebleu
import tensorflow as tf
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from keras_transformer import DataConfig, Transformer, files
from keras_transformer.data import pairs as pairs_lib
from keras_transformer.data import text
from keras_transformer.data.tokenizer import END_ID, train_tokenizer
from keras_transformer.serving import translator as translator_lib
from keras_transformer.training import bleu as bleu_callback
from keras_transformer.training import distribution

PAIRS = [("a man rides a horse .", "ein Mann reitet ein Pferd ."),
         ("two dogs play in the snow .", "zwei Hunde spielen im Schnee ."),
         ("a girl reads a book .", "ein Mädchen liest ein Buch ."),
         ("the boy jumps into the water .", "der Junge springt ins Wasser ."),
         ("a woman sings on a stage .", "eine Frau singt auf einer Bühne ."),
         ("three people walk in the street .", "drei Menschen gehen auf der Straße .")]
SOURCES = [source for source, _ in PAIRS]
REFERENCES = [target for _, target in PAIRS]


@pytest.fixture(scope="module")
def tokenizer():
    lines = [line for pair in PAIRS for line in pair] * 5
    return train_tokenizer(lines, 60, verbose=False)


def _model(tokenizer, compile=True):
    keras.utils.set_random_seed(0)
    model = Transformer.from_preset("tiny", vocabulary_size=tokenizer.vocabulary_size,
                                    num_layers=1)
    if compile:
        # Eager steps: a handful of them costs less than tracing the training step.
        model.compile(optimizer=keras.optimizers.Adam(1e-2), run_eagerly=True,
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _training_data(tokenizer):
    """Teacher-forcing arrays for the pairs, made as the data pipeline makes them."""
    text = types.SimpleNamespace(source_lines=SOURCES, target_lines=REFERENCES)
    pairs = pairs_lib.tokenize_pairs(text, tokenizer, max_length=64)
    inputs = {"source_ids": pairs.source_ids.to_tensor(),
              "target_ids": pairs.target_ids.to_tensor()}
    return inputs, pairs.targets.to_tensor()


def _scripted(scores):
    """A score function returning `scores` one after the other."""
    remaining = list(scores)
    return lambda hypotheses, references: remaining.pop(0)


def _logged(log_dir):
    accumulator = EventAccumulator(str(log_dir))
    accumulator.Reload()
    return [(event.step, float(tf.make_ndarray(event.tensor_proto)))
            for event in accumulator.Tensors(bleu_callback.SUMMARY_TAG)]


class _WeightsAtEpochEnd(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.weights = []

    def on_epoch_end(self, epoch, logs=None):
        self.weights.append([np.array(w) for w in self.model.get_weights()])


# Callbacks over `_LookupModel` decode without XLA: its hash table has no XLA kernel.
LOOKUP_OPTIONS = dict(jit_compile=False, verbose=False)


class _LookupModel:
    """Stands in for a `Transformer`: translates each known source into a fixed text.

    Its decoder spells the output ids of the source sentence it is given (found by a
    key computed from the source ids), so translations that come back in the wrong
    order or for the wrong sentence are caught. Saved "weights" record the step.
    """

    max_length = 64
    variables = []

    def __init__(self, tokenizer, sources, outputs, step=0):
        source_ids = translator_lib.Translator(self, tokenizer).source_ids(tf.constant(sources))
        keys = [int(key) for key in self._key(source_ids)]
        assert len(set(keys)) == len(keys)
        self._rows = tf.lookup.StaticHashTable(
            tf.lookup.KeyValueTensorInitializer(
                tf.constant(keys, tf.int64), tf.range(len(keys), dtype=tf.int64)), -1)
        output_ids = [ids + [END_ID] for ids in tokenizer.tokenize(outputs).to_list()]
        self._outputs = tf.constant(
            keras.utils.pad_sequences(output_ids, maxlen=self.max_length, padding="post"))
        self._vocabulary_size = tokenizer.vocabulary_size
        self.optimizer = types.SimpleNamespace(iterations=tf.Variable(step, dtype=tf.int64))
        self.distribute_strategy = tf.distribute.get_strategy()
        self.stop_training = False

    @staticmethod
    def _key(source_ids):
        # Padding (id 0) adds nothing: padded and unpadded ids give the same key.
        positions = tf.range(1, tf.shape(source_ids)[1] + 1, dtype=tf.int64)  # (S,)
        return tf.reduce_sum(tf.cast(source_ids, tf.int64) * positions ** 2, axis=1)  # (B,)

    def encode(self, source_ids, training=None):
        return tf.zeros(tf.concat([tf.shape(source_ids), [1]], 0))  # (B, S, 1)

    def init_cache(self, encoder_output, source_ids, max_length):
        return {"row": tf.cast(self._rows.lookup(self._key(source_ids)), tf.int32)}  # (B,)

    def decode_step(self, token_ids, cache, index):
        next_ids = tf.gather(self._outputs, cache["row"])[:, index]  # (B,)
        return 10.0 * tf.one_hot(next_ids, self._vocabulary_size), cache

    def save_weights(self, path, overwrite=True):
        with open(path, "w", encoding="utf-8") as file:
            json.dump({"step": int(self.optimizer.iterations.numpy())}, file)

    @staticmethod
    def saved_step(path):
        with open(path, encoding="utf-8") as file:
            return json.load(file)["step"]


def test_logs_every_score_keeps_the_best_weights_and_stops_on_patience(tokenizer, tmp_path):
    model = _model(tokenizer)
    x, y = _training_data(tokenizer)
    callback = bleu_callback.BleuCallback(
        SOURCES, REFERENCES, tokenizer, log_dir=tmp_path / "logs",
        checkpoint_dir=tmp_path / "checkpoints", patience=2, max_length=8,
        score_function=_scripted([10.0, 30.0, 20.0, 25.0, 40.0]), verbose=False)
    snapshots = _WeightsAtEpochEnd()
    history = model.fit(x, y, batch_size=len(PAIRS), epochs=6,
                        callbacks=[snapshots, callback], verbose=0)
    # Epochs 3 and 4 did not beat 30: patience 2 stops after epoch 4.
    assert history.history["val_bleu"] == [10.0, 30.0, 20.0, 25.0]
    assert _logged(tmp_path / "logs") == [(1, 10.0), (2, 30.0), (3, 20.0), (4, 25.0)]
    info = bleu_callback.read_best_info(tmp_path / "checkpoints")
    assert (info["bleu"], info["step"], info["epoch"]) == (30.0, 2, 2)
    restored = _model(tokenizer, compile=False)
    restored.load_weights(os.path.join(tmp_path, "checkpoints", files.BEST_WEIGHTS))
    for saved, expected, last in zip(restored.get_weights(), snapshots.weights[1],
                                     snapshots.weights[-1]):
        np.testing.assert_array_equal(saved, expected)
    assert any(not np.array_equal(a, b) for a, b in zip(snapshots.weights[1],
                                                        snapshots.weights[-1]))
    assert not [name for name in os.listdir(tmp_path / "checkpoints")
                if "partial" in name or name.endswith(".tmp")]


def test_default_score_is_sacrebleu_on_the_greedy_translations(tokenizer, tmp_path):
    # Sentences 1 and 4 get another sentence's reference: BLEU is strictly below 100.
    outputs = [REFERENCES[4 if index == 1 else 0 if index == 4 else index]
               for index in range(len(PAIRS))]
    model = _LookupModel(tokenizer, SOURCES, outputs, step=7)
    callback = bleu_callback.BleuCallback(
        SOURCES, REFERENCES, tokenizer, log_dir=tmp_path / "logs",
        checkpoint_dir=tmp_path / "checkpoints", batch_size=4, **LOOKUP_OPTIONS)
    callback.set_model(model)
    callback.on_train_begin()
    logs = {}
    callback.on_epoch_end(0, logs)
    assert callback.hypotheses == outputs
    bleu = sacrebleu.corpus_bleu(outputs, [REFERENCES])
    assert 0 < bleu.score < 100
    assert logs["val_bleu"] == pytest.approx(bleu.score)
    assert _logged(tmp_path / "logs") == [(7, pytest.approx(bleu.score, rel=1e-6))]
    info = bleu_callback.read_best_info(tmp_path / "checkpoints")
    assert (info["bleu"], info["step"], info["epoch"]) == (pytest.approx(bleu.score), 7, 1)
    metric = sacrebleu.BLEU()
    metric.corpus_score(outputs, [REFERENCES])
    assert info["signature"] == str(metric.get_signature())
    assert "tok:13a" in info["signature"]


def test_scores_every_n_steps(tokenizer, tmp_path):
    model = _LookupModel(tokenizer, SOURCES[:2], REFERENCES[:2])
    callback = bleu_callback.BleuCallback(
        SOURCES[:2], REFERENCES[:2], tokenizer, log_dir=tmp_path, every_steps=3,
        score_function=_scripted([1.0, 2.0]), **LOOKUP_OPTIONS)
    callback.set_model(model)
    callback.on_train_begin()
    for step in range(1, 8):
        model.optimizer.iterations.assign(step)
        callback.on_train_batch_end(step - 1, {})
    callback.on_epoch_end(0, {})
    assert _logged(tmp_path) == [(3, 1.0), (6, 2.0)]


def test_resumed_run_keeps_a_better_earlier_checkpoint(tokenizer, tmp_path):
    model = _LookupModel(tokenizer, SOURCES[:2], REFERENCES[:2], step=9)
    bleu_callback.save_best(model, tmp_path, {"bleu": 50.0, "step": 9, "epoch": 3})
    callback = bleu_callback.BleuCallback(
        SOURCES[:2], REFERENCES[:2], tokenizer, checkpoint_dir=tmp_path,
        score_function=_scripted([40.0]), **LOOKUP_OPTIONS)
    model.optimizer.iterations.assign(12)
    callback.set_model(model)
    callback.on_train_begin()
    callback.on_epoch_end(0, {})
    assert bleu_callback.read_best_info(tmp_path)["bleu"] == 50.0
    assert model.saved_step(tmp_path / files.BEST_WEIGHTS) == 9


def test_only_the_chief_writes_and_zeros_do_not_count_against_patience(tokenizer, tmp_path,
                                                                       monkeypatch):
    model = _LookupModel(tokenizer, SOURCES[:2], REFERENCES[:2])
    monkeypatch.setattr(distribution, "is_chief", lambda: False)
    callback = bleu_callback.BleuCallback(
        SOURCES[:2], REFERENCES[:2], tokenizer, log_dir=tmp_path / "logs",
        checkpoint_dir=tmp_path / "checkpoints", patience=1,
        score_function=_scripted([0.0, 0.0, 5.0, 4.0]), **LOOKUP_OPTIONS)
    callback.set_model(model)
    callback.on_train_begin()
    # Zeros (a model that translates nothing right yet) do not use up the patience.
    for epoch in range(3):
        callback.on_epoch_end(epoch, {})
        assert not model.stop_training
    callback.on_epoch_end(3, {})
    assert not os.path.exists(tmp_path / "logs")
    assert not os.path.exists(tmp_path / "checkpoints")
    # Other workers still score, so that every worker stops at the same time.
    assert callback.best == 5.0 and model.stop_training


def test_for_run_reads_the_validation_slice_and_writes_into_the_run(
        tmp_path, fixture_corpus_dir):
    data_config = DataConfig(data_dir=str(fixture_corpus_dir))
    sources, references = bleu_callback.validation_slice(data_config, 3)
    assert (sources, references) == (
        text.read_lines(fixture_corpus_dir / "val.en.gz")[:3],
        text.read_lines(fixture_corpus_dir / "val.de.gz")[:3])
    tokenizer = train_tokenizer((sources + references) * 5, 80, verbose=False)
    tokenizer.save(tmp_path / files.TOKENIZER)
    callback = bleu_callback.BleuCallback.for_run(str(tmp_path), sources, references,
                                                  **LOOKUP_OPTIONS)
    callback.set_model(_LookupModel(tokenizer, sources, references, step=5))
    callback.on_train_begin()
    callback.on_epoch_end(0, {})
    assert callback.hypotheses == references
    assert _logged(tmp_path / files.LOGS / "validation") == [(5, pytest.approx(100.0))]
    assert bleu_callback.read_best_info(tmp_path / files.CHECKPOINTS)["bleu"] == (
        pytest.approx(100.0))
