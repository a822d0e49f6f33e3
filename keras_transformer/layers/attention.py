"""Multi-head scaled dot-product attention (Vaswani et al., 2017, §3.2)."""

import math

import keras
from keras import ops

from keras_transformer.layers.initializers import sublayer_initializer

# Masked scores are replaced by this before the softmax (computed in float32). A finite
# value, unlike -inf, keeps a fully masked row finite (uniform) instead of NaN.
_MASKED_SCORE = -1e9


def scaled_dot_product_attention(query, keys, values, attention_mask=None, scale=None,
                                 weights_dropout=None, training=None, score_bias=None):
    """Attention(Q, K, V) = softmax(Q·Kᵀ · scale) · V for every head (§3.2.1).

    The tensors come head-first, keys transposed, the layouts the two matmuls read:
    that is how a decoding step multiplies its cache as stored, with no transpose of it
    (the cache is transposed once, when each position is written), and how the layer
    lays out its projections for every other call.

    Args:
        query: float tensor `(B, H, T, K)`.
        keys: float tensor `(B, H, K, S)`, the keys transposed.
        values: float tensor `(B, H, S, K_v)`.
        attention_mask: optional bool tensor broadcastable to `(B, T, S)`; `True` where
            the query may attend to the key.
        scale: float. Multiplies the scores; defaults to `1/√K` as in the paper.
        weights_dropout: optional callable `(weights, training) -> weights`, applied to
            the weights before they weigh the values (attention dropout).
        training: bool. Passed to `weights_dropout`.
        score_bias: optional float tensor broadcastable to `(B, T, S)`, added to the
            scores (0 where the query may attend, `_MASKED_SCORE` where not): a mask
            applied by addition, which differs from `attention_mask` only in a row
            whose every key is masked (softmax of the scores, not uniform weights).

    Returns:
        `(context, weights)`: `(B, H, T, K_v)` and float32 `(B, H, T, S)`, each row of the
        weights summing to 1.
    """
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    # Softmax in float32: under mixed precision the scores' range would overflow float16.
    scores = ops.cast(ops.matmul(query, keys), "float32") * scale  # (B, H, T, S)
    if attention_mask is not None:
        scores = ops.where(ops.expand_dims(attention_mask, 1), scores, _MASKED_SCORE)
    if score_bias is not None:
        scores = scores + ops.expand_dims(score_bias, 1)
    weights = ops.softmax(scores, axis=-1)  # (B, H, T, S)
    weighing = weights if weights_dropout is None else weights_dropout(weights,
                                                                       training=training)
    return ops.matmul(ops.cast(weighing, values.dtype), values), weights


