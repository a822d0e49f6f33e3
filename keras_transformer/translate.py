"""Translate text with an exported translator: one line in, one line out.

    python -m keras_transformer.translate RUN_DIR < sentences.txt
    python -m keras_transformer.translate RUN_DIR/export/translator.tflite \\
        --input sentences.txt --output translations.txt --batch-size 64

The artifact is a SavedModel directory, a `.tflite` file or a run directory (its
`export/saved_model`). Lines are read as bytes and handed to the artifact as they are
(invalid UTF-8 included), so line `i` of the output is always the translation of line
`i` of the input, empty lines included. Sentences are batched by length, which saves
padding, and put back in input order. Long inputs are translated and written in chunks of
`CHUNK_BATCHES` batches, so a run that is interrupted or fails keeps every chunk it
finished, and says how many lines that is.
"""

import argparse
import contextlib
import sys

from keras_transformer import exported, output_paths, runtimes


def read_sentences(file):
    """Returns the lines of a binary file as bytes, without `\\n` or `\\r\\n`."""
    lines = file.read().split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    return [line.removesuffix(b"\r") for line in lines]


# Batches per chunk: sorting by length within 64 batches saves nearly as much padding as
# sorting the whole input, and a failure loses at most one chunk's work.
CHUNK_BATCHES = 64


def translate_sentences(runner, sentences, batch_size=32, progress=None):
    """Returns the translations (list of str) of `sentences`, in their order.

    Args:
        runner: callable, list of sentences -> outputs dict (see `runtimes`).
        sentences: list of str or bytes.
        batch_size: int. Sentences per call.
        progress: optional callable, given the number of sentences done after each
            batch.
    """
    return [translation for chunk in translation_chunks(runner, sentences, batch_size,
                                                       progress)
            for translation in chunk]


def translation_chunks(runner, sentences, batch_size=32, progress=None):
    """Yields the translations of consecutive chunks of `sentences`, in input order.

    Each chunk holds `CHUNK_BATCHES` batches of sentences (the last one fewer), batched
    by length within the chunk. Arguments as `translate_sentences`.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}.")
    chunk_size = batch_size * CHUNK_BATCHES
    for chunk_start in range(0, len(sentences), chunk_size):
        chunk = sentences[chunk_start:chunk_start + chunk_size]
        order = sorted(range(len(chunk)), key=lambda i: len(chunk[i]))
        results = [None] * len(chunk)
        for start in range(0, len(order), batch_size):
            indices = order[start:start + batch_size]
            texts = runtimes.translations(runner([chunk[i] for i in indices]))
            for index, text in zip(indices, texts):
                # One translation per line, whatever characters the detokenizer produced.
                results[index] = " ".join(text.splitlines())
            if progress:
                progress(chunk_start + min(start + batch_size, len(order)))
        yield results


def progress_bar(total):
    """Returns an update function for a Keras progress bar drawn on stderr."""
    import keras

    bar = keras.utils.Progbar(total, unit_name="sentence")

    def update(done):
        # Progbar writes to stdout, which may be carrying the translations.
        with contextlib.redirect_stdout(sys.stderr):
            bar.update(done)

    return update


def main(argv=None):
    """Command line; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m keras_transformer.translate",
        description="Translate sentences (one per line) with an exported translator.")
    parser.add_argument("artifact", help="SavedModel directory, .tflite file, or run "
                                         "directory (uses RUN_DIR/export/saved_model)")
    parser.add_argument("-i", "--input", help="input file (default: standard input)")
    parser.add_argument("-o", "--output", help="output file (default: standard output)")
    parser.add_argument("--batch-size", type=int, default=32, help="sentences per call")
    parser.add_argument("--beam", action="store_true",
                        help="beam search instead of greedy decoding")
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress bar (shown by default when reading a file)")
    args = parser.parse_args(argv)
    if args.batch_size < 1:
        parser.error(f"--batch-size must be at least 1, got {args.batch_size}")
    try:
        output_paths.check_output_file("--output", args.output, {"--input": args.input})
        runner = runtimes.open_runner(exported.resolve_artifact(args.artifact),
                                      beam=args.beam)
        if args.input:
            with open(args.input, "rb") as file:
                sentences = read_sentences(file)
        else:
            sentences = read_sentences(sys.stdin.buffer)
        # Bytes: the translations are UTF-8 whatever the terminal's locale says.
        output = (open(args.output, "wb") if args.output
                  else contextlib.nullcontext(sys.stdout.buffer))
    except (ValueError, OSError) as error:  # bad arguments or files: no traceback
        print(f"error: {error}", file=sys.stderr)
        return 2
    progress = (progress_bar(len(sentences))
                if args.input and sentences and not args.no_progress else None)
    with output as stream:
        done = 0
        try:
            for chunk in translation_chunks(runner, sentences, args.batch_size, progress):
                stream.write("".join(f"{line}\n" for line in chunk).encode("utf-8"))
                stream.flush()
                done += len(chunk)
        except (Exception, KeyboardInterrupt) as error:
            print(f"\nStopped after {done} of {len(sentences)} sentences: "
                  f"{args.output or 'standard output'} holds the translations of the "
                  f"first {done} lines.", file=sys.stderr)
            if isinstance(error, KeyboardInterrupt):
                return 130
            raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
