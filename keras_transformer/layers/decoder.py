"""The decoder stack: N identical decoder layers (Vaswani et al., 2017, §3.1)."""

import keras

from keras_transformer.layers.decoder_layer import DecoderLayer


@keras.saving.register_keras_serializable(package="keras_transformer")
class Decoder(keras.layers.Layer):
    """A stack of `num_layers` `DecoderLayer`s; with pre-LN, a final LayerNorm.

    Args:
        num_layers: int. Number of layers (`N`).
        intermediate_dim, num_heads, dropout, attention_dropout, normalize_first,
        layer_norm_epsilon, use_fused_attention: the `DecoderLayer` arguments.
        **kwargs: passed to `keras.layers.Layer`.

    Call arguments:
        x: float tensor `(B, T, D)`, the embedded target prefix.
        encoder_output: float tensor `(B, S, D)`.
        self_attention_mask: bool `(B, T, T)`.
        cross_attention_mask: bool broadcastable to `(B, T, S)`.
        return_attention_scores: bool. Also return a list with each layer's scores.
        training: bool. Whether dropout is active.

    Example:
    >>> decoder = Decoder(num_layers=2, intermediate_dim=32, num_heads=2)
    >>> decoder(np.ones((1, 4, 8)), np.ones((1, 6, 8))).shape
    (1, 4, 8)

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
        self.decoder_layers = [
            DecoderLayer(**self.layer_arguments, dtype=self.dtype_policy, name=f"layer_{i}")
            for i in range(num_layers)]
        # Pre-LN leaves the residual stream unnormalised after the last layer.
        self.output_norm = keras.layers.LayerNormalization(
            epsilon=layer_norm_epsilon, dtype=self.dtype_policy,
            name="output_norm") if normalize_first else None

    def build(self, x_shape, encoder_output_shape):
        for layer in self.decoder_layers:
            layer.build(x_shape, encoder_output_shape)
        if self.output_norm is not None:
            self.output_norm.build(x_shape)

    def call(self, x, encoder_output, self_attention_mask=None, cross_attention_mask=None,
             return_attention_scores=False, training=None):
        scores = []
        for layer in self.decoder_layers:
            x = layer(x, encoder_output, self_attention_mask, cross_attention_mask,
                      return_attention_scores=return_attention_scores, training=training)
            if return_attention_scores:
                x, layer_scores = x
                scores.append(layer_scores)
        x = x if self.output_norm is None else self.output_norm(x)  # (B, T, D)
        return (x, scores) if return_attention_scores else x

    def project_encoder_output(self, encoder_output):
        """Returns per-layer lists of cross-attention keys `(B, H, K, S)` and values
        `(B, H, S, K)`."""
        projected = [layer.project_encoder_output(encoder_output)
                     for layer in self.decoder_layers]
        return [keys for keys, _ in projected], [values for _, values in projected]

    def decode_step(self, x, cache, index, cross_attention_mask):
        """Runs one position `(B, D)` through every layer; returns `(x, cache)`.

        `cache` holds per-layer lists `self_keys`, `self_values`, `cross_keys`,
        `cross_values` (see `DecoderLayer.decode_step`); other entries pass through.
        """
        cache = dict(cache)
        names = ("self_keys", "self_values", "cross_keys", "cross_values")
        updated = {name: list(cache[name]) for name in names}
        for i, layer in enumerate(self.decoder_layers):
            x, layer_cache = layer.decode_step(
                x, {name: updated[name][i] for name in names}, index, cross_attention_mask)
            for name in names:
                updated[name][i] = layer_cache[name]
        cache.update(updated)
        x = x if self.output_norm is None else self.output_norm(x)  # (B, D)
        return x, cache

    def compute_output_shape(self, x_shape, encoder_output_shape=None):
        return x_shape

    def get_config(self):
        return {**super().get_config(), "num_layers": self.num_layers, **self.layer_arguments}
