"""Checkpoint averaging: the mean of the last checkpoints' weights (Vaswani et al., §6.1).

The paper's base models average the last 5 checkpoints (written every 10 minutes), its
big models the last 20. From the command line:

    python -m keras_transformer.averaging RUN_DIR --last 5

writes `RUN_DIR/averaged.weights.h5` (and `averaged.json`, naming the checkpoints used),
which `runs.load_run` then prefers as the newest weights.
"""

import argparse
import json
import logging
import os

import numpy as np

from keras_transformer import callbacks as callbacks_lib
from keras_transformer import config as config_lib
from keras_transformer import output_paths, runs


def average_weights(model, paths):
    """Loads the element-wise mean of the weight files `paths` into `model`.

    Args:
        model: a built `Transformer` of the architecture the files were saved from.
        paths: sequence of `.weights.h5` files (any optimizer state in them is ignored).

    Returns:
        `model`, holding the averaged weights.
    """
    if not paths:
        raise ValueError("No checkpoints to average.")
    totals = None
    for path in paths:
        runs.load_weights(model, path)  # a corrupt or foreign file is named in the error
        weights = [np.asarray(value, dtype=np.float64) for value in model.get_weights()]
        totals = weights if totals is None else [a + b for a, b in zip(totals, weights)]
    model.set_weights([(total / len(paths)).astype(variable.dtype)
                       for total, variable in zip(totals, model.get_weights())])
    return model


def average_run(run_dir, last=5, output=None):
    """Averages the newest `last` checkpoints of a run and saves the result.

    Args:
        run_dir: str. A run directory (see `keras_transformer.runs`).
        last: int. How many of the newest checkpoints to average. Fewer are used, with a
            warning, when fewer exist (training keeps `train.keep_checkpoints` of them).
        output: str. Where to write; defaults to `RUN_DIR/averaged.weights.h5`.

    Returns:
        The path written.
    """
    if last < 1:
        raise ValueError(f"--last must be at least 1, got {last}.")
    if output is not None:  # checked before the averaging, not after it
        if not output.endswith(".weights.h5"):
            raise ValueError(f"--output {output}: Keras weights files end in .weights.h5; "
                             "name one that does.")
        output_paths.check_output_file("--output", output)
    runs.check_run_dir(run_dir)
    checkpoint_dir = os.path.join(run_dir, runs.CHECKPOINTS)
    paths = callbacks_lib.list_checkpoints(checkpoint_dir)[-last:]
    if not paths:
        raise FileNotFoundError(f"No checkpoints in {checkpoint_dir}: train first.")
    if len(paths) < last:
        logging.warning("Only %d checkpoint(s) in %s; averaging those.",
                        len(paths), checkpoint_dir)
    config = config_lib.Config.load(os.path.join(run_dir, runs.CONFIG))
    model = average_weights(runs.build_model(config), paths)
    output = output or os.path.join(run_dir, runs.AVERAGED_WEIGHTS)
    partial = os.path.join(os.path.dirname(output) or ".", "partial-" + os.path.basename(output))
    model.save_weights(partial, overwrite=True)
    os.replace(partial, output)
    with open(record_path(output), "w", encoding="utf-8") as file:
        json.dump({"checkpoints": [os.path.basename(path) for path in paths]}, file, indent=2)
    return output


def record_path(weights_path):
    """Returns where `average_run` records which checkpoints made `weights_path`."""
    return os.path.splitext(os.path.splitext(weights_path)[0])[0] + ".json"


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m keras_transformer.averaging",
        description="Average the newest checkpoints of a training run (paper §6.1).")
    parser.add_argument("run_dir", help="run directory written by train.py")
    parser.add_argument("--last", type=int, default=5,
                        help="how many of the newest checkpoints to average (default: 5, "
                             "the paper's base models; it used 20 for big models)")
    parser.add_argument("--output", default=None,
                        help="weights file to write (default: RUN_DIR/averaged.weights.h5)")
    arguments = parser.parse_args(argv)
    try:
        path = average_run(arguments.run_dir, arguments.last, arguments.output)
    except (ValueError, OSError) as error:  # WeightsFileError and a bad config included
        raise SystemExit(f"error: {error}") from None
    print(f"Wrote {path}")


if __name__ == "__main__":
    main()
