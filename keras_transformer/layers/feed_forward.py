"""Position-wise feed-forward network (Vaswani et al., 2017, §3.3)."""

import keras

from keras_transformer.layers.initializers import sublayer_initializer


@keras.saving.register_keras_serializable(package="keras_transformer")
class FeedForward(keras.layers.Layer):
    """FFN(x) = max(0, x·W₁ + b₁)·W₂ + b₂, applied at every position alike.

    Keeps the shape of its input. Dropout on its output belongs to the residual
    connection around it (see `residual.py`), as for every sub-layer.

    Args:
        intermediate_dim: int. Width of the hidden layer (`d_ff`).
        kernel_initializer: initializer of both kernels. Defaults to Glorot uniform.
        **kwargs: passed to `keras.layers.Layer`.

    Call arguments:
        inputs: float tensor `(B, L, D)`.

    Example:
    >>> tuple(FeedForward(intermediate_dim=32)(np.ones((2, 5, 8))).shape)
    (2, 5, 8)

    References:
        - [Vaswani et al., 2017](https://arxiv.org/abs/1706.03762), §3.3.
    """

    def __init__(self, intermediate_dim, kernel_initializer="glorot_uniform", **kwargs):
        super().__init__(**kwargs)
        self.intermediate_dim = intermediate_dim
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.hidden = keras.layers.Dense(
            intermediate_dim, activation="relu",
            kernel_initializer=sublayer_initializer(self.kernel_initializer),
            dtype=self.dtype_policy, name="hidden")

    def build(self, inputs_shape):
        self.projection = keras.layers.Dense(
            inputs_shape[-1], kernel_initializer=sublayer_initializer(self.kernel_initializer),
            dtype=self.dtype_policy, name="projection")
        self.hidden.build(inputs_shape)
        self.projection.build((*inputs_shape[:-1], self.intermediate_dim))

    def call(self, inputs):
        x = self.hidden(inputs)  # (B, L, F)
        return self.projection(x)  # (B, L, D)

    def compute_output_shape(self, inputs_shape):
        return inputs_shape

    def get_config(self):
        return {**super().get_config(),
                "intermediate_dim": self.intermediate_dim,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer)}
