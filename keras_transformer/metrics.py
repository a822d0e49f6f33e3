"""Training metrics over target tokens that ignore padding: accuracy and token count."""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_transformer")
class MaskedAccuracy(keras.metrics.Mean):
    """Fraction of real target tokens whose arg-max prediction is the reference token.

    Padding (`y_true == pad_id`) is left out whether or not a `sample_weight` is given, so
    the metric can be listed in `compile(metrics=...)`. Its state is a total and a count,
    which `tf.distribute` sums over replicas: the value is exact for the global batch.

    Args:
        pad_id: int. Target id to ignore. Defaults to `0`.
        name: str. Defaults to `"accuracy"`.
        dtype: dtype of the state.

    Example:

    >>> metric = MaskedAccuracy()
    >>> metric.update_state([[1, 2, 0]], [[[0, 1, 0], [0, 1, 0], [0, 1, 0]]])
    >>> float(metric.result())
    0.5
    """

    def __init__(self, pad_id=0, name="accuracy", dtype=None):
        super().__init__(name=name, dtype=dtype)
        self.pad_id = pad_id

    def update_state(self, y_true, y_pred, sample_weight=None):
        y_true = ops.cast(y_true, "int32")
        weights = _token_weights(y_true, self.pad_id, sample_weight)  # (B, T)
        predicted = ops.cast(ops.argmax(y_pred, axis=-1), "int32")  # (B, T)
        matches = ops.cast(ops.equal(predicted, y_true), "float32")
        super().update_state(matches, sample_weight=weights)

    def get_config(self):
        return {**super().get_config(), "pad_id": self.pad_id}


@keras.saving.register_keras_serializable(package="keras_transformer")
class TargetTokens(keras.metrics.Sum):
    """Number of real target tokens seen since the metric was last reset (each epoch).

    Keras callbacks never see the batches; `ThroughputLogger` turns the change of this
    count between two steps into target tokens per second.

    Args:
        pad_id: int. Target id not counted. Defaults to `0`.
        name: str. Defaults to `"target_tokens"`.
        dtype: dtype of the state.
    """

    def __init__(self, pad_id=0, name="target_tokens", dtype=None):
        super().__init__(name=name, dtype=dtype)
        self.pad_id = pad_id

    def update_state(self, y_true, y_pred, sample_weight=None):
        super().update_state(_token_weights(ops.cast(y_true, "int32"), self.pad_id,
                                            sample_weight))

    def get_config(self):
        return {**super().get_config(), "pad_id": self.pad_id}


def _token_weights(y_true, pad_id, sample_weight):
    weights = ops.cast(ops.not_equal(y_true, pad_id), "float32")
    if sample_weight is not None:
        weights = weights * ops.cast(sample_weight, "float32")
    return weights
