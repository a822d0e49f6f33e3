"""A stack of N identical layers, what the encoder and decoder share (Vaswani et al., §3.1)."""

import keras


class LayerStack(keras.layers.Layer):
    """`num_layers` identical layers in sequence; with pre-LN, a final LayerNorm.

    The common part of `Encoder` and `Decoder`, which name their layer class
    (`layer_class`) and the attribute that holds the layers (`layers_attribute`: it is
    part of the path of every weight in a saved file, so it keeps its name).

    Args:
        num_layers: int. Number of layers (`N`).
        intermediate_dim, num_heads, dropout, attention_dropout, normalize_first,
        layer_norm_epsilon, use_fused_attention: the arguments of each layer.
        **kwargs: passed to `keras.layers.Layer`.
    """

    layer_class = None
    layers_attribute = None

    def __init__(self, num_layers, intermediate_dim, num_heads, dropout=0.1,
                 attention_dropout=0.0, normalize_first=False, layer_norm_epsilon=1e-6,
                 use_fused_attention=False, **kwargs):
        super().__init__(**kwargs)
        self.num_layers = num_layers
        self.layer_arguments = dict(
            intermediate_dim=intermediate_dim, num_heads=num_heads, dropout=dropout,
            attention_dropout=attention_dropout, normalize_first=normalize_first,
            layer_norm_epsilon=layer_norm_epsilon, use_fused_attention=use_fused_attention)
        setattr(self, self.layers_attribute, [
            self.layer_class(**self.layer_arguments, dtype=self.dtype_policy, name=f"layer_{i}")
            for i in range(num_layers)])
        # Pre-LN leaves the residual stream unnormalised after the last layer.
        self.output_norm = keras.layers.LayerNormalization(
            epsilon=layer_norm_epsilon, dtype=self.dtype_policy,
            name="output_norm") if normalize_first else None

    @property
    def stacked_layers(self):
        """The layers, first to last."""
        return getattr(self, self.layers_attribute)

    def build_stack(self, x_shape, *other_shapes):
        """Builds every layer with the shapes of its call, then the final LayerNorm.

        Called by the subclasses' `build`, whose arguments Keras matches to those of
        `call` by name.
        """
        for layer in self.stacked_layers:
            layer.build(x_shape, *other_shapes)
        if self.output_norm is not None:
            self.output_norm.build(x_shape)

    def normalize_output(self, x):
        """The stack's output from the last layer's: the final LayerNorm of pre-LN."""
        return x if self.output_norm is None else self.output_norm(x)

    def compute_output_shape(self, x_shape):
        return x_shape

    def get_config(self):
        return {**super().get_config(), "num_layers": self.num_layers, **self.layer_arguments}
