"""Multi-head scaled dot-product attention (Vaswani et al., 2017, §3.2)."""

import math

import keras
from keras import ops

# Masked scores are replaced by this before the softmax (computed in float32). A finite
# value, unlike -inf, keeps a fully masked row finite (uniform) instead of NaN.
_MASKED_SCORE = -1e9


def attention_weights(query, key, attention_mask=None, scale=None):
    """softmax(Q·Kᵀ · scale) for every head (§3.2.1).

    Args:
        query: float tensor `(B, T, H, K)`.
        key: float tensor `(B, S, H, K)`.
        attention_mask: optional bool tensor broadcastable to `(B, T, S)`; `True` where
            the query may attend to the key.
        scale: float. Multiplies the scores; defaults to `1/√K` as in the paper.

    Returns:
        Float32 weights `(B, H, T, S)`; each row sums to 1.
    """
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    query = ops.transpose(query, (0, 2, 1, 3))  # (B, H, T, K)
    key = ops.transpose(key, (0, 2, 3, 1))  # (B, H, K, S)
    # Softmax in float32: under mixed precision the scores' range would overflow float16.
    scores = ops.cast(ops.matmul(query, key), "float32") * scale  # (B, H, T, S)
    if attention_mask is not None:
        scores = ops.where(ops.expand_dims(attention_mask, 1), scores, _MASKED_SCORE)
    return ops.softmax(scores, axis=-1)


def weighted_values(weights, value):
    """Returns `(B, T, H, K_v)`: the `(B, H, T, S)` weights applied to `(B, S, H, K_v)`."""
    value = ops.transpose(value, (0, 2, 1, 3))  # (B, H, S, K_v)
    output = ops.matmul(ops.cast(weights, value.dtype), value)  # (B, H, T, K_v)
    return ops.transpose(output, (0, 2, 1, 3))


def scaled_dot_product_attention(query, key, value, attention_mask=None, scale=None):
    """Attention(Q, K, V) = softmax(Q·Kᵀ · scale) · V (§3.2.1); shapes as above.

    Returns:
        `(output, weights)`: `(B, T, H, K_v)` and float32 `(B, H, T, S)`.
    """
    weights = attention_weights(query, key, attention_mask, scale)
    return weighted_values(weights, value), weights


def head_first_attention(query, key, value, attention_mask=None, scale=None):
    """Attention(Q, K, V) on head-first tensors, the layout of the decoding cache.

    The same function as `scaled_dot_product_attention`, with the keys already
    transposed and the values head-first, as the two matmuls read them: a decoding step
    multiplies its cache as stored, with no transpose of it (the cache is transposed
    once, when each position is written).

    Args:
        query: float tensor `(B, H, T, K)`.
        key: float tensor `(B, H, K, S)`, the keys transposed.
        value: float tensor `(B, H, S, K_v)`.
        attention_mask: optional bool tensor broadcastable to `(B, T, S)`.
        scale: float. Defaults to `1/√K`.

    Returns:
        `(B, H, T, K_v)`.
    """
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    scores = ops.cast(ops.matmul(query, key), "float32") * scale  # (B, H, T, S)
    if attention_mask is not None:
        scores = ops.where(ops.expand_dims(attention_mask, 1), scores, _MASKED_SCORE)
    weights = ops.softmax(scores, axis=-1)  # (B, H, T, S)
    return ops.matmul(ops.cast(weights, value.dtype), value)


