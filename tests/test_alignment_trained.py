"""Alignments of a trained model: a copy task with reordering, whose alignment is known.

The target is the source with each pair of adjacent words swapped
(`benchmarks/alignment_layers.py`); the reference is that permutation, not the model.
"""

import pytest

from benchmarks import alignment_layers
from keras_transformer.decoding import alignment

# The fixture trains 40 epochs of 31 batches, half the benchmark's 80: the default layer
# aligned 0.981 of the words after 30 epochs and 0.994 after 45 (exact translations 0.957
# and 0.98). The test took 2.1 min alone on a 2-core AMD EPYC with AVX-512 bf16.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def accuracies(tmp_path_factory):
    """`{layer: (exact, aligned)}` of the first and the default decoder layer, and the
    default layer (the tests read no other: each costs a beam search of every pair)."""
    model, tokenizer, pairs = alignment_layers.train_copy_model(
        tmp_path_factory.mktemp("copy"), layers=3, epochs=40)
    default = alignment.default_layer(model.num_layers)
    return ({layer: alignment_layers.layer_accuracy(model, tokenizer, pairs, layer)
             for layer in {0, default}}, default)


def test_the_default_layer_aligns_the_permutation(accuracies):
    layers, default = accuracies
    exact, aligned = layers[default]
    assert exact >= 0.9
    assert aligned >= 0.95


def test_the_first_layer_aligns_worse_than_the_default(accuracies):
    # What makes the layer a choice: seen 0.76 against 1.00 (docs/serving.md).
    layers, default = accuracies
    assert layers[0][1] < layers[default][1]
