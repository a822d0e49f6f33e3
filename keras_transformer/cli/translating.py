"""The verbs of translation: `translate` and `evaluate`."""

import contextlib
import json
import logging
import os
import sys

from keras_transformer import files
from keras_transformer.cli import console, options

logger = logging.getLogger(__name__)


def _add_translate(parser):
    parser.add_argument("artifact", metavar="ARTIFACT",
                        help="run directory, SavedModel directory, .tflite file or "
                             "CTranslate2 directory")
    parser.add_argument("-i", "--input", metavar="FILE",
                        help="sentences, one a line (default: standard input)")
    parser.add_argument("-o", "--output", metavar="FILE",
                        help="translations, one a line (default: standard output)")
    parser.add_argument("--batch-size", type=options.positive_int, default=32, metavar="N",
                        help="most sentences per call (default: 32)")
    parser.add_argument("--batch-tokens", type=options.positive_int, metavar="N",
                        help="also at most N source tokens per call, padding included "
                             "(sentences x the longest one's tokens), counted with the "
                             "run's tokenizer")
    options.add_decoder_options(parser)
    options.add_threads_option(parser)
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress bar (shown when reading a file)")


def _translate(args):
    from keras_transformer import translate  # NumPy: see the module docstring
    files.check_output_file("--output", args.output, {"--input": args.input})
    if args.input and not os.path.isfile(args.input):
        raise options.UsageError(f"--input {args.input}: no such file.")
    if not args.artifact.endswith(".tflite"):
        console.load_tensorflow(args.verbose)
    translator = _load_translator(args)
    source = open(args.input, "rb") if args.input else sys.stdin.buffer
    name = args.input or "standard input"
    progress = None if args.no_progress or not args.input else translate.progress_bar()
    # Bytes: the translations are UTF-8 whatever the terminal's locale says.
    output = open(args.output, "wb") if args.output else contextlib.nullcontext(
        sys.stdout.buffer)
    with source, output as stream:
        lines = translate.warn_if_not_utf8(translate.iter_sentences(source), name)
        try:
            translate.translate_file(translator.runner, lines, stream, progress=progress,
                                     **translator.batching)
        except translate.TranslationInterrupted as stopped:
            print(f"\n{args.output or 'standard output'}: {stopped}.", file=sys.stderr)
            raise stopped.__cause__ from None


def _load_translator(args):
    from keras_transformer import translate  # NumPy: see the module docstring
    translator = translate.load_translator(args.artifact, beam=args.beam,
                                         beam_size=args.beam_size,
                                         length_penalty=args.length_penalty,
                                         greedy=args.greedy,
                                         batch_size=args.batch_size,
                                         batch_tokens=getattr(args, "batch_tokens", None),
                                         session=getattr(args, "session", False),
                                         threads=args.threads)
    logger.info("Translating with %s (%s).", translator.artifact or
                f"the model of {args.artifact}", translator.decoder)
    return translator


def _add_evaluate(parser):
    parser.add_argument("artifact", metavar="ARTIFACT",
                        help="run directory, SavedModel directory, .tflite file or "
                             "CTranslate2 directory")
    parser.add_argument("--split", action="append", metavar="NAME",
                        help="a split of the run's corpus to score, e.g. test_2017_flickr "
                             "or validation (repeatable; default: every test split)")
    parser.add_argument("--source", metavar="FILE", help="score this source file instead "
                                                         "(with --reference)")
    parser.add_argument("--reference", metavar="FILE", help="its reference translations")
    parser.add_argument("--data-dir", metavar="DIR",
                        help="local copy of the run's corpus (default: the run's data_dir, "
                             "else downloaded)")
    parser.add_argument("--batch-size", type=options.positive_int, default=64, metavar="N",
                        help="sentences per call (default: 64)")
    options.add_decoder_options(parser)
    options.add_threads_option(parser)
    parser.add_argument("--session", action="store_true",
                        help="load the SavedModel as TF Serving does (session loader)")
    parser.add_argument("-o", "--output", metavar="PATH",
                        help="keep the translations: a file with --source, else a folder")
    parser.add_argument("--json", metavar="FILE", help="write the scores here as JSON")


def _evaluate(args):
    from keras_transformer import evaluation
    if (args.source is None) != (args.reference is None):
        raise options.UsageError("--source and --reference go together")
    if args.source and args.split:
        raise options.UsageError("give --split or --source/--reference, not both")
    single = args.source is not None
    if single:
        pairs = {os.path.basename(args.source): (args.source, args.reference)}
    else:
        pairs = evaluation.split_files(args.artifact, args.split, data_dir=args.data_dir)
    # Every file and output is checked before the artifact loads and translates.
    evaluation.check_pairs(pairs, output=args.output, single_output=single)
    files.check_output_file("--json", args.json, {"source": args.source,
                                                  "reference": args.reference})
    if not args.artifact.endswith(".tflite"):
        console.load_tensorflow(args.verbose)
    translator = _load_translator(args)
    results = evaluation.evaluate_splits(translator, pairs, output=args.output,
                                         single_output=single)
    print(evaluation.format_table(results, translator.decoder))
    if args.json:
        files.write_text(args.json, json.dumps(
            {"artifact": translator.artifact, "decoder": translator.decoder,
             "splits": results}, indent=2, ensure_ascii=False) + "\n")


VERBS = {
    "translate": (_add_translate, _translate, "translate sentences, one a line"),
    "evaluate": (_add_evaluate, _evaluate,
                 "score translations of test splits with sacreBLEU (BLEU, chrF)"),
}
