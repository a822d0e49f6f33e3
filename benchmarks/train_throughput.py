"""Training throughput: our Transformer against an equal keras-hub model under model.fit.

Both models get the same tf.data batches (`data.make_dataset` on synthetic ids with a
realistic length distribution, or on Multi30K with `--data-dir`), the same loss,
optimizer and schedule (`training.compile_model`) and the same number of warm-up and
timed steps. Each model trains in its own process, so that its memory high-water mark is
its own; with `--repeats` the order alternates and the median counts.

    python -m benchmarks.train_throughput                      # both, default size
    python -m benchmarks.train_throughput --steps 5 --hidden-dim 64 --json out.json
    python -m benchmarks.train_throughput --jit-compile --mixed-precision bfloat16  # GPU

The keras-hub model is assembled from `TokenAndPositionEmbedding`, `TransformerEncoder`
and `TransformerDecoder` with the same vocabulary, widths, heads and layers, one
embedding shared by both sides and reused (reversed) as the output projection, as ours
ties them (§3.4). keras-hub drops attention weights with the layer's `dropout`; ours
is given the same `attention_dropout` so that both do the same work.
"""

import argparse
import os
import statistics
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402

from benchmarks import common  # noqa: E402

MODELS = ("ours", "keras_hub")


def parse_arguments(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=("both",) + MODELS, default="both",
                        help="'both' runs each model in its own process and compares")
    common.add_model_arguments(parser)
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--batch-tokens", type=int, default=4096, help="per side")
    parser.add_argument("--num-pairs", type=int, default=29000,
                        help="synthetic pairs (Multi30K has 29,000)")
    parser.add_argument("--data-dir", default=None,
                        help="Multi30K directory: tokenize its training split instead")
    parser.add_argument("--tokenizer-dir", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--warmup-batches", type=int, default=3,
                        help="steps run before timing starts (tracing included)")
    parser.add_argument("--steps", type=int, default=20, help="timed steps")
    parser.add_argument("--repeats", type=int, default=1, help="processes per model")
    parser.add_argument("--profile-steps", type=int, default=0,
                        help="after timing, profile this many steps by op and part")
    parser.add_argument("--jit-compile", action="store_true", help="XLA (GPU)")
    parser.add_argument("--mixed-precision", default=None,
                        help="bfloat16 or float16 (GPU)")
    parser.add_argument("--json", default=None, metavar="PATH", help="write results here")
    return parser.parse_args(argv)


def make_data(arguments):
    """Returns `(dataset, vocabulary_size)`: repeating batches of (inputs, targets, weights)."""
    from keras_transformer import data
    if arguments.data_dir or arguments.tokenizer_dir:
        from keras_transformer import corpus, tokenizer as tokenizer_lib
        from keras_transformer.config import DataConfig
        text = corpus.load_split(DataConfig(data_dir=arguments.data_dir), "train",
                                 verbose=False)
        tokenizer = tokenizer_lib.Tokenizer.load(arguments.tokenizer_dir)
        vocabulary_size = tokenizer.vocabulary_size
    else:
        vocabulary_size = arguments.vocabulary_size
        text = common.synthetic_text(arguments.num_pairs, vocabulary_size,
                                     arguments.max_length)
        tokenizer = common.IdTokenizer()
    dataset = data.make_dataset(text, tokenizer, batch_tokens=arguments.batch_tokens,
                                max_length=arguments.max_length, shuffle=True,
                                seed=0, repeat=True, verbose=False)
    return dataset, vocabulary_size


def build_ours(arguments, vocabulary_size):
    from keras_transformer.model import Transformer
    return Transformer(
        vocabulary_size, num_layers=arguments.num_layers, hidden_dim=arguments.hidden_dim,
        intermediate_dim=arguments.intermediate_dim, num_heads=arguments.num_heads,
        dropout=arguments.dropout, attention_dropout=arguments.dropout,
        max_length=arguments.max_length,
        use_fused_attention=arguments.use_fused_attention)


def build_keras_hub(arguments, vocabulary_size):
    """The same architecture from keras-hub's layers, as a functional model."""
    import keras_hub
    from keras import ops
    source_ids = keras.Input((None,), dtype="int32", name="source_ids")
    target_ids = keras.Input((None,), dtype="int32", name="target_ids")
    # Explicit masks: Keras 3 attention drops implicit ones after the first layer.
    source_padding = ops.not_equal(source_ids, 0)
    target_padding = ops.not_equal(target_ids, 0)
    embedding = keras_hub.layers.TokenAndPositionEmbedding(
        vocabulary_size, arguments.max_length, arguments.hidden_dim, tie_weights=True,
        name="shared_embedding")
    embedding_dropout = keras.layers.Dropout(arguments.dropout)
    layer_arguments = dict(intermediate_dim=arguments.intermediate_dim,
                           num_heads=arguments.num_heads, dropout=arguments.dropout,
                           layer_norm_epsilon=1e-6)
    x = embedding_dropout(embedding(source_ids))
    for _ in range(arguments.num_layers):
        x = keras_hub.layers.TransformerEncoder(**layer_arguments)(
            x, padding_mask=source_padding)
    y = embedding_dropout(embedding(target_ids))
    for _ in range(arguments.num_layers):
        y = keras_hub.layers.TransformerDecoder(**layer_arguments)(
            y, x, decoder_padding_mask=target_padding, encoder_padding_mask=source_padding)
    logits = embedding.token_embedding(y, reverse=True)
    model = keras.Model({"source_ids": source_ids, "target_ids": target_ids}, logits,
                        name="keras_hub_transformer")
    # What `training.compile_model` reads from a model.
    model.pad_id, model.hidden_dim = 0, arguments.hidden_dim
    return model


