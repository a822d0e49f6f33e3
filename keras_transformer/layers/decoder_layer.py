"""One decoder layer: masked self-attention, cross-attention, feed-forward (§3.1)."""

import math

import keras
from keras import ops

from keras_transformer.layers.attention import MultiHeadAttention
from keras_transformer.layers.feed_forward import FeedForward
from keras_transformer.layers.masks import causal_mask
from keras_transformer.layers.residual import residual_block


@keras.saving.register_keras_serializable(package="keras_transformer")
class DecoderLayer(keras.layers.Layer):
    """Masked self-attention, encoder-decoder attention, then a feed-forward network.

    Each sub-layer sits in a residual connection with dropout and layer normalisation.
    `call` runs all target positions at once (training, scoring); `decode_step` runs one
    new position against a key/value cache of the earlier ones and the encoder keys and
    values projected once per sentence (`project_encoder_output`), so that a decoding
    step costs O(T) instead of O(T²). `cross_attention_weights` gives the weights of its
    encoder-decoder attention.

    Args:
        intermediate_dim: int. Feed-forward width (`d_ff`).
        num_heads: int. Attention heads (`h`).
        dropout: float. Dropout on every sub-layer output (`P_drop`).
        attention_dropout: float. Dropout on attention weights (not in the paper).
        normalize_first: bool. Pre-LN instead of the paper's post-LN.
        layer_norm_epsilon: float. Epsilon of the layer normalisations.
        use_fused_attention: bool. Use `keras.ops.dot_product_attention`.
        **kwargs: passed to `keras.layers.Layer`.

    Call arguments:
        x: float tensor `(B, T, D)`, the embedded target prefix.
        encoder_output: float tensor `(B, S, D)`.
        self_attention_mask: bool `(B, T, T)`: look-ahead and target padding.
        cross_attention_mask: bool broadcastable to `(B, T, S)`: source padding.
        training: bool. Whether dropout is active.

    Example:
    >>> layer = DecoderLayer(intermediate_dim=32, num_heads=2)
    >>> tuple(layer(np.ones((2, 4, 8)), np.ones((2, 6, 8))).shape)
    (2, 4, 8)

    References:
        - [Vaswani et al., 2017](https://arxiv.org/abs/1706.03762), §3.1, §3.2.3.
    """

    def __init__(self, intermediate_dim, num_heads, dropout=0.1, attention_dropout=0.0,
                 normalize_first=False, layer_norm_epsilon=1e-6, use_fused_attention=False,
                 **kwargs):
        super().__init__(**kwargs)
        self.intermediate_dim = intermediate_dim
        self.num_heads = num_heads
        self.dropout = dropout
        self.attention_dropout = attention_dropout
        self.normalize_first = normalize_first
        self.layer_norm_epsilon = layer_norm_epsilon
        self.use_fused_attention = use_fused_attention
        for role in ("self_attention", "cross_attention"):
            setattr(self, role, MultiHeadAttention(
                num_heads, dropout=attention_dropout, use_fused_attention=use_fused_attention,
                dtype=self.dtype_policy, name=role))
        self.feed_forward = FeedForward(
            intermediate_dim, dtype=self.dtype_policy, name="feed_forward")
        for role in ("self_attention", "cross_attention", "feed_forward"):
            setattr(self, f"{role}_norm", keras.layers.LayerNormalization(
                epsilon=layer_norm_epsilon, dtype=self.dtype_policy, name=f"{role}_norm"))
            setattr(self, f"{role}_dropout",
                    keras.layers.Dropout(dropout, dtype=self.dtype_policy))

    def build(self, x_shape, encoder_output_shape):
        self.self_attention.build(x_shape, x_shape)
        self.self_attention_norm.build(x_shape)
        self.cross_attention.build(x_shape, encoder_output_shape)
        self.cross_attention_norm.build(x_shape)
        self.feed_forward.build(x_shape)
        self.feed_forward_norm.build(x_shape)

    def _self_attention_block(self, x, self_attend, training):
        # Masked self-attention block (§3.2.3).
        return residual_block(x, self_attend, self.self_attention_norm,
                              self.self_attention_dropout, self.normalize_first, training)

    def _sublayers(self, x, self_attend, cross_attend, training):
        x = self._self_attention_block(x, self_attend, training)
        # Encoder-decoder attention block: queries from the decoder, keys/values from
        # the encoder output (§3.2.3).
        x = residual_block(x, cross_attend, self.cross_attention_norm,
                           self.cross_attention_dropout, self.normalize_first, training)
        # Feed-forward block.
        return residual_block(x, self.feed_forward, self.feed_forward_norm,
                              self.feed_forward_dropout, self.normalize_first, training)

    def call(self, x, encoder_output, self_attention_mask=None, cross_attention_mask=None,
             training=None):
        def self_attend(h):
            return self.self_attention(h, h, attention_mask=self_attention_mask,
                                       training=training)

        def cross_attend(h):
            return self.cross_attention(h, encoder_output, attention_mask=cross_attention_mask,
                                        training=training)

        return self._sublayers(x, self_attend, cross_attend, training)  # (B, T, D)

    def cross_attention_weights(self, x, encoder_output, self_attention_mask=None,
                                cross_attention_mask=None):
        """Returns the float32 encoder-decoder attention weights `(B, H, T, S)` of `call`.

        Arguments as for `call`, without dropout. The weights are those of the queries
        that `call` gives the cross-attention: the self-attention block's output (after
        its LayerNorm with pre-LN).
        """
        x = self._self_attention_block(
            x, lambda h: self.self_attention(h, h, attention_mask=self_attention_mask),
            training=False)  # (B, T, D)
        query = self.cross_attention_norm(x) if self.normalize_first else x
        return self.cross_attention.attention_weights(query, encoder_output,
                                                      attention_mask=cross_attention_mask)

    def project_encoder_output(self, encoder_output):
        """Returns cross-attention keys `(B, H, K, S)` and values `(B, H, S, K)`, once per
        sentence."""
        return self.cross_attention.project_cached_key_value(encoder_output, encoder_output)

    def decode_step(self, x, cache, index, cross_attention_mask, hypotheses=1,
                    write_cache=None):
        """Runs one target position against the cache of this layer.

        The cache is laid out as the attention reads it (see
        `MultiHeadAttention.attend_cached`), and only position `index` is written, by
        `write_cache`. A step works on `(B, D)` rows, one position per sentence, which
        keeps every projection a plain matmul.

        Args:
            x: float tensor `(B, D)`, the embedded token at position `index`.
            cache: dict of `self_keys` `(B, H, K, T_max)` and `self_values` `(B, H,
                T_max, K)` (positions before `index` filled), and `cross_keys` `(B, H,
                K, S)` and `cross_values` `(B, H, S, K)`.
            index: scalar int tensor, the position of `x`.
            cross_attention_mask: bool `(B, 1, S)`: source padding.
            hypotheses: int. Rows of `x` per row of the cross-attention entries and
                mask (beam search's hypotheses per sentence; see
                `MultiHeadAttention.attend_cached`). The self-attention entries have a
                row per row of `x`.
            write_cache: how to write one position of the cache: `write_by_scatter`
                (`None`, the default) or `write_by_slice_update`, whichever the
                runtime that will run the step writes in place.

        Returns:
            `(x, cache)`: `(B, D)` and the cache with position `index` written.
        """
        cache = dict(cache)
        cache_length = ops.shape(cache["self_values"])[2]
        write = write_cache or write_by_scatter

        def self_attend(h):
            # keys (B, H, K, 1), values (B, H, 1, K)
            keys, values = self.self_attention.project_step_key_value(h)
            cache["self_keys"] = write(cache["self_keys"], index, keys, axis=3)
            cache["self_values"] = write(cache["self_values"], index, values, axis=2)
            visible = ops.expand_dims(causal_mask(1, cache_length, query_offset=index),
                                      0)  # (1, 1, T_max)
            return self.self_attention.attend_cached(
                h, cache["self_keys"], cache["self_values"], visible)

        def cross_attend(h):
            return self.cross_attention.attend_cached(
                h, cache["cross_keys"], cache["cross_values"], cross_attention_mask,
                queries_per_row=hypotheses)

        x = self._sublayers(x, self_attend, cross_attend, training=False)  # (B, D)
        return x, cache

    def compute_output_shape(self, x_shape, encoder_output_shape=None):
        return x_shape

    def get_config(self):
        return {**super().get_config(),
                "intermediate_dim": self.intermediate_dim,
                "num_heads": self.num_heads,
                "dropout": self.dropout,
                "attention_dropout": self.attention_dropout,
                "normalize_first": self.normalize_first,
                "layer_norm_epsilon": self.layer_norm_epsilon,
                "use_fused_attention": self.use_fused_attention}


