"""One encoder layer: self-attention and feed-forward (Vaswani et al., 2017, §3.1)."""

import keras

from keras_transformer.layers.attention import MultiHeadAttention
from keras_transformer.layers.feed_forward import FeedForward
from keras_transformer.layers.masks import key_padding_attention_mask
from keras_transformer.layers.residual import residual_block


@keras.saving.register_keras_serializable(package="keras_transformer")
class EncoderLayer(keras.layers.Layer):
    """Multi-head self-attention, then a position-wise feed-forward network.

    Each of the two sub-layers sits in a residual connection with dropout and layer
    normalisation (see `residual_block`). Keys at padding positions are masked out of
    the self-attention; outputs at padding positions are computed but meaningless.

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
        x: float tensor `(B, S, D)`.
        padding_mask: bool tensor `(B, S)`, `True` at real tokens, or `None`.
        training: bool. Whether dropout is active.

    Example:
    >>> layer = EncoderLayer(intermediate_dim=32, num_heads=2)
    >>> tuple(layer(np.ones((2, 5, 8))).shape)
    (2, 5, 8)

    References:
        - [Vaswani et al., 2017](https://arxiv.org/abs/1706.03762), §3.1.
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
        self.self_attention = MultiHeadAttention(
            num_heads, dropout=attention_dropout, use_fused_attention=use_fused_attention,
            dtype=self.dtype_policy, name="self_attention")
        self.self_attention_norm = keras.layers.LayerNormalization(
            epsilon=layer_norm_epsilon, dtype=self.dtype_policy, name="self_attention_norm")
        self.self_attention_dropout = keras.layers.Dropout(dropout, dtype=self.dtype_policy)
        self.feed_forward = FeedForward(
            intermediate_dim, dtype=self.dtype_policy, name="feed_forward")
        self.feed_forward_norm = keras.layers.LayerNormalization(
            epsilon=layer_norm_epsilon, dtype=self.dtype_policy, name="feed_forward_norm")
        self.feed_forward_dropout = keras.layers.Dropout(dropout, dtype=self.dtype_policy)

    def build(self, x_shape):
        self.self_attention.build(x_shape, x_shape)
        self.self_attention_norm.build(x_shape)
        self.feed_forward.build(x_shape)
        self.feed_forward_norm.build(x_shape)

    def call(self, x, padding_mask=None, training=None):
        mask = None if padding_mask is None else key_padding_attention_mask(padding_mask)

        # Self-attention block.
        x = residual_block(
            x, lambda h: self.self_attention(h, h, attention_mask=mask, training=training),
            self.self_attention_norm, self.self_attention_dropout,
            self.normalize_first, training)  # (B, S, D)

        # Feed-forward block.
        return residual_block(
            x, self.feed_forward, self.feed_forward_norm, self.feed_forward_dropout,
            self.normalize_first, training)  # (B, S, D)

    def compute_output_shape(self, x_shape):
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
