"""Forward + backward time of the label-smoothed loss: TF's fused kernel vs logsumexp.

The training profile (`train_throughput --profile-steps`) put the loss at about an
eighth of a step when it was written as `logsumexp(z) - (1-ε)·z_y - ε·mean(z)`, much of
it in the gradient of `take_along_axis` (an `UnsortedSegmentSum` over the `(B, T, V)`
logits). `losses.LabelSmoothedCrossEntropy` now calls
`tf.nn.softmax_cross_entropy_with_logits` with smoothed one-hot labels (one fused kernel
computing loss and gradient). This script times both forms, alternately in one process
on the same logits, and checks that they give the same values and gradients.

    python -m benchmarks.loss_step                       # a 4096-token batch, V = 8000
"""

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from benchmarks import common  # noqa: E402
from keras_transformer.training.losses import LabelSmoothedCrossEntropy  # noqa: E402


def parse_arguments(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=205, help="B (205 × 20 ≈ 4096)")
    parser.add_argument("--length", type=int, default=20, help="T")
    parser.add_argument("--vocabulary-size", type=int, default=8000, help="V")
    parser.add_argument("--label-smoothing", type=float, default=0.1)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--json", default=None, metavar="PATH", help="write results here")
    return parser.parse_args(argv)


def logsumexp_loss(label_smoothing, pad_id=0):
    """The same loss as `LabelSmoothedCrossEntropy` (one device), written with logsumexp."""
    def loss(targets, logits, weights):
        log_normalizer = tf.reduce_logsumexp(logits, axis=-1)  # (B, T)
        true_logit = tf.gather(logits, targets[..., None], axis=-1, batch_dims=2)[..., 0]
        per_token = log_normalizer - (1.0 - label_smoothing) * true_logit - (
            label_smoothing * tf.reduce_mean(logits, axis=-1))  # (B, T)
        weights = weights * tf.cast(targets != pad_id, tf.float32)
        return tf.math.divide_no_nan(tf.reduce_sum(per_token * weights),
                                     tf.reduce_sum(weights))
    return loss


def gradient_step(loss):
    """Returns a `tf.function` computing `(loss, d loss / d logits)`."""
    @tf.function
    def step(targets, logits, weights):
        with tf.GradientTape() as tape:
            tape.watch(logits)
            value = loss(targets, logits, weights)
        return value, tape.gradient(value, logits)
    return step


def main(argv=None):
    arguments = parse_arguments(argv)
    result = common.header(arguments)
    generator = np.random.default_rng(0)
    shape = (arguments.batch, arguments.length)
    logits = tf.constant(generator.normal(size=(*shape, arguments.vocabulary_size)),
                         tf.float32)
    targets = tf.constant(generator.integers(0, arguments.vocabulary_size, shape), tf.int32)
    weights = tf.cast(targets != 0, tf.float32)
    ours = LabelSmoothedCrossEntropy(arguments.label_smoothing)
    steps = {"keras_transformer": gradient_step(
                 lambda y, p, w: ours(y, p, sample_weight=w)),
             "logsumexp": gradient_step(logsumexp_loss(arguments.label_smoothing))}
    outputs = {name: step(targets, logits, weights) for name, step in steps.items()}
    times = {name: [] for name in steps}
    for _ in range(arguments.calls):
        for name, step in steps.items():
            started = time.perf_counter()
            step(targets, logits, weights)[1].numpy()
            times[name].append(time.perf_counter() - started)
    rows = [{"loss": name, "median_ms": 1e3 * statistics.median(values),
             "value": float(outputs[name][0])} for name, values in times.items()]
    common.print_table(rows, [("loss", "loss"), ("median_ms", "fwd+bwd ms"),
                              ("value", "value")])
    difference = float(tf.reduce_max(tf.abs(outputs["keras_transformer"][1]
                                            - outputs["logsumexp"][1])))
    speedup = rows[1]["median_ms"] / rows[0]["median_ms"]
    print(f"fused kernel (ours) vs logsumexp: {speedup:.2f}x faster; largest gradient difference "
          f"{difference:.2e}")
    result.update(rows=rows, speedup=speedup, max_gradient_difference=difference,
                  load_average_end=common.load_average())
    common.write_json(arguments.json, result)


if __name__ == "__main__":
    sys.exit(main())
