"""The warmup schedule against a NumPy transcription of the paper's equation (3)."""

import keras
import numpy as np
import pytest

from keras_transformer.training.optimization import WarmupInverseSqrtSchedule


def paper_learning_rate(step, hidden_dim, warmup_steps, scale=1.0):
    """§5.3: lrate = d_model^-0.5 · min(step^-0.5, step · warmup_steps^-1.5), step ≥ 1."""
    step = np.asarray(step, dtype=np.float64)
    return scale * hidden_dim ** -0.5 * np.minimum(step ** -0.5, step * warmup_steps ** -1.5)


@pytest.mark.parametrize("hidden_dim, warmup_steps, scale", [(512, 4000, 1.0), (256, 1000, 2.0)])
def test_schedule_matches_the_paper_at_key_steps(hidden_dim, warmup_steps, scale):
    schedule = WarmupInverseSqrtSchedule(hidden_dim, warmup_steps, learning_rate_scale=scale)
    for paper_step in (1, 2, warmup_steps // 2, warmup_steps, 2 * warmup_steps, 100_000):
        # Keras iteration i is the paper's step i + 1.
        got = float(schedule(paper_step - 1))
        want = paper_learning_rate(paper_step, hidden_dim, warmup_steps, scale)
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_schedule_peaks_at_warmup_with_the_papers_value():
    schedule = WarmupInverseSqrtSchedule(hidden_dim=512, warmup_steps=4000)
    iterations = np.arange(0, 12000)
    rates = np.asarray(schedule(iterations))
    assert int(np.argmax(rates)) == 4000 - 1
    np.testing.assert_allclose(rates.max(), (512 * 4000) ** -0.5, rtol=1e-6)
    assert np.all(np.diff(rates[:3999]) > 0)
    assert np.all(np.diff(rates[3999:]) < 0)


def test_first_iteration_has_a_nonzero_rate():
    assert float(WarmupInverseSqrtSchedule(32, 50)(0)) > 0.0


def test_accumulation_counts_weight_updates_not_micro_batches():
    plain = WarmupInverseSqrtSchedule(64, warmup_steps=10)
    accumulated = WarmupInverseSqrtSchedule(64, warmup_steps=10, gradient_accumulation_steps=4)
    for update in (0, 3, 9, 25):
        for micro_batch in range(4):
            np.testing.assert_allclose(
                float(accumulated(4 * update + micro_batch)), float(plain(update)), rtol=1e-7)


def test_get_config_round_trip_and_serialization():
    schedule = WarmupInverseSqrtSchedule(256, warmup_steps=1000, learning_rate_scale=2.0,
                                         gradient_accumulation_steps=2)
    clone = WarmupInverseSqrtSchedule.from_config(schedule.get_config())
    assert clone.get_config() == schedule.get_config()
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(schedule))
    assert isinstance(restored, WarmupInverseSqrtSchedule)
    assert restored.get_config() == schedule.get_config()
    np.testing.assert_allclose(float(restored(1234)), float(schedule(1234)))


def test_adam_with_the_schedule_survives_optimizer_serialization():
    optimizer = keras.optimizers.Adam(WarmupInverseSqrtSchedule(32, 50), beta_1=0.9,
                                      beta_2=0.98, epsilon=1e-9)
    restored = keras.optimizers.Adam.from_config(optimizer.get_config())
    assert restored.get_config()["learning_rate"] == optimizer.get_config()["learning_rate"]
    assert restored.get_config()["learning_rate"]["config"]["warmup_steps"] == 50


@pytest.mark.parametrize("arguments", [dict(warmup_steps=0), dict(gradient_accumulation_steps=0)])
def test_invalid_arguments_are_rejected(arguments):
    with pytest.raises(ValueError):
        WarmupInverseSqrtSchedule(32, **arguments)
