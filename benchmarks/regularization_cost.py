"""Training cost per step of each regularisation option, against the preset's own step.

    python -m benchmarks.regularization_cost                    # multi30k, 3 variants
    python -m benchmarks.regularization_cost --preset multi30k_hour --variant rdrop_alpha=1

Each variant is the preset with `FIELD=VALUE` overrides (several in one variant joined
by commas); by default R-Drop (`rdrop_alpha=5`), `mixed_precision=bfloat16`, and the
preset without word dropout (`token_dropout=0`, for presets that have it on). The
preset and every variant train in one process on the same batches (synthetic ids with
realistic lengths, or Multi30K's with `--data-dir`), step by step in turn with the order
rotating, so that whatever else the machine does hits all alike; the first
`--warmup-batches` steps (tracing) are not counted. Printed: median seconds per step, and
each variant's median over steps of its step time divided by the preset's on the same
batch.
"""

import argparse
import os
import statistics
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402

from benchmarks import common  # noqa: E402
from benchmarks.train_throughput import StepTimer  # noqa: E402
from keras_transformer import config as config_lib  # noqa: E402
from keras_transformer import runs  # noqa: E402
from keras_transformer.config import DataConfig  # noqa: E402
from keras_transformer.data import batching, corpus  # noqa: E402
from keras_transformer.data import tokenizer as tokenizer_lib  # noqa: E402
from keras_transformer.training import distribution, fit  # noqa: E402

DEFAULT_VARIANTS = ("rdrop_alpha=5", "mixed_precision=bfloat16", "token_dropout=0")
BASELINE = "preset"


def parse_arguments(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", choices=sorted(config_lib.PRESETS), default="multi30k")
    parser.add_argument("--variant", action="append", metavar="FIELD=VALUE[,...]",
                        help="overrides of one variant; repeat for more (default: "
                             f"{' '.join(DEFAULT_VARIANTS)})")
    parser.add_argument("--data-dir", default=None,
                        help="Multi30K directory: its training pairs (and a tokenizer "
                             "trained on them) instead of synthetic ids")
    parser.add_argument("--num-pairs", type=int, default=29000,
                        help="synthetic pairs (Multi30K has 29,000)")
    parser.add_argument("overrides", nargs="*", metavar="FIELD=VALUE",
                        help="overrides of the preset itself, for every variant (e.g. a "
                             "smaller model for a smoke run)")
    parser.add_argument("--warmup-batches", type=int, default=3,
                        help="steps run before timing starts (tracing included)")
    parser.add_argument("--steps", type=int, default=20, help="timed steps")
    parser.add_argument("--json", default=None, metavar="PATH", help="write results here")
    return parser.parse_args(argv)


def variant_configs(arguments):
    """`{name: Config}`: the preset (with `arguments.overrides`) first, then each variant."""
    base = config_lib.override(config_lib.preset_config(arguments.preset),
                               arguments.overrides)
    configs = {BASELINE: base}
    for variant in arguments.variant or DEFAULT_VARIANTS:
        configs[variant] = config_lib.override(base, variant.split(","))
        config_lib.check_config(configs[variant])
        if configs[variant] == base and not arguments.variant:
            del configs[variant]  # a default the preset has already: no second copy
    return configs


def make_batches(config, arguments, total):
    """Returns `(batches, vocabulary_size)`: the first `total` training batches, cached,
    so that every variant reads the same ones."""
    vocabulary_size = config.model.vocabulary_size
    if arguments.data_dir:
        text = corpus.load_split(DataConfig(data_dir=arguments.data_dir), "train",
                                 verbose=False)
        tokenizer = tokenizer_lib.train_tokenizer(text.source_lines + text.target_lines,
                                                  vocabulary_size)
        vocabulary_size = tokenizer.vocabulary_size  # may hold fewer pieces than asked
    else:
        text = common.synthetic_text(arguments.num_pairs, vocabulary_size,
                                     config.model.max_length)
        tokenizer = common.IdTokenizer()
    batches = batching.make_dataset(
        text, tokenizer, batch_tokens=config.data.batch_tokens,
        max_length=config.model.max_length, shuffle=True, seed=0, repeat=True,
        verbose=False).take(total).cache()
    for _ in batches:  # fill the cache
        pass
    return batches, vocabulary_size


def compiled_model(config, vocabulary_size):
    """The variant's model, built in its precision and compiled as training compiles it."""
    previous = keras.mixed_precision.global_policy()
    distribution.set_precision(distribution.backend_precision(config.train.mixed_precision))
    try:
        keras.utils.set_random_seed(0)
        model = runs.build_model(config_lib.override(
            config, [f"vocabulary_size={vocabulary_size}"]))
        fit.compile_model(model, config.train)
    finally:
        keras.mixed_precision.set_global_policy(previous)
    return model


def measure(arguments):
    configs = variant_configs(arguments)
    base = configs[BASELINE]
    total = arguments.warmup_batches + arguments.steps
    batches, vocabulary_size = make_batches(base, arguments, total)
    models = {name: compiled_model(config, vocabulary_size)
              for name, config in configs.items()}
    timers = {name: StepTimer() for name in models}
    names = list(models)
    for step in range(total):
        shift = step % len(names)
        for name in names[shift:] + names[:shift]:
            models[name].fit(batches.skip(step).take(1), epochs=1, steps_per_epoch=1,
                             callbacks=[timers[name]], shuffle=False, verbose=0)
    timed = {name: [seconds for seconds, _ in timers[name].steps[arguments.warmup_batches:]]
             for name in names}
    rows = []
    for name in names:
        ratios = [mine / theirs for mine, theirs in zip(timed[name], timed[BASELINE])]
        rows.append({"variant": name, "median_step_seconds": statistics.median(timed[name]),
                     "median_step_ratio": statistics.median(ratios),
                     "parameters": models[name].count_params()})
    return {"preset": arguments.preset, "batch_tokens": base.data.batch_tokens,
            "rows": rows}


COLUMNS = [("variant", "variant"), ("median_step_seconds", "step s"),
           ("median_step_ratio", "× preset's step"), ("parameters", "params")]


def main(argv=None):
    arguments = parse_arguments(argv)
    result = common.header(arguments)
    result.update(measure(arguments), load_average_end=common.load_average())
    common.print_table(result["rows"], COLUMNS)
    common.write_json(arguments.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
