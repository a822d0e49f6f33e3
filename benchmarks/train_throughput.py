"""Training throughput: our Transformer against an equal keras-hub model under model.fit.

Both models (see `benchmarks.models`) get the same tf.data batches (`batching.make_dataset`
on synthetic ids with a realistic length distribution, or on Multi30K with
`--data-dir`), the same loss, optimizer and schedule (`training.losses.compile_model`).

Speed is measured with the two models in one process, step by step: batch i goes
through one model and then the other (the order alternating), each step a
`model.fit` call of one step timed by a callback, so that whatever else the machine
does hits both alike; the first `--warmup-batches` steps (tracing) are not counted.
Memory is measured apart: each model also trains `--memory-steps` steps in a process of
its own, whose resident-set high-water mark is its peak.

    python -m benchmarks.train_throughput                      # both, default size
    python -m benchmarks.train_throughput --model ours --profile-steps 3
    python -m benchmarks.train_throughput --jit-compile --mixed-precision bfloat16  # GPU
"""

import argparse
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402

from benchmarks import common, models  # noqa: E402
from keras_transformer.config import DataConfig, TrainConfig  # noqa: E402
from keras_transformer.data import batching, corpus  # noqa: E402
from keras_transformer.data import tokenizer as tokenizer_lib  # noqa: E402
from keras_transformer.training import (
    distribution,  # noqa: E402
    fit,  # noqa: E402
)

MODELS = ("ours", "keras_hub")


def parse_arguments(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=("both",) + MODELS, default="both",
                        help="'both': compare; one name: train it alone in this process")
    common.add_model_arguments(parser)
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--attention-dropout", type=float, default=None,
                        help="ours only; default: --dropout, as keras-hub does "
                             "(the paper and our default have none)")
    parser.add_argument("--batch-tokens", type=int, default=4096, help="per side")
    parser.add_argument("--num-pairs", type=int, default=29000,
                        help="synthetic pairs (Multi30K has 29,000)")
    parser.add_argument("--data-dir", default=None,
                        help="Multi30K directory: tokenize its training split instead")
    parser.add_argument("--tokenizer-dir", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--warmup-batches", type=int, default=3,
                        help="steps run before timing starts (tracing included)")
    parser.add_argument("--steps", type=int, default=20, help="timed steps")
    parser.add_argument("--memory-steps", type=int, default=5,
                        help="'both': steps of each model's own process (0: none)")
    parser.add_argument("--profile-steps", type=int, default=0,
                        help="after timing, profile this many steps by op and part")
    parser.add_argument("--jit-compile", action="store_true",
                        help="XLA; batches padded to their bucket's shape, each shape "
                             "compiled before timing")
    parser.add_argument("--mixed-precision", default=None,
                        help="bfloat16 or float16 (GPU)")
    parser.add_argument("--json", default=None, metavar="PATH", help="write results here")
    return parser.parse_args(argv)


def make_data(arguments):
    """Returns `(dataset, vocabulary_size)`: repeating batches of (inputs, targets, weights)."""
    if arguments.tokenizer_dir:
        text = corpus.load_split(DataConfig(data_dir=arguments.data_dir), "train",
                                 verbose=False)
        tokenizer = tokenizer_lib.Tokenizer.load(arguments.tokenizer_dir)
        vocabulary_size = tokenizer.vocabulary_size
    else:
        vocabulary_size = arguments.vocabulary_size
        text = common.synthetic_text(arguments.num_pairs, vocabulary_size,
                                     arguments.max_length)
        tokenizer = common.IdTokenizer()
    dataset = batching.make_dataset(text, tokenizer, batch_tokens=arguments.batch_tokens,
                                max_length=arguments.max_length, shuffle=True,
                                seed=0, repeat=True, pad_to_bucket=arguments.jit_compile,
                                verbose=False)
    return dataset, vocabulary_size


def compiled_model(name, arguments, vocabulary_size):
    """Builds `name` and compiles it as training does (loss, Adam, schedule, metrics)."""
    distribution.set_precision(arguments.mixed_precision)
    keras.utils.set_random_seed(0)
    model = models.build(name, arguments, vocabulary_size)
    fit.compile_model(model, TrainConfig(jit_compile=arguments.jit_compile))
    return model


