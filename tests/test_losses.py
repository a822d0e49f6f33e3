"""The loss and the token metrics against NumPy references; padding never counts."""

import keras
import numpy as np
import pytest

from keras_transformer.training.losses import (
    LabelSmoothedCrossEntropy,
    MaskedAccuracy,
    TargetTokens,
    symmetric_kl_divergence,
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


# --- R-Drop ---------------------------------------------------------------------------

def numpy_symmetric_kl(target_ids, logits, other_logits, weights=None):
    """½ (KL(p‖q) + KL(q‖p)) per token, written as the two divergences' definition,
    summed over non-pad tokens times their weights, over the tokens of positive weight."""
    log_p = numpy_log_softmax(logits.astype(np.float64))
    log_q = numpy_log_softmax(other_logits.astype(np.float64))
    kl_pq = (np.exp(log_p) * (log_p - log_q)).sum(axis=-1)
    kl_qp = (np.exp(log_q) * (log_q - log_p)).sum(axis=-1)
    mask = (target_ids != 0).astype(np.float64)
    if weights is not None:
        mask = mask * weights
    return (0.5 * (kl_pq + kl_qp) * mask).sum() / (mask > 0).sum()


def test_symmetric_kl_divergence_matches_numpy_reference():
    target_ids, logits = make_batch(seed=3)
    _, other_logits = make_batch(seed=4)
    weights = np.random.default_rng(5).uniform(0.5, 2.0, size=target_ids.shape)
    for sample_weight in (None, weights):
        found = float(symmetric_kl_divergence(target_ids, logits, other_logits,
                                              sample_weight))
        expected = numpy_symmetric_kl(target_ids, logits, other_logits, sample_weight)
        assert found == pytest.approx(expected, rel=1e-5)
    assert float(symmetric_kl_divergence(target_ids, logits, logits)) == pytest.approx(
        0.0, abs=1e-6)


def _tiny_transformer(dropout):
    from keras_transformer.model import Transformer
    keras.utils.set_random_seed(0)
    return Transformer(vocabulary_size=13, num_layers=1, hidden_dim=8, intermediate_dim=16,
                       num_heads=2, dropout=dropout, max_length=8)


def _rdrop_batch():
    rng = np.random.default_rng(7)
    source = rng.integers(1, 13, size=(3, 6)).astype(np.int32)
    target = rng.integers(1, 13, size=(3, 5)).astype(np.int32)
    source[1, 4:] = target[2, 2:] = 0
    inputs = {"source_ids": source, "target_ids": target}
    return inputs, np.roll(target, -1, axis=1)


def test_rdrop_loss_is_the_papers_on_two_dropout_passes(monkeypatch):
    from keras_transformer.config import TrainConfig
    from keras_transformer.training.losses import compile_model
    model = _tiny_transformer(dropout=0.3)
    compile_model(model, TrainConfig(label_smoothing=0.1, rdrop_alpha=4.0))
    passes = []
    call = model.call
    monkeypatch.setattr(model, "call", lambda *args, **kwargs: passes.append(
        call(*args, **kwargs)) or passes[-1])
    inputs, targets = _rdrop_batch()
    first = model(inputs, training=True)
    loss = float(model.compute_loss(inputs, targets, first, training=True))
    assert len(passes) == 2  # compute_loss made the second pass
    logits, other = (np.asarray(keras.ops.convert_to_numpy(p)) for p in passes)
    assert not np.allclose(logits, other)  # each pass had its own dropout
    expected = (0.5 * (numpy_label_smoothed_loss(targets, logits, 0.1)
                       + numpy_label_smoothed_loss(targets, other, 0.1))
                + 0.5 * 4.0 * numpy_symmetric_kl(targets, logits, other))
    assert loss == pytest.approx(expected, rel=1e-5)
    # Validation computes the plain loss of its one pass.
    plain = float(model.compute_loss(inputs, targets, first, training=False))
    assert len(passes) == 2
    assert plain == pytest.approx(numpy_label_smoothed_loss(targets, logits, 0.1), rel=1e-5)


def test_rdrop_is_off_by_default_and_trains_through_fit():
    from keras_transformer.config import TrainConfig
    from keras_transformer.training.losses import RDrop, compile_model
    assert TrainConfig().rdrop_alpha == 0.0
    model = _tiny_transformer(dropout=0.1)
    compile_model(model, TrainConfig())
    assert model.rdrop is None
    compile_model(model, TrainConfig(rdrop_alpha=1.0))
    assert isinstance(model.rdrop, RDrop) and model.rdrop.alpha == 1.0
    inputs, targets = _rdrop_batch()
    history = model.fit(inputs, targets, epochs=2, batch_size=3, verbose=0)
    assert all(np.isfinite(history.history["loss"]))
    with pytest.raises(ValueError, match="positive"):
        RDrop(0.0)