class StepTimer(keras.callbacks.Callback):
    """Times the steps after `warmup_batches`, so that tracing is left out."""

    def __init__(self, warmup_batches):
        super().__init__()
        self.warmup_batches = warmup_batches
        self.marks = []  # (time, cumulative target tokens) after each batch

    def on_train_batch_end(self, batch, logs=None):
        self.marks.append((time.perf_counter(), float(logs["target_tokens"])))

    def timed(self):
        marks = self.marks[self.warmup_batches - 1:]
        (start, tokens_start), (end, tokens_end) = marks[0], marks[-1]
        step_seconds = [b[0] - a[0] for a, b in zip(marks, marks[1:])]
        return {"seconds": end - start, "target_tokens": tokens_end - tokens_start,
                "tokens_per_second": (tokens_end - tokens_start) / (end - start),
                "median_step_seconds": statistics.median(step_seconds),
                "start_seconds": start}


def measure(arguments):
    """Trains `arguments.model` in this process; returns its numbers."""
    from keras_transformer import distribution, training
    from keras_transformer.config import TrainConfig
    started = time.perf_counter()
    dataset, vocabulary_size = make_data(arguments)
    train_config = TrainConfig(label_smoothing=0.1, warmup_steps=4000,
                               jit_compile=arguments.jit_compile)
    distribution.set_precision(arguments.mixed_precision)
    keras.utils.set_random_seed(0)
    before_model = common.memory_mb()
    build = build_ours if arguments.model == "ours" else build_keras_hub
    model = build(arguments, vocabulary_size)
    training.compile_model(model, train_config)
    timer = StepTimer(arguments.warmup_batches)
    model.fit(dataset, epochs=1, steps_per_epoch=arguments.warmup_batches + arguments.steps,
              callbacks=[timer], shuffle=False, verbose=0)
    timed = timer.timed()
    timed["warmup_seconds"] = timed.pop("start_seconds") - started
    flops = common.training_flops_per_target_token(arguments)
    result = {"model": arguments.model, "parameters": model.count_params(),
              "vocabulary_size": vocabulary_size, **timed,
              "gflops_per_second": timed["tokens_per_second"] * flops / 1e9,
              "rss_before_model_mb": before_model["rss_mb"], **common.memory_mb()}
    if arguments.profile_steps:
        from benchmarks import profile_ops
        result["profile"] = profile_ops.profile(
            lambda steps: model.fit(dataset, epochs=1, steps_per_epoch=steps, verbose=0),
            arguments.profile_steps)
    return result


def compare(arguments):
    """Runs each model in its own process(es); returns the rows and the speed ratio."""
    forwarded = _forwarded_arguments(arguments)
    with tempfile.TemporaryDirectory() as scratch:
        if arguments.data_dir:
            forwarded += ["--tokenizer-dir", _train_tokenizer(arguments, scratch)]
        rows = []
        for repeat in range(arguments.repeats):
            # Alternate the order so that a trend in the machine's load hits both.
            order = MODELS if repeat % 2 == 0 else MODELS[::-1]
            for name in order:
                path = os.path.join(scratch, f"{name}-{repeat}.json")
                result = common.run_json_subprocess(
                    "benchmarks.train_throughput", ["--model", name, *forwarded], path)
                rows.append({**result, "repeat": repeat})
    speed = {name: statistics.median(row["tokens_per_second"] for row in rows
                                     if row["model"] == name) for name in MODELS}
    return rows, speed["ours"] / speed["keras_hub"]


def _forwarded_arguments(arguments):
    skip = {"model", "json", "repeats", "data_dir", "tokenizer_dir"}
    forwarded = []
    for key, value in vars(arguments).items():
        flag = "--" + key.replace("_", "-")
        if key in skip or value is None or value is False:
            continue
        forwarded += [flag] if value is True else [flag, str(value)]
    return forwarded


def _train_tokenizer(arguments, scratch):
    from keras_transformer import corpus, tokenizer as tokenizer_lib
    from keras_transformer.config import DataConfig
    text = corpus.load_split(DataConfig(data_dir=arguments.data_dir), "train")
    tokenizer = tokenizer_lib.train_tokenizer(text.source_lines + text.target_lines,
                                              arguments.vocabulary_size)
    directory = os.path.join(scratch, "tokenizer")
    tokenizer.save(directory)
    return directory


COLUMNS = [("model", "model"), ("repeat", "run"), ("parameters", "params"),
           ("tokens_per_second", "target tok/s"), ("gflops_per_second", "GFLOP/s"),
           ("median_step_seconds", "step s"),
           ("warmup_seconds", "start+trace s"), ("peak_rss_mb", "peak RSS MB"),
           ("rss_before_model_mb", "RSS before model MB")]


def main(argv=None):
    arguments = parse_arguments(argv)
    result = common.header(arguments)
    if arguments.model == "both":
        rows, ratio = compare(arguments)
        result.update(rows=rows, ours_over_keras_hub=ratio)
        common.print_table(rows, COLUMNS)
        print(f"ours / keras-hub target tokens per second: {ratio:.2f}x")
    else:
        result.update(measure(arguments))
        rows = [result]
    for row in rows:
        if "profile" in row:
            from benchmarks import profile_ops
            print(f"{row['model']}:")
            profile_ops.print_profile(row["profile"])
    result["load_average_end"] = common.load_average()
    common.write_json(arguments.json, result)


if __name__ == "__main__":
    main()
