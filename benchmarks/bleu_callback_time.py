"""Time the validation-BLEU callback's translations with and without XLA, on a real run.

`BleuCallback` translates the same validation slice at the end of every epoch, inside
the training time. This script loads a finished run's weights and times that
translation both ways, each after a warm-up call (tracing, XLA compilation), alternating
the two so that machine noise falls on both alike, and checks that both translate alike.

    python -m benchmarks.bleu_callback_time RUN_DIR --sentences 200 --repeats 3
"""

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from benchmarks import common  # noqa: E402
from keras_transformer import runs  # noqa: E402
from keras_transformer.training import bleu as bleu_callback


def parse_arguments(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    common.add_run_arguments(parser)
    parser.add_argument("--sentences", type=int, default=200,
                        help="validation sentences translated per call (default: 200)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="timed translations of the slice per mode (default: 3)")
    parser.add_argument("--json", default=None, metavar="PATH", help="write results here")
    return parser.parse_args(argv)


def main(argv=None):
    arguments = parse_arguments(argv)
    result = common.header(arguments)
    run_config, tokenizer, model = runs.load_run(arguments.run_dir, arguments.weights)
    sources, references = bleu_callback.validation_slice(run_config.data,
                                                         arguments.sentences)
    callbacks = {mode: bleu_callback.BleuCallback(sources, references, tokenizer,
                                                  jit_compile=mode == "xla", verbose=False)
                 for mode in ("graph", "xla")}
    seconds = {mode: [] for mode in callbacks}
    translations = {}
    warmup = {}
    for mode, callback in callbacks.items():
        callback.set_model(model)
        started = time.perf_counter()
        translations[mode] = callback.translate(sources)
        warmup[mode] = time.perf_counter() - started
    for _ in range(arguments.repeats):
        for mode, callback in callbacks.items():
            started = time.perf_counter()
            callback.translate(sources)
            seconds[mode].append(time.perf_counter() - started)
    rows = [{"mode": mode, "median_seconds": statistics.median(times),
             "warmup_seconds": warmup[mode]} for mode, times in seconds.items()]
    common.print_table(rows, [("mode", "decoding"), ("median_seconds", "s / slice"),
                              ("warmup_seconds", "first call s")])
    same = translations["graph"] == translations["xla"]
    speedup = rows[0]["median_seconds"] / rows[1]["median_seconds"]
    print(f"graph / xla: {speedup:.2f}x; same translations: {same}")
    result.update(rows=rows, graph_over_xla=speedup, same_translations=same,
                  load_average_end=common.load_average())
    common.write_json(arguments.json, result)


if __name__ == "__main__":
    sys.exit(main())