# Two ways to write one position of a cache (`decode_step`'s `write_cache`). Each is a
# single-position write, not a select that reads and rewrites every position at every
# step; which one a runtime runs in place is for the caller to know: TensorFlow
# updates a scatter (`TensorScatterUpdate`, a core op) in place when it can, and runs a
# slice update (`XlaDynamicUpdateSlice`) without XLA one op at a time, slower; TFLite
# runs a slice update as its builtin `DYNAMIC_UPDATE_SLICE`, in place, and lowers a
# scatter to `SCATTER_ND` plus arithmetic over the whole cache.

def write_by_scatter(cache, index, new, axis):
    """Returns `cache` with position `index` of `axis` set to `new` (size 1 on `axis`),
    by a scatter.

    `cache` is `(B, ...)`, of one size through a decoding loop: `(B, H, K, T_max)` keys
    (`axis=3`) or `(B, H, T_max, K)` values (`axis=2`).
    """
    shape = ops.shape(cache)
    inner = math.prod(shape[axis + 1:])
    rows = ops.reshape(cache, (-1, shape[axis], inner))  # (B·…, T_max, inner)
    count = ops.shape(rows)[0]
    indices = ops.stack([ops.arange(count, dtype="int32"),
                         ops.full((count,), index, "int32")], axis=1)  # (B·…, 2)
    rows = ops.scatter_update(rows, indices, ops.reshape(new, (-1, inner)))
    return ops.reshape(rows, (-1, *shape[1:]))


def write_by_slice_update(cache, index, new, axis):
    """`write_by_scatter`'s write, by a slice update."""
    start = [0] * len(cache.shape)
    start[axis] = index
    return ops.slice_update(cache, start, ops.cast(new, cache.dtype))
