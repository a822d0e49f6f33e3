"""Beam search's length penalty α on a trained run: BLEU, chrF and output length per α.

Beam search with the GNMT penalty (`decoding.beam_search`) ranks hypotheses by
log P(Y) / ((5 + |Y|) / 6)^α; a larger α favours longer outputs. This script translates
a split of the run's corpus with the run's weights (by default the averaged ones) for
each α, in this process (`serving.Translator` with XLA decoding: the exported graph's
beam search, whose α is fixed at export), and scores each with sacreBLEU. Choose α on
the validation split, then report the test split with that α only.

    python -m benchmarks.length_penalty RUN_DIR --split validation --alphas 0.6 1.0 1.5 2.0
    python -m benchmarks.length_penalty RUN_DIR --split test --alphas 0.6 1.5
"""

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from benchmarks import common  # noqa: E402
from keras_transformer import runs
from keras_transformer.data import corpus
from keras_transformer.serving import translator as translator_lib  # noqa: E402


def parse_arguments(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    common.add_run_arguments(parser, default_weights="averaged")
    parser.add_argument("--split", default="validation", choices=sorted(corpus.MULTI30K_SPLITS),
                        help="corpus split to score (default: validation)")
    parser.add_argument("--alphas", nargs="+", action=common.ListOption, type=float,
                        default=[0.6, 1.0, 1.5, 2.0],
                        help="length penalties to try (default: 0.6 1.0 1.5 2.0)")
    parser.add_argument("--beam-size", type=int, default=4)
    parser.add_argument("--sentences", type=int, default=None,
                        help="score only the first N sentences (default: all)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--json", default=None, metavar="PATH", help="write results here")
    return parser.parse_args(argv)


def main(argv=None):
    arguments = parse_arguments(argv)
    result = common.header(arguments)
    run_config, tokenizer, model = runs.load_run(arguments.run_dir, arguments.weights)
    sources, references = common.read_split(run_config.data, arguments.split,
                                            arguments.sentences)
    rows = []
    for alpha in arguments.alphas:
        translator = translator_lib.Translator(model, tokenizer, beam_size=arguments.beam_size,
                                        length_penalty=alpha, jit_compile=True)
        row = {"alpha": alpha, **common.score_beam_search(
            translator, sources, references, arguments.batch_size)}
        rows.append(row)
        print(row["bleu_text"], f"(α {alpha})", flush=True)
    common.report_scores(result, rows, ("alpha", "α"), arguments.split, len(sources),
                         arguments.json)


if __name__ == "__main__":
    sys.exit(main())
