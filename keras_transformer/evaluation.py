"""Evaluation: translate a source file with an exported translator and score it with sacreBLEU.

What is served is what is scored: the default is to run the exported SavedModel (or a
`.tflite` file) on the source text and score its output, so tokenization, the decode loop
and detokenization are the ones users get. Scores are sacreBLEU's BLEU and chrF on
detokenized, cased text with its default `13a` tokenization, each printed with its
sacreBLEU signature so that numbers from different runs can be compared honestly.

Command line:

    python -m keras_transformer.evaluation --artifact RUN_DIR/export/saved_model \\
        --source test_2016_flickr.en.gz --reference test_2016_flickr.de.gz \\
        [--beam] [--session] [--batch-size 64] [--output hypotheses.de] \\
        [--json scores.json] [--quiet]

`--artifact` also takes a `.tflite` file (greedy only), or a run directory, which stands
for its `export/saved_model`: a run not exported yet is exported first (as `python -m
export RUN_DIR` does; `--no-export` fails instead). `--session` loads the SavedModel with
the session-based loader that TF Serving uses. Sentences are translated as `python -m
keras_transformer.translate` translates them (`--output` keeps them). The paper's final
scores use the average of the last checkpoints (`python -m keras_transformer.averaging
RUN_DIR`, then export) and `--beam` (beam 4, length penalty α = 0.6, §6.1).
"""

import argparse
import contextlib
import json
import math
import os
import sys

from sacrebleu.metrics import BLEU, CHRF

from keras_transformer import exported, output_paths, runtimes, translate
from keras_transformer.corpus import read_lines

# Each metric is a fresh object per call: sacreBLEU objects cache reference statistics.
_METRICS = {"bleu": BLEU, "chrf": CHRF}


def write_lines(path, lines):
    """Writes `lines` to `path`, one per line (written to a temporary name, then renamed)."""
    temporary = f"{path}.partial"
    with open(temporary, "w", encoding="utf-8") as file:
        file.writelines(f"{line}\n" for line in lines)
    os.replace(temporary, path)


def check_line_counts(lines, reference_lines, lines_name, reference_name):
    """Raises `ValueError` naming both files and their counts when the counts differ."""
    if len(lines) != len(reference_lines):
        raise ValueError(
            f"Line counts differ: {lines_name} has {len(lines)} lines but "
            f"{reference_name} has {len(reference_lines)}. The files must be "
            "line-aligned: one translation per reference line.")


def score(hypotheses, references, *, hypotheses_name="hypotheses",
          references_name="references"):
    """Scores detokenized `hypotheses` against one reference each with sacreBLEU.

    Args:
        hypotheses: list of str, one translation per line.
        references: list of str, aligned with `hypotheses`.
        hypotheses_name, references_name: str. What to call them in errors (file names).

    Returns:
        `{"bleu": {...}, "chrf": {...}}`, each `{"name": str, "score": float,
        "signature": str, "text": str}`: `name` and `signature` as sacreBLEU writes them
        (`"BLEU"`, `"nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0"`), and
        `text` sacreBLEU's own line: name, signature, score and details.

    Raises:
        ValueError: when the line counts differ.
    """
    check_line_counts(hypotheses, references, hypotheses_name, references_name)
    scores = {}
    for name, metric_class in _METRICS.items():
        metric = metric_class()
        result = metric.corpus_score(list(hypotheses), [list(references)])
        # The signature is only complete after scoring (it records e.g. the version).
        signature = str(metric.get_signature())
        scores[name] = {"name": result.name, "score": result.score, "signature": signature,
                        "text": result.format(signature=signature)}
    return scores


