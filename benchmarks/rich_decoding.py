"""n-best lists and scoring: our artifacts against CTranslate2's same feature, one run.

    keras-transformer export RUN_DIR --ctranslate2
    python -m benchmarks.rich_decoding --export-dir RUN_DIR/export \\
        --source test_2016_flickr.en.gz --reference test_2016_flickr.de.gz

For each artifact (SavedModel, TFLite float, CTranslate2 float32), the `n_best`
signature (CTranslate2: `translate_batch` with `num_hypotheses`, then `score_batch` for
the log-probabilities the signature gives) lists the sentences' hypotheses, and the
`score` signature (CTranslate2: `score_batch`) scores the references, through the
package's runners: raw strings in, tokenization included, batches by length as the
translate command forms them. Every batch runs on each artifact in turn, so that the
machine's changes of speed fall on all alike; rows are medians of `--repeats` passes
after one warm-up batch, with sentences/s and the ratio to CTranslate2's.
"""

import argparse
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from benchmarks import common  # noqa: E402
from keras_transformer import files, translate  # noqa: E402
from keras_transformer.data.text import read_lines  # noqa: E402
from keras_transformer.serving import runners  # noqa: E402

ARTIFACTS = {"saved_model": files.SAVED_MODEL, "tflite": files.TFLITE,
             "ctranslate2": files.CTRANSLATE2}
FEATURES = (files.N_BEST_SIGNATURE, files.SCORE_SIGNATURE)


def parse_arguments(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--export-dir", required=True,
                        help="an export written with --ctranslate2")
    parser.add_argument("--source", required=True, help="source sentences, one a line")
    parser.add_argument("--reference", required=True, help="their translations, to score")
    parser.add_argument("--sentences", type=int, default=500, help="first N lines")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", metavar="PATH", help="write the results here")
    return parser.parse_args(argv)


def time_interleaved(runs, batches):
    """Returns `{name: seconds}`: every batch run by each callable of `runs` in turn."""
    seconds = dict.fromkeys(runs, 0.0)
    names = list(runs)
    for number, batch in enumerate(batches):
        for name in names[number % len(names):] + names[:number % len(names)]:
            start = time.perf_counter()
            runs[name](batch)
            seconds[name] += time.perf_counter() - start
    return seconds


def main(argv=None):
    args = parse_arguments(argv)
    sources = read_lines(args.source)[:args.sentences]
    references = read_lines(args.reference)[:args.sentences]
    order = translate.length_batches([len(line) for line in sources], args.batch_size)
    batches = [[(sources[i], references[i]) for i in indices] for indices in order]
    rows = []
    for feature in FEATURES:
        runs = {}
        for name, path in ARTIFACTS.items():
            runner = runners.open_runner(os.path.join(args.export_dir, path),
                                         signature=feature)
            if feature == files.SCORE_SIGNATURE:
                runs[name] = lambda batch, runner=runner: runner(
                    [s for s, _ in batch], [t for _, t in batch])
            else:
                runs[name] = lambda batch, runner=runner: runner([s for s, _ in batch])
            runs[name](batches[0])  # warm-up
        passes = [time_interleaved(runs, batches) for _ in range(args.repeats)]
        for name in runs:
            seconds = statistics.median(one[name] for one in passes)
            rows.append({"feature": feature, "artifact": name,
                         "sentences_per_second": len(sources) / seconds})
        reference = rows[-1]["sentences_per_second"]  # CTranslate2's, the last
        for row in rows[-len(runs):]:
            row["ratio_to_ctranslate2"] = row["sentences_per_second"] / reference
    common.print_table(rows, [("feature", "feature"), ("artifact", "artifact"),
                              ("sentences_per_second", "sentences/s"),
                              ("ratio_to_ctranslate2", "x CTranslate2")])
    common.write_json(args.json, {**common.header(args), "rows": rows})

if __name__ == "__main__":
    main()
