import numpy as np
import pytest
from keras import ops

from keras_transformer.layers.decoder import Decoder
from keras_transformer.layers.decoder_layer import DecoderLayer
from keras_transformer.layers.encoder import Encoder
from keras_transformer.layers.encoder_layer import EncoderLayer
from tests.layer_checks import check_layer


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
