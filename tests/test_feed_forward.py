import numpy as np
from keras import ops

from keras_transformer.layers.feed_forward import FeedForward
from keras_transformer.layers.residual import residual_block
from tests.layer_checks import check_layer


def test_feed_forward_is_relu_between_two_affine_maps():
    x = np.random.default_rng(0).normal(size=(2, 3, 8)).astype("float32")
    layer = FeedForward(intermediate_dim=16)
    output = ops.convert_to_numpy(layer(x))
    w1, b1 = (ops.convert_to_numpy(v) for v in (layer.hidden.kernel, layer.hidden.bias))
    w2, b2 = (ops.convert_to_numpy(v) for v in (layer.projection.kernel, layer.projection.bias))
    np.testing.assert_allclose(output, np.maximum(0, x @ w1 + b1) @ w2 + b2, rtol=1e-5,
                               atol=1e-6)


def test_residual_block_post_and_pre_layer_norm():
    x = np.arange(6, dtype="float32").reshape(1, 2, 3)

    def sublayer(h):
        return h * 2.0

    def norm(h):
        return h - 1.0

    def dropout(h, training=None):
        return h

    # Post-LN (the paper): norm(x + sublayer(x)); pre-LN: x + sublayer(norm(x)).
    np.testing.assert_allclose(residual_block(x, sublayer, norm, dropout, False), 3 * x - 1)
    np.testing.assert_allclose(residual_block(x, sublayer, norm, dropout, True), 3 * x - 2)


def test_keras_contract(tmp_path):
    check_layer(lambda: FeedForward(intermediate_dim=16), [(5, 8)], (5, 8), tmp_path)
