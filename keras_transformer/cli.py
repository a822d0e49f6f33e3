"""The command line: `keras-transformer VERB ...` (also `python -m keras_transformer`).

One verb per job, one vocabulary of options: `RUN_DIR` (train's `--run-dir`) is a run
directory, `ARTIFACT` a run directory, SavedModel or `.tflite` file, `-i/--input` what a
verb reads and `-o/--output` what it writes, `--beam`/`--beam-size`/`--length-penalty`
the decoder, `--count N` how many sentences; options that set a config field carry its
name (`--time-budget-minutes` sets `train.time_budget_minutes`). Older spellings
(`check --sentences`, `recipe --minutes`) still work, unlisted.

Conventions: a bad argument, file or config is one `error: …` line on stderr naming it
and the fix, exit status 2; work that runs and fails (a self-check, a non-finite loss)
exits with 1. Library messages and progress bars go to stderr, results to stdout.
TensorFlow's start-up lines are dropped unless `--verbose`, which also shows the
traceback behind an error.

Only modules that need nothing beyond the standard library (`config`, `files`, `runs`,
the fuzzer's generator) are imported here; the others (TensorFlow, Keras, NumPy for the
runners) by the verb that needs them, when it runs: `--help` then answers at once, and
TensorFlow loads only after its start-up output is set to be dropped.
"""

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import re
import sys
import threading

from keras_transformer import config as config_lib
from keras_transformer import files, runs
from keras_transformer.tools import fuzzing

PROGRAM = "keras-transformer"

# What TensorFlow's C++ code writes to stderr while it loads, before its logging (and
# TF_CPP_MIN_LOG_LEVEL) applies: dropped unless --verbose.
_STARTUP_NOISE = re.compile(
    r"absl::InitializeLog|port\.cc:\d+\] oneDNN|cudart_stub\.cc|cpu_feature_guard\.cc|"
    r"To enable the following instructions|rebuild TensorFlow with the appropriate|"
    r"cuda_executor|cuInit|computation placer|TF-TRT Warning|Unable to register cu|"
    r"Created TensorFlow Lite XNNPACK delegate")

logger = logging.getLogger("keras_transformer")


class UsageError(ValueError):
    """A command line that cannot be carried out as given; the message says the fix."""