class StepTimer(keras.callbacks.Callback):
    """Records `(seconds, target tokens)` of every training step (from the metric)."""

    def __init__(self):
        super().__init__()
        self.steps = []

    def on_epoch_begin(self, epoch, logs=None):
        self._tokens = 0.0  # the token metric restarts every epoch

    def on_train_batch_begin(self, batch, logs=None):
        self._begin = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        tokens = float(logs["target_tokens"])
        self.steps.append((time.perf_counter() - self._begin, tokens - self._tokens))
        self._tokens = tokens


def summarize(steps, arguments):
    """Tokens per second, FLOP rate and median step time of timed `(seconds, tokens)`."""
    seconds = sum(step for step, _ in steps)
    tokens = sum(count for _, count in steps)
    flops = common.training_flops_per_target_token(arguments)
    return {"seconds": seconds, "target_tokens": tokens,
            "tokens_per_second": tokens / seconds,
            "gflops_per_second": tokens / seconds * flops / 1e9,
            "median_step_seconds": statistics.median(step for step, _ in steps)}


def measure_alone(arguments):
    """Trains `arguments.model` alone in this process; returns speed and memory."""
    dataset, vocabulary_size = make_data(arguments)
    before_model = common.memory_mb()
    model = compiled_model(arguments.model, arguments, vocabulary_size)
    timer = StepTimer()
    model.fit(dataset, epochs=1, steps_per_epoch=arguments.warmup_batches + arguments.steps,
              callbacks=[timer], shuffle=False, verbose=0)
    warmup = timer.steps[:arguments.warmup_batches]
    result = {"model": arguments.model, "parameters": model.count_params(),
              "vocabulary_size": vocabulary_size,
              **summarize(timer.steps[arguments.warmup_batches:], arguments),
              "warmup_step_seconds": [step for step, _ in warmup],  # tracing first
              "rss_before_model_mb": before_model["rss_mb"], **common.memory_mb()}
    if arguments.profile_steps:
        from benchmarks import profile_ops  # here: TensorFlow's profiler, for this alone
        result["profile"] = profile_ops.profile(
            lambda steps: model.fit(dataset, epochs=1, steps_per_epoch=steps, verbose=0),
            arguments.profile_steps)
    return result


def measure_paired(arguments):
    """Trains both models in this process on the same batches, alternating every step."""
    dataset, vocabulary_size = make_data(arguments)
    total = arguments.warmup_batches + arguments.steps
    batches = dataset.take(total).cache()
    for _ in batches:  # fill the cache: then both models read the very same batches
        pass
    trained = {name: compiled_model(name, arguments, vocabulary_size) for name in MODELS}
    compile_seconds = compile_every_shape(trained, batches) if arguments.jit_compile else {}
    timers = {name: StepTimer() for name in MODELS}
    for step in range(total):
        for name in MODELS if step % 2 == 0 else MODELS[::-1]:
            trained[name].fit(batches.skip(step).take(1), epochs=1, steps_per_epoch=1,
                              callbacks=[timers[name]], shuffle=False, verbose=0)
    timed = {name: timers[name].steps[arguments.warmup_batches:] for name in MODELS}
    rows = [{"model": name, "parameters": trained[name].count_params(),
             "vocabulary_size": vocabulary_size, **summarize(timed[name], arguments),
             **({"xla_compile_seconds": compile_seconds[name]} if compile_seconds else {})}
            for name in MODELS]
    step_ratios = [hub / ours for (ours, _), (hub, _) in zip(timed["ours"],
                                                              timed["keras_hub"])]
    return rows, statistics.median(step_ratios)


