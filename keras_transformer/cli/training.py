"""The verbs of training: `train`, `recipe` (the main job) and `average`."""

import logging
import os

from keras_transformer import files
from keras_transformer.cli import console, options

logger = logging.getLogger(__name__)


def _add_train(parser):
    options.add_config_options(parser)
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
    config, run_dir = options.make_config(args)
    console.load_tensorflow(args.verbose)
    from keras_transformer.training import fit
    logger.info("Training into %s", run_dir)
    fit.train(config, run_dir)
    print(f"Done. Weights: {os.path.join(run_dir, files.FINAL_WEIGHTS)}; logs: "
          f"tensorboard --logdir {os.path.join(run_dir, files.LOGS)}")


def _add_recipe(parser):
    options.add_recipe_options(parser)
    parser.add_argument("--no-check", action="store_true",
                        help="skip the export's self-check")
    parser.epilog = """\
Trains the preset (the main job: multi30k, en-de), then chooses the weights (newest
checkpoint, a mean of the newest ones, or the best-validation-BLEU ones), the beam size
and α on the validation split, exports the choice with its self-check, and scores the
exported SavedModel on every test split, beam and greedy. Run it again on the same
--run-dir to resume an interrupted training or to redo the steps after it."""


def _recipe(args):
    config, run_dir = options.recipe_config(args)
    console.load_tensorflow(args.verbose)
    from keras_transformer import recipe
    result = recipe.run_recipe(config, run_dir, choices=options.recipe_choices(args),
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
    parser.add_argument("--last", type=options.positive_int, default=5, metavar="N",
                        help="how many of the newest checkpoints to average (default: 5, "
                             "as the paper's base models; its big models used 20)")
    parser.add_argument("-o", "--output", metavar="FILE",
                        help="weights file to write (default: RUN_DIR/averaged.weights.h5)")


def _average(args):
    from keras_transformer import runs
    output = args.output or os.path.join(args.run_dir, files.AVERAGED_WEIGHTS)
    choice = runs.load_choice(args.run_dir) if files.is_run_dir(args.run_dir) else None
    if choice is not None and files.same_path(choice.weights_path(args.run_dir), output):
        # Else export, translate and evaluate would take another mean for the chosen one.
        raise options.UsageError(
            f"{output} holds the weights the recipe chose on validation "
            f"({choice.chosen_by}): write this average elsewhere (--output FILE).")
    console.load_tensorflow(args.verbose)
    from keras_transformer.training import averaging
    print(f"Wrote {averaging.average_run(args.run_dir, args.last, args.output)}")


VERBS = {
    "train": (_add_train, _train, "train a preset or config with model.fit (resumable)"),
    "average": (_add_average, _average, "average a run's newest checkpoints (§6.1)"),
    "recipe": (_add_recipe, _recipe,
               "the main job: train, choose on validation, export, score every test split"),
}
