"""Cold start: wall time from process start to the first translation from a SavedModel.

Each run launches a new Python process (`benchmarks/first_translation.py`) that imports
TensorFlow and tf-text, loads the SavedModel and translates one sentence; the clock
starts just before the launch. Without `--saved-model`, a randomly initialised model of
the given size is exported first (the greedy translator with `--output-length` tokens,
END never winning, as in `benchmarks.decode_throughput`). The operating system's file
cache is warm after the first run (dropping it needs root), so run 1 is the coldest.

    python -m benchmarks.cold_start --runs 3
    python -m benchmarks.cold_start --saved-model runs/multi30k-en-de/export/saved_model
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from benchmarks import common  # noqa: E402

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "first_translation.py")


def parse_arguments(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--saved-model", default=None,
                        help="an exported translator; default: export a random model")
    parser.add_argument("--runs", type=int, default=3, help="fresh processes")
    parser.add_argument("--output-length", type=int, default=50)
    common.add_model_arguments(parser)
    parser.add_argument("--json", default=None, metavar="PATH", help="write results here")
    return parser.parse_args(argv)


def first_translation(path):
    """Launches one process; returns its phases in seconds since the launch."""
    environment = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    launched = time.time()
    completed = subprocess.run([sys.executable, CHILD, path], capture_output=True,
                               text=True, env=environment, check=False)
    exited = time.time()
    if completed.returncode != 0:
        raise RuntimeError(f"{CHILD} failed:\n{completed.stderr[-3000:]}")
    marks = json.loads(completed.stdout.strip().splitlines()[-1])
    return {"python_start_s": marks["started"] - launched,
            "import_s": marks["imported"] - marks["started"],
            "load_s": marks["loaded"] - marks["imported"],
            "first_call_s": marks["translated"] - marks["loaded"],
            "start_to_first_translation_s": marks["translated"] - launched,
            "second_call_s": marks["translated_again"] - marks["translated"],
            "process_total_s": exited - launched}


def export_random_model(arguments, directory):
    """Exports the decoding benchmark's random-init translator; returns its path."""
    from benchmarks import decode_throughput
    from keras_transformer.serving import translator as serving
    _, translator = decode_throughput.build(arguments)
    path = os.path.join(directory, "saved_model")
    serving.save_saved_model(translator, path)
    return path


COLUMNS = [("run", "run"), ("python_start_s", "python s"), ("import_s", "import s"),
           ("load_s", "load s"), ("first_call_s", "1st call s"),
           ("start_to_first_translation_s", "start→1st translation s"),
           ("second_call_s", "2nd call s")]


def main(argv=None):
    arguments = parse_arguments(argv)
    result = common.header(arguments)
    with tempfile.TemporaryDirectory() as scratch:
        path = arguments.saved_model or export_random_model(arguments, scratch)
        rows = [{"run": run + 1, **first_translation(path)}
                for run in range(arguments.runs)]
        size_mb = sum(os.path.getsize(os.path.join(root, name))
                      for root, _, names in os.walk(path) for name in names) / 2**20
    common.print_table(rows, COLUMNS)
    median = {key: statistics.median(row[key] for row in rows)
              for key, _ in COLUMNS[1:]}
    print(f"median start→first translation: {median['start_to_first_translation_s']:.2f} s "
          f"(imports {median['import_s']:.2f} s)")
    result.update(rows=rows, median=median, saved_model_mb=size_mb,
                  load_average_end=common.load_average())
    common.write_json(arguments.json, result)


if __name__ == "__main__":
    main()
