"""The verbs of export: `export` and `check`."""

import argparse
import os

from keras_transformer import files, runs
from keras_transformer.cli import console, options


def _add_export(parser):
    parser.add_argument("run_dir", metavar="RUN_DIR", help="the run to export")
    parser.add_argument("--weights", help="'averaged', 'final', 'latest' or a weights "
                                          "file (default: the run's choice, else the "
                                          "newest)")
    parser.add_argument("-o", "--output", metavar="DIR",
                        help="folder to write (default: RUN_DIR/export)")
    parser.add_argument("--beam-size", type=options.positive_int, metavar="N",
                        help="beam size of the beam_search signature (default: the run's "
                             f"choice, else {files.PAPER_BEAM_SIZE}, §6.1)")
    parser.add_argument("--length-penalty", type=options.non_negative_float, metavar="ALPHA",
                        help="α of its length penalty (default: the run's choice, else "
                             f"{files.PAPER_LENGTH_PENALTY})")
    parser.add_argument("--n-best", type=options.positive_int, metavar="N",
                        help="hypotheses of the n_best signature, at most the beam size "
                             "(default: 4, or the beam size if smaller)")
    parser.add_argument("--sampling-topk", type=options.non_negative_int, metavar="K",
                        default=files.SAMPLING_TOP_K,
                        help="the sample signature draws among the K most probable "
                             "tokens (default: 0, all of them)")
    parser.add_argument("--temperature", type=options.positive_float, metavar="T",
                        default=files.SAMPLING_TEMPERATURE,
                        help="its temperature (default: 1)")
    parser.add_argument("--alignment-layer", type=options.non_negative_int, metavar="N",
                        help="decoder layer (from 0) whose attention the align signature "
                             "reads (default: the penultimate)")
    parser.add_argument("--signatures", type=options.list_of(_signature), metavar="NAMES",
                        default=list(files.SIGNATURES),
                        help=f"comma-separated signatures to export, "
                             f"{files.GREEDY_SIGNATURE} among them (default: all, "
                             f"{','.join(files.SIGNATURES)}); fewer export faster")
    parser.add_argument("--max-output-length", type=options.positive_int, metavar="N",
                        help="most output tokens (default: the model's max_length - 1)")
    parser.add_argument("--no-quantize", action="store_true",
                        help="skip the TFLite file with int8 weights")
    # "extend": `--ensemble b --ensemble c` names both runs; "store" would keep only the
    # last flag's and export a smaller ensemble without a word.
    parser.add_argument("--ensemble", nargs="+", action="extend", default=[],
                        metavar="RUN_DIR",
                        help="further runs trained with RUN_DIR's tokenizer: the artifact "
                             "translates with the mean of all the models' probabilities "
                             "(needs --output: each run's export/ is its own)")
    parser.add_argument("--ctranslate2", action="store_true",
                        help="also write CTranslate2 models, float32 and int8 (needs the "
                             "ctranslate2 extra)")
    parser.add_argument("--check", action="store_true",
                        help="then check that every artifact translates like the model")


def _signature(name):
    if name not in files.SIGNATURES:
        raise argparse.ArgumentTypeError(f"{name!r} is no signature: choose among "
                                         f"{', '.join(files.SIGNATURES)}")
    return name


def _export(args):
    for run_dir in [args.run_dir, *args.ensemble]:
        runs.load_config(run_dir)  # names a missing or broken run before minutes of work
    runs.load_choice(args.run_dir)  # and a broken choice
    # Refused here too, before TensorFlow loads (export_run refuses it from Python).
    clash = (files.own_export_at(args.output, [args.run_dir, *args.ensemble])
             if args.ensemble else None)
    if clash:
        raise options.UsageError(
            f"--ensemble needs --output DIR, a folder of the ensemble's own: {clash[1]} "
            f"holds {clash[0]}'s own export, which translate, evaluate and the recipe read "
            "as the run's.")
    if args.output and os.path.exists(args.output) and not os.path.isdir(args.output):
        raise options.UsageError(f"--output {args.output} is a file: name a folder to write into.")
    if files.GREEDY_SIGNATURE not in args.signatures:
        raise options.UsageError(f"--signatures must include {files.GREEDY_SIGNATURE}, "
                                 "which every reader of an artifact opens first.")
    console.load_tensorflow(args.verbose)
    from keras_transformer.serving import export, self_check
    export_options = dict(
        weights=args.weights, output_dir=args.output,
        quantize=not args.no_quantize, ensemble=args.ensemble,
        ctranslate2=args.ctranslate2, max_output_length=args.max_output_length,
        beam_size=args.beam_size, length_penalty=args.length_penalty,
        n_best=args.n_best, sampling_top_k=args.sampling_topk,
        sampling_temperature=args.temperature, alignment_layer=args.alignment_layer,
        signatures=args.signatures)
    if args.check:
        output_dir, _, checks = self_check.export_and_check(args.run_dir, **export_options)
    else:
        output_dir, _ = export.export_run(args.run_dir, **export_options)
    print(f"Exported to {output_dir} (report: "
          f"{os.path.join(output_dir, files.REPORT_MARKDOWN)})")
    if args.check:
        _print_checks(checks, output_dir)


def _add_check(parser):
    parser.add_argument("run_dir", metavar="RUN_DIR", help="the run whose export to check")
    parser.add_argument("--export-dir", metavar="DIR",
                        help="the artifacts' folder (default: RUN_DIR/export)")
    parser.add_argument("-i", "--input", metavar="FILE",
                        help="source sentences to check, one a line (default: the run's "
                             "validation sources)")
    parser.add_argument("--sentences", dest="input",
                        help=argparse.SUPPRESS)  # the option's earlier name
    parser.add_argument("--count", type=options.positive_int, default=100, metavar="N",
                        help="sentences to check (default: 100)")


def _check(args):
    console.load_tensorflow(args.verbose)
    from keras_transformer.serving import self_check
    checks = self_check.check_run(args.run_dir, export_dir=args.export_dir,
                                  sentences_file=args.input, count=args.count)
    _print_checks(checks, args.export_dir or os.path.join(args.run_dir, files.EXPORT_DIR))


def _print_checks(checks, export_dir):
    from keras_transformer.serving import self_check
    print(self_check.format_table(checks))
    print(f"\n{self_check.summary(checks, export_dir)}")
    self_check.raise_on_failure(checks)


VERBS = {
    "export": (_add_export, _export,
               "export a run as a SavedModel (TF Serving) and .tflite translators"),
    "check": (_add_check, _check,
              "check that a run's exported artifacts translate like its model"),
}