def compile_every_shape(trained, batches):
    """Runs each model once on one batch of every input shape in `batches`, untimed.

    Under XLA each new shape is a new compilation (seconds each), which the timed steps
    would otherwise pay whenever they meet a bucket for the first time; the training
    data pads batches to their bucket's shape (`pad_to_bucket`) so that these are few.

    Returns:
        `{name: seconds}`, the time each model spent on these first steps.
    """
    firsts, seen = [], set()
    for index, (inputs, _, _) in enumerate(batches):
        shape = (tuple(inputs["source_ids"].shape), tuple(inputs["target_ids"].shape))
        if shape not in seen:
            seen.add(shape)
            firsts.append(index)
    print(f"Compiling {len(firsts)} batch shapes for each model (XLA)", flush=True)
    seconds = {}
    for name, model in trained.items():
        start = time.perf_counter()
        for index in firsts:
            model.fit(batches.skip(index).take(1), epochs=1, steps_per_epoch=1,
                      shuffle=False, verbose=0)
        seconds[name] = time.perf_counter() - start
    return seconds


def measure_memory(arguments):
    """Peak RSS of each model trained in a process of its own: `{name: result}`."""
    forwarded = _forwarded_arguments(arguments)
    results = {}
    with tempfile.TemporaryDirectory() as scratch:
        for name in MODELS:
            path = os.path.join(scratch, f"{name}.json")
            results[name] = common.run_json_subprocess(
                "benchmarks.train_throughput", ["--model", name, *forwarded], path)
    return results


def _forwarded_arguments(arguments):
    changed = {"steps": arguments.memory_steps}
    skip = {"model", "json", "memory_steps"}
    forwarded = []
    for key, value in {**vars(arguments), **changed}.items():
        flag = "--" + key.replace("_", "-")
        if key in skip or value is None or value is False:
            continue
        forwarded += [flag] if value is True else [flag, str(value)]
    return forwarded


def _train_tokenizer(arguments, directory):
    text = corpus.load_split(DataConfig(data_dir=arguments.data_dir), "train")
    tokenizer = tokenizer_lib.train_tokenizer(text.source_lines + text.target_lines,
                                              arguments.vocabulary_size)
    tokenizer.save(directory)
    return directory


COLUMNS = [("model", "model"), ("parameters", "params"),
           ("tokens_per_second", "target tok/s"), ("gflops_per_second", "GFLOP/s"),
           ("median_step_seconds", "step s"), ("peak_rss_mb", "peak RSS MB"),
           ("rss_before_model_mb", "RSS before model MB"),
           ("alone_tokens_per_second", "alone tok/s"),
           ("xla_compile_seconds", "XLA compile s")]


def compare(arguments):
    """Paired speed, then each model's memory (and unpaired speed) alone."""
    rows, step_ratio = measure_paired(arguments)
    alone = measure_memory(arguments) if arguments.memory_steps else {}
    for row in rows:
        result = alone.get(row["model"], {})
        row.update({key: result.get(key) for key in ("peak_rss_mb", "rss_before_model_mb")},
                   alone_tokens_per_second=result.get("tokens_per_second"),
                   profile=result.get("profile"))
    speed = {row["model"]: row["tokens_per_second"] for row in rows}
    return {"rows": rows, "ours_over_keras_hub": speed["ours"] / speed["keras_hub"],
            "median_step_ratio": step_ratio}


def main(argv=None):
    arguments = parse_arguments(argv)
    result = common.header(arguments)
    with tempfile.TemporaryDirectory() as scratch:
        if arguments.data_dir and not arguments.tokenizer_dir:
            arguments.tokenizer_dir = _train_tokenizer(arguments, scratch)
        if arguments.model == "both":
            result.update(compare(arguments))
            rows = result["rows"]
        else:
            result.update(measure_alone(arguments))
            rows = [result]
    common.print_table(rows, COLUMNS)
    if arguments.model == "both":
        print(f"ours / keras-hub target tokens per second: "
              f"{result['ours_over_keras_hub']:.2f}x (median per-step ratio "
              f"{result['median_step_ratio']:.2f}x)")
    for row in rows:
        if row.get("profile"):
            from benchmarks import profile_ops  # here: TensorFlow's profiler, as above
            print(f"{row['model']}:")
            profile_ops.print_profile(row["profile"])
    result["load_average_end"] = common.load_average()
    common.write_json(arguments.json, result)


if __name__ == "__main__":
    sys.exit(main())
