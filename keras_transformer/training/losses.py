"""What training minimises and reports over target tokens, padding left out (§5.4).

`LabelSmoothedCrossEntropy` is the loss; `RDrop` combines two passes' losses with their
`symmetric_kl_divergence` (`Transformer.compute_loss` makes the second);
`MaskedAccuracy` and `TargetTokens` are the metrics `fit` shows (the token count also
feeds `callbacks.ThroughputLogger`); `compile_model` compiles a model with them and
the optimizer. Nothing here imports
TensorFlow, so that a training step can be compiled on a machine with another Keras
backend alone (`benchmarks/mfu.py` on a GPU machine with JAX).
"""

import keras
from keras import ops

from keras_transformer.training.optimization import make_optimizer


@keras.saving.register_keras_serializable(package="keras_transformer")
class LabelSmoothedCrossEntropy(keras.losses.Loss):
    """Mean label-smoothed cross-entropy per real (non-padding) target token.

    The target distribution puts `1 - label_smoothing` on the reference token and spreads
    `label_smoothing` uniformly over the whole vocabulary (`ε/V` on every token, the
    convention of Szegedy et al. and of Keras's dense-label losses). The per-token loss is
    `-(1 - ε) · log p(y) - (ε / V) · Σ_v log p(v)`; with `label_smoothing=0` it is the
    plain cross-entropy.

    Tokens equal to `pad_id` get weight 0; `sample_weight`, when given (the data pipeline
    passes its loss weights), multiplies that mask. The sum of weighted token losses is
    divided by the number of tokens of positive weight over the *whole* global batch:
    under `tf.distribute` each replica divides by the token count of all replicas
    together (one scalar all-reduce), so the summed gradients, and the loss Keras
    reports, are those of one device seeing the whole batch, whatever the number of
    replicas. (A loss that returned its own `sum / count` would be counted once per
    replica.) With weights of 0 and 1 (padding, and the pipeline's default) this is
    the mean over the weighted tokens; other weights scale their tokens' share, as
    `batching.weigh_micro_batches` does for gradient accumulation.

    Args:
        label_smoothing: float in `[0, 1)`. `ε_ls` of the paper. Defaults to `0.1`.
        pad_id: int. Target id that never contributes. Defaults to `0`.
        name: str. Name of the loss.
        dtype: dtype of the computation. Defaults to `"float32"`, also under mixed
            precision, where the logits are float32 anyway.

    Call arguments:
        y_true: int tensor `(B, T)` of target ids.
        y_pred: float tensor `(B, T, V)` of logits (not probabilities).
        sample_weight: optional float tensor `(B, T)`.

    Returns:
        A float32 scalar. `loss.call(y_true, y_pred)` gives the per-token losses `(B, T)`.

    Example:

    >>> loss = LabelSmoothedCrossEntropy(label_smoothing=0.0)
    >>> logits = np.array([[[0.0, 0.0, 0.0, 0.0], [9.0, 0.0, 0.0, 0.0]]])  # (1, 2, 4)
    >>> round(float(loss(np.array([[3, 0]]), logits)), 4)  # -log(1/4); padding not counted
    1.3863

    References:
        - [Vaswani et al., 2017](https://arxiv.org/abs/1706.03762), §5.4.
        - [Szegedy et al., 2016](https://arxiv.org/abs/1512.00567), §7.
    """

    def __init__(self, label_smoothing=0.1, pad_id=0,
                 name="label_smoothed_cross_entropy", dtype="float32"):
        if not 0.0 <= label_smoothing < 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1), got {label_smoothing}.")
        super().__init__(name=name, reduction="sum", dtype=dtype)
        self.label_smoothing = label_smoothing
        self.pad_id = pad_id

    def __call__(self, y_true, y_pred, sample_weight=None):
        weights = ops.cast(ops.not_equal(y_true, self.pad_id), self.dtype)  # (B, T)
        if sample_weight is not None:
            weights = weights * ops.cast(sample_weight, self.dtype)
        total = super().__call__(y_true, y_pred, sample_weight=weights)
        counted = ops.cast(ops.greater(weights, 0), self.dtype)
        tokens = _sum_over_replicas(ops.stop_gradient(ops.sum(counted)))
        return ops.divide_no_nan(total, tokens)

    def call(self, y_true, y_pred):
        y_true = ops.cast(y_true, "int32")  # Loss.__call__ hands it over as floats
        if keras.backend.backend() == "tensorflow":
            return _tensorflow_cross_entropy(y_true, y_pred, self.label_smoothing)
        return _portable_cross_entropy(y_true, y_pred, self.label_smoothing)

    def get_config(self):
        return {"name": self.name, "label_smoothing": self.label_smoothing,
                "pad_id": self.pad_id, "dtype": self.dtype}


