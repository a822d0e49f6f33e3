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

Here: `main` and the parser; `console` (log output, TensorFlow's start-up lines),
`options` (what verbs share: types, decoder and config options, `make_config`), and
the verbs by stage: `training`, `exporting`, `translating`, `serving`, `tools`.

Only modules that need nothing beyond the standard library (`config`, `files`, `runs`,
the fuzzer's generator) are imported at the top; the others (TensorFlow, Keras, NumPy for the
runners) by the verb that needs them, when it runs: `--help` then answers at once, and
TensorFlow loads only after its start-up output is set to be dropped.
"""

import argparse
import contextlib
import sys

from keras_transformer.cli import console, exporting, serving, tools, training, translating
from keras_transformer.cli.options import (  # noqa: F401 (the command's API)
    UsageError,
    add_recipe_options,
    make_config,
    recipe_choices,
    recipe_config,
)

PROGRAM = "keras-transformer"

# In the order `--help` lists them: the data flow, then the main job that runs it all.
_VERBS = {**training.VERBS, **exporting.VERBS, **translating.VERBS, **serving.VERBS,
          **tools.VERBS}
_VERBS = {name: _VERBS[name] for name in (
    "train", "average", "export", "check", "translate", "translate-corpus", "score",
    "evaluate", "serve", "distill", "fuzz", "recipe")}


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
        verb_parser = verb_parsers[argv[0]]
        if verb_parser.get_default("pass_through") is None:
            # Options and positional arguments in any order (overrides between options).
            args = verb_parser.parse_intermixed_args(leading + argv[1:])
        else:  # what the verb does not know goes on (Beam's options), as Beam's examples
            args, args.pass_through = verb_parser.parse_known_args(leading + argv[1:])
    except SystemExit as exit:  # --help (0) or a usage error (2), already printed
        return exit.code
    quiet = contextlib.nullcontext() if args.verbose else console.native_stderr_filtered()
    try:
        with console.console(args.verbose), quiet:
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
