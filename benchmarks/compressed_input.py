"""translate-corpus reading the chunks of one compressed input: each chunk decompressing
the file up to its first line, against one decompressed copy that every chunk seeks into.

    python -m benchmarks.compressed_input --lines 1000000 --compression gz

Writes `--lines` lines of made-up words (12 on average, `corpus_bytes`), compresses them,
numbers the file and cuts it into `translate`'s windows (`--batch-size` × 64 lines) as
translate-corpus does, then reads every chunk both ways in this process: from the
compressed file (`read_chunk` without copies: the work grows with the square of the
file), and after writing the copy (`_decompressed_copies`, the copy's time included).
Prints seconds, megabytes decompressed and the ratio; both must read the same lines.
Needs the beam extra.
"""

import argparse
import bz2
import gzip
import lzma
import os
import random
import sys
import tempfile
import time
import zlib

from benchmarks import common
from keras_transformer import translate, translate_corpus

COMPRESSORS = {"gz": gzip.compress, "bz2": bz2.compress, "xz": lzma.compress,
               "deflate": zlib.compress,
               "zst": lambda data: translate_corpus.zstandard.ZstdCompressor().compress(data)}


def parse_arguments(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--compression", choices=sorted(COMPRESSORS), default="gz")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--json", default=None, metavar="PATH", help="write results here")
    return parser.parse_args(argv)


def corpus_bytes(lines):
    """Lines of 6 to 18 words drawn (seeded) from 5,000 made-up ones, Zipf-like: text
    that compresses about as natural text does, unlike a few words repeated."""
    rng = random.Random(0)
    letters = "etaoinshrdlcumwfgypbvkjxqz"
    vocabulary = ["".join(rng.choices(letters, weights=range(26, 0, -1),
                                      k=rng.randint(2, 10))) for _ in range(5000)]
    weights = [1 / rank for rank in range(1, len(vocabulary) + 1)]
    return "".join(" ".join(rng.choices(vocabulary, weights, k=rng.randint(6, 18))) + "\n"
                   for _ in range(lines)).encode("ascii")


def read_all(chunks, copies=None):
    start = time.perf_counter()
    lines = [line for chunk in chunks for line in translate_corpus.read_chunk(chunk, copies)]
    return time.perf_counter() - start, lines


def main(argv=None):
    arguments = parse_arguments(argv)
    result = common.header(arguments)
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, f"corpus.{arguments.compression}")
        text = corpus_bytes(arguments.lines)
        with open(path, "wb") as file:
            file.write(COMPRESSORS[arguments.compression](text))
        numbered = translate_corpus.number_lines(path)
        chunks = translate_corpus.plan_chunks(
            [numbered], arguments.batch_size * translate.WINDOW_BATCHES)
        # Read without a copy, each chunk decompresses the file up to its last line.
        line_ends = [index + 1 for index, byte in enumerate(text) if byte == 0x0A]
        ends = [line_ends[chunk.first_line + chunk.lines - 1] for chunk in chunks]
        own_seconds, own_lines = read_all(chunks)
        parts = os.path.join(directory, "out.parts")
        os.mkdir(parts)
        start = time.perf_counter()
        copies = translate_corpus._decompressed_copies(parts, [numbered], {path},
                                                       progress=False)
        copy_seconds = time.perf_counter() - start
        read_seconds, copy_lines = read_all(chunks, copies)
        if own_lines != copy_lines:
            raise RuntimeError("the copy's chunks are not the compressed file's")
        rows = [{"read": "each chunk decompresses the file", "seconds": own_seconds,
                 "decompressed_mb": sum(ends) / 1e6, "ratio": 1.0},
                {"read": "one decompressed copy", "seconds": copy_seconds + read_seconds,
                 "copy_seconds": copy_seconds, "decompressed_mb": len(text) / 1e6,
                 "ratio": (copy_seconds + read_seconds) / own_seconds}]
    print(f"{arguments.lines:,} lines, {len(text) / 1e6:.1f} MB, {len(chunks):,} chunks, "
          f"{arguments.compression}:")
    common.print_table(rows, [("read", "chunks read"), ("seconds", "seconds"),
                              ("copy_seconds", "of which the copy"),
                              ("decompressed_mb", "MB decompressed"),
                              ("ratio", "× the first")])
    result.update(chunks=len(chunks), text_mb=len(text) / 1e6, rows=rows,
                  load_average_end=common.load_average())
    common.write_json(arguments.json, result)


if __name__ == "__main__":
    sys.exit(main())
