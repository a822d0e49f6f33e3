"""Checkpoint averaging: the mean of the last checkpoints' weights (Vaswani et al., §6.1).

The paper's base models average the last 5 checkpoints (written every 10 minutes), its
big models the last 20. `keras-transformer average RUN_DIR --last 5` writes
`RUN_DIR/averaged.weights.h5` (and `averaged.json`, naming the checkpoints used), which
`runs.load_run` then prefers as the newest weights.
"""

import json
import logging
import os

import numpy as np

from keras_transformer import files, runs

logger = logging.getLogger(__name__)


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
        output: str. Where to write; defaults to `RUN_DIR/averaged.weights.h5`. An
            existing file is replaced only when it is an earlier average (its record
            beside it), never a checkpoint, the best or final weights, or a file of the
            user's.

    Returns:
        The path written.
    """
    if last < 1:
        raise ValueError(f"--last must be at least 1, got {last}.")
    if output is not None:  # checked before the averaging, not after it
        if not output.endswith(".weights.h5"):
            raise ValueError(f"--output {output}: Keras weights files end in .weights.h5; "
                             "name one that does.")
        files.check_output_file("--output", output)
        _check_replaceable(output)
    runs.check_run_dir(run_dir)
    checkpoint_dir = os.path.join(run_dir, files.CHECKPOINTS)
    paths = runs.list_checkpoints(checkpoint_dir)[-last:]
    if not paths:
        raise FileNotFoundError(f"No checkpoints in {checkpoint_dir}: train first.")
    if len(paths) < last:
        logger.warning("Only %d checkpoint(s) in %s; averaging those.",
                        len(paths), checkpoint_dir)
    config = runs.load_config(run_dir)
    model = average_weights(runs.build_model(config), paths)
    output = output or os.path.join(run_dir, files.AVERAGED_WEIGHTS)
    files.replace_atomically(output, lambda path: model.save_weights(path, overwrite=True))
    files.write_text(record_path(output), json.dumps(
        {"checkpoints": [os.path.basename(path) for path in paths]}, indent=2))
    return output


def record_path(weights_path):
    """Returns where `average_run` records which checkpoints made `weights_path`."""
    return os.path.splitext(os.path.splitext(weights_path)[0])[0] + ".json"


def _check_replaceable(output):
    """Raises ValueError when writing `output` and its record would replace what is
    not an earlier average: a checkpoint (`--output RUN/checkpoints/step-….weights.h5`),
    the best weights and their `best.json`, `config.json` beside `config.weights.h5`."""
    record = record_path(output)
    try:
        with open(record, encoding="utf-8") as file:
            earlier = isinstance(json.load(file).get("checkpoints"), list)
    except (OSError, ValueError, AttributeError):  # none, not JSON, not an object
        earlier = False
    for path in (output, record):
        if os.path.exists(path) and not earlier:
            raise ValueError(f"--output {output}: {path} exists and is not an earlier "
                             f"average (no {record} names its checkpoints); writing "
                             "would replace it. Name a new file.")
