"""The verbs of translation: `translate`, `score` and `evaluate`."""

import contextlib
import json
import logging
import os
import sys

from keras_transformer import files, formats
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
    written = parser.add_mutually_exclusive_group()
    written.add_argument("--n-best", type=options.positive_int, metavar="N",
                         help="the N best hypotheses of beam search (at most the "
                              "artifact's, export --n-best), in Moses's n-best format: "
                              "'LINE ||| TRANSLATION ||| log_prob= LP ||| SCORE', LINE "
                              "from 0, SCORE = LP over the length penalty")
    written.add_argument("--scores", action="store_true",
                         help="write 'SCORE<TAB>TRANSLATION', SCORE the translation's "
                              "log-probability")
    options.add_threads_option(parser)
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress bar (shown when reading a file)")


def _translate(args):
    from keras_transformer import translate  # NumPy: see the module docstring
    files.check_output_file("--output", args.output, {"--input": args.input})
    if args.input and not os.path.isfile(args.input):
        raise options.UsageError(f"--input {args.input}: no such file.")
    if args.n_best and args.greedy:
        raise options.UsageError("--n-best lists come from beam search: drop --greedy.")
    if not args.artifact.endswith(".tflite"):
        console.load_tensorflow(args.verbose)
    translator = _load_translator(args, beam=args.beam or bool(args.n_best))
    runner, format_output = translator.runner, None
    if args.n_best:
        runner = translator.signature_runner(files.N_BEST_SIGNATURE)
        _check_n_best(args.n_best, translator)
        format_output = formats.n_best(args.n_best)
    elif args.scores:
        format_output = formats.scored_translation
    source = open(args.input, "rb") if args.input else sys.stdin.buffer
    name = args.input or "standard input"
    _stream(runner, translate.warn_if_not_utf8(translate.iter_sentences(source), name),
            args, progress=not args.no_progress and args.input,
            opened=[source], format_output=format_output, **translator.batching)


def _check_n_best(count, translator):
    """Refuses more hypotheses than the artifact's n-best lists hold."""
    from keras_transformer.serving import artifacts
    if translator.artifact is None:
        held = translator.runner.translator.n_best
    else:
        held = ((artifacts.export_report(translator.artifact) or {})
                .get("translator", {}).get("n_best"))
    if held is not None and count > held:
        raise options.UsageError(
            f"--n-best {count}: the n-best lists of {translator.artifact or 'this run'} "
            f"hold {held} hypotheses: ask for at most {held}, or export again with "
            f"--n-best {count} (and a --beam-size of at least {count}).")


def _stream(runner, lines, args, *, progress, opened, **file_options):
    """Writes the outputs of `lines` to `--output` (or standard output), window by
    window (`translate.translate_file`, given `file_options`); closes the `opened`
    files at the end."""
    from keras_transformer import translate
    progress = translate.progress_bar() if progress else None
    # Bytes: the translations are UTF-8 whatever the terminal's locale says.
    output = open(args.output, "wb") if args.output else contextlib.nullcontext(
        sys.stdout.buffer)
    with contextlib.ExitStack() as stack:
        for file in opened:
            stack.enter_context(file)
        stream = stack.enter_context(output)
        try:
            translate.translate_file(runner, lines, stream, progress=progress,
                                     **file_options)
        except translate.TranslationInterrupted as stopped:
            print(f"\n{args.output or 'standard output'}: {stopped}.", file=sys.stderr)
            raise stopped.__cause__ from None


def _load_translator(args, beam=None, doing="Translating"):
    from keras_transformer import translate  # NumPy: see the module docstring
    beam = getattr(args, "beam", False) if beam is None else beam
    translator = translate.load_translator(args.artifact, beam=beam,
                                         beam_size=getattr(args, "beam_size", None),
                                         length_penalty=getattr(args, "length_penalty",
                                                                None),
                                         greedy=getattr(args, "greedy", False),
                                         batch_size=args.batch_size,
                                         batch_tokens=getattr(args, "batch_tokens", None),
                                         session=getattr(args, "session", False),
                                         threads=args.threads)
    logger.info("%s with %s (%s).", doing, translator.artifact or
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


def _add_score(parser):
    parser.add_argument("artifact", metavar="ARTIFACT",
                        help="run directory, SavedModel directory, .tflite file or "
                             "CTranslate2 directory")
    parser.add_argument("--source", required=True, metavar="FILE",
                        help="sentences, one a line")
    parser.add_argument("--target", required=True, metavar="FILE",
                        help="their translations, one a line, to score")
    parser.add_argument("--tokens", action="store_true",
                        help="write 'SCORE<TAB>PIECES<TAB>TOKEN_SCORES': each piece and "
                             "its log-probability, separated by spaces")
    parser.add_argument("-o", "--output", metavar="FILE",
                        help="scores, one a line (default: standard output)")
    parser.add_argument("--batch-size", type=options.positive_int, default=32, metavar="N",
                        help="most sentence pairs per call (default: 32)")
    options.add_threads_option(parser)
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def _score(args):
    from keras_transformer import translate
    for flag, path in (("--source", args.source), ("--target", args.target)):
        if not os.path.isfile(path):
            raise options.UsageError(f"{flag} {path}: no such file.")
    files.check_output_file("--output", args.output, {"--source": args.source,
                                                      "--target": args.target})
    counts = [_count_lines(path) for path in (args.source, args.target)]
    if counts[0] != counts[1]:
        raise options.UsageError(
            f"--source {args.source} has {counts[0]} lines but --target {args.target} has "
            f"{counts[1]}: give one translation per sentence, line by line.")
    if not args.artifact.endswith(".tflite"):
        console.load_tensorflow(args.verbose)
    translator = _load_translator(args, doing="Scoring")
    runner = translator.signature_runner(files.SCORE_SIGNATURE)
    source, target = open(args.source, "rb"), open(args.target, "rb")
    _stream(runner, translate.warn_if_not_utf8(translate.iter_sentences(source),
                                               args.source),
            args, progress=not args.no_progress, opened=[source, target],
            format_output=formats.token_scores if args.tokens else formats.score,
            translations=translate.warn_if_not_utf8(translate.iter_sentences(target),
                                                    args.target),
            batch_size=args.batch_size)


def _count_lines(path):
    with open(path, "rb") as file:
        return sum(1 for _ in file)


VERBS = {
    "translate": (_add_translate, _translate, "translate sentences, one a line"),
    "score": (_add_score, _score, "score given translations: the log-probability of "
                                  "each, per token with --tokens"),
    "evaluate": (_add_evaluate, _evaluate,
                 "score translations of test splits with sacreBLEU (BLEU, chrF)"),
}
