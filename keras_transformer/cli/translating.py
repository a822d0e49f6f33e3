"""The verbs of translation: `translate`, `score` and `evaluate`."""

import contextlib
import errno
import json
import logging
import os
import shutil
import sys

from keras_transformer import files, formats
from keras_transformer.cli import console, options
from keras_transformer.data import text

logger = logging.getLogger(__name__)

# The file standard input reads when it is redirected from one (Linux, macOS).
STANDARD_INPUT = "/dev/stdin"


def _add_translate(parser):
    parser.add_argument("artifact", metavar="ARTIFACT",
                        help="run directory, SavedModel directory, .tflite file or "
                             "CTranslate2 directory")
    parser.add_argument("-i", "--input", metavar="FILE",
                        help="sentences, one a line (default: standard input)")
    parser.add_argument("-o", "--output", metavar="FILE",
                        help="translations, one a line (default: standard output); "
                             "written as FILE.partial until complete")
    parser.add_argument("--batch-size", type=options.positive_int, default=32, metavar="N",
                        help="most sentences per call (default: 32)")
    parser.add_argument("--batch-tokens", type=options.positive_int, metavar="N",
                        help="also at most N source tokens per call, padding included "
                             "(sentences x the longest one's tokens), counted with the "
                             "run's tokenizer")
    options.add_decoder_options(parser)
    written = parser.add_mutually_exclusive_group()
    written.add_argument("--n-best", type=options.positive_int, metavar="N",
                         help="the N best hypotheses of beam search (an artifact's hold "
                              "export --n-best; a run directory gives up to its beam "
                              "size), in Moses's n-best format: "
                              "'LINE ||| TRANSLATION ||| log_prob= LP ||| SCORE', LINE "
                              "from 0, SCORE = LP over the length penalty")
    written.add_argument("--scores", action="store_true",
                         help="write 'SCORE<TAB>TRANSLATION', SCORE the translation's "
                              "log-probability")
    written.add_argument("--alignment", action="store_true",
                         help="beam search with word alignments: write 'TRANSLATION ||| "
                              "PAIRS', PAIRS the Pharaoh pairs i-j of source word i and "
                              "translation word j (from 0)")
    parser.add_argument("--prefix-file", metavar="FILE",
                        help="target prefixes, one a line for each input line (empty: "
                             "none): beam search's translations start with them")
    _add_sampling_options(parser)
    options.add_threads_option(parser)
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress bar (shown when reading a file)")


def _add_sampling_options(parser):
    sampling = parser.add_argument_group(
        "sampling", "draw each token instead of searching (back-translation); a "
                    "sentence's sample depends on the seed and its text only")
    sampling.add_argument("--sampling-topk", type=options.non_negative_int, metavar="K",
                          help="draw among the K most probable tokens, 0 for all "
                               "(default: the artifact's, export --sampling-topk)")
    sampling.add_argument("--temperature", type=options.positive_float, metavar="T",
                          help="sampling temperature (default: the artifact's)")
    sampling.add_argument("--seed", type=int, metavar="S",
                          help="seed of every line's draws (default: 0)")


def _translate(args):
    from keras_transformer import translate  # NumPy: see the module docstring
    _check_streamed_output(args.output, {
        "--input": args.input, "--prefix-file": args.prefix_file, "artifact": args.artifact,
        # `-o x.txt < x.txt` would replace the input with its translations.
        "standard input": STANDARD_INPUT if args.input is None else None})
    if args.input and not os.path.isfile(args.input):
        raise options.UsageError(f"--input {args.input}: no such file.")
    searching = args.n_best or args.alignment or args.prefix_file
    sampling = _sampling_asked(args, searching, "--n-best, --alignment and --prefix-file")
    if args.prefix_file and (args.n_best or args.alignment):
        raise options.UsageError("--prefix-file gives one translation a line: drop "
                                 "--n-best and --alignment.")
    if args.prefix_file:
        _check_same_lengths(("--input", args.input), ("--prefix-file", args.prefix_file))
    if not args.artifact.endswith(".tflite"):
        console.load_tensorflow(args.verbose)
    translator = _load_translator(args, beam=args.beam or bool(searching),
                                  sampling_top_k=args.sampling_topk,
                                  sampling_temperature=args.temperature,
                                  n_best=args.n_best)
    runner = translate.decoding_runner(translator, n_best=args.n_best,
                                       alignment=args.alignment,
                                       seed=(args.seed or 0) if sampling else None)
    format_output = formats.output_format(n_best=args.n_best, scores=args.scores,
                                          alignment=args.alignment)
    second, opened = None, []
    if args.prefix_file:
        runner = translator.signature_runner(files.PREFIX_SIGNATURE)
        opened.append(text.open_lines(args.prefix_file))
        second = translate.warn_if_not_utf8(translate.iter_sentences(opened[-1]),
                                            args.prefix_file)
    source = text.open_lines(args.input) if args.input else sys.stdin.buffer
    name = args.input or "standard input"
    _stream(runner, translate.warn_if_not_utf8(translate.iter_sentences(source), name),
            args, progress=not args.no_progress and args.input,
            opened=[source, *opened], format_output=format_output, second=second,
            **translator.batching)


