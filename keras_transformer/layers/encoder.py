"""The encoder stack: N identical encoder layers (Vaswani et al., 2017, §3.1)."""

import keras

from keras_transformer.layers.encoder_layer import EncoderLayer


@keras.saving.register_keras_serializable(package="keras_transformer")
class Encoder(keras.layers.Layer):
    """A stack of `num_layers` `EncoderLayer`s; with pre-LN, a final LayerNorm.

    Args:
        num_layers: int. Number of layers (`N`).
        **layer_kwargs: the `EncoderLayer` arguments (`intermediate_dim`, `num_heads`,
            `dropout`, `attention_dropout`, `normalize_first`, `layer_norm_epsilon`,
            `use_fused_attention`) and those of `keras.layers.Layer`.

    Call arguments:
        x: float tensor `(B, S, D)`, the embedded source.
        padding_mask: bool tensor `(B, S)`, `True` at real tokens.
        training: bool. Whether dropout is active.

    Example:
    >>> Encoder(num_layers=2, intermediate_dim=32, num_heads=2)(np.ones((1, 5, 8))).shape
    (1, 5, 8)

    References:
        - [Vaswani et al., 2017](https://arxiv.org/abs/1706.03762), §3.1.
    """

    def __init__(self, num_layers, intermediate_dim, num_heads, dropout=0.1,
                 attention_dropout=0.0, normalize_first=False, layer_norm_epsilon=1e-6,
                 use_fused_attention=False, **kwargs):
        super().__init__(**kwargs)
        self.num_layers = num_layers
        self.layer_arguments = dict(
            intermediate_dim=intermediate_dim, num_heads=num_heads, dropout=dropout,
            attention_dropout=attention_dropout, normalize_first=normalize_first,
            layer_norm_epsilon=layer_norm_epsilon, use_fused_attention=use_fused_attention)
        self.encoder_layers = [
            EncoderLayer(**self.layer_arguments, dtype=self.dtype_policy, name=f"layer_{i}")
            for i in range(num_layers)]
        # Pre-LN leaves the residual stream unnormalised after the last layer.
        self.output_norm = keras.layers.LayerNormalization(
            epsilon=layer_norm_epsilon, dtype=self.dtype_policy,
            name="output_norm") if normalize_first else None

    def build(self, x_shape):
        for layer in self.encoder_layers:
            layer.build(x_shape)
        if self.output_norm is not None:
            self.output_norm.build(x_shape)

    def call(self, x, padding_mask=None, training=None):
        for layer in self.encoder_layers:
            x = layer(x, padding_mask=padding_mask, training=training)  # (B, S, D)
        return x if self.output_norm is None else self.output_norm(x)

    def compute_output_shape(self, x_shape):
        return x_shape

    def get_config(self):
        return {**super().get_config(), "num_layers": self.num_layers, **self.layer_arguments}
