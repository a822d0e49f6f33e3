"""Peak memory of `keras-transformer translate` on long inputs: it must stay flat.

    python -m benchmarks.translate_memory --artifact EXPORT/translator.tflite \\
        --lines 10000 1000000

For each count, writes a file of that many lines (the fixture corpus's validation
sentences, repeated), translates it with the command in a fresh process, and reports
the process's peak resident memory (`VmHWM`), the wall time and lines per second. The
translate command reads a window of batches at a time, so the peak should not grow with
the length of the input.
"""

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time

from benchmarks import common

FIXTURE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                       "tests", "fixtures", "corpus", "own-val.en.gz")
# Runs the command in-process, then prints the peak resident memory.
CHILD = """
import sys
from keras_transformer import cli
status = cli.main(["translate", *sys.argv[1:]])
peak = [line for line in open("/proc/self/status") if line.startswith("VmHWM")][0]
print(status, int(peak.split()[1]) // 1024, file=sys.stderr)
"""


def parse_arguments(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--artifact", required=True, help="a SavedModel or .tflite file")
    parser.add_argument("--lines", type=int, nargs="+", action=common.ListOption,
                        default=[10_000, 1_000_000], help="input lengths to measure")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--json", default=None, metavar="PATH", help="write results here")
    return parser.parse_args(argv)


def measure(artifact, lines, batch_size, directory):
    with gzip.open(FIXTURE, "rt", encoding="utf-8") as file:
        sentences = file.read().splitlines()
    source = os.path.join(directory, f"input-{lines}.txt")
    with open(source, "w", encoding="utf-8") as file:
        for index in range(lines):
            file.write(sentences[index % len(sentences)] + "\n")
    output = os.path.join(directory, f"output-{lines}.txt")
    start = time.perf_counter()
    completed = subprocess.run(
        [sys.executable, "-c", CHILD, artifact, "--input", source, "--output", output,
         "--batch-size", str(batch_size), "--no-progress"],
        capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - start
    status, peak_mb = completed.stderr.strip().splitlines()[-1].split()
    if status != "0":
        raise RuntimeError(completed.stderr[-3000:])
    with open(output, "rb") as file:
        written = sum(1 for _ in file)
    return {"lines": lines, "written": written, "peak_rss_mb": int(peak_mb),
            "seconds": seconds, "lines_per_second": lines / seconds}


def main(argv=None):
    arguments = parse_arguments(argv)
    result = common.header(arguments)
    with tempfile.TemporaryDirectory() as directory:
        rows = [measure(arguments.artifact, lines, arguments.batch_size, directory)
                for lines in arguments.lines]
    common.print_table(rows, [("lines", "lines"), ("peak_rss_mb", "peak RSS MB"),
                              ("seconds", "seconds"), ("lines_per_second", "lines/s")])
    result.update(rows=rows, load_average_end=common.load_average())
    common.write_json(arguments.json, result)
    print(json.dumps({row["lines"]: row["peak_rss_mb"] for row in rows}))


if __name__ == "__main__":
    sys.exit(main())
