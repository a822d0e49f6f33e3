"""Alignments of a trained model: a copy task with reordering, whose alignment is known.

The target is the source with each pair of adjacent words swapped
(`benchmarks/alignment_layers.py`); the reference is that permutation, not the model.
"""

import pytest

from benchmarks import alignment_layers
from keras_transformer.decoding import alignment

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    # 80 epochs of 31 batches: about 2 minutes on a 2-core Xeon with AVX-512.
    return alignment_layers.train_copy_model(tmp_path_factory.mktemp("copy"), layers=3,
                                             epochs=80)


@pytest.mark.timeout(900)  # the fixture trains: 2.5 min with AVX-512, about 6 without
def test_the_default_layer_aligns_the_permutation(trained):
    model, tokenizer, pairs = trained
    exact, aligned = alignment_layers.layer_accuracy(
        model, tokenizer, pairs, alignment.default_layer(model.num_layers))
    assert exact >= 0.9
    assert aligned >= 0.95


def test_the_first_layer_aligns_worse_than_the_default(trained):
    # What makes the layer a choice: seen 0.76 against 1.00 (docs/serving.md).
    model, tokenizer, pairs = trained
    _, first = alignment_layers.layer_accuracy(model, tokenizer, pairs, 0)
    _, default = alignment_layers.layer_accuracy(
        model, tokenizer, pairs, alignment.default_layer(model.num_layers))
    assert first < default