@keras.saving.register_keras_serializable(package="keras_transformer")
class MultiHeadAttention(keras.layers.Layer):
    """Multi-head attention: `h` heads of scaled dot-product attention, concatenated.

    Projects queries, keys and values into `num_heads` subspaces of `key_dim` each,
    attends in each (§3.2.1), concatenates the heads and projects back (§3.2.2). The
    boolean `attention_mask` says which keys each query may see; callers build it from
    token ids (see `masks.py`). Keys and values can be projected once and reused
    (`project_key_value` + `attend`). Cached decoding does the same with keys `(B, H,
    K, L)` and values `(B, H, L, K)` (`project_cached_key_value`, `project_step_key_value`
    + `attend_cached`), the layouts the attention matmuls read, so that a decoding step
    never transposes its cache.

    The fused path calls `keras.ops.dot_product_attention` (cuDNN/flash kernels on GPU)
    and computes the same function; it is used only when weights are not requested and
    attention dropout is inactive, since the fused op returns neither.

    Args:
        num_heads: int. Number of heads (`h`).
        key_dim: int. Size of each head (`d_k = d_v`). Defaults to the query width
            divided by `num_heads`, as in the paper.
        output_dim: int. Width of the output. Defaults to the query width.
        dropout: float. Dropout on the attention weights. The paper has none
            (defaults to `0.0`); it is a regulariser some small-data recipes add.
        use_fused_attention: bool. Use `keras.ops.dot_product_attention`.
        kernel_initializer: initializer of the projections. Defaults to Glorot uniform.
        **kwargs: passed to `keras.layers.Layer`.

    Call arguments:
        query: float tensor `(B, T, D)`.
        value: float tensor `(B, S, D)`.
        key: float tensor `(B, S, D)`. Defaults to `value`.
        attention_mask: bool tensor broadcastable to `(B, T, S)`, or `None`.
        return_attention_scores: bool. Also return the weights `(B, H, T, S)`.
        training: bool. Whether dropout is active.

    Returns:
        `(B, T, output_dim)`, or `(output, weights)` when `return_attention_scores`.

    Example:
    >>> attention = MultiHeadAttention(num_heads=2)
    >>> attention(np.ones((1, 3, 8)), np.ones((1, 5, 8))).shape
    (1, 3, 8)

    References:
        - [Vaswani et al., 2017](https://arxiv.org/abs/1706.03762), §3.2.
    """

    def __init__(self, num_heads, key_dim=None, output_dim=None, dropout=0.0,
                 use_fused_attention=False, kernel_initializer="glorot_uniform", **kwargs):
        super().__init__(**kwargs)
        self.num_heads = num_heads
        self.key_dim = key_dim
        self.output_dim = output_dim
        self.dropout = dropout
        self.use_fused_attention = use_fused_attention
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.weights_dropout = keras.layers.Dropout(dropout, dtype=self.dtype_policy)

    def build(self, query_shape, value_shape=None, key_shape=None):
        value_shape = query_shape if value_shape is None else value_shape
        key_shape = value_shape if key_shape is None else key_shape
        query_width = query_shape[-1]
        if self.key_dim is None and query_width % self.num_heads:
            raise ValueError(f"The query width {query_width} is not divisible by "
                             f"num_heads={self.num_heads}; pass key_dim or change num_heads.")
        self.head_dim = self.key_dim or query_width // self.num_heads
        width = self.num_heads * self.head_dim
        self.query_projection = self._dense(width, "query")
        self.key_projection = self._dense(width, "key")
        self.value_projection = self._dense(width, "value")
        self.output_projection = self._dense(self.output_dim or query_width, "output")
        self.query_projection.build(query_shape)
        self.key_projection.build(key_shape)
        self.value_projection.build(value_shape)
        self.output_projection.build((*query_shape[:-1], width))

    def _dense(self, units, name):
        return keras.layers.Dense(units, kernel_initializer=self.kernel_initializer,
                                  dtype=self.dtype_policy, name=name)

    def _split_heads(self, x):
        batch, length = ops.shape(x)[0], ops.shape(x)[1]
        return ops.reshape(x, (batch, length, self.num_heads, self.head_dim))  # (B, L, H, K)

    def project_key_value(self, key, value):
        """Returns the per-head keys and values `(B, S, H, K)`, to attend to repeatedly."""
        return (self._split_heads(self.key_projection(key)),
                self._split_heads(self.value_projection(value)))

    def project_cached_key_value(self, key, value):
        """Returns keys `(B, H, K, S)` and values `(B, H, S, K)` for a decoding cache."""
        keys, values = self.project_key_value(key, value)  # (B, S, H, K)
        return ops.transpose(keys, (0, 2, 3, 1)), ops.transpose(values, (0, 2, 1, 3))

    def project_step_key_value(self, x):
        """Returns the key `(B, H, K, 1)` and value `(B, H, 1, K)` of one position `(B, D)`.

        The cache layouts of `project_cached_key_value` for a single position, reached
        by reshapes alone: with one position, the transposed key has the same memory
        order as the projection.
        """
        keys = ops.reshape(self.key_projection(x), (-1, self.num_heads, self.head_dim, 1))
        values = ops.reshape(self.value_projection(x), (-1, self.num_heads, 1, self.head_dim))
        return keys, values

    def attend_cached(self, query, keys, values, attention_mask=None):
        """Attends from one position per sentence, `query` `(B, D)`, to cached `keys`
        `(B, H, K, S)` and `values` `(B, H, S, K)` (see `project_cached_key_value`).

        Inference only (no dropout, no weights returned). Never fused: with the one
        query position of a decoding step there is nothing for a fused kernel to save.
        A step runs on `(B, D)` rows rather than `(B, 1, D)` sequences: every
        projection is then one plain matmul, and every change of layout a reshape with
        static sizes, where a length axis of 1 made Keras lower each projection to a
        `tensordot` and each head split to shape arithmetic and a transpose: half of a
        step's graph nodes (BENCHMARKS.md, "A decoding step on rows").
        Returns `(B, output_dim)`.
        """
        query_heads = ops.reshape(self.query_projection(query),
                                  (-1, self.num_heads, 1, self.head_dim))  # (B, H, 1, K)
        context = head_first_attention(query_heads, keys, values, attention_mask)  # (B, H, 1, K)
        context = ops.reshape(context, (-1, self.num_heads * self.head_dim))  # (B, H·K)
        return self.output_projection(context)  # (B, output_dim)

    def attend(self, query, keys, values, attention_mask=None,
               return_attention_scores=False, training=None):
        """Attends from `query` `(B, T, D)` to projected `keys`/`values` `(B, S, H, K)`."""
        query_heads = self._split_heads(self.query_projection(query))  # (B, T, H, K)
        # The fused op returns no weights and has no dropout on them.
        dropout_active = bool(training) and self.dropout > 0
        if self.use_fused_attention and not return_attention_scores and not dropout_active:
            mask = None
            if attention_mask is not None:
                # cuDNN's kernel (JAX backend) takes a mask only as a full (T, S) bias
                # and otherwise falls back to the unfused path: broadcast padding masks
                # of shape (B, 1, S) to every query position.
                shape = ops.shape(query_heads)[:2] + ops.shape(keys)[1:2]
                mask = ops.expand_dims(ops.broadcast_to(attention_mask, shape), 1)
            context = ops.dot_product_attention(query_heads, keys, values, mask=mask)
            weights = None
        else:
            weights = attention_weights(query_heads, keys, attention_mask)  # (B, H, T, S)
            context = weighted_values(
                self.weights_dropout(weights, training=training), values)  # (B, T, H, K)
        batch, length = ops.shape(query)[0], ops.shape(query)[1]
        context = ops.reshape(context, (batch, length, self.num_heads * self.head_dim))
        output = self.output_projection(context)  # (B, T, output_dim)
        return (output, weights) if return_attention_scores else output

    def call(self, query, value, key=None, attention_mask=None,
             return_attention_scores=False, training=None):
        keys, values = self.project_key_value(value if key is None else key, value)
        return self.attend(query, keys, values, attention_mask,
                           return_attention_scores=return_attention_scores, training=training)

    def compute_output_shape(self, query_shape, value_shape=None, key_shape=None):
        return (*query_shape[:-1], self.output_dim or query_shape[-1])

    def get_config(self):
        return {**super().get_config(),
                "num_heads": self.num_heads,
                "key_dim": self.key_dim,
                "output_dim": self.output_dim,
                "dropout": self.dropout,
                "use_fused_attention": self.use_fused_attention,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer)}
