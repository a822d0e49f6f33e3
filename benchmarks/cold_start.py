"""Cold start: wall time from process start to the first translation, per artifact.

Each run launches a new Python process (`benchmarks/first_translation.py`) that opens
the artifact with the package's runner (a SavedModel needs TensorFlow and tf-text, a
`.tflite` file LiteRT and tf-text's kernels alone) and translates one sentence; the
clock starts just before the launch. Without `--export-dir`, a randomly initialised model
of the given size is exported first (the greedy translator with `--output-length`
tokens, END never winning, as in `benchmarks.decode_throughput`). The operating system's
file cache is warm after the first run (dropping it needs root), so run 1 is the
coldest; the median of `--runs` is reported for each artifact.

    python -m benchmarks.cold_start --runs 5
    python -m benchmarks.cold_start --export-dir runs/multi30k-en-de/export
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
from keras_transformer import files  # noqa: E402

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "first_translation.py")


def parse_arguments(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--export-dir", default=None,
                        help="an export directory (its SavedModel and .tflite file); "
                             "default: export a random model")
    parser.add_argument("--runs", type=int, default=5, help="fresh processes per artifact")
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
            "open_s": marks["loaded"] - marks["started"],
            "first_call_s": marks["translated"] - marks["loaded"],
            "start_to_first_translation_s": marks["translated"] - launched,
            "second_call_s": marks["translated_again"] - marks["translated"],
            "process_total_s": exited - launched,
            "tensorflow_imported": marks["tensorflow_imported"]}


def export_random_model(arguments, directory):
    """Exports the decoding benchmark's random-init translator; returns the directory."""
    # Here: they load TensorFlow, which timing an --export-dir does not need.
    from benchmarks import decode_throughput
    from keras_transformer.serving import export
    _, translator = decode_throughput.build(arguments)
    export.export_translator(translator, directory, quantize=False)
    return directory


COLUMNS = [("artifact", "artifact"), ("run", "run"), ("python_start_s", "python s"),
           ("open_s", "open s"), ("first_call_s", "1st call s"),
           ("start_to_first_translation_s", "start→1st translation s"),
           ("second_call_s", "2nd call s"), ("tensorflow_imported", "TF imported")]


def main(argv=None):
    arguments = parse_arguments(argv)
    result = common.header(arguments)
    with tempfile.TemporaryDirectory() as scratch:
        export_dir = arguments.export_dir or export_random_model(arguments, scratch)
        artifacts = {"saved_model": os.path.join(export_dir, files.SAVED_MODEL),
                     "tflite": os.path.join(export_dir, files.TFLITE)}
        rows = [{"artifact": name, "run": run + 1, **first_translation(path)}
                for name, path in artifacts.items() for run in range(arguments.runs)]
    common.print_table(rows, COLUMNS)
    medians = {name: {key: statistics.median(row[key] for row in rows
                                             if row["artifact"] == name)
                      for key, _ in COLUMNS[2:-1]}
               for name in artifacts}
    for name, median in medians.items():
        print(f"{name}: median start→first translation "
              f"{median['start_to_first_translation_s']:.2f} s")
    result.update(rows=rows, median=medians, load_average_end=common.load_average())
    common.write_json(arguments.json, result)


if __name__ == "__main__":
    sys.exit(main())
