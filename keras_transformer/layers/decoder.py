"""The decoder stack: N identical decoder layers (Vaswani et al., 2017, §3.1)."""

import keras
from keras import ops

from keras_transformer.layers.decoder_layer import DecoderLayer
from keras_transformer.layers.stack import LayerStack


@keras.saving.register_keras_serializable(package="keras_transformer")
class Decoder(LayerStack):
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
        training: bool. Whether dropout is active.

    Example:
    >>> decoder = Decoder(num_layers=2, intermediate_dim=32, num_heads=2)
    >>> tuple(decoder(np.ones((1, 4, 8)), np.ones((1, 6, 8))).shape)
    (1, 4, 8)

    References:
        - [Vaswani et al., 2017](https://arxiv.org/abs/1706.03762), §3.1.
    """

    layer_class = DecoderLayer
    layers_attribute = "decoder_layers"

    def build(self, x_shape, encoder_output_shape):
        self.build_stack(x_shape, encoder_output_shape)

    def call(self, x, encoder_output, self_attention_mask=None, cross_attention_mask=None,
             training=None):
        for layer in self.decoder_layers:
            x = layer(x, encoder_output, self_attention_mask, cross_attention_mask,
                      training=training)  # (B, T, D)
        return self.normalize_output(x)

    def cross_attention_weights(self, x, encoder_output, self_attention_mask=None,
                                cross_attention_mask=None):
        """Returns float32 `(B, N, H, T, S)`: every layer's encoder-decoder attention.

        Arguments as for `call`, without dropout.
        """
        weights = []
        for layer in self.decoder_layers:
            weights.append(layer.cross_attention_weights(
                x, encoder_output, self_attention_mask, cross_attention_mask))
            x = layer(x, encoder_output, self_attention_mask, cross_attention_mask)
        return ops.stack(weights, axis=1)

    def project_encoder_output(self, encoder_output):
        """Returns per-layer lists of cross-attention keys `(B, H, K, S)` and values
        `(B, H, S, K)`."""
        projected = [layer.project_encoder_output(encoder_output)
                     for layer in self.decoder_layers]
        return [keys for keys, _ in projected], [values for _, values in projected]

    def decode_step(self, x, cache, index, cross_attention_mask, hypotheses=1,
                    write_cache=None):
        """Runs one position `(B, D)` through every layer; returns `(x, cache)`.

        `cache` holds per-layer lists `self_keys`, `self_values`, `cross_keys`,
        `cross_values` (see `DecoderLayer.decode_step`, also for `hypotheses` and
        `write_cache`); other entries pass through.
        """
        cache = dict(cache)
        names = ("self_keys", "self_values", "cross_keys", "cross_values")
        updated = {name: list(cache[name]) for name in names}
        for i, layer in enumerate(self.decoder_layers):
            x, layer_cache = layer.decode_step(
                x, {name: updated[name][i] for name in names}, index, cross_attention_mask,
                hypotheses, write_cache)
            for name in names:
                updated[name][i] = layer_cache[name]
        cache.update(updated)
        return self.normalize_output(x), cache  # (B, D)
