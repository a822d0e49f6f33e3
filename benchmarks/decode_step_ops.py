"""The per-step ops of cached decoding: the original patterns, alternatives, the model's.

The decoding profile at batch 32 (`profile_ops` around `greedy_decode`) of the first
cached decoder was dominated by ops whose cost grows with the cache length, not by the
model's matmuls: the full-cache select that wrote one position (`ops.where`), and the
transposes of the cached keys and values into the head-major layout that
`attention_weights` multiplies in. This script times `--steps` loop iterations of each
pattern inside one `tf.function` per variant, alternating variants, on tensors of one
layer's cache. For each pattern: the original code, the alternative first measured, and
what the model does now (imported from it, so this keeps timing the real code):

- cache write: `where(position == index, new, cache)`; `tf.tensor_scatter_nd_update` of
  one row per sentence (batch-major cache `(B, C, H, K)`); the model's `write_by_scatter`
  into values `(B, H, C, K)` and into transposed keys `(B, H, K, C)`;
- attention read: transpose the cache every step; keys kept `(B, H, K, C)` and values
  `(B, H, C, K)`, transposed once outside the loop; the model's `scaled_dot_product_attention`
  on that layout (its scale and float32 softmax included);
- output projection: `matmul(h, transpose(E))` (transposed weights, as tied); a `(D, V)`
  copy made once per decode call; the model's `tied_step_logits`, (E·hᵀ)ᵀ.

    python -m benchmarks.decode_step_ops                 # batch 32, cache 50, d 256
"""

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tensorflow as tf  # noqa: E402

from benchmarks import common  # noqa: E402
from keras_transformer.layers.attention import scaled_dot_product_attention  # noqa: E402
from keras_transformer.layers.decoder_layer import write_by_scatter  # noqa: E402
from keras_transformer.model import tied_step_logits  # noqa: E402


def parse_arguments(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--cache-length", type=int, default=50)
    parser.add_argument("--hidden-dim", type=int, default=256)
    parser.add_argument("--num-heads", type=int, default=4)
    parser.add_argument("--vocabulary-size", type=int, default=8000)
    parser.add_argument("--steps", type=int, default=50, help="loop iterations per call")
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--json", default=None, metavar="PATH", help="write results here")
    return parser.parse_args(argv)


def variants(arguments):
    """Returns `{(pattern, variant): tf.function running --steps iterations}`."""
    b, c, h = arguments.batch, arguments.cache_length, arguments.num_heads
    k, v = arguments.hidden_dim // h, arguments.vocabulary_size
    cache = tf.random.normal((b, c, h, k))
    new = tf.random.normal((b, 1, h, k))
    query = tf.random.normal((b, h, 1, k))
    hidden = tf.random.normal((b, arguments.hidden_dim))
    embeddings = tf.random.normal((v, arguments.hidden_dim))

    def loop(body, state):
        return tf.function(lambda: tf.while_loop(
            lambda i, s: i < arguments.steps, lambda i, s: (i + 1, body(i, s)),
            (tf.constant(0), state))[1])

    def where_write(i, s):
        return tf.where((tf.range(c) == i)[None, :, None, None], new, s)

    def scatter_write(i, s):
        rows = tf.stack([tf.range(b), tf.fill([b], i)], axis=1)  # (B, 2)
        return tf.tensor_scatter_nd_update(s, rows, new[:, 0])

    def model_write_values(i, s):
        return write_by_scatter(s, i, tf.transpose(new, (0, 2, 1, 3)), axis=2)

    def model_write_keys(i, s):
        return write_by_scatter(s, i, tf.transpose(new, (0, 2, 3, 1)), axis=3)

    def read_transposed(i, s):
        keys = tf.transpose(cache, (0, 2, 3, 1))  # (B, H, K, C), every step
        values = tf.transpose(cache, (0, 2, 1, 3))  # (B, H, C, K)
        return s + tf.matmul(tf.nn.softmax(tf.matmul(query, keys)), values)

    keys_once = tf.transpose(cache, (0, 2, 3, 1))
    values_once = tf.transpose(cache, (0, 2, 1, 3))

    def read_head_major(i, s):
        return s + tf.matmul(tf.nn.softmax(tf.matmul(query, keys_once)), values_once)

    def model_read(i, s):
        return s + scaled_dot_product_attention(query, keys_once, values_once)[0]

    def project_transposed(i, s):
        return s + tf.matmul(hidden, embeddings, transpose_b=True)

    projection_once = tf.transpose(embeddings)

    def project_once(i, s):
        return s + tf.matmul(hidden, projection_once)

    def model_project(i, s):
        return s + tied_step_logits(hidden, embeddings)

    logits = tf.zeros((b, v))
    return {("cache write", "where over the cache"): loop(where_write, cache),
            ("cache write", "scatter one position"): loop(scatter_write, cache),
            ("cache write", "model: write_by_scatter, values"): loop(
                model_write_values, tf.transpose(cache, (0, 2, 1, 3))),
            ("cache write", "model: write_by_scatter, keys"): loop(
                model_write_keys, tf.transpose(cache, (0, 2, 3, 1))),
            ("attention read", "transpose every step"): loop(read_transposed,
                                                             tf.zeros_like(query)),
            ("attention read", "head-major cache"): loop(read_head_major,
                                                         tf.zeros_like(query)),
            ("attention read", "model: scaled_dot_product_attention"): loop(model_read,
                                                                    tf.zeros_like(query)),
            ("output projection", "transposed E"): loop(project_transposed, logits),
            ("output projection", "(D, V) copy once"): loop(project_once, logits),
            ("output projection", "model: tied_step_logits"): loop(model_project, logits)}


def main(argv=None):
    arguments = parse_arguments(argv)
    result = common.header(arguments)
    # One tf.function per variant, all from the same lambda: not a retracing problem.
    tf.get_logger().setLevel("ERROR")
    functions = variants(arguments)
    for function in functions.values():
        function()  # trace
    times = {key: [] for key in functions}
    for _ in range(arguments.calls):
        for key, function in functions.items():
            started = time.perf_counter()
            function().numpy()
            times[key].append(time.perf_counter() - started)
    rows = [{"pattern": pattern, "variant": variant,
             "ms_per_step": 1e3 * statistics.median(values) / arguments.steps}
            for (pattern, variant), values in times.items()]
    common.print_table(rows, [("pattern", "pattern"), ("variant", "variant"),
                              ("ms_per_step", "ms per step")])
    result.update(rows=rows, load_average_end=common.load_average())
    common.write_json(arguments.json, result)


if __name__ == "__main__":
    sys.exit(main())
