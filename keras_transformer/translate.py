"""Translate text with an exported translator: one line in, one line out.

    python -m keras_transformer.translate RUN_DIR < sentences.txt
    python -m keras_transformer.translate RUN_DIR/export/translator.tflite \\
        --input sentences.txt --output translations.txt --batch-size 64

The artifact is a SavedModel directory, a `.tflite` file or a run directory (its
`export/saved_model`). Lines are read as bytes and handed to the artifact as they are
(invalid UTF-8 included), so line `i` of the output is always the translation of line
`i` of the input, empty lines included. Sentences are batched by length, which saves
padding, and put back in input order.
"""

import argparse
import contextlib
import sys

from keras_transformer import exported, runtimes


def read_sentences(file):
    """Returns the lines of a binary file as bytes, without `\\n` or `\\r\\n`."""
    lines = file.read().split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    return [line.removesuffix(b"\r") for line in lines]


def translate_sentences(runner, sentences, batch_size=32, progress=None):
    """Returns the translations (list of str) of `sentences`, in their order.

    Args:
        runner: callable, list of sentences -> outputs dict (see `runtimes`).
        sentences: list of str or bytes.
        batch_size: int. Sentences per call.
        progress: optional callable, given the number of sentences done after each
            batch.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}.")
    order = sorted(range(len(sentences)), key=lambda i: len(sentences[i]))
    results = [None] * len(sentences)
    for start in range(0, len(order), batch_size):
        indices = order[start:start + batch_size]
        texts = runtimes.translations(runner([sentences[i] for i in indices]))
        for index, text in zip(indices, texts):
            # One translation per line, whatever characters the detokenizer produced.
            results[index] = " ".join(text.splitlines())
        if progress:
            progress(min(start + batch_size, len(order)))
    return results


def _progress_bar(total):
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
    runner = runtimes.open_runner(exported.resolve_artifact(args.artifact), beam=args.beam)
    if args.input:
        with open(args.input, "rb") as file:
            sentences = read_sentences(file)
    else:
        sentences = read_sentences(sys.stdin.buffer)
    progress = (_progress_bar(len(sentences))
                if args.input and sentences and not args.no_progress else None)
    translations = translate_sentences(runner, sentences, args.batch_size, progress)
    text = "".join(f"{translation}\n" for translation in translations)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as file:
            file.write(text)
    else:
        # Bytes: the translations are UTF-8 whatever the terminal's locale says.
        sys.stdout.buffer.write(text.encode("utf-8"))
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
