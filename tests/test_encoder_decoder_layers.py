import numpy as np
import pytest
from keras import ops

from keras_transformer.layers.decoder import Decoder
from keras_transformer.layers.decoder_layer import DecoderLayer
from keras_transformer.layers.encoder import Encoder
from keras_transformer.layers.encoder_layer import EncoderLayer
from tests.layer_checks import check_layer

# Compares float computations: also run on Eigen's kernels in CI (tests/numerics.py).
pytestmark = pytest.mark.numerics


@pytest.mark.parametrize("normalize_first", [False, True])
def test_encoder_layer_contract(tmp_path, normalize_first):
    check_layer(lambda: EncoderLayer(intermediate_dim=16, num_heads=2,
                                     normalize_first=normalize_first),
                [(5, 8)], (5, 8), tmp_path)


@pytest.mark.parametrize("normalize_first", [False, True])
def test_decoder_layer_contract(tmp_path, normalize_first):
    check_layer(lambda: DecoderLayer(intermediate_dim=16, num_heads=2,
                                     normalize_first=normalize_first),
                [(4, 8), (6, 8)], (4, 8), tmp_path)


def test_encoder_stack_contract(tmp_path):
    check_layer(lambda: Encoder(num_layers=2, intermediate_dim=16, num_heads=2),
                [(5, 8)], (5, 8), tmp_path)


def test_decoder_stack_contract(tmp_path):
    check_layer(lambda: Decoder(num_layers=2, intermediate_dim=16, num_heads=2),
                [(4, 8), (6, 8)], (4, 8), tmp_path)


def test_post_layer_norm_output_is_normalised_and_pre_layer_norm_is_not():
    x = np.random.default_rng(0).normal(3.0, 5.0, size=(2, 5, 8)).astype("float32")
    post = ops.convert_to_numpy(EncoderLayer(16, 2, dropout=0.0)(x))
    pre = ops.convert_to_numpy(EncoderLayer(16, 2, dropout=0.0, normalize_first=True)(x))
    # Post-LN ends with LayerNorm (fresh gamma 1, beta 0): zero mean, unit variance.
    np.testing.assert_allclose(post.mean(-1), 0.0, atol=1e-5)
    np.testing.assert_allclose(post.std(-1), 1.0, rtol=1e-3)
    # Pre-LN keeps the raw residual stream.
    assert abs(pre.mean()) > 1.0


def test_stacks_have_the_requested_number_of_layers():
    assert len(Encoder(3, 16, 2).encoder_layers) == 3
    assert len(Decoder(4, 16, 2).decoder_layers) == 4


def test_decode_step_writes_the_full_pass_projections_at_its_position_only():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 4, 8)).astype("float32")
    encoder_output = rng.normal(size=(2, 6, 8)).astype("float32")
    layer = DecoderLayer(intermediate_dim=16, num_heads=2, dropout=0.0)
    full = ops.convert_to_numpy(layer(x, encoder_output, self_attention_mask=np.tril(
        np.ones((1, 4, 4), bool))))
    cross_keys, cross_values = layer.project_encoder_output(encoder_output)
    # Post-LN: self-attention sees the layer input itself, so the cache must hold the
    # key/value projections of `x`: keys (B, H, K, T), values (B, H, T, K).
    expected_keys, expected_values = (
        ops.convert_to_numpy(t) for t in layer.self_attention.project_cached_key_value(x, x))
    # Positions on the last axis of the keys and on axis 2 of the values.
    expected = {"self_keys": np.moveaxis(expected_keys, 3, 2), "self_values": expected_values}
    cache = {"self_keys": np.zeros((2, 2, 4, 7), "float32"),  # T_max = 7, beyond T
             "self_values": np.zeros((2, 2, 7, 4), "float32"),
             "cross_keys": cross_keys, "cross_values": cross_values}
    for index in range(4):
        step, cache = layer.decode_step(x[:, index], cache, index, np.ones((2, 1, 6), bool))
        np.testing.assert_allclose(ops.convert_to_numpy(step), full[:, index],
                                   rtol=1e-5, atol=1e-5)
        for name in ("self_keys", "self_values"):
            written = ops.convert_to_numpy(cache[name])
            if name == "self_keys":
                written = np.moveaxis(written, 3, 2)  # (B, H, T_max, K)
            np.testing.assert_allclose(written[:, :, :index + 1],
                                       expected[name][:, :, :index + 1], rtol=1e-6, atol=1e-6)
            np.testing.assert_array_equal(written[:, :, index + 1:], 0.0)
