"""Adam with the paper's learning-rate schedule: linear warmup, then inverse square root (§5.3).

`WarmupInverseSqrtSchedule` is the schedule; `make_schedule` and `make_optimizer` build
it and Adam as a `TrainConfig` sets them. Nothing here needs TensorFlow, so a training
step can be built on any Keras backend.
"""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_transformer")
class WarmupInverseSqrtSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """`scale · d_model^-0.5 · min(step^-0.5, step · warmup_steps^-1.5)`.

    The rate rises linearly for `warmup_steps` updates, peaks at
    `scale · (d_model · warmup_steps)^-0.5` and then decays with the inverse square root of
    the step. Keras counts optimizer iterations from 0 while the formula counts from 1,
    so iteration `i` is the paper's step `i + 1` (its step 0 would give a rate of 0).

    With gradient accumulation, Keras calls the schedule with the number of micro-batches
    seen; dividing by `gradient_accumulation_steps` keeps the formula in weight updates,
    which is what the paper's steps are.

    The formula is multiplied by `multiplier`, a non-trainable variable that stays 1
    unless a callback changes it while training runs (`callbacks.LearningRateCooldown`
    takes it to 0 over the end of a run). It is a variable rather than a number so that
    the compiled training step reads its current value.

    Args:
        hidden_dim: int. Model width (`d_model` in the paper).
        warmup_steps: int. Updates of linear warmup. Defaults to `4000` (the paper's).
        learning_rate_scale: float. Multiplies the whole formula; `1.0` is the paper's.
        gradient_accumulation_steps: int. Micro-batches per weight update. Defaults to `1`.
        name: str. Name scope of the computation.

    Example:

    >>> schedule = WarmupInverseSqrtSchedule(hidden_dim=512, warmup_steps=4000)
    >>> round(float(schedule(3999)), 8)  # the peak, at the paper's step 4000
    0.00069877

    References:
        - [Vaswani et al., 2017](https://arxiv.org/abs/1706.03762), §5.3, equation (3).
    """

    def __init__(self, hidden_dim, warmup_steps=4000, learning_rate_scale=1.0,
                 gradient_accumulation_steps=1, name="warmup_inverse_sqrt"):
        super().__init__()
        if warmup_steps < 1:
            raise ValueError(f"warmup_steps must be at least 1, got {warmup_steps}.")
        if gradient_accumulation_steps < 1:
            raise ValueError("gradient_accumulation_steps must be at least 1, got "
                             f"{gradient_accumulation_steps}.")
        self.hidden_dim = hidden_dim
        self.warmup_steps = warmup_steps
        self.learning_rate_scale = learning_rate_scale
        self.gradient_accumulation_steps = gradient_accumulation_steps
        self.name = name
        self.multiplier = keras.Variable(1.0, dtype="float32", trainable=False,
                                         name="learning_rate_multiplier")

    def __call__(self, step):
        with keras.name_scope(self.name):
            # int32 (2·10⁹ steps) rather than int64, which JAX lacks by default.
            updates = ops.floor_divide(ops.cast(step, "int32"), self.gradient_accumulation_steps)
            step = ops.cast(updates, "float32") + 1.0  # the paper counts from 1
            decay = ops.rsqrt(step)
            warmup = step * float(self.warmup_steps) ** -1.5
            return (self.learning_rate_scale * float(self.hidden_dim) ** -0.5
                    * ops.minimum(decay, warmup) * ops.convert_to_tensor(self.multiplier))

    def get_config(self):
        return {
            "hidden_dim": self.hidden_dim,
            "warmup_steps": self.warmup_steps,
            "learning_rate_scale": self.learning_rate_scale,
            "gradient_accumulation_steps": self.gradient_accumulation_steps,
            "name": self.name,
        }


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
