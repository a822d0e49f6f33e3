"""Our translators against CTranslate2: one trained model, the same sentences, one run.

    keras-transformer export RUN_DIR --ctranslate2
    python -m benchmarks.decode_engines --export-dir RUN_DIR/export \\
        --source test_2016_flickr.en.gz --reference test_2016_flickr.de.gz

Every artifact of one export (SavedModel, TFLite float, TFLite with int8 weights,
CTranslate2 float32 and int8) translates the same sentences, greedy and with beam
search (the exported beam size and α), at each batch size, through the package's
runners: raw strings in, strings out, tokenization included. Batches are formed as the
translate command forms them, by length within windows (`--order input` takes the
sentences as they come, which makes each batch decode as long as its longest
sentence). A runner is loaded and warmed up on one batch before its clock starts; each
row is the median of `--repeats` passes, and within a pass every batch is translated
by each artifact in turn, so that the machine's changes of speed fall on all of them
alike. Each row gives sentences/s, output tokens/s (END included), cased sacreBLEU and
chrF against the reference, and the speed ratio of the row to CTranslate2's of the
same setting (float32 and int8).
"""

import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from benchmarks import common  # noqa: E402
from keras_transformer import evaluation, files, translate  # noqa: E402
from keras_transformer.data.text import read_lines  # noqa: E402
from keras_transformer.serving import runners  # noqa: E402
from keras_transformer.serving.self_check import token_sequences  # noqa: E402

ARTIFACTS = {
    "saved_model": files.SAVED_MODEL,
    "tflite": files.TFLITE,
    "tflite_int8": files.TFLITE_QUANTIZED,
    "ctranslate2": files.CTRANSLATE2,
    "ctranslate2_int8": files.CTRANSLATE2_INT8,
}
OURS = ("saved_model", "tflite", "tflite_int8")