def _tensorflow_cross_entropy(target_ids, logits, label_smoothing):
    """Per-token smoothed cross-entropy with TF's fused softmax cross-entropy kernel."""
    import tensorflow as tf  # here: the loss imports no backend it does not run on
    vocabulary = logits.shape[-1] or tf.shape(logits)[-1]
    spread = label_smoothing / tf.cast(vocabulary, logits.dtype)
    labels = tf.one_hot(target_ids, vocabulary, on_value=1.0 - label_smoothing + spread,
                        off_value=spread, dtype=logits.dtype)  # (B, T, V)
    # The fused kernel computes the softmax once for the loss and its gradient
    # (softmax − labels). Written with logsumexp and take_along_axis instead, the
    # gradient of the gather alone costs a scatter over the (B, T, V) logits:
    # `python -m benchmarks.loss_step` measured the fused form 1.31× faster, forward
    # and backward, with the same values.
    return tf.nn.softmax_cross_entropy_with_logits(labels, logits)


def _portable_cross_entropy(target_ids, logits, label_smoothing):
    """The same loss in `keras.ops`, for Keras's other backends.

    The model and this loss run on any backend (`benchmarks.mfu` trains them under
    JAX, whose compiler fuses this form); the data pipeline and export need TensorFlow.
    """
    vocabulary = logits.shape[-1] or ops.shape(logits)[-1]
    spread = label_smoothing / ops.cast(vocabulary, logits.dtype)
    # A one-hot product rather than a gather: XLA fuses the comparison into the sum and
    # the gradient stays dense (softmax − labels), with no scatter.
    labels = ops.one_hot(target_ids, vocabulary, dtype=logits.dtype) * (1.0 - label_smoothing)
    return -ops.sum((labels + spread) * ops.log_softmax(logits, axis=-1), axis=-1)


def symmetric_kl_divergence(y_true, logits, other_logits, sample_weight=None, pad_id=0):
    """Mean over real target tokens of `½ (KL(p ‖ q) + KL(q ‖ p))`, R-Drop's term.

    `p` and `q` are the softmax of two passes' logits over the same targets. Per token
    `½ Σ_v (p_v − q_v)(log p_v − log q_v)`, which is that sum of the two divergences;
    tokens equal to `pad_id` get weight 0, `sample_weight` multiplies, and the sum is
    divided by the tokens of positive weight over the whole global batch, as
    `LabelSmoothedCrossEntropy` divides (so the two add up under `tf.distribute`).

    Args:
        y_true: int tensor `(B, T)` of target ids.
        logits, other_logits: float tensors `(B, T, V)`, the two passes' logits.
        sample_weight: optional float tensor `(B, T)`.
        pad_id: int. Target id that never contributes.

    Returns:
        A float32 scalar.

    References:
        - [Liang et al., 2021](https://arxiv.org/abs/2106.14448), equation 2.
    """
    log_p = ops.log_softmax(ops.cast(logits, "float32"), axis=-1)
    log_q = ops.log_softmax(ops.cast(other_logits, "float32"), axis=-1)
    per_token = 0.5 * ops.sum((ops.exp(log_p) - ops.exp(log_q)) * (log_p - log_q),
                              axis=-1)  # (B, T)
    weights = ops.cast(ops.not_equal(ops.cast(y_true, "int32"), pad_id), "float32")
    if sample_weight is not None:
        weights = weights * ops.cast(sample_weight, "float32")
    counted = ops.cast(ops.greater(weights, 0), "float32")
    tokens = _sum_over_replicas(ops.stop_gradient(ops.sum(counted)))
    return ops.divide_no_nan(ops.sum(per_token * weights), tokens)


