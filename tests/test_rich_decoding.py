"""The translator's n-best lists and scores of given translations, in memory.

Against independent references: the translator's own beam output and the model's
teacher-forced log-softmax in NumPy (scoring a decoder's own ids gives its score:
`tests/test_decoding.py`; an untrained model's outputs do not survive detokenizing).
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_transformer import Transformer
from keras_transformer.data.tokenizer import END_ID, PAD_ID, START_ID
from keras_transformer.serving import translator as translator_lib
from keras_transformer.serving.translator import Translator
from tests.export_helpers import batch_of, tiny_tokenizer
from tests.numerics import assert_close_in_ulps

# Compares float computations: also run on Eigen's kernels in CI (tests/numerics.py).
pytestmark = pytest.mark.numerics

SENTENCES = [*batch_of(5), ""]


@pytest.fixture(scope="module")
def translator():
    tokenizer = tiny_tokenizer()
    keras.utils.set_random_seed(3)
    model = Transformer.from_preset("tiny", vocabulary_size=tokenizer.vocabulary_size,
                                    num_layers=1)
    return Translator(model, tokenizer, beam_size=4, max_output_length=12)


def test_the_n_best_list_starts_with_the_beam_translation(translator):
    listed = translator.translate_n_best(tf.constant(SENTENCES))
    best = translator.translate_beam(tf.constant(SENTENCES))
    assert listed["translations"].shape == (len(SENTENCES), 4)
    np.testing.assert_array_equal(listed["translations"].numpy()[:, 0],
                                  best["translations"].numpy())
    np.testing.assert_array_equal(listed["token_ids"].numpy()[:, 0],
                                  best["token_ids"].numpy())
    assert_close_in_ulps(listed["scores"].numpy()[:, 0], best["scores"].numpy())
    # Distinct hypotheses for a real sentence; one for the empty source, then fillers.
    assert len({tuple(row) for row in listed["token_ids"].numpy()[0]}) == 4
    assert list(listed["translations"].numpy()[-1]) == [b""] * 4
    assert np.all(listed["scores"].numpy()[-1, 1:] == -1e9)


def test_an_n_best_list_longer_than_the_beam_is_an_error(translator):
    with pytest.raises(ValueError, match="n_best"):
        Translator(translator.model, translator.tokenizer, beam_size=2, n_best=3)


def test_scores_are_the_models_log_probabilities_of_the_given_pieces(translator):
    sources = SENTENCES[:3]
    targets = ["Ein Hund läuft.", "", "zwei Männer spielen Fußball im Park"]
    found = translator.score(tf.constant(sources), tf.constant(targets))
    # The reference: pieces and END as training's targets, NumPy's log-softmax of one
    # call of the model.
    pieces = [translator.tokenizer.tokenize(tf.constant([text]))[0].numpy().tolist()
              for text in targets]
    ids = np.full((3, max(len(p) for p in pieces) + 1), PAD_ID, np.int32)
    for row, piece_ids in enumerate(pieces):
        ids[row, :len(piece_ids) + 1] = piece_ids + [END_ID]
    np.testing.assert_array_equal(found["token_ids"].numpy(), ids)
    decoder_input = np.concatenate([np.full((3, 1), START_ID), ids[:, :-1]], axis=1)
    source_ids = translator.source_ids(tf.constant(sources))
    logits = np.asarray(translator.model({"source_ids": source_ids,
                                          "target_ids": decoder_input}), np.float64)
    shifted = logits - logits.max(axis=-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    expected = np.where(ids == PAD_ID, 0.0,
                        np.take_along_axis(log_probs, ids[..., None], axis=-1)[..., 0])
    assert_close_in_ulps(found["token_scores"].numpy(), expected)
    assert_close_in_ulps(found["scores"].numpy(), expected.sum(axis=1))
    tokens = found["tokens"].numpy()
    assert tokens[1, 0] == translator.tokenizer.id_to_piece(END_ID).encode()
    assert [t.decode() for t in tokens[0] if t] == [
        translator.tokenizer.id_to_piece(i) for i in ids[0] if i != PAD_ID]


# The signatures that take a second input of one entry per sentence, with a second
# input one entry short.
PAIRED = {
    "score": lambda t: t.score(tf.constant(["a", "b"]), tf.constant(["c"])),
    "translate_prefix": lambda t: t.translate_prefix(tf.constant(["a", "b"]),
                                                     tf.constant(["c"])),
    "sample": lambda t: t.sample(tf.constant(["a", "b"]), tf.constant([1], tf.int32)),
}


@pytest.mark.parametrize("signature", PAIRED)
def test_mismatched_batches_are_an_error_naming_the_inputs(translator, signature):
    with pytest.raises(tf.errors.InvalidArgumentError, match="one entry each"):
        PAIRED[signature](translator)


@pytest.mark.parametrize("signature", PAIRED)
def test_nothing_reads_the_inputs_before_their_batches_are_checked(translator, signature):
    # In a graph, ops without a path between them run in any order: a model's reshape
    # of mismatched batches can fail before the check, with a message that names
    # neither input. Only the check's own shapes may read the inputs before it.
    graph = getattr(translator, signature).get_concrete_function().graph
    checks = [op for op in graph.get_operations()
              if op.type == "Assert" and op.name.startswith(translator_lib.ONE_ENTRY_EACH)]
    assert len(checks) == 1

    def ancestors(op, seen):
        for parent in [tensor.op for tensor in op.inputs] + list(op.control_inputs):
            if parent not in seen:
                seen.add(parent)
                ancestors(parent, seen)
        return seen

    before_check = ancestors(checks[0], set())
    for placeholder in graph.inputs[:2]:
        for reader in placeholder.consumers():
            assert reader in before_check or checks[0] in ancestors(reader, set()), (
                f"{reader.name} reads {placeholder.name} before the check")
