import math

import numpy as np
from keras import ops

from keras_transformer.layers.positional_encoding import sinusoidal_positional_encoding
from keras_transformer.layers.token_embedding import TokenEmbedding
from tests.layer_checks import check_layer


def test_embedding_is_scaled_by_sqrt_d_model_plus_positions():
    layer = TokenEmbedding(vocabulary_size=20, hidden_dim=8, max_length=10, dropout=0.0)
    ids = np.array([[3, 4, 5], [7, 0, 0]])
    output = ops.convert_to_numpy(layer(ids))
    matrix = ops.convert_to_numpy(layer.embeddings)
    expected = matrix[ids] * math.sqrt(8) + sinusoidal_positional_encoding(10, 8)[:3]
    np.testing.assert_allclose(output, expected, rtol=1e-6, atol=1e-6)


def test_start_position_continues_the_positions():
    layer = TokenEmbedding(vocabulary_size=20, hidden_dim=8, max_length=10, dropout=0.0)
    ids = np.array([[3, 4, 5, 6]])
    whole = ops.convert_to_numpy(layer(ids))
    step = ops.convert_to_numpy(layer(ids[:, 2:3], start_position=2))
    np.testing.assert_allclose(step[:, 0], whole[:, 2], rtol=1e-6)


def test_attend_is_hidden_times_embedding_transposed():
    layer = TokenEmbedding(vocabulary_size=20, hidden_dim=8, max_length=10)
    layer.build((None, None))
    hidden = np.random.default_rng(0).normal(size=(2, 3, 8)).astype("float32")
    expected = hidden @ ops.convert_to_numpy(layer.embeddings).T
    np.testing.assert_allclose(ops.convert_to_numpy(layer.attend(hidden)), expected, rtol=1e-5)


def test_dropout_applies_only_in_training():
    layer = TokenEmbedding(vocabulary_size=20, hidden_dim=64, max_length=10, dropout=0.5)
    ids = np.array([[3, 4, 5]])
    np.testing.assert_array_equal(ops.convert_to_numpy(layer(ids)),
                                  ops.convert_to_numpy(layer(ids)))
    dropped = ops.convert_to_numpy(layer(ids, training=True))
    assert (dropped == 0).mean() > 0.2


def test_token_dropout_drops_whole_tokens_in_training_and_scales_the_rest():
    rate, rows, length = 0.3, 40, 50
    layer = TokenEmbedding(vocabulary_size=20, hidden_dim=8, max_length=length,
                           dropout=0.0, token_dropout=rate)
    ids = np.random.default_rng(1).integers(1, 20, size=(rows, length))
    inferred = ops.convert_to_numpy(layer(ids))  # builds the layer
    positions = sinusoidal_positional_encoding(length, 8)[:length]
    kept = ops.convert_to_numpy(layer.embeddings)[ids] * math.sqrt(8)  # (B, L, D)
    np.testing.assert_allclose(inferred, kept + positions, rtol=1e-5,
                               atol=1e-5)  # not in inference
    tokens = ops.convert_to_numpy(layer(ids, training=True)) - positions
    dropped = np.all(np.abs(tokens) < 1e-5, axis=-1)  # (B, L): the whole vector gone
    expected = np.where(dropped[..., None], 0.0, kept / (1 - rate))
    np.testing.assert_allclose(tokens, expected, rtol=1e-5, atol=1e-5)
    # 2,000 tokens: the dropped share lies within 4 standard deviations of the rate.
    deviation = 4 * math.sqrt(rate * (1 - rate) / dropped.size)
    assert abs(dropped.mean() - rate) < deviation
    assert TokenEmbedding(20, 8, 10).get_config()["token_dropout"] == 0.0


def test_keras_contract(tmp_path):
    check_layer(lambda: TokenEmbedding(vocabulary_size=20, hidden_dim=8, max_length=10),
                [(5,)], (5, 8), tmp_path, input_dtype="int32")