def parse_arguments(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--export-dir", required=True,
                        help="an export written with --ctranslate2")
    parser.add_argument("--source", required=True, help="source sentences, one a line")
    parser.add_argument("--reference", required=True, help="their reference translations")
    parser.add_argument("--sentences", type=int, default=1000, help="first N lines")
    parser.add_argument("--artifacts", nargs="+", action=common.ListOption,
                        default=list(ARTIFACTS), choices=list(ARTIFACTS))
    parser.add_argument("--batch-sizes", type=int, nargs="+", action=common.ListOption,
                        default=[1, 32])
    parser.add_argument("--decoders", nargs="+", action=common.ListOption,
                        default=["greedy", "beam"], choices=["greedy", "beam"])
    parser.add_argument("--threads", type=int, nargs="+", action=common.ListOption,
                        default=[1],
                        help="threads of LiteRT and CTranslate2, one row each (the "
                             "SavedModel runs with TensorFlow's default threads)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="times each artifact translates the sentences (median)")
    parser.add_argument("--order", choices=["sorted", "input"], default="sorted",
                        help="batch by length as the translate command does (default), "
                             "or in input order")
    parser.add_argument("--json", default=None, metavar="PATH", help="write results here")
    return parser.parse_args(argv)


def translate_interleaved(loaded, sentences, batch_size, order):
    """Returns `{key: (seconds, output tokens, translations)}` for each runner of `loaded`.

    Every batch is translated by each runner in turn, the first one rotating from
    batch to batch, so that a change in the machine's speed falls on all of them
    alike: on a shared virtual machine it drifted by 25 % within 20 minutes, which
    alternating whole passes over the sentences did not cancel. `order="sorted"`
    batches as the translate command does (by length within windows,
    `translate.translate_sentences`); `"input"` takes the sentences as they come.
    """
    keys = list(loaded)
    for runner in loaded.values():
        runner(sentences[:batch_size])  # warm-up: tracing, allocation
    seconds = dict.fromkeys(keys, 0.0)
    recorded = {key: [] for key in keys}

    def every_runner(batch):
        first = len(recorded[keys[0]]) % len(keys)
        for key in keys[first:] + keys[:first]:
            start = time.perf_counter()
            outputs = loaded[key](batch)
            seconds[key] += time.perf_counter() - start
            recorded[key].append(outputs)
        return recorded[keys[0]][-1]

    translate_in_order(every_runner, sentences, batch_size, order)
    results = {}
    for key in keys:
        replay = iter(recorded[key])  # the same batches, in the same order
        texts = translate_in_order(lambda batch: next(replay), sentences, batch_size, order)
        tokens = sum(len(sequence) for outputs in recorded[key]
                     for sequence in token_sequences(outputs["token_ids"]))
        results[key] = (seconds[key], tokens, texts)
    return results


def translate_in_order(runner, sentences, batch_size, order):
    """Returns the translations of `sentences` in their order, batched as `order` says."""
    if order == "sorted":
        return translate.translate_sentences(runner, sentences, batch_size)
    return [text for index in range(0, len(sentences), batch_size)
            for text in runners.translations(runner(sentences[index:index + batch_size]))]


def measure(arguments, sentences, references):
    """One row per artifact, decoder, threads and batch size: the median of the repeats.

    The runners stay loaded, and every batch of a repeat is timed on each of them in
    turn (`translate_interleaved`).
    """
    loaded = {}
    for artifact in arguments.artifacts:
        path = os.path.join(arguments.export_dir, ARTIFACTS[artifact])
        for decoder in arguments.decoders:
            for threads in [None] if artifact == "saved_model" else arguments.threads:
                loaded[artifact, decoder, threads] = runners.open_runner(
                    path, beam=decoder == "beam", threads=threads)
    rows = []
    for batch_size in arguments.batch_sizes:
        timings = {key: [] for key in loaded}
        for _ in range(arguments.repeats):
            for key, run in translate_interleaved(loaded, sentences, batch_size,
                                                  arguments.order).items():
                timings[key].append(run)
        for (artifact, decoder, threads), runs in timings.items():
            seconds = statistics.median(run[0] for run in runs)
            _, tokens, texts = runs[0]
            scores = evaluation.score(texts, references)
            rows.append({
                "artifact": artifact, "decoder": decoder, "batch_size": batch_size,
                "threads": threads or "default", "seconds": seconds,
                "all_seconds": [run[0] for run in runs],
                "sentences_per_second": len(sentences) / seconds,
                "tokens_per_second": tokens / seconds,
                "bleu": scores["bleu"]["score"], "chrf": scores["chrf"]["score"],
                "signatures": {name: scores[name]["signature"] for name in ("bleu", "chrf")}})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def add_ratios(rows):
    """Adds each row's speed over CTranslate2's (float32, int8) of the same setting."""
    by_setting = {(row["artifact"], row["decoder"], row["batch_size"], row["threads"]): row
                  for row in rows}
    for row in rows:
        for engine in ("ctranslate2", "ctranslate2_int8"):
            threads = row["threads"] if row["threads"] != "default" else 1
            reference = by_setting.get((engine, row["decoder"], row["batch_size"], threads))
            if reference is not None:
                row[f"over_{engine}"] = (row["sentences_per_second"]
                                         / reference["sentences_per_second"])


def best_of_ours(rows):
    """Per setting: our fastest artifact and its speed over CTranslate2's fastest."""
    summary = []
    settings = sorted({(row["decoder"], row["batch_size"]) for row in rows})
    for decoder, batch_size in settings:
        same = [row for row in rows
                if (row["decoder"], row["batch_size"]) == (decoder, batch_size)]
        ours = [row for row in same if row["artifact"] in OURS]
        theirs = [row for row in same if row["artifact"] not in OURS]
        if not ours or not theirs:
            continue
        best, engine = (max(group, key=lambda row: row["sentences_per_second"])
                        for group in (ours, theirs))
        summary.append({"decoder": decoder, "batch_size": batch_size,
                        "ours": f"{best['artifact']} ({best['threads']} threads)",
                        "ctranslate2": f"{engine['artifact']} ({engine['threads']} threads)",
                        "ratio": best["sentences_per_second"]
                        / engine["sentences_per_second"]})
    return summary


def main(argv=None):
    arguments = parse_arguments(argv)
    result = common.header(arguments)
    sentences = read_lines(arguments.source)[:arguments.sentences]
    references = read_lines(arguments.reference)[:arguments.sentences]
    rows = measure(arguments, sentences, references)
    add_ratios(rows)
    common.print_table(rows, [
        ("artifact", "artifact"), ("decoder", "decoder"), ("batch_size", "batch"),
        ("threads", "threads"), ("sentences_per_second", "sent/s"),
        ("tokens_per_second", "tok/s"), ("bleu", "BLEU"), ("chrf", "chrF"),
        ("over_ctranslate2", "/ CT2 f32"), ("over_ctranslate2_int8", "/ CT2 int8")])
    summary = best_of_ours(rows)
    if summary:
        print()
        common.print_table(summary, [("decoder", "decoder"), ("batch_size", "batch"),
                                     ("ours", "our fastest"), ("ctranslate2", "CT2 fastest"),
                                     ("ratio", "ours / CT2")])
    result.update(sentences=len(sentences), rows=rows, best_of_ours=summary,
                  load_average_end=common.load_average())
    common.write_json(arguments.json, result)


if __name__ == "__main__":
    sys.exit(main())