def main(argv=None):
    """Runs the command line `argv` (default `sys.argv[1:]`); returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser, verb_parsers = make_parser()
    leading = []  # options before the verb (--verbose, --help)
    while argv and argv[0].startswith("-"):
        leading.append(argv.pop(0))
    try:
        if not argv or argv[0] not in verb_parsers:
            # Exits: with the help, or with the usage error naming the missing or unknown verb.
            parser.parse_args(leading + argv)
        # Options and positional arguments in any order (overrides between options).
        args = verb_parsers[argv[0]].parse_intermixed_args(leading + argv[1:])
    except SystemExit as exit:  # --help (0) or a usage error (2), already printed
        return exit.code
    quiet = contextlib.nullcontext() if args.verbose else _native_stderr_filtered()
    try:
        with _console(args.verbose), quiet:
            return args.handler(args) or 0
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    except (ValueError, OSError, RuntimeError, ImportError) as error:
        if args.verbose:
            raise
        own = type(error).__module__.startswith("keras_transformer")
        hint = "" if own else " (--verbose shows where)"
        print(f"error: {error}{hint}", file=sys.stderr)
        # Bad input is a usage error (2); work that ran and failed is a failure (1).
        return getattr(error, "exit_status", 1 if isinstance(error, RuntimeError) else 2)


def make_parser():
    """Returns `(parser, {verb: its parser})`."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--verbose", action="store_true",
                        help="show TensorFlow's start-up lines and the traceback of errors")
    parser = argparse.ArgumentParser(
        prog=PROGRAM, parents=[common],
        description="The Transformer of 'Attention Is All You Need' for machine "
                    "translation: train, average, export, translate, evaluate.")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    verb_parsers = {}
    for name, (adder, handler, summary) in _VERBS.items():
        verb = verbs.add_parser(name, parents=[common], help=summary, description=summary,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
        verb.prog = f"{PROGRAM} {name}"
        adder(verb)
        verb.set_defaults(handler=handler)
        verb_parsers[name] = verb
    return parser, verb_parsers


# --- conventions ----------------------------------------------------------------------

class _MessageFormatter(logging.Formatter):
    def format(self, record):
        message = super().format(record)
        return message if record.levelno < logging.WARNING else f"warning: {message}"


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever `sys.stderr` is when a message comes (tests replace it)."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value):
        pass  # always sys.stderr


@contextlib.contextmanager
def _console(verbose):
    """The command's log output: every message once, on stderr, in the package's format.

    The root logger's handlers are the command's, set before TensorFlow loads: absl's
    first message (`tf.saved_model.save` sends one) runs `logging.basicConfig()` on a
    root logger without handlers, and TensorFlow gives its logger a handler of its own
    in that case too, which printed every later message of the package a second time
    (`INFO:keras_transformer.recipe:…`). The package's messages go to the command's
    handler alone (`propagate=False`), so that a handler a library adds to the root
    later changes nothing they show. Other libraries' messages show from warnings on,
    from INFO with `verbose` (TensorFlow's own lines, C++ start-up lines aside: see
    `_native_stderr_filtered`). Everything is put back when the command ends, for a
    process that runs it in-process (tests, notebooks).
    """
    if not verbose:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    handler = _StderrHandler()
    handler.setFormatter(_MessageFormatter("%(message)s"))
    root = logging.getLogger()
    saved = (root.handlers[:], root.level, logger.handlers[:], logger.level,
             logger.propagate)
    root.handlers = [handler]
    root.setLevel(logging.INFO if verbose else logging.WARNING)
    logger.handlers = [handler]
    logger.setLevel(logging.DEBUG if verbose else logging.INFO)
    logger.propagate = False
    try:
        yield
    finally:
        root.handlers, level, logger.handlers, logger_level, logger.propagate = saved
        root.setLevel(level)
        logger.setLevel(logger_level)


def _load_tensorflow(verbose):
    """Imports TensorFlow and tf-text (registering the ops exported graphs use) early,
    so that the verb's own messages come after TensorFlow's start-up; quiets TensorFlow's
    Python logger unless `verbose`."""
    import tensorflow as tf
    import tensorflow_text  # noqa: F401
    if not verbose:
        tf.get_logger().setLevel("ERROR")


@contextlib.contextmanager
def _native_stderr_filtered():
    """Passes file descriptor 2 (where C++ libraries write) through a filter.

    TensorFlow and LiteRT write start-up lines from C++ straight to the descriptor,
    some before their logging (and TF_CPP_MIN_LOG_LEVEL) applies, so no Python setting
    reaches them. Here the descriptor is a pipe, and a thread copies what comes through
    to the real stderr as it comes, less `_STARTUP_NOISE` lines; progress bars (ended by
    a carriage return) pass at once.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    read_end, write_end = os.pipe()
    os.dup2(write_end, 2)
    os.close(write_end)

    def copy():
        pending = b""
        while chunk := os.read(read_end, 65536):
            pending += chunk
            *pieces, pending = re.split(rb"(?<=[\r\n])", pending)
            for piece in pieces:
                if not _STARTUP_NOISE.search(piece.decode("utf-8", "replace")):
                    os.write(saved, piece)
        if pending and not _STARTUP_NOISE.search(pending.decode("utf-8", "replace")):
            os.write(saved, pending)

    thread = threading.Thread(target=copy, daemon=True)
    thread.start()
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)  # closes the pipe's last write end: the thread reads to its end
        thread.join(timeout=5)
        os.close(read_end)
        os.close(saved)


def _positive_int(text):
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return value


def _non_negative_float(text):
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of at least 0")
    return value


def _list_of(item_type):
    """argparse type: comma-separated values (a list option would swallow FIELD=VALUEs)."""
    def parse(text):
        return [item_type(item) for item in text.split(",") if item]
    return parse


def _add_threads_option(parser):
    parser.add_argument("--threads", type=_positive_int, metavar="N",
                        help="threads of the runtime: TensorFlow's for a SavedModel "
                             "(default: 1), LiteRT's for a .tflite file (default: "
                             "LiteRT's), CTranslate2's (default: 1)")


def _add_decoder_options(parser):
    parser.add_argument("--beam", action="store_true",
                        help=f"beam search (the artifact's: beam {files.PAPER_BEAM_SIZE}, α "
                             f"{files.PAPER_LENGTH_PENALTY} unless exported otherwise; on a "
                             "run directory, the run's choice) instead of greedy decoding")
    parser.add_argument("--beam-size", type=_positive_int, metavar="N",
                        help="beam search with N hypotheses (implies --beam; on an "
                             "artifact, the exported size)")
    parser.add_argument("--length-penalty", type=_non_negative_float, metavar="ALPHA",
                        help="α of beam search's length penalty (implies --beam)")
    parser.add_argument("--greedy", action="store_true",
                        help="greedy decoding on a run directory whose choice on "
                             "validation (recipe) is beam search, which it uses by default")


def _add_config_options(parser):
    """Options that build a `Config`: a preset or a saved config, the data, overrides."""
    parser.add_argument("--preset", choices=sorted(config_lib.PRESETS),
                        help=f"named configuration (default: {config_lib.DEFAULT_PRESET})")
    parser.add_argument("--config", metavar="FILE",
                        help="config.json of an earlier run (replaces --preset)")
    parser.add_argument("--data-dir", metavar="DIR",
                        help="local copy of the corpus (Multi30K names: train.en.gz, "
                             "val.de.gz, ...); default: download Multi30K")
    parser.add_argument("--train-files", nargs=2, metavar=("SOURCE", "TARGET"),
                        help="your own training text: two line-aligned files, plain or .gz")
    parser.add_argument("--validation-files", "--valid-files", nargs=2,
                        metavar=("SOURCE", "TARGET"), help="your own validation text")
    parser.add_argument("--test-files", nargs=2, metavar=("SOURCE", "TARGET"),
                        help="your own test text (optional)")
    parser.add_argument("--source-language", metavar="CODE",
                        help="source language code (default: en)")
    parser.add_argument("--target-language", metavar="CODE",
                        help="target language code (default: de)")
    parser.add_argument("--run-dir", metavar="DIR",
                        help="where the run's files go (default: runs/<preset>-<source>-"
                             "<target>, or the folder of a run's config.json)")
    parser.add_argument("--epochs", type=_positive_int, metavar="N",
                        help="passes over the data, or of --steps-per-epoch steps")
    parser.add_argument("--steps-per-epoch", type=_positive_int, metavar="N",
                        help="batches per epoch (default: one pass over the data)")
    parser.add_argument("overrides", nargs="*", metavar="FIELD=VALUE",
                        help="config overrides, e.g. dropout=0.2 target_language=fr "
                             "(any field of keras_transformer/config.py)")


def make_config(args):
    """Returns `(config, run_dir)` from the config options of `args`."""
    if args.config and args.preset:
        raise UsageError("give --preset or --config, not both")
    if args.config:
        try:
            config = config_lib.Config.load(args.config)
        except OSError as error:
            raise UsageError(f"--config {args.config}: cannot read it ({error.strerror}). "
                             "Give the config.json of an earlier run, or a --preset.") from None
        name = os.path.splitext(os.path.basename(args.config))[0]
    else:
        name = args.preset or config_lib.DEFAULT_PRESET
        config = config_lib.preset_config(name)
    data = {key: value for key, value in (
        ("data_dir", args.data_dir), ("train_files", args.train_files),
        ("validation_files", args.validation_files), ("test_files", args.test_files),
        ("source_language", args.source_language),
        ("target_language", args.target_language)) if value is not None}
    if args.train_files or args.validation_files:
        if not (args.train_files and args.validation_files):
            raise UsageError("your own data needs both --train-files and "
                             "--validation-files (SOURCE TARGET each)")
        data["corpus"] = "files"
        data = {key: tuple(value) if isinstance(value, list) else value
                for key, value in data.items()}
    train = {key: value for key, value in (
        ("epochs", args.epochs), ("steps_per_epoch", args.steps_per_epoch))
        if value is not None}
    config = dataclasses.replace(
        config, data=dataclasses.replace(config.data, **data),
        train=dataclasses.replace(config.train, **train))
    config = config_lib.override(config, args.overrides)
    run_dir = args.run_dir
    if run_dir is None and args.config and name == "config":
        run_dir = os.path.dirname(args.config) or "."  # a run's own config.json
    if run_dir is None:
        run_dir = os.path.join("runs", f"{name}-{config.data.source_language}-"
                                       f"{config.data.target_language}")
    return config, run_dir


# --- train, recipe, average -----------------------------------------------------------

def _add_train(parser):
    _add_config_options(parser)
    parser.epilog = """\
examples:
  keras-transformer train                                   # multi30k preset, en-de
  keras-transformer train --preset tiny --epochs 1 --steps-per-epoch 50
  keras-transformer train --data-dir DIR target_language=fr dropout=0.2
  keras-transformer train --train-files my.en my.xx --validation-files dev.en dev.xx \\
      --source-language en --target-language xx
  keras-transformer train --config runs/multi30k-en-de/config.json   # resumes the run
Running the same command again after an interruption resumes from the last backup."""


def _train(args):
    config, run_dir = make_config(args)
    _load_tensorflow(args.verbose)
    from keras_transformer.training import fit
    logger.info("Training into %s", run_dir)
    fit.train(config, run_dir)
    print(f"Done. Weights: {os.path.join(run_dir, files.FINAL_WEIGHTS)}; logs: "
          f"tensorboard --logdir {os.path.join(run_dir, files.LOGS)}")


def add_recipe_options(parser):
    """The recipe's options: the config's, the time budget and the candidates to choose
    from (also those of `benchmarks.quality`, which records a recipe)."""
    _add_config_options(parser)
    parser.add_argument("--time-budget-minutes", type=float, metavar="M",
                        help="train for M minutes of wall-clock time instead of the "
                             "preset's epochs")
    parser.add_argument("--minutes", type=float, dest="time_budget_minutes",
                        help=argparse.SUPPRESS)  # the option's earlier name
    parser.add_argument("--length-penalties", type=_list_of(_non_negative_float),
                        metavar="A,B,...", help="values of α to choose from on validation "
                                                "(default: 0.6,0.8,1.0)")
    parser.add_argument("--beam-sizes", type=_list_of(_positive_int), metavar="N,M,...",
                        help="beam sizes to choose from on validation (default: 4)")


def recipe_config(args):
    """Returns `(config, run_dir)` of the recipe's options (`add_recipe_options`)."""
    config, run_dir = make_config(args)
    if args.time_budget_minutes is not None:
        # The budget ends the run; the epoch count only has to be out of its way.
        config = dataclasses.replace(config, train=dataclasses.replace(
            config.train, time_budget_minutes=args.time_budget_minutes,
            epochs=max(config.train.epochs, 1000)))
    return config, run_dir


def recipe_choices(args):
    """Returns the `recipe.Choices` of the recipe's options (imports TensorFlow)."""
    from keras_transformer import recipe
    defaults = recipe.Choices()
    return dataclasses.replace(
        defaults, beam_sizes=tuple(args.beam_sizes or defaults.beam_sizes),
        length_penalties=tuple(args.length_penalties or defaults.length_penalties))


def _add_recipe(parser):
    add_recipe_options(parser)
    parser.add_argument("--no-check", action="store_true",
                        help="skip the export's self-check")
    parser.epilog = """\
Trains the preset (the main job: multi30k, en-de), then chooses the weights (newest
checkpoint, a mean of the newest ones, or the best-validation-BLEU ones), the beam size
and α on the validation split, exports the choice with its self-check, and scores the
exported SavedModel on every test split, beam and greedy. Run it again on the same
--run-dir to resume an interrupted training or to redo the steps after it."""


def _recipe(args):
    config, run_dir = recipe_config(args)
    _load_tensorflow(args.verbose)
    from keras_transformer import recipe
    result = recipe.run_recipe(config, run_dir, choices=recipe_choices(args),
                               check=not args.no_check)
    selection = result["selection"]
    print(f"Chosen on validation ({selection['sentences']} sentences): "
          f"{selection['weights']}, beam {selection['beam_size']}, "
          f"α {selection['length_penalty']:g}. Exported to {result['export_dir']}.\n")
    print(recipe.results_table(result))
    print("\nSample translations (validation):")
    for source, translation in result["samples"]:
        print(f"  {source}\n  → {translation}")
    print(f"\nEverything measured: {os.path.join(run_dir, files.RECIPE_RESULT)}")


def _add_average(parser):
    parser.add_argument("run_dir", metavar="RUN_DIR", help="the run whose checkpoints to "
                                                           "average")
    parser.add_argument("--last", type=_positive_int, default=5, metavar="N",
                        help="how many of the newest checkpoints to average (default: 5, "
                             "as the paper's base models; its big models used 20)")
    parser.add_argument("-o", "--output", metavar="FILE",
                        help="weights file to write (default: RUN_DIR/averaged.weights.h5)")


def _average(args):
    _load_tensorflow(args.verbose)
    from keras_transformer.training import averaging
    print(f"Wrote {averaging.average_run(args.run_dir, args.last, args.output)}")


# --- export, check ---------------------------------------------------------------------

def _add_export(parser):
    parser.add_argument("run_dir", metavar="RUN_DIR", help="the run to export")
    parser.add_argument("--weights", help="'averaged', 'final', 'latest' or a weights "
                                          "file (default: the run's choice, else the "
                                          "newest)")
    parser.add_argument("-o", "--output", metavar="DIR",
                        help="folder to write (default: RUN_DIR/export)")
    parser.add_argument("--beam-size", type=_positive_int, metavar="N",
                        help="beam size of the beam_search signature (default: the run's "
                             f"choice, else {files.PAPER_BEAM_SIZE}, §6.1)")
    parser.add_argument("--length-penalty", type=_non_negative_float, metavar="ALPHA",
                        help="α of its length penalty (default: the run's choice, else "
                             f"{files.PAPER_LENGTH_PENALTY})")
    parser.add_argument("--max-output-length", type=_positive_int, metavar="N",
                        help="most output tokens (default: the model's max_length - 1)")
    parser.add_argument("--no-quantize", action="store_true",
                        help="skip the TFLite file with int8 weights")
    # "extend": `--ensemble b --ensemble c` names both runs; "store" would keep only the
    # last flag's and export a smaller ensemble without a word.
    parser.add_argument("--ensemble", nargs="+", action="extend", default=[],
                        metavar="RUN_DIR",
                        help="further runs trained with RUN_DIR's tokenizer: the artifact "
                             "translates with the mean of all the models' probabilities")
    parser.add_argument("--ctranslate2", action="store_true",
                        help="also write CTranslate2 models, float32 and int8 (needs the "
                             "ctranslate2 extra)")
    parser.add_argument("--check", action="store_true",
                        help="then check that every artifact translates like the model")


def _export(args):
    for run_dir in [args.run_dir, *args.ensemble]:
        runs.load_config(run_dir)  # names a missing or broken run before minutes of work
    runs.load_choice(args.run_dir)  # and a broken choice
    if args.output and os.path.exists(args.output) and not os.path.isdir(args.output):
        raise UsageError(f"--output {args.output} is a file: name a folder to write into.")
    _load_tensorflow(args.verbose)
    from keras_transformer.serving import export
    output_dir, _ = export.export_run(
        args.run_dir, weights=args.weights, output_dir=args.output,
        quantize=not args.no_quantize, ensemble=args.ensemble,
        ctranslate2=args.ctranslate2, max_output_length=args.max_output_length,
        beam_size=args.beam_size,
        length_penalty=args.length_penalty)
    print(f"Exported to {output_dir} (report: "
          f"{os.path.join(output_dir, files.REPORT_MARKDOWN)})")
    if args.check:
        _print_checks(args.run_dir, export_dir=output_dir)


def _add_check(parser):
    parser.add_argument("run_dir", metavar="RUN_DIR", help="the run whose export to check")
    parser.add_argument("--export-dir", metavar="DIR",
                        help="the artifacts' folder (default: RUN_DIR/export)")
    parser.add_argument("-i", "--input", metavar="FILE",
                        help="source sentences to check, one a line (default: the run's "
                             "validation sources)")
    parser.add_argument("--sentences", dest="input",
                        help=argparse.SUPPRESS)  # the option's earlier name
    parser.add_argument("--count", type=_positive_int, default=100, metavar="N",
                        help="sentences to check (default: 100)")


def _check(args):
    _load_tensorflow(args.verbose)
    _print_checks(args.run_dir, export_dir=args.export_dir, sentences_file=args.input,
                  count=args.count)


def _print_checks(run_dir, **options):
    from keras_transformer.serving import self_check
    checks = self_check.check_run(run_dir, **options)
    print(self_check.format_table(checks))
    export_dir = options.get("export_dir") or os.path.join(run_dir, files.EXPORT_DIR)
    print(f"\n{self_check.summary(checks, export_dir)}")
    self_check.raise_on_failure(checks)


# --- translate, evaluate ---------------------------------------------------------------

def _add_translate(parser):
    parser.add_argument("artifact", metavar="ARTIFACT",
                        help="run directory, SavedModel directory, .tflite file or "
                             "CTranslate2 directory")
    parser.add_argument("-i", "--input", metavar="FILE",
                        help="sentences, one a line (default: standard input)")
    parser.add_argument("-o", "--output", metavar="FILE",
                        help="translations, one a line (default: standard output)")
    parser.add_argument("--batch-size", type=_positive_int, default=32, metavar="N",
                        help="most sentences per call (default: 32)")
    parser.add_argument("--batch-tokens", type=_positive_int, metavar="N",
                        help="also at most N source tokens per call, padding included "
                             "(sentences x the longest one's tokens), counted with the "
                             "run's tokenizer")
    _add_decoder_options(parser)
    _add_threads_option(parser)
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress bar (shown when reading a file)")


def _translate(args):
    from keras_transformer import translate  # NumPy: see the module docstring
    files.check_output_file("--output", args.output, {"--input": args.input})
    if args.input and not os.path.isfile(args.input):
        raise UsageError(f"--input {args.input}: no such file.")
    if not args.artifact.endswith(".tflite"):
        _load_tensorflow(args.verbose)
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
    parser.add_argument("--batch-size", type=_positive_int, default=64, metavar="N",
                        help="sentences per call (default: 64)")
    _add_decoder_options(parser)
    _add_threads_option(parser)
    parser.add_argument("--session", action="store_true",
                        help="load the SavedModel as TF Serving does (session loader)")
    parser.add_argument("-o", "--output", metavar="PATH",
                        help="keep the translations: a file with --source, else a folder")
    parser.add_argument("--json", metavar="FILE", help="write the scores here as JSON")


def _evaluate(args):
    from keras_transformer import evaluation
    if (args.source is None) != (args.reference is None):
        raise UsageError("--source and --reference go together")
    if args.source and args.split:
        raise UsageError("give --split or --source/--reference, not both")
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
        _load_tensorflow(args.verbose)
    translator = _load_translator(args)
    results = evaluation.evaluate_splits(translator, pairs, output=args.output,
                                         single_output=single)
    print(evaluation.format_table(results, translator.decoder))
    if args.json:
        files.write_text(args.json, json.dumps(
            {"artifact": translator.artifact, "decoder": translator.decoder,
             "splits": results}, indent=2, ensure_ascii=False) + "\n")


# --- distill, fuzz ---------------------------------------------------------------------

def _add_distill(parser):
    parser.add_argument("run_dir", metavar="RUN_DIR", help="the teacher run")
    parser.add_argument("-o", "--output", required=True, metavar="DIR",
                        help="where the student's corpus goes")
    parser.add_argument("--artifact", help="SavedModel or .tflite exported from RUN_DIR "
                                           "(an ensemble of it and other runs, say) that "
                                           "translates instead of the run's own SavedModel")
    parser.add_argument("--data-dir", metavar="DIR",
                        help="local copy of Multi30K (default: the teacher's data_dir)")
    parser.add_argument("--beam", action="store_true",
                        help="beam search (the artifact's) instead of greedy decoding")
    parser.add_argument("--batch-size", type=_positive_int, default=64, metavar="N",
                        help="sentences per call (default: 64)")


def _distill(args):
    _load_tensorflow(args.verbose)
    from keras_transformer.tools import distillation
    distillation.distill(args.run_dir, args.output, artifact=args.artifact,
                         data_dir=args.data_dir, beam=args.beam, batch_size=args.batch_size)


def _add_fuzz(parser):
    parser.add_argument("artifacts", nargs="+", metavar="ARTIFACT",
                        help="exported translators: SavedModel or CTranslate2 directories, "
                             ".tflite files, or run directories (their SavedModel)")
    parser.add_argument("--count", type=_positive_int, default=10_000, metavar="N",
                        help="generated sentences per artifact (default: 10000)")
    parser.add_argument("--seed", type=int, default=0, help="generator seed")
    parser.add_argument("--max-batch", type=_positive_int, default=fuzzing.MAX_BATCH,
                        metavar="N", help="largest batch of generated sentences, sent "
                                          f"once at least (default: {fuzzing.MAX_BATCH})")
    parser.add_argument("--max-seconds", type=float, default=60.0, metavar="S",
                        help="longest a call may take, in seconds (default: 60)")
    parser.add_argument("-o", "--output", metavar="FILE", help="write the reports here")


def _fuzz(args):
    files.check_output_file("--output", args.output)
    if not all(artifact.endswith(".tflite") for artifact in args.artifacts):
        _load_tensorflow(args.verbose)
    from keras_transformer.serving import artifacts, runners  # NumPy: see the docstring
    reports = {}
    for artifact in args.artifacts:
        runner = runners.open_runner(artifacts.resolve_artifact(artifact))
        reports[artifact] = fuzzing.fuzz(runner, fuzzing.generate_batches(
            args.seed, args.count, args.max_batch), args.max_seconds)
        print(json.dumps({artifact: reports[artifact]}, indent=2), flush=True)
    if args.output:
        files.write_text(args.output, json.dumps(reports, indent=2) + "\n")
    return 0 if all(report["passed"] for report in reports.values()) else 1


_VERBS = {
    "train": (_add_train, _train, "train a preset or config with model.fit (resumable)"),
    "average": (_add_average, _average, "average a run's newest checkpoints (§6.1)"),
    "export": (_add_export, _export,
               "export a run as a SavedModel (TF Serving) and .tflite translators"),
    "check": (_add_check, _check,
              "check that a run's exported artifacts translate like its model"),
    "translate": (_add_translate, _translate, "translate sentences, one a line"),
    "evaluate": (_add_evaluate, _evaluate,
                 "score translations of test splits with sacreBLEU (BLEU, chrF)"),
    "distill": (_add_distill, _distill,
                "write a student's corpus: the teacher's translations of its training text"),
    "fuzz": (_add_fuzz, _fuzz, "send hostile input through exported translators"),
    "recipe": (_add_recipe, _recipe,
               "the main job: train, choose on validation, export, score every test split"),
}


if __name__ == "__main__":
    sys.exit(main())
