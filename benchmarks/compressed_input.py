"""translate-corpus numbering one compressed input and reading its chunks: each chunk
decompressing the file up to its last line, against the text numbering writes, which
every chunk seeks into.

    python -m benchmarks.compressed_input --lines 1000000 --compression gz

Writes `--lines` lines of made-up words (12 on average, `corpus_bytes`), compresses them,
then, in this process, numbers the file and reads every chunk (`translate`'s windows of
`--batch-size` × 64 lines) both ways: numbering alone, then each chunk read from the
compressed file (`read_chunk` without the text: the work grows with the square of the
file); numbering that writes the text, then each chunk read from it. Prints seconds and
the megabytes decompressed (at least: readers decompress a little past a chunk's last
line); both ways must read the same lines. Needs the beam extra.
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


def number_and_read(path, window, text_to=None):
    """Numbers `path` (writing its text to `text_to`, if given) and reads every chunk;
    returns the seconds of each, the chunks and their lines."""
    start = time.perf_counter()
    numbered = translate_corpus.number_lines(path, text_to=text_to)
    numbering = time.perf_counter() - start
    chunks = translate_corpus.plan_chunks([numbered], window)
    texts = {path: text_to} if text_to else None
    start = time.perf_counter()
    lines = [line for chunk in chunks for line in translate_corpus.read_chunk(chunk, texts)]
    return numbering, time.perf_counter() - start, chunks, lines


def main(argv=None):
    arguments = parse_arguments(argv)
    result = common.header(arguments)
    window = arguments.batch_size * translate.WINDOW_BATCHES
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, f"corpus.{arguments.compression}")
        text = corpus_bytes(arguments.lines)
        with open(path, "wb") as file:
            file.write(COMPRESSORS[arguments.compression](text))
        rows = []
        for name, text_to in [("each chunk decompresses the file", None),
                              ("numbering writes the text", os.path.join(directory, "text"))]:
            numbering, reading, chunks, lines = number_and_read(path, window, text_to)
            if text_to is None:
                # Each chunk decompresses the file up to its last line; numbering once.
                line_ends = [index + 1 for index, byte in enumerate(text) if byte == 0x0A]
                decompressed = len(text) + sum(
                    line_ends[chunk.first_line + chunk.lines - 1] for chunk in chunks)
                first_lines = lines
            elif lines != first_lines:
                raise RuntimeError("the text's chunks are not the compressed file's")
            else:
                decompressed = len(text)
            rows.append({"read": name, "seconds": numbering + reading,
                         "numbering_seconds": numbering, "reading_seconds": reading,
                         "decompressed_mb": decompressed / 1e6})
    for row in rows:
        row["ratio"] = row["seconds"] / rows[0]["seconds"]
    print(f"{arguments.lines:,} lines, {len(text) / 1e6:.1f} MB, {len(chunks):,} chunks, "
          f"{arguments.compression}:")
    common.print_table(rows, [("read", "chunks read"), ("seconds", "seconds"),
                              ("numbering_seconds", "numbering"),
                              ("reading_seconds", "reading chunks"),
                              ("decompressed_mb", "MB decompressed (at least)"),
                              ("ratio", "× the first")])
    result.update(chunks=len(chunks), text_mb=len(text) / 1e6, rows=rows,
                  load_average_end=common.load_average())
    common.write_json(arguments.json, result)


if __name__ == "__main__":
    sys.exit(main())