class RDrop:
    """R-Drop's loss of two passes of a batch, each with its own dropout masks.

    R-Drop (Liang et al., 2021, equation 3) minimises both passes' losses plus α times
    their symmetric KL divergence. Here that sum is halved,
    `½ (loss₁ + loss₂) + ½ α · KL` (`symmetric_kl_divergence`), so that the loss Keras
    reports stays comparable with a run without R-Drop while α weighs the divergence
    against the cross-entropy as in the paper (which uses α = 5 on IWSLT).

    Args:
        alpha: float > 0. The weight α of the divergence.
        pad_id: int. Target id that never contributes.
    """

    def __init__(self, alpha, pad_id=0):
        if not alpha > 0:
            raise ValueError(f"R-Drop's alpha must be positive, got {alpha}.")
        self.alpha, self.pad_id = float(alpha), pad_id

    def __call__(self, loss, other_loss, y_true, logits, other_logits, sample_weight=None):
        divergence = symmetric_kl_divergence(y_true, logits, other_logits, sample_weight,
                                             self.pad_id)
        return 0.5 * (loss + other_loss) + 0.5 * self.alpha * divergence


def _sum_over_replicas(value):
    """Sums a scalar over the replicas that train in sync; unchanged on one device."""
    if keras.backend.backend() != "tensorflow":
        return value  # `tf.distribute` replicas exist on the TensorFlow backend alone
    import tensorflow as tf  # here, as above
    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        return value
    return context.all_reduce(tf.distribute.ReduceOp.SUM, value)


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
    """1.0 on each real token of positive weight, else 0.0: metrics count tokens, not
    the loss's weights (scaled under gradient accumulation)."""
    weights = ops.not_equal(y_true, pad_id)
    if sample_weight is not None:
        weights = ops.logical_and(weights, ops.greater(sample_weight, 0))
    return ops.cast(weights, "float32")


def compile_model(model, train_config, optimizer=None, **options):
    """Compiles `model` with the label-smoothed loss and the token metrics.

    A positive `train_config.rdrop_alpha` gives the model an `RDrop`, which its
    `compute_loss` applies in training.

    Args:
        model: `Transformer`, built under the strategy's scope.
        train_config: `TrainConfig`.
        optimizer: optional optimizer replacing `make_optimizer`'s.
        **options: further arguments of `model.compile` (`steps_per_execution`, say).
    """
    pad_id = model.pad_id
    # A training setting, not the architecture's: kept out of the model's config.
    model.rdrop = (RDrop(train_config.rdrop_alpha, pad_id)
                   if train_config.rdrop_alpha else None)
    model.compile(
        optimizer=optimizer or make_optimizer(train_config, model.hidden_dim),
        loss=LabelSmoothedCrossEntropy(train_config.label_smoothing, pad_id=pad_id),
        metrics=[MaskedAccuracy(pad_id=pad_id), TargetTokens(pad_id=pad_id)],
        jit_compile=compiles_step(train_config), **options)


def compiles_step(train_config):
    """Whether the training step is one XLA program: `train.jit_compile` on TensorFlow
    (where "auto" never picks XLA under a strategy), always on JAX (whose steps run op
    by op otherwise)."""
    return bool(train_config.jit_compile) or keras.backend.backend() == "jax"