def _sampling_asked(args, searching, searched_with):
    """Returns whether sampling options are given. Refuses them beside beam search's
    options, and `searching` (true when options that need beam search, named
    `searched_with`, are given) beside --greedy."""
    if searching and args.greedy:
        raise options.UsageError(f"Only beam search gives {searched_with}: drop --greedy.")
    sampling = [args.sampling_topk, args.temperature, args.seed] != [None] * 3
    if sampling and (searching or args.beam or args.beam_size or args.length_penalty):
        raise options.UsageError("Sampling (--sampling-topk, --temperature, --seed) draws "
                                 "tokens instead of searching: drop the beam-search "
                                 "options, or the sampling ones.")
    return sampling


def _add_translate_corpus(parser):
    parser.description += (
        ": on Apache Beam's RunInference (the beam extra), in-process by default or on "
        "any Beam runner; Beam's options (--runner, --direct_num_workers, Dataflow's, "
        "Flink's, Spark's) pass through. Killed or failed, the same command again "
        "finishes the work.")
    parser.add_argument("artifact", metavar="ARTIFACT",
                        help="run directory, SavedModel directory, .tflite file or "
                             "CTranslate2 directory")
    parser.add_argument("-i", "--input", required=True, action="append", metavar="GLOB",
                        help="input files, one sentence a line, joined in sorted name "
                             "order (repeatable; any file system Beam reads)")
    parser.add_argument("-o", "--output", required=True, metavar="PATH",
                        help="one file: line i holds line i's output (with --pairs, "
                             "its source too); its parts are kept in PATH.parts until "
                             "the end")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--ordered", action="store_true",
                      help="write what translate writes, line i for line i (default)")
    mode.add_argument("--pairs", choices=("tsv", "jsonl"),
                      help="write source, translation and score: SOURCE<TAB>TRANSLATION"
                           "<TAB>SCORE (tab and backslash escaped) or JSON lines")
    parser.add_argument("--batch-size", type=options.positive_int, default=32, metavar="N",
                        help="most sentences per call (default: 32); chunks hold 64 "
                             "batches")
    parser.add_argument("--batch-tokens", type=options.positive_int, metavar="N",
                        help="also at most N source tokens per call, padding included")
    options.add_decoder_options(parser)
    written = parser.add_mutually_exclusive_group()
    written.add_argument("--n-best", type=options.positive_int, metavar="N",
                         help="the N best hypotheses, in Moses's n-best format (as "
                              "translate --n-best)")
    written.add_argument("--scores", action="store_true",
                         help="write 'SCORE<TAB>TRANSLATION' (as translate --scores)")
    _add_sampling_options(parser)
    parser.add_argument("--threads", type=options.positive_int, metavar="N",
                        help="threads of each worker's runtime (default: the runtime's "
                             "with one worker, else the cores over the workers)")
    beam = parser.add_argument_group("Apache Beam (other options of Beam pass through)")
    beam.add_argument("--runner", metavar="NAME",
                      help="Beam's runner (default: FnApiRunner, in this process)")
    beam.add_argument("--direct_num_workers", type=options.positive_int, metavar="N",
                      help="workers of the in-process runner (default: 1)")
    beam.add_argument("--direct_running_mode",
                      choices=("in_memory", "multi_threading", "multi_processing"),
                      help="how they run (default: in_memory, multi_processing for "
                           "several workers)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    # main() hands what this parser does not know to Beam.
    parser.set_defaults(pass_through=[])


def _translate_corpus(args):
    sampling = _sampling_asked(args, args.n_best, "--n-best")
    if args.pairs and (args.n_best or args.scores):
        raise options.UsageError("--pairs writes one translation and its score a line: "
                                 "drop --n-best and --scores.")
    try:
        from keras_transformer import translate_corpus
    except ImportError as error:
        raise options.UsageError(str(error)) from None
    beam_args = list(args.pass_through)
    for name in ("runner", "direct_num_workers", "direct_running_mode"):
        if getattr(args, name) is not None:
            beam_args += [f"--{name}", str(getattr(args, name))]
    workers = translate_corpus.workers_of(beam_args)
    threads = args.threads or (max(1, (os.cpu_count() or 1) // workers)
                               if workers > 1 else None)
    if args.n_best:
        _check_n_best_of_artifact(args.n_best, args.artifact, args.beam_size)
    if not args.artifact.endswith(".tflite"):
        console.load_tensorflow(args.verbose)
    result = translate_corpus.translate_corpus(
        args.artifact, args.input, args.output, pairs=args.pairs, n_best=args.n_best,
        scores=args.scores, seed=(args.seed or 0) if sampling else None,
        beam_args=beam_args, verbose=args.verbose,
        progress=not args.no_progress,
        beam=args.beam or bool(args.n_best), beam_size=args.beam_size,
        length_penalty=args.length_penalty, greedy=args.greedy,
        batch_size=args.batch_size, batch_tokens=args.batch_tokens, threads=threads,
        sampling_top_k=args.sampling_topk, sampling_temperature=args.temperature)
    print(result.summary(), file=sys.stderr)


def _check_n_best_of_artifact(count, artifact, beam_size=None):
    """Refuses, before any worker starts, more hypotheses than an artifact's n-best
    lists hold, or than a run directory's beam search keeps (`load_translator`, which
    the workers call, gives a run directory's n-best lists of any length up to that)."""
    from keras_transformer import loading
    from keras_transformer.serving import artifacts
    if files.is_run_dir(artifact):
        searched = loading.beam_size_of(artifact, beam_size)
        if count > searched:
            raise options.UsageError(
                f"--n-best {count}: beam search keeps {searched} hypotheses: give "
                f"--beam-size {count} or more.")
        return
    held = artifacts.exported_options(artifact).get("n_best")
    if held is not None and count > held:
        raise options.UsageError(
            f"--n-best {count}: the n-best lists of {artifact} hold {held} hypotheses: "
            f"ask for at most {held}, export the run again with --n-best {count} (and a "
            f"--beam-size of at least {count}), or name the run directory, which gives "
            "any.")


def _check_same_lengths(*flags_and_paths):
    """Refuses files (`(flag, path)`, path `None` for standard input, not counted) that
    do not exist or have different numbers of lines, before any model loads."""
    counts = []
    for flag, path in flags_and_paths:
        if path is None:
            continue
        if not os.path.isfile(path):
            raise options.UsageError(f"{flag} {path}: no such file.")
        counts.append((flag, path, _count_lines(path)))
    if len({count for _, _, count in counts}) > 1:
        raise options.UsageError(
            " but ".join(f"{flag} {path} has {count} lines" for flag, path, count in counts)
            + ": give one line of each per sentence.")


def _stream(runner, lines, args, *, progress, opened, **file_options):
    """Writes the outputs of `lines` to `--output` (or standard output), window by
    window (`translate.translate_file`, given `file_options`); closes the `opened`
    files at the end.

    `--output FILE` is written as `FILE.partial` and renamed to FILE once complete
    (`_partial_path`): a run that stops keeps what it finished there, and an earlier
    FILE stays whole. A second run writing FILE meanwhile is refused
    (`_open_partial`).
    """
    from keras_transformer import translate
    progress = translate.progress_bar() if progress else None
    partial = _partial_path(args.output)
    with contextlib.ExitStack() as stack:
        for file in opened:
            stack.enter_context(file)
        # Bytes: the translations are UTF-8 whatever the terminal's locale says.
        if partial:
            stream = stack.enter_context(_open_partial(partial, args.output))
        else:
            stream = stack.enter_context(open(args.output, "wb") if args.output
                                         else contextlib.nullcontext(sys.stdout.buffer))
        try:
            translate.translate_file(runner, lines, stream, progress=progress,
                                     **file_options)
        except translate.TranslationInterrupted as stopped:
            kept = (f"{partial}: {stopped}; {args.output} is unchanged" if partial
                    else f"{args.output or 'standard output'}: {stopped}")
            print(f"\n{kept}.", file=sys.stderr)
            raise stopped.__cause__ from None
        if partial:
            stream.flush()
            # Under the lock still: a run that opened FILE.partial before the rename
            # must not write into what is FILE after it.
            _put_in_place(partial, os.path.realpath(args.output))


def _open_partial(partial, output):
    """Opens `partial` to write, emptied, under an exclusive `flock` that lasts until it
    is closed: two runs writing one `--output` at once would write into one file. Where
    the file system has no locks, it is opened without one.

    Raises:
        ValueError: another process holds it, naming both.
    """
    import fcntl  # POSIX only, as `runs.lock_run_dir`

    while True:
        descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT, 0o666)
        try:
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise ValueError(f"--output {output} is being written by another run (it "
                                 f"holds {partial}): wait for it to end, or name another "
                                 "--output.") from None
            except OSError as error:
                if error.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                    raise
                logger.warning("%s: the file system takes no locks (%s); written without "
                               "one.", partial, error.strerror)
            # Locked after the run before it renamed the file to `output`: not ours to
            # empty. Open the new one.
            if _same_file(descriptor, partial):
                os.ftruncate(descriptor, 0)
                return os.fdopen(descriptor, "wb")
        except BaseException:
            os.close(descriptor)
            raise
        os.close(descriptor)


def _same_file(descriptor, path):
    """Whether the open file `descriptor` is the one `path` names now."""
    try:
        found = os.stat(path)
    except FileNotFoundError:
        return False
    return os.path.samestat(os.fstat(descriptor), found)


def _partial_path(output):
    """The name `--output` has until it is complete: `FILE.partial` beside the file
    FILE names (through links), or `None` (written as it goes) for standard output, for
    what is not a file to replace (`/dev/null`, a pipe), and where FILE or its folder
    may not be written (opening FILE then fails at once, as it would have)."""
    if not output:
        return None
    real = os.path.realpath(output)
    if os.path.exists(real) and not (os.path.isfile(real) and os.access(real, os.W_OK)):
        return None
    if not os.access(os.path.dirname(real), os.W_OK):
        return None
    return real + PARTIAL_ENDING


def _put_in_place(partial, final):
    """Renames the complete `partial` to `final`, keeping an earlier file's permissions;
    copies it where a rename cannot replace `final` (a file mounted on its own)."""
    if os.path.exists(final):
        shutil.copymode(final, partial)
    try:
        os.replace(partial, final)
    except OSError as error:
        if error.errno not in (errno.EXDEV, errno.EBUSY):
            raise
        shutil.copyfile(partial, final)
        os.remove(partial)


PARTIAL_ENDING = ".partial"


def _check_streamed_output(output, inputs):
    """Refuses an `--output` (of `_stream`) that cannot be written or is one of `inputs`
    (what the command calls each file it reads -> its path), under its own name or the
    one it has until complete."""
    files.check_output_file("--output", output, inputs)
    partial = _partial_path(output)
    input_name = partial and files.input_named(partial, inputs)
    if input_name:
        raise ValueError(f"--output {output} is written as {partial} until it is "
                         f"complete, and {partial} is the {input_name}: name another "
                         "--output.")


def _load_translator(args, beam=None, doing="Translating", **sampling):
    from keras_transformer import loading  # NumPy: see the module docstring
    beam = getattr(args, "beam", False) if beam is None else beam
    translator = loading.load_translator(args.artifact, beam=beam,
                                         beam_size=getattr(args, "beam_size", None),
                                         length_penalty=getattr(args, "length_penalty",
                                                                None),
                                         greedy=getattr(args, "greedy", False),
                                         batch_size=args.batch_size,
                                         batch_tokens=getattr(args, "batch_tokens", None),
                                         session=getattr(args, "session", False),
                                         threads=args.threads, **sampling)
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
    evaluation.check_pairs(pairs, output=args.output, single_output=single,
                           artifact=args.artifact)
    files.check_output_file("--json", args.json, {"source": args.source,
                                                  "reference": args.reference,
                                                  "artifact": args.artifact})
    if args.json and args.output and files.same_path(args.json, args.output):
        raise options.UsageError(f"--json {args.json} is also the --output: the scores "
                                 "would replace the translations. Name another --json.")
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
                        help="scores, one a line (default: standard output); written "
                             "as FILE.partial until complete")
    parser.add_argument("--batch-size", type=options.positive_int, default=32, metavar="N",
                        help="most sentence pairs per call (default: 32)")
    options.add_threads_option(parser)
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def _score(args):
    from keras_transformer import translate
    _check_streamed_output(args.output, {"--source": args.source, "--target": args.target,
                                         "artifact": args.artifact})
    _check_same_lengths(("--source", args.source), ("--target", args.target))
    if not args.artifact.endswith(".tflite"):
        console.load_tensorflow(args.verbose)
    translator = _load_translator(args, doing="Scoring")
    runner = translator.signature_runner(files.SCORE_SIGNATURE)
    source, target = text.open_lines(args.source), text.open_lines(args.target)
    _stream(runner, translate.warn_if_not_utf8(translate.iter_sentences(source),
                                               args.source),
            args, progress=not args.no_progress, opened=[source, target],
            format_output=formats.token_scores if args.tokens else formats.score,
            second=translate.warn_if_not_utf8(translate.iter_sentences(target),
                                                    args.target),
            batch_size=args.batch_size)


def _count_lines(path):
    with text.open_lines(path) as file:
        return sum(1 for _ in file)


VERBS = {
    "translate": (_add_translate, _translate, "translate sentences, one a line"),
    "translate-corpus": (_add_translate_corpus, _translate_corpus,
                         "translate files on Apache Beam, order kept, resumable"),
    "score": (_add_score, _score, "score given translations: the log-probability of "
                                  "each, per token with --tokens"),
    "evaluate": (_add_evaluate, _evaluate,
                 "score translations of test splits with sacreBLEU (BLEU, chrF)"),
}
