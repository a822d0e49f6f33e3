"""The encoder stack: N identical encoder layers (Vaswani et al., 2017, §3.1)."""

import keras

from keras_transformer.layers.encoder_layer import EncoderLayer
from keras_transformer.layers.stack import LayerStack


@keras.saving.register_keras_serializable(package="keras_transformer")
class Encoder(LayerStack):
    """A stack of `num_layers` `EncoderLayer`s; with pre-LN, a final LayerNorm.

    Args:
        num_layers: int. Number of layers (`N`).
        intermediate_dim, num_heads, dropout, attention_dropout, normalize_first,
        layer_norm_epsilon, use_fused_attention: the `EncoderLayer` arguments.
        **kwargs: passed to `keras.layers.Layer`.

    Call arguments:
        x: float tensor `(B, S, D)`, the embedded source.
        padding_mask: bool tensor `(B, S)`, `True` at real tokens.
        training: bool. Whether dropout is active.

    Example:
    >>> encoder = Encoder(num_layers=2, intermediate_dim=32, num_heads=2)
    >>> tuple(encoder(np.ones((1, 5, 8))).shape)
    (1, 5, 8)

    References:
        - [Vaswani et al., 2017](https://arxiv.org/abs/1706.03762), §3.1.
    """

    layer_class = EncoderLayer
    layers_attribute = "encoder_layers"

    def build(self, x_shape):
        self.build_stack(x_shape)

    def call(self, x, padding_mask=None, training=None):
        for layer in self.encoder_layers:
            x = layer(x, padding_mask=padding_mask, training=training)  # (B, S, D)
        return self.normalize_output(x)
