"""What several verbs share: argument types, the decoder and config options, and the
`Config` (and run directory) they build."""

import argparse
import dataclasses
import os

from keras_transformer import config as config_lib
from keras_transformer import files


class UsageError(ValueError):
    """A command line that cannot be carried out as given; the message says the fix."""


def positive_int(text):
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return value


def non_negative_float(text):
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of at least 0")
    return value


def non_negative_int(text):
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer of at least 0")
    return value


def port(text):
    """A TCP port: 0 (any free one) to 65535."""
    value = non_negative_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port (0 to 65535)")
    return value


def positive_float(text):
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number above 0")
    return value


def list_of(item_type):
    """argparse type: comma-separated values (a list option would swallow FIELD=VALUEs)."""
    def parse(text):
        return [item_type(item) for item in text.split(",") if item]
    return parse


def add_threads_option(parser):
    parser.add_argument("--threads", type=positive_int, metavar="N",
                        help="threads of the runtime: TensorFlow's for a SavedModel "
                             "(default: 1), LiteRT's for a .tflite file (default: "
                             "LiteRT's), CTranslate2's (default: 1)")


def add_decoder_options(parser):
    parser.add_argument("--beam", action="store_true",
                        help=f"beam search (the artifact's: beam {files.PAPER_BEAM_SIZE}, α "
                             f"{files.PAPER_LENGTH_PENALTY} unless exported otherwise; on a "
                             "run directory, the run's choice) instead of greedy decoding")
    parser.add_argument("--beam-size", type=positive_int, metavar="N",
                        help="beam search with N hypotheses (implies --beam; on an "
                             "artifact, the exported size)")
    parser.add_argument("--length-penalty", type=non_negative_float, metavar="ALPHA",
                        help="α of beam search's length penalty (implies --beam)")
    parser.add_argument("--greedy", action="store_true",
                        help="greedy decoding on a run directory whose choice on "
                             "validation (recipe) is beam search, which it uses by default")


def add_config_options(parser):
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
    parser.add_argument("--epochs", type=positive_int, metavar="N",
                        help="passes over the data, or of --steps-per-epoch steps")
    parser.add_argument("--steps-per-epoch", type=positive_int, metavar="N",
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
            config = config_lib.Config.load(args.config, check=False)  # see below
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
    if args.config:  # after the options and overrides, which may fix a value of the file
        config_lib.check_file_types(config, args.config)
    run_dir = args.run_dir
    if run_dir is None and args.config and name == "config":
        run_dir = os.path.dirname(args.config) or "."  # a run's own config.json
    if run_dir is None:
        run_dir = os.path.join("runs", f"{name}-{config.data.source_language}-"
                                       f"{config.data.target_language}")
    return config, run_dir


# --- train, recipe, average -----------------------------------------------------------
def add_recipe_options(parser):
    """The recipe's options: the config's, the time budget and the candidates to choose
    from (also those of `benchmarks.quality`, which records a recipe)."""
    add_config_options(parser)
    parser.add_argument("--time-budget-minutes", type=float, metavar="M",
                        help="train for M minutes of wall-clock time instead of the "
                             "preset's epochs")
    parser.add_argument("--minutes", type=float, dest="time_budget_minutes",
                        help=argparse.SUPPRESS)  # the option's earlier name
    parser.add_argument("--length-penalties", type=list_of(non_negative_float),
                        metavar="A,B,...", help="values of α to choose from on validation "
                                                "(default: 0.6,0.8,1.0)")
    parser.add_argument("--beam-sizes", type=list_of(positive_int), metavar="N,M,...",
                        help="beam sizes to choose from on validation (default: 4)")


def recipe_config(args):
    """Returns `(config, run_dir)` of the recipe's options (`add_recipe_options`)."""
    config, run_dir = make_config(args)
    if args.time_budget_minutes is not None:
        config_lib.check_config(config)  # epochs must be a number for max() below
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