def translate_file_lines(runner, lines, batch_size=64, verbose=True):
    """Returns the translations of `lines` (list of str), in their order.

    Args:
        runner: callable, list of str -> outputs dict (see `runtimes.open_runner`).
        lines: list of str.
        batch_size: int. Sentences per call of the translator.
        verbose: bool. Show a progress bar counting batches (on stderr: stdout carries
            the scores).
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}.")
    progress = None
    if verbose and lines:
        import keras

        bar = keras.utils.Progbar(math.ceil(len(lines) / batch_size), unit_name="batch")

        def progress(done):
            with contextlib.redirect_stdout(sys.stderr):
                bar.update(math.ceil(done / batch_size))

    return translate.translate_sentences(runner, lines, batch_size, progress)


def evaluate(artifact, source, reference, *, batch_size=64, beam=False, session=False,
             output=None, json_path=None, export_if_missing=True, verbose=True):
    """Translates the `source` file with `artifact` and scores it against `reference`.

    Args:
        artifact: str. A SavedModel directory, a `.tflite` file or a run directory.
        source: str. Source sentences, one per line (plain text or `.gz`).
        reference: str. Reference translations, line-aligned with `source`.
        batch_size: int. Sentences per call of the translator.
        beam: bool. Use the SavedModel's beam-search signature instead of greedy decoding.
        session: bool. Load the SavedModel with the session-based loader that TF
            Serving uses, instead of `tf.saved_model.load`.
        output: optional str. Where to write the translations, one per line.
        json_path: optional str. Where to write the scores (and what was scored) as JSON.
        export_if_missing: bool. Export a run directory that has no export yet.
        verbose: bool. Show a progress bar.

    Returns:
        The dict of `score`, plus what was scored: `"artifact"` (the path used),
        `"source"`, `"reference"`, `"beam"`, `"session"` and `"sentences"`.
    """
    # Checked before translating, which can take minutes.
    files_read = {"source": source, "reference": reference}
    output_paths.check_output_file("--output", output, files_read)
    output_paths.check_output_file("--json", json_path, files_read)
    for name, path in files_read.items():
        if not os.path.isfile(path):  # read_lines would speak of a corpus configuration
            raise FileNotFoundError(f"The {name} {path} is "
                                    f"{'a folder' if os.path.isdir(path) else 'missing'}: "
                                    "name a text file (plain or .gz), one sentence a line.")
    source_lines, reference_lines = read_lines(source), read_lines(reference)
    check_line_counts(source_lines, reference_lines, source, reference)
    if not source_lines:
        raise ValueError(f"{source} and {reference} hold no lines: nothing to score.")
    artifact_path = exported.resolve_artifact(artifact, export_if_missing=export_if_missing,
                                              verbose=verbose)
    try:
        runner = runtimes.open_runner(artifact_path, beam=beam, session=session)
    except KeyError as error:
        raise ValueError(f"{artifact_path} has no signature {error}: export it again with "
                         "the current code (python -m export RUN_DIR).") from None
    hypotheses = translate_file_lines(runner, source_lines, batch_size, verbose)
    if output:
        write_lines(output, hypotheses)
    scores = score(hypotheses, reference_lines, hypotheses_name=output or "the translations",
                   references_name=reference)
    scores.update(artifact=os.fspath(artifact_path), source=os.fspath(source),
                  reference=os.fspath(reference), beam=beam, session=session,
                  sentences=len(hypotheses))
    if json_path:
        with open(json_path, "w", encoding="utf-8") as file:
            json.dump(scores, file, indent=2, ensure_ascii=False)
            file.write("\n")
    return scores


def format_scores(scores):
    """Returns sacreBLEU's line (signature = score) for each metric of `score`'s result."""
    return "\n".join(scores[name]["text"] for name in _METRICS)


def parse_args(argv=None):
    """Parses the command line of `main`."""
    parser = argparse.ArgumentParser(
        prog="python -m keras_transformer.evaluation",
        description="Translate a source file with an exported translator and score it "
                    "with sacreBLEU (BLEU, chrF; detokenized, cased, 13a).")
    parser.add_argument("--artifact", required=True,
                        help="exported SavedModel directory, .tflite file, or run directory "
                             "(uses RUN_DIR/export/saved_model)")
    parser.add_argument("--source", required=True, help="source text (plain or .gz)")
    parser.add_argument("--reference", required=True, help="reference text (plain or .gz)")
    parser.add_argument("--batch-size", type=int, default=64,
                        help="sentences per translator call (default: 64)")
    parser.add_argument("--beam", action="store_true",
                        help="beam search (the SavedModel's beam_search signature: beam 4, "
                             "alpha 0.6 unless exported otherwise) instead of greedy")
    parser.add_argument("--session", action="store_true",
                        help="load the SavedModel as TF Serving does (session-based loader)")
    parser.add_argument("--no-export", action="store_true",
                        help="fail instead of exporting a run directory that has no export")
    parser.add_argument("--output", help="write the translations here, one per line")
    parser.add_argument("--json", dest="json_path", help="write the scores here as JSON")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    return parser.parse_args(argv)


def main(argv=None):
    """Runs the command line; returns the exit status."""
    args = parse_args(argv)
    try:
        scores = evaluate(args.artifact, args.source, args.reference,
                          batch_size=args.batch_size, beam=args.beam,
                          session=args.session, output=args.output,
                          json_path=args.json_path, export_if_missing=not args.no_export,
                          verbose=not args.quiet)
    except (ValueError, OSError, ImportError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    decoding = "beam search" if args.beam else "greedy"
    print(f"{scores['artifact']} ({decoding}): {scores['sentences']} sentences of "
          f"{args.source} scored against {args.reference}")
    print(format_scores(scores))
    return 0


if __name__ == "__main__":
    sys.exit(main())
