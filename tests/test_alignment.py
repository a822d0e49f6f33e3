"""Word alignments from cross-attention (`decoding.alignment`, `formats`), in memory.

Against independent references: Python transcriptions of the word rules, NumPy's
argmax and mean, and the model's own teacher-forced cross-attention over the beam
output. The exported `align` signatures are held to this translator in
`tests/test_decoding_signatures.py`.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_transformer import Transformer, formats
from keras_transformer.data.tokenizer import END_ID, PAD_ID, START_ID
from keras_transformer.decoding import alignment
from keras_transformer.serving import ctranslate2_runner
from keras_transformer.serving.translator import Translator
from tests.export_helpers import batch_of, tiny_tokenizer

SPECIAL = (PAD_ID, START_ID, END_ID)


def python_word_indices(row, word_starts):
    """The word rule, written out: a piece starting with "▁" opens the next word; the
    first real piece is in word 0 whatever it is; special ids are in none."""
    words, current = [], -1
    for token in row:
        if token in SPECIAL:
            words.append(-1)
            continue
        if word_starts[token] or current < 0:
            current += 1
        words.append(current)
    return words


def test_word_indices_follow_the_word_rule():
    generator = np.random.default_rng(0)
    word_starts = generator.random(30) < 0.5
    ids = generator.integers(0, 30, size=(64, 12))
    ids[:, 0] = START_ID
    ids[::3, -3:] = PAD_ID  # padded rows
    ids[1::4, 1] = np.flatnonzero(~word_starts)[4]  # rows opening without "▁"
    found = alignment.word_indices(tf.constant(ids), tf.constant(word_starts)).numpy()
    expected = [python_word_indices(row, word_starts) for row in ids]
    np.testing.assert_array_equal(found, expected)
    # The CTranslate2 runner's NumPy twin, on unpadded id lists.
    lists = [[token for token in row if token != PAD_ID] for row in ids]
    found = ctranslate2_runner._word_indices(lists, word_starts, SPECIAL)
    np.testing.assert_array_equal(
        found, [python_word_indices(row + [PAD_ID] * (12 - len(row)), word_starts)
                for row in lists])


def test_hard_alignment_is_the_argmax_among_word_positions():
    generator = np.random.default_rng(1)
    attention = generator.random((8, 6, 10)).astype(np.float32)
    source_words = generator.integers(-1, 4, size=(8, 10)).astype(np.int32)
    source_words[3] = -1  # a source without words
    target_words = generator.integers(-1, 3, size=(8, 6)).astype(np.int32)
    found = alignment.hard_alignment(tf.constant(attention), tf.constant(source_words),
                                     tf.constant(target_words)).numpy()
    expected = np.full((8, 6), -1)
    for b in range(8):
        in_words = np.flatnonzero(source_words[b] >= 0)
        for t in range(6):
            if target_words[b, t] >= 0 and in_words.size:
                best = in_words[np.argmax(attention[b, t, in_words])]
                expected[b, t] = source_words[b, best]
    np.testing.assert_array_equal(found, expected)
    assert np.all(found[3] == -1)


def test_layer_attention_averages_one_layers_heads():
    attention = np.random.default_rng(2).random((2, 3, 4, 5, 6)).astype(np.float32)
    for layer in range(3):
        np.testing.assert_allclose(
            alignment.layer_attention(tf.constant(attention), layer).numpy(),
            attention[:, layer].mean(axis=1), rtol=1e-6)


@pytest.mark.parametrize("layers, expected", [(1, 0), (2, 0), (3, 1), (6, 4)])
def test_the_default_layer_is_the_penultimate(layers, expected):
    assert alignment.default_layer(layers) == expected


@pytest.fixture(scope="module")
def translator():
    tokenizer = tiny_tokenizer()
    keras.utils.set_random_seed(5)
    model = Transformer.from_preset("tiny", vocabulary_size=tokenizer.vocabulary_size,
                                    num_layers=3)
    return Translator(model, tokenizer, beam_size=3, max_output_length=10,
                      alignment_layer=0)


def test_align_reads_the_chosen_layer_over_the_beam_output(translator):
    sentences = tf.constant([*batch_of(4), ""])
    aligned = translator.align(sentences)
    beam = translator.translate_beam(sentences)
    ids = aligned["token_ids"].numpy()
    np.testing.assert_array_equal(ids, beam["token_ids"].numpy())
    np.testing.assert_array_equal(aligned["translations"].numpy(),
                                  beam["translations"].numpy())
    # Reference: the model's teacher-forced cross-attention, computed here.
    model = translator.model
    source_ids = translator.source_ids(sentences)
    decoder_input = np.concatenate([np.full((len(ids), 1), START_ID), ids[:, :-1]], axis=1)
    weights = keras.ops.convert_to_numpy(model.cross_attention_weights(
        tf.constant(decoder_input, tf.int32), model.encode(source_ids), source_ids))
    expected = weights[:, 0].mean(axis=1)  # layer 0, heads averaged: (B, L, S)
    np.testing.assert_allclose(aligned["attention"].numpy(), expected, rtol=1e-5,
                               atol=1e-6)
    starts = np.array([translator.tokenizer.id_to_piece(i).startswith("\u2581")
                       for i in range(translator.tokenizer.vocabulary_size)])
    target_words = [python_word_indices(row, starts) for row in ids]
    np.testing.assert_array_equal(aligned["target_words"].numpy(), target_words)
    # A source word per output word piece, from that attention.
    source_words = aligned["source_words"].numpy()
    for b, row in enumerate(aligned["alignments"].numpy()):
        for t, source_word in enumerate(row):
            if target_words[b][t] < 0:
                assert source_word == -1
            else:
                in_words = np.flatnonzero(source_words[b] >= 0)
                assert source_word == source_words[b, in_words[
                    np.argmax(expected[b, t, in_words])]]


def test_another_layer_gives_that_layers_attention(translator):
    last = Translator(translator.model, translator.tokenizer, beam_size=3,
                      max_output_length=10, alignment_layer=2)
    sentences = tf.constant(batch_of(2))
    first = translator.align(sentences)["attention"].numpy()
    assert not np.allclose(first, last.align(sentences)["attention"].numpy())


def test_an_alignment_layer_outside_the_decoder_is_an_error(translator):
    with pytest.raises(ValueError, match="alignment_layer=3 must lie in 0..2"):
        Translator(translator.model, translator.tokenizer, alignment_layer=3)


def test_aligned_rows_keep_distinct_word_pairs_and_cut_padding():
    row = {"translations": b"ein Hund", "token_ids": np.array([7, 8, 9, END_ID, PAD_ID]),
           "alignments": np.array([1, 1, 0, -1, -1]),
           "target_words": np.array([0, 0, 1, -1, -1]),
           "attention": np.array([[0, .2, .8, 0], [0, .6, .4, 0], [.1, .9, 0, 0],
                                  [.5, .5, 0, 0], [0, 0, 0, 0]], np.float32)}
    aligned = formats.aligned(row)
    assert aligned.translation == "ein Hund"
    assert aligned.alignment == [(0, 1), (1, 0)]
    assert aligned.attention.shape == (4, 3)  # END's row kept, padding cut


@pytest.mark.parametrize("pairs", [[], [(0, 0)], [(0, 1), (2, 0), (10, 12)]])
def test_pharaoh_text_round_trips(pairs):
    assert formats.parse_pharaoh(formats.pharaoh(pairs)) == pairs


@pytest.mark.parametrize("line, entry", [("0-0 1", "'1'"), ("0-0 a-1", "'a-1'"),
                                         ("-1-0", "'-1-0'"), ("0-1-2", "'0-1-2'")])
def test_malformed_pharaoh_text_names_the_entry(line, entry):
    with pytest.raises(ValueError, match=entry):
        formats.parse_pharaoh(line)
