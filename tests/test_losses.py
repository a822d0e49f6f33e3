"""The loss and the token metrics against NumPy references; padding never counts."""

import keras
import numpy as np
import pytest

from keras_transformer.training.losses import (
    LabelSmoothedCrossEntropy,
    MaskedAccuracy,
    TargetTokens,
)

# Compares float computations: also run on Eigen's kernels in CI (tests/numerics.py).
pytestmark = pytest.mark.numerics


def numpy_log_softmax(logits):
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def numpy_label_smoothed_loss(target_ids, logits, smoothing, weights=None):
    """Cross-entropy against (1 - ε)·one_hot + ε/V, summed over non-pad tokens times
    their `weights` and divided by the number of non-pad tokens of positive weight."""
    vocabulary_size = logits.shape[-1]
    smoothed = (1 - smoothing) * np.eye(vocabulary_size)[target_ids] + smoothing / vocabulary_size
    token_losses = -(smoothed * numpy_log_softmax(logits.astype(np.float64))).sum(axis=-1)
    mask = (target_ids != 0).astype(np.float64)
    if weights is not None:
        mask = mask * weights
    return (token_losses * mask).sum() / (mask > 0).sum()


def make_batch(seed=0, batch=3, length=5, vocabulary_size=11):
    rng = np.random.default_rng(seed)
    target_ids = rng.integers(1, vocabulary_size, size=(batch, length)).astype(np.int32)
    target_ids[0, 3:] = 0  # padded rows of different lengths
    target_ids[2, 1:] = 0
    logits = rng.normal(scale=3.0, size=(batch, length, vocabulary_size)).astype(np.float32)
    return target_ids, logits


@pytest.mark.parametrize("smoothing", [0.0, 0.1, 0.3])
def test_loss_matches_numpy_reference(smoothing):
    target_ids, logits = make_batch()
    got = float(LabelSmoothedCrossEntropy(label_smoothing=smoothing)(target_ids, logits))
    np.testing.assert_allclose(got, numpy_label_smoothed_loss(target_ids, logits, smoothing),
                               rtol=1e-5)


def test_without_smoothing_it_is_masked_sparse_cross_entropy():
    target_ids, logits = make_batch(seed=1)
    token_losses = keras.losses.sparse_categorical_crossentropy(
        target_ids, logits, from_logits=True)
    mask = target_ids != 0
    want = float(np.asarray(token_losses)[mask].mean())
    got = float(LabelSmoothedCrossEntropy(label_smoothing=0.0)(target_ids, logits))
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_padding_contributes_nothing():
    target_ids, logits = make_batch(seed=2)
    loss = LabelSmoothedCrossEntropy(label_smoothing=0.1)
    reference = float(loss(target_ids, logits))
    # Whatever the model predicts at padded positions does not matter...
    scrambled = logits.copy()
    scrambled[target_ids == 0] = np.random.default_rng(3).normal(
        scale=50.0, size=scrambled[target_ids == 0].shape)
    np.testing.assert_allclose(float(loss(target_ids, scrambled)), reference, rtol=1e-6)
    # ...and neither do extra padded positions or padded rows.
    padded_ids = np.pad(target_ids, ((0, 2), (0, 4)))
    padded_logits = np.pad(logits, ((0, 2), (0, 4), (0, 0)), constant_values=7.0)
    np.testing.assert_allclose(float(loss(padded_ids, padded_logits)), reference, rtol=1e-6)


def test_sample_weight_multiplies_each_tokens_loss():
    # Weights scale tokens' shares, as gradient accumulation's do; the divisor is the
    # count of weighted tokens, so weights of 0 leave tokens out.
    target_ids, logits = make_batch(seed=4)
    weights = np.random.default_rng(5).uniform(0.5, 2.0, size=target_ids.shape)
    weights[1, 2] = 0.0
    loss = LabelSmoothedCrossEntropy(label_smoothing=0.1)
    got = float(loss(target_ids, logits, sample_weight=weights.astype(np.float32)))
    np.testing.assert_allclose(
        got, numpy_label_smoothed_loss(target_ids, logits, 0.1, weights), rtol=1e-5)
    # The pipeline's loss weights (targets != 0) give the unweighted value.
    np.testing.assert_allclose(
        float(loss(target_ids, logits, sample_weight=(target_ids != 0).astype(np.float32))),
        float(loss(target_ids, logits)), rtol=1e-7)


def test_all_padding_gives_zero_not_nan():
    logits = np.zeros((2, 3, 5), np.float32)
    assert float(LabelSmoothedCrossEntropy()(np.zeros((2, 3), np.int32), logits)) == 0.0


def test_get_config_round_trip_and_invalid_smoothing():
    loss = LabelSmoothedCrossEntropy(label_smoothing=0.2, pad_id=0)
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(loss))
    assert isinstance(restored, LabelSmoothedCrossEntropy)
    assert restored.get_config() == loss.get_config()
    with pytest.raises(ValueError):
        LabelSmoothedCrossEntropy(label_smoothing=1.0)


def test_masked_accuracy_ignores_padding():
    target_ids = np.array([[1, 2, 3, 0, 0], [4, 0, 0, 0, 0]])
    predicted = np.array([[1, 2, 4, 0, 0], [1, 0, 0, 0, 0]])  # right at pads, on purpose
    logits = np.eye(6, dtype=np.float32)[predicted]
    metric = MaskedAccuracy()
    metric.update_state(target_ids, logits)
    assert float(metric.result()) == pytest.approx(2 / 4)
    metric.update_state(target_ids, logits, sample_weight=np.array([[1, 1, 1, 1, 1],
                                                                    [0, 0, 0, 0, 0]]))
    assert float(metric.result()) == pytest.approx(4 / 7)


def test_target_tokens_counts_real_tokens():
    metric = TargetTokens()
    metric.update_state(np.array([[5, 6, 0], [7, 0, 0]]), np.zeros((2, 3, 9), np.float32))
    assert float(metric.result()) == 3.0
    assert TargetTokens.from_config(metric.get_config()).pad_id == 0


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_portable_form_for_other_backends_matches_the_tensorflow_kernel(smoothing):
    from keras_transformer.training import losses
    target_ids, logits = make_batch(seed=4)
    want = np.asarray(losses._tensorflow_cross_entropy(target_ids, logits, smoothing))
    got = np.asarray(losses._portable_cross_entropy(target_ids, logits, smoothing))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert want.shape == target_ids.shape
