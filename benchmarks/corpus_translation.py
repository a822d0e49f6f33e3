"""`translate-corpus` on Apache Beam against `translate` in one process, on one corpus.

    python -m benchmarks.corpus_translation --artifact EXPORT/translator_dynamic_range.tflite \\
        --source val.en.gz --lines 100000 --workers 1 2 --json results/corpus.json

Writes a corpus of `--lines` lines (the source's sentences, repeated, with an empty line
every 1,000, a line 30 sentences long every 997 and a Latin-1 line every 1,009),
translates it with `translate` and with `translate-corpus` on N workers of Beam's
in-process runner (threads per worker = cores / N), each in a fresh process, and reports
sentences/s, the speedup over `translate` and the efficiency (speedup / N), the model
load time per worker (Beam's RunInference measures it), the start-up of the pipeline
alone (`translate-corpus` on an empty file), lines in and out, and whether the output's
sha256 is `translate`'s. Needs the beam extra.
"""

import argparse
import gzip
import hashlib
import os
import re
import subprocess
import sys
import tempfile
import time

from benchmarks import common


def parse_arguments(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--artifact", required=True, help="any artifact translate takes")
    parser.add_argument("--source", required=True, help="sentences (plain or .gz)")
    parser.add_argument("--lines", type=int, default=100_000)
    parser.add_argument("--workers", type=int, nargs="+", action=common.ListOption,
                        default=[1, 2], help="worker counts of translate-corpus")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--json", default=None, metavar="PATH", help="write results here")
    return parser.parse_args(argv)


def write_corpus(source, lines, path):
    opener = gzip.open if source.endswith(".gz") else open
    with opener(source, "rb") as file:
        sentences = file.read().splitlines()
    with open(path, "wb") as file:
        for index in range(lines):
            sentence = sentences[index % len(sentences)]
            if index % 1000 == 999:
                sentence = b""
            elif index % 997 == 996:
                sentence = b" ".join(sentences[index % len(sentences):][:30])
            elif index % 1009 == 1008:
                sentence += b" caf\xe9"  # Latin-1: not UTF-8
            file.write(sentence + b"\n")


def run(arguments):
    command = [sys.executable, "-m", "keras_transformer", *map(str, arguments),
               "--no-progress"]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    return seconds, done.stderr


def sha256_and_lines(path):
    with open(path, "rb") as file:
        data = file.read()
    return hashlib.sha256(data).hexdigest(), data.count(b"\n")


def main(argv=None):
    arguments = parse_arguments(argv)
    result = common.header(arguments)
    cores = os.cpu_count() or 1
    rows = []
    with tempfile.TemporaryDirectory() as directory:
        corpus = os.path.join(directory, "corpus.txt")
        write_corpus(arguments.source, arguments.lines, corpus)
        empty = os.path.join(directory, "empty.txt")
        open(empty, "wb").close()
        reference = os.path.join(directory, "translate.out")
        seconds, _ = run(["translate", arguments.artifact, "--input", corpus, "--output",
                          reference, "--batch-size", arguments.batch_size])
        digest, lines = sha256_and_lines(reference)
        rows.append({"command": "translate", "workers": 1, "seconds": seconds,
                     "sentences_per_second": arguments.lines / seconds, "speedup": 1.0,
                     "efficiency": 1.0, "lines_out": lines, "same_sha256": True})
        for workers in arguments.workers:
            beam_args = ["--direct_num_workers", workers, "--threads",
                         max(1, cores // workers)]
            startup, _ = run(["translate-corpus", arguments.artifact, "--input", empty,
                              "--output", os.path.join(directory, f"empty-{workers}.out"),
                              *beam_args])
            output = os.path.join(directory, f"corpus-{workers}.out")
            seconds, stderr = run(["translate-corpus", arguments.artifact, "--input",
                                   corpus, "--output", output, "--batch-size",
                                   arguments.batch_size, *beam_args])
            load = re.search(r"(\d+) model load\(s\), ([\d.]+) s each", stderr)
            digest_n, lines_n = sha256_and_lines(output)
            speedup = rows[0]["seconds"] / seconds
            rows.append({"command": "translate-corpus", "workers": workers,
                         "seconds": seconds,
                         "sentences_per_second": arguments.lines / seconds,
                         "speedup": speedup, "efficiency": speedup / workers,
                         "startup_seconds": startup,
                         "model_loads": int(load.group(1)) if load else 0,
                         "load_seconds": float(load.group(2)) if load else None,
                         "lines_out": lines_n, "same_sha256": digest_n == digest,
                         "summary": stderr.strip().splitlines()[-1]})
    common.print_table(rows, [("command", "command"), ("workers", "N"),
                              ("seconds", "seconds"), ("sentences_per_second", "sent/s"),
                              ("speedup", "speedup"), ("efficiency", "efficiency"),
                              ("startup_seconds", "start-up s"),
                              ("load_seconds", "load s/worker"), ("lines_out", "lines out"),
                              ("same_sha256", "sha256 = translate's")])
    result.update(lines_in=arguments.lines, rows=rows, load_average_end=common.load_average())
    common.write_json(arguments.json, result)


if __name__ == "__main__":
    sys.exit(main())
