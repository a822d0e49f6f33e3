"""Adam with the warmup schedule of §5.3, as a `TrainConfig` sets them.

Apart from `training` (which needs TensorFlow for its data), so that a training step can
be built on any Keras backend (`benchmarks.mfu`).
"""

import keras

from keras_transformer.schedules import WarmupInverseSqrtSchedule


def make_schedule(train_config, hidden_dim):
    """Returns the warmup schedule of §5.3 as `train_config` sets it."""
    return WarmupInverseSqrtSchedule(
        hidden_dim, train_config.warmup_steps, train_config.learning_rate_scale,
        gradient_accumulation_steps=train_config.gradient_accumulation_steps)


def make_optimizer(train_config, hidden_dim=None, *, schedule=None):
    """Returns Adam with the warmup schedule, accumulating gradients if asked.

    Args:
        train_config: `TrainConfig`.
        hidden_dim: int. The model's width, for a new `make_schedule`.
        schedule: the schedule to use instead (`make_schedule`'s, kept by the caller).
    """
    if schedule is None:
        schedule = make_schedule(train_config, hidden_dim)
    accumulation = train_config.gradient_accumulation_steps
    return keras.optimizers.Adam(
        schedule, beta_1=train_config.beta_1, beta_2=train_config.beta_2,
        epsilon=train_config.epsilon,
        gradient_accumulation_steps=accumulation if accumulation > 1 else None)
