"""Checkpoint averaging on a trained run: BLEU of the last N checkpoints' mean, per N.

The recipe averages the last 5 checkpoints (paper §6.1). This script measures what that
buys on a finished run: it loads the element-wise mean of the newest N checkpoints for
each N (`averaging.average_weights`; N = 1 is the last checkpoint alone), and the
best-validation-BLEU weights the BLEU callback kept, translates a split with beam search
(4, α 0.6, XLA, in this process) and scores each with sacreBLEU. The best-BLEU weights
were chosen on the first `train.bleu_sentences` validation sentences, so the validation
split flatters them; compare them on the test split.

    python -m benchmarks.checkpoint_averaging RUN_DIR --split validation
    python -m benchmarks.checkpoint_averaging RUN_DIR --split test --counts 1 5
"""

import argparse
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from benchmarks import common  # noqa: E402
from keras_transformer import files, runs
from keras_transformer.data import corpus
from keras_transformer.files import BEST_INFO, BEST_WEIGHTS  # noqa: E402
from keras_transformer.serving import translator as translator_lib  # noqa: E402
from keras_transformer.training import averaging


def parse_arguments(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run_dir", help="a finished run directory with its checkpoints")
    parser.add_argument("--split", default="validation", choices=sorted(corpus.MULTI30K_SPLITS),
                        help="corpus split to score (default: validation)")
    parser.add_argument("--counts", nargs="+", action=common.ListOption, type=int,
                        default=None,
                        help="how many of the newest checkpoints to average, one score "
                             "each (default: 1 up to every checkpoint kept)")
    parser.add_argument("--beam-size", type=int, default=4)
    parser.add_argument("--length-penalty", type=float, default=0.6)
    parser.add_argument("--sentences", type=int, default=None,
                        help="score only the first N sentences (default: all)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--json", default=None, metavar="PATH", help="write results here")
    return parser.parse_args(argv)


def weight_sets(run_dir, counts=None):
    """Returns `(label, weight paths)` pairs to score: the averages, then the best weights.

    Raises:
        FileNotFoundError: when the run has no checkpoints.
        ValueError: when a count is below 1 or above the number of checkpoints kept.
    """
    checkpoints = runs.list_checkpoints(os.path.join(run_dir, files.CHECKPOINTS))
    if not checkpoints:
        raise FileNotFoundError(f"No checkpoints in {run_dir}: train first.")
    counts = counts or range(1, len(checkpoints) + 1)
    sets = []
    for count in counts:
        if not 1 <= count <= len(checkpoints):
            raise ValueError(f"--counts: {count} is not between 1 and the {len(checkpoints)} "
                             f"checkpoints kept in {run_dir}.")
        chosen = checkpoints[-count:]
        steps = [int(files.CHECKPOINT_PATTERN.match(os.path.basename(path)).group(1))
                 for path in chosen]
        label = (f"last checkpoint (step {steps[0]})" if count == 1 else
                 f"mean of the last {count} (steps {steps[0]}–{steps[-1]})")
        sets.append((label, chosen))
    best = os.path.join(run_dir, files.CHECKPOINTS, BEST_WEIGHTS)
    if os.path.exists(best):
        with open(os.path.join(run_dir, files.CHECKPOINTS, BEST_INFO), encoding="utf-8") as file:
            record = json.load(file)
        sets.append((f"best validation BLEU (step {record['step']}, "
                     f"{record['bleu']:.1f} on {record['sentences']} sentences)", [best]))
    return sets


def main(argv=None):
    arguments = parse_arguments(argv)
    result = common.header(arguments)
    sets = weight_sets(arguments.run_dir, arguments.counts)
    run_config, tokenizer, model = runs.load_run(arguments.run_dir, sets[0][1][0])
    sources, references = common.read_split(run_config.data, arguments.split,
                                            arguments.sentences)
    # One translator for every weight set: its compiled functions read the model's
    # variables at each call, so loading other weights into them needs no new trace.
    translator = translator_lib.Translator(model, tokenizer, beam_size=arguments.beam_size,
                                    length_penalty=arguments.length_penalty, jit_compile=True)
    rows = []
    for label, paths in sets:
        averaging.average_weights(model, paths)
        row = {"weights": label, "checkpoints": [os.path.basename(path) for path in paths],
               **common.score_beam_search(translator, sources, references,
                                          arguments.batch_size)}
        rows.append(row)
        print(row["bleu_text"], f"({label})", flush=True)
    common.report_scores(result, rows, ("weights", "weights"), arguments.split, len(sources),
                         arguments.json)


if __name__ == "__main__":
    sys.exit(main())
