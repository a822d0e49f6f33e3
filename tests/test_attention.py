import math

import numpy as np
import pytest
from keras import ops

from keras_transformer.layers.attention import MultiHeadAttention, scaled_dot_product_attention
from tests.layer_checks import check_layer

# Compares float computations: also run on Eigen's kernels in CI (tests/numerics.py).
pytestmark = pytest.mark.numerics

# The one-head walk-through with unscaled scores (divisor 1) from the seed book chapter.
X = np.array([[1, 0, 1, 0], [0, 2, 0, 2], [1, 1, 1, 1]], dtype="float32")
W_Q = np.array([[1, 0, 1], [1, 0, 0], [0, 0, 1], [0, 1, 1]], dtype="float32")
W_K = np.array([[0, 0, 1], [1, 1, 0], [0, 1, 0], [1, 1, 0]], dtype="float32")
W_V = np.array([[0, 2, 0], [0, 3, 0], [1, 0, 3], [1, 1, 0]], dtype="float32")
BOOK_WEIGHTS_INPUT_1 = [0.06337894, 0.46831053, 0.46831053]
BOOK_OUTPUT_INPUT_1 = [1.93662106, 6.68310531, 1.59506841]


def numpy_multi_head_attention(query, value, kernels, biases, num_heads, mask=None):
    """§3.2.2 in NumPy: per-head softmax(Q·Kᵀ/√d_k)·V, concatenated, projected."""
    q, k, v = (x @ kernels[name] + biases[name]
               for x, name in ((query, "query"), (value, "key"), (value, "value")))
    head_dim = q.shape[-1] // num_heads
    heads = []
    for h in range(num_heads):
        part = slice(h * head_dim, (h + 1) * head_dim)
        scores = q[..., part] @ np.swapaxes(k[..., part], -1, -2) / math.sqrt(head_dim)
        if mask is not None:
            scores = np.where(mask, scores, -1e9)
        weights = np.exp(scores - scores.max(-1, keepdims=True))
        weights /= weights.sum(-1, keepdims=True)
        heads.append(weights @ v[..., part])
    return np.concatenate(heads, -1) @ kernels["output"] + biases["output"]


def projections(layer):
    return {name: getattr(layer, f"{name}_projection") for name in
            ("query", "key", "value", "output")}


def test_unscaled_function_reproduces_the_book_walkthrough():
    query, key, value = [(X @ w)[None, None] for w in (W_Q, W_K, W_V)]  # (1, 1, 3, 3)
    keys = np.swapaxes(key, -1, -2)  # (B, H, K, S): the layout the function reads
    output, weights = scaled_dot_product_attention(query, keys, value, scale=1.0)
    np.testing.assert_allclose(ops.convert_to_numpy(weights)[0, 0, 0], BOOK_WEIGHTS_INPUT_1,
                               rtol=1e-6)
    np.testing.assert_allclose(ops.convert_to_numpy(output)[0, 0, 0], BOOK_OUTPUT_INPUT_1,
                               rtol=1e-6)


def test_layer_with_book_weights_reproduces_the_book_walkthrough():
    layer = MultiHeadAttention(num_heads=1, key_dim=3, output_dim=3)
    layer.build((1, 3, 4), (1, 3, 4))
    # The layer divides scores by √d_k = √3; multiplying W_Q by √3 gives the book's
    # divisor of 1. The identity output projection exposes the attention output itself.
    kernels = {"query": W_Q * math.sqrt(3), "key": W_K, "value": W_V, "output": np.eye(3)}
    for name, dense in projections(layer).items():
        dense.set_weights([kernels[name], np.zeros(3)])
    output = layer(X[None], X[None])
    weights = layer.attention_weights(X[None], X[None])
    np.testing.assert_allclose(ops.convert_to_numpy(weights)[0, 0, 0], BOOK_WEIGHTS_INPUT_1,
                               rtol=1e-5)
    np.testing.assert_allclose(ops.convert_to_numpy(output)[0, 0], BOOK_OUTPUT_INPUT_1,
                               rtol=1e-5)


@pytest.mark.parametrize("use_fused_attention", [False, True])
def test_layer_matches_numpy_multi_head_attention_with_mask(use_fused_attention):
    rng = np.random.default_rng(1)
    query = rng.normal(size=(2, 4, 8)).astype("float32")
    value = rng.normal(size=(2, 6, 8)).astype("float32")
    mask = np.ones((2, 4, 6), dtype=bool)
    mask[1, :, 3:] = False
    layer = MultiHeadAttention(num_heads=2, use_fused_attention=use_fused_attention)
    output = ops.convert_to_numpy(layer(query, value, attention_mask=mask))
    kernels = {name: ops.convert_to_numpy(d.kernel) for name, d in projections(layer).items()}
    biases = {name: ops.convert_to_numpy(d.bias) for name, d in projections(layer).items()}
    expected = numpy_multi_head_attention(query, value, kernels, biases, 2, mask)
    np.testing.assert_allclose(output, expected, rtol=1e-5, atol=1e-5)


def test_fused_and_explicit_paths_agree():
    rng = np.random.default_rng(2)
    query = rng.normal(size=(3, 5, 16)).astype("float32")
    mask = rng.random((3, 5, 5)) > 0.3
    mask[..., 0] = True
    explicit = MultiHeadAttention(num_heads=4)
    fused = MultiHeadAttention(num_heads=4, use_fused_attention=True)
    explicit.build(query.shape, query.shape)
    fused.build(query.shape, query.shape)
    fused.set_weights(explicit.get_weights())
    np.testing.assert_allclose(
        ops.convert_to_numpy(fused(query, query, attention_mask=mask)),
        ops.convert_to_numpy(explicit(query, query, attention_mask=mask)), rtol=1e-5, atol=1e-6)


def test_masked_keys_get_zero_weight_and_rows_sum_to_one():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(1, 4, 8)).astype("float32")
    mask = np.array([[[True, True, False, False]] * 4])
    weights = MultiHeadAttention(num_heads=2).attention_weights(x, x, attention_mask=mask)
    weights = ops.convert_to_numpy(weights)
    assert weights.shape == (1, 2, 4, 4)
    np.testing.assert_allclose(weights[..., 2:], 0.0, atol=1e-7)
    np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-6)


def test_width_not_divisible_by_heads_is_rejected():
    with pytest.raises(ValueError, match="num_heads=3"):
        MultiHeadAttention(num_heads=3).build((1, 2, 8), (1, 2, 8))


def test_keras_contract(tmp_path):
    check_layer(lambda: MultiHeadAttention(num_heads=2), [(5, 8), (7, 8)], (5, 8), tmp_path)
