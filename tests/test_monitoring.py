"""TensorBoard monitoring: a tiny `model.fit` with the run's callbacks, events read back."""

import dataclasses
import os
import types

import keras
import pytest
import tensorflow as tf
from tensorboard.backend.event_processing import event_accumulator

from keras_transformer import config as config_lib
from keras_transformer.data import batching, text
from keras_transformer.data.tokenizer import train_tokenizer
from keras_transformer.model import Transformer
from keras_transformer.training import fit, monitoring

SOURCES = ["a black dog runs .", "a man rides a bike .", "two girls | play ."]
REFERENCES = ["ein schwarzer hund rennt .", "ein mann fährt fahrrad .",
              "zwei mädchen | spielen ."]
EPOCHS = 2
STEPS_PER_EPOCH = 2


def _events(directory):
    accumulator = event_accumulator.EventAccumulator(
        directory, size_guidance={event_accumulator.TENSORS: 0})
    accumulator.Reload()
    return accumulator


def _plugin(accumulator, tag):
    return accumulator.SummaryMetadata(tag).plugin_data.plugin_name


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(SOURCES * 5 + REFERENCES * 5, 48, verbose=False)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, tokenizer):
    """Fits the tiny model for two epochs with the run's callbacks and the monitor."""
    run_dir = tmp_path_factory.mktemp("run")
    config = config_lib.preset_config("tiny")
    train_config = dataclasses.replace(config.train, log_every_steps=1, epochs=EPOCHS)
    keras.utils.set_random_seed(0)
    model = Transformer.from_preset("tiny", vocabulary_size=tokenizer.vocabulary_size)
    fit.compile_model(model, train_config)
    monitor = monitoring.TranslationMonitor(
        SOURCES, REFERENCES, tokenizer, log_dir=run_dir / "logs" / "validation",
        attention_index=1, max_length=8)
    graph_logger = keras.callbacks.TensorBoard(run_dir / "graph_logs", write_graph=True)
    callbacks = fit.make_callbacks(train_config, str(run_dir), [monitor, graph_logger])
    model.fit(_dataset(tokenizer), epochs=EPOCHS, steps_per_epoch=STEPS_PER_EPOCH,
              callbacks=callbacks, shuffle=False, verbose=0)
    return run_dir


def _dataset(tokenizer):
    pairs = text.ParallelText(tuple(SOURCES), tuple(REFERENCES), "sources", "references",
                                text.FilterStats(read=len(SOURCES), kept=len(SOURCES)))
    return batching.make_dataset(pairs, tokenizer, batch_tokens=128, max_length=64,
                             shuffle=False, repeat=True, verbose=False)


def test_translations_are_written_as_a_text_table_every_epoch(run_dir):
    events = _events(str(run_dir / "logs" / "validation"))
    assert _plugin(events, "samples/translations") == "text"
    written = events.Tensors("samples/translations")
    assert [event.step for event in written] == list(range(EPOCHS))
    table = tf.make_ndarray(written[-1].tensor_proto).item().decode("utf-8")
    lines = table.splitlines()
    assert lines[0] == "| # | source | reference | hypothesis |"
    assert len(lines) == 2 + len(SOURCES)
    assert "| 0 | a black dog runs . | ein schwarzer hund rennt . |" in lines[2]
    assert "two girls \\| play ." in lines[4]  # a "|" in the text does not split cells


def test_cross_attention_of_every_decoder_layer_is_an_image(run_dir):
    events = _events(str(run_dir / "logs" / "validation"))
    tags = [f"cross_attention/layer_{layer}" for layer in range(2)]  # tiny: 2 layers
    assert sorted(tag for tag in events.Tags()["tensors"] if "attention" in tag) == tags
    for tag in tags:
        assert _plugin(events, tag) == "images"
        written = events.Tensors(tag)
        assert [event.step for event in written] == list(range(EPOCHS))
        width, height, png = tf.make_ndarray(written[-1].tensor_proto)
        image = tf.image.decode_png(png, channels=4)
        assert tuple(image.shape) == (int(height), int(width), 4)


def test_learning_rate_and_throughput_are_recorded_by_the_run_callbacks(run_dir):
    events = _events(str(run_dir / "logs" / "train"))
    tags = set(events.Tags()["tensors"])
    for name in ("learning_rate", "tokens_per_second"):
        assert {f"epoch_{name}", f"batch_{name}"} <= tags
        values = [float(tf.make_ndarray(event.tensor_proto))
                  for event in events.Tensors(f"epoch_{name}")]
        assert len(values) == EPOCHS and all(value > 0 for value in values)


def test_keras_writes_no_graph_for_the_subclassed_model(run_dir):
    # Keras 3's TensorBoard writes a model summary for Functional/Sequential models only,
    # and a train graph only when `train_function` is a `tf.function`, which on the
    # TensorFlow backend it is not (a Python wrapper around one). Should that change,
    # turn `write_graph` on in `training.make_callbacks`.
    events = _events(str(run_dir / "graph_logs" / "train"))
    assert not events.Tags()["graph"]
    assert "keras" not in events.Tags()["tensors"]


def test_every_epochs_skips_epochs_but_writes_the_last(tmp_path, tokenizer):
    monitor = monitoring.TranslationMonitor(SOURCES, REFERENCES, tokenizer,
                                            log_dir=tmp_path, every_epochs=3)
    written = []
    monitor.write_summaries = written.append
    monitor.set_params({"epochs": 5})
    for epoch in range(5):
        monitor.on_epoch_end(epoch)
    assert written == [2, 4]


def test_for_run_reads_the_run_tokenizer_and_writes_next_to_the_validation_scalars():
    monitor = monitoring.TranslationMonitor.for_run("runs/a", SOURCES, REFERENCES,
                                                    every_epochs=2)
    assert monitor.translator.tokenizer == os.path.join("runs/a", "tokenizer")
    assert monitor.log_dir == os.path.join("runs/a", "logs", "validation")
    assert monitor.every_epochs == 2


def test_the_monitor_and_the_bleu_callback_of_a_run_share_one_translator(tmp_path):
    config = config_lib.override(config_lib.preset_config("tiny"),
                                 ["bleu_sentences=2", "monitor_sentences=2"])
    validation = types.SimpleNamespace(source_lines=SOURCES, target_lines=REFERENCES)
    bleu, monitor = fit.make_translation_callbacks(config.train, str(tmp_path),
                                                        validation)
    assert bleu.translator is monitor.translator


@pytest.mark.parametrize("arguments, message", [
    (dict(sources=["a"], references=[]), "as many references"),
    (dict(sources=["a"], references=["b"], attention_index=1), "names none"),
    (dict(sources=["a"], references=["b"], every_epochs=0), "every_epochs"),
])
def test_invalid_arguments_are_rejected(tmp_path, tokenizer, arguments, message):
    with pytest.raises(ValueError, match=message):
        monitoring.TranslationMonitor(tokenizer=tokenizer, log_dir=tmp_path, **arguments)