@keras.saving.register_keras_serializable(package="keras_transformer")
class MultiHeadAttention(keras.layers.Layer):
    """Multi-head attention: `h` heads of scaled dot-product attention, concatenated.

    Projects queries, keys and values into `num_heads` subspaces of `key_dim` each,
    attends in each (§3.2.1), concatenates the heads and projects back (§3.2.2). The
    boolean `attention_mask` says which keys each query may see; callers build it from
    token ids (see `masks.py`). `attention_weights` gives the weights the same call
    would use. Cached decoding projects keys `(B, H, K, L)` and values `(B, H, L, K)`
    once (`project_cached_key_value`, `project_step_key_value`) and attends from one
    position at a time (`attend_cached`), in the layouts the attention matmuls read, so
    that a decoding step never transposes its cache.

    The fused path calls `keras.ops.dot_product_attention` (cuDNN/flash kernels on GPU)
    and computes the same function; it is used only when attention dropout is inactive,
    since the fused op has none.

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
        training: bool. Whether dropout is active.

    Returns:
        `(B, T, output_dim)`.

    Example:
    >>> attention = MultiHeadAttention(num_heads=2)
    >>> tuple(attention(np.ones((1, 3, 8)), np.ones((1, 5, 8))).shape)
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
        return keras.layers.Dense(
            units, kernel_initializer=sublayer_initializer(self.kernel_initializer),
            dtype=self.dtype_policy, name=name)

    def _split_heads(self, x):
        batch, length = ops.shape(x)[0], ops.shape(x)[1]
        return ops.reshape(x, (batch, length, self.num_heads, self.head_dim))  # (B, L, H, K)

    def project_cached_key_value(self, key, value):
        """Returns keys `(B, H, K, S)` and values `(B, H, S, K)`, the layouts attention
        reads (for a decoding cache, and for `call`)."""
        keys = self._split_heads(self.key_projection(key))  # (B, S, H, K)
        values = self._split_heads(self.value_projection(value))  # (B, S, H, K)
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

    def attend_cached(self, query, keys, values, attention_mask=None, queries_per_row=1):
        """Attends from one position per sentence, `query` `(B·n, D)`, to cached `keys`
        `(B, H, K, S)` and `values` `(B, H, S, K)` (see `project_cached_key_value`).

        Inference only (no dropout). Never fused: with the one query position of a
        decoding step there is nothing for a fused kernel to save. A step runs on
        `(B, D)` rows rather than `(B, 1, D)` sequences: every projection is then one
        plain matmul, and every change of layout a reshape with static sizes, where a
        length axis of 1 made Keras lower each projection to a `tensordot` and each head
        split to shape arithmetic and a transpose: half of a step's graph nodes
        (BENCHMARKS.md, "A decoding step on rows").

        With `queries_per_row` n > 1, the `n` consecutive query rows `b·n … b·n + n - 1`
        (beam search's hypotheses of sentence `b`) share row `b` of the keys, values and
        mask: one `(n, K) × (K, S)` matmul per head instead of `n` matrix-vector products
        over `n` copies of the same keys. Returns `(B·n, output_dim)`.
        """
        projected = self.query_projection(query)  # (B·n, H·K)
        if queries_per_row == 1:
            query_heads = ops.reshape(projected, (-1, self.num_heads, 1, self.head_dim))
        else:
            query_heads = ops.transpose(ops.reshape(
                projected, (-1, queries_per_row, self.num_heads, self.head_dim)),
                (0, 2, 1, 3))  # (B, H, n, K)
        # The mask as an additive bias: LiteRT runs the broadcast select of a mask
        # with its scalar reference kernel, over every score at every step, and adds
        # with XNNPACK. A decoding step's rows always see a key (position 0; a
        # source's end token), where the two would differ.
        bias = None if attention_mask is None else ops.where(attention_mask, 0.0,
                                                             _MASKED_SCORE)
        context, _ = scaled_dot_product_attention(query_heads, keys, values,
                                                  score_bias=bias)  # (B, H, n, K)
        if queries_per_row > 1:
            context = ops.transpose(context, (0, 2, 1, 3))  # (B, n, H, K)
        context = ops.reshape(context, (-1, self.num_heads * self.head_dim))  # (B·n, H·K)
        return self.output_projection(context)  # (B·n, output_dim)

    def _attend(self, query, key, value, attention_mask, training):
        """Returns `(context (B, H, T, K), weights (B, H, T, S))` of the unfused path."""
        query_heads = ops.transpose(self._split_heads(self.query_projection(query)),
                                    (0, 2, 1, 3))  # (B, H, T, K)
        keys, values = self.project_cached_key_value(key, value)  # (B, H, K, S), (B, H, S, K)
        return scaled_dot_product_attention(query_heads, keys, values, attention_mask,
                                            weights_dropout=self.weights_dropout,
                                            training=training)

    def attention_weights(self, query, value, key=None, attention_mask=None):
        """Returns the float32 weights `(B, H, T, S)` that `call` (without dropout) uses.

        Builds the layer first if no call has (as a call would).
        """
        key = value if key is None else key
        if not self.built:
            self.build(ops.shape(query), ops.shape(value), ops.shape(key))
        return self._attend(query, key, value, attention_mask, training=False)[1]

    def call(self, query, value, key=None, attention_mask=None, training=None):
        key = value if key is None else key
        batch, length = ops.shape(query)[0], ops.shape(query)[1]
        if self.use_fused_attention and not (training and self.dropout > 0):
            mask = None
            if attention_mask is not None:
                # cuDNN's kernel (JAX backend) takes a mask only as a full (T, S) bias
                # and otherwise falls back to the unfused path: broadcast padding masks
                # of shape (B, 1, S) to every query position.
                shape = (batch, length, ops.shape(key)[1])
                mask = ops.expand_dims(ops.broadcast_to(attention_mask, shape), 1)
            context = ops.dot_product_attention(
                self._split_heads(self.query_projection(query)),
                self._split_heads(self.key_projection(key)),
                self._split_heads(self.value_projection(value)), mask=mask)  # (B, T, H, K)
        else:
            context, _ = self._attend(query, key, value, attention_mask, training)
            context = ops.transpose(context, (0, 2, 1, 3))  # (B, T, H, K)
        context = ops.reshape(context, (batch, length, self.num_heads * self.head_dim))
        return self.output_projection(context)  # (B, T, output_dim)

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
