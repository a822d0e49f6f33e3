"""Train the Transformer: `python train.py --help`.

Reads a preset (or a saved config), applies `field=value` overrides, and calls
`keras_transformer.training.train`. Everything the run produces goes to its run directory
(default `runs/<preset>-<source>-<target>`); running the same command again after an
interruption resumes from the last backup there.
"""

import argparse
import dataclasses
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's C++ start-up chatter

from keras_transformer import config as config_lib  # noqa: E402
from keras_transformer import runs, training  # noqa: E402

EPILOG = """\
examples:
  python train.py                                    # default preset on Multi30K en-de
  python train.py --preset tiny --epochs 1 --steps 50
  python train.py --data-dir ../shared/data/multi30k target_language=fr dropout=0.2
  python train.py --config runs/multi30k-en-de/config.json --run-dir runs/multi30k-en-de

overrides: FIELD=VALUE or SECTION.FIELD=VALUE for any field of ModelConfig, DataConfig or
TrainConfig (keras_transformer/config.py); values are JSON (0.2, true, null) or plain text.
Afterwards: python -m keras_transformer.averaging RUN_DIR --last 5
"""


def positive_integer(text):
    """argparse type: an integer of at least 1 (0 epochs would train nothing)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return value


def parse_arguments(argv=None):
    parser = argparse.ArgumentParser(
        description="Train the encoder-decoder Transformer (Vaswani et al., 2017) with "
                    "model.fit; resumable, logs to TensorBoard.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default=None, choices=sorted(config_lib.PRESETS),
                        help=f"named configuration (default: {config_lib.DEFAULT_PRESET})")
    parser.add_argument("--config", default=None, metavar="FILE",
                        help="config.json written by an earlier run (Config.save); "
                             "replaces --preset")
    parser.add_argument("--data-dir", default=None, metavar="DIR",
                        help="local directory with the corpus files (Multi30K names: "
                             "train.en.gz, val.de.gz, ...); default: download Multi30K")
    parser.add_argument("--run-dir", default=None, metavar="DIR",
                        help="where the config, tokenizer, checkpoints, backup, logs and "
                             "weights go (default: runs/<preset>-<source>-<target>, "
                             "or the folder of a run's config.json given with --config)")
    parser.add_argument("--epochs", type=positive_integer, default=None, metavar="N",
                        help="number of epochs (sets train.epochs)")
    parser.add_argument("--steps", type=positive_integer, default=None, metavar="N",
                        help="batches per epoch (sets train.steps_per_epoch; the data "
                             "then repeats as needed). With --epochs 1 it is the total "
                             "number of training steps. Default: one pass over the data")
    parser.add_argument("overrides", nargs="*", metavar="FIELD=VALUE",
                        help="config overrides, applied last")
    # Overrides may come before, between or after the options.
    return parser.parse_intermixed_args(argv)


def make_config(arguments):
    """Returns `(run_dir, config)` for the parsed command line."""
    if arguments.config and arguments.preset:
        raise SystemExit("error: give --preset or --config, not both")
    if arguments.config:
        try:
            config = config_lib.Config.load(arguments.config)
        except OSError as error:  # missing, a directory, unreadable
            raise ValueError(f"--config {arguments.config}: cannot read it "
                             f"({error.strerror}). Give the config.json of an earlier "
                             "run, or a --preset.") from None
        name = os.path.splitext(os.path.basename(arguments.config))[0]
    else:
        name = arguments.preset or config_lib.DEFAULT_PRESET
        config = config_lib.preset_config(name)
    data, train = config.data, config.train
    if arguments.data_dir is not None:
        data = dataclasses.replace(data, data_dir=arguments.data_dir)
    if arguments.epochs is not None:
        train = dataclasses.replace(train, epochs=arguments.epochs)
    if arguments.steps is not None:
        train = dataclasses.replace(train, steps_per_epoch=arguments.steps)
    config = config_lib.override(dataclasses.replace(config, data=data, train=train),
                                 arguments.overrides)
    run_dir = arguments.run_dir
    if run_dir is None and arguments.config and name == "config":
        run_dir = os.path.dirname(arguments.config) or "."  # a run's own config.json
    return run_dir or runs.default_run_dir(name, config), config


def main(argv=None):
    arguments = parse_arguments(argv)
    try:
        run_dir, config = make_config(arguments)
    except ValueError as error:
        raise SystemExit(f"error: {error}") from None
    print(f"Training into {run_dir}", flush=True)
    try:
        training.train(config, run_dir)
    except training.USER_ERRORS as error:
        raise SystemExit(f"error: {error}") from None
    print(f"Done. Weights: {os.path.join(run_dir, runs.FINAL_WEIGHTS)}; "
          f"logs: tensorboard --logdir {os.path.join(run_dir, runs.LOGS)}")


if __name__ == "__main__":
    sys.exit(main())
