"""The verbs around the main flow: `distill` (a student's corpus) and `fuzz`."""

import json

from keras_transformer import files
from keras_transformer.cli import console, options
from keras_transformer.tools import fuzzing


def _add_distill(parser):
    parser.add_argument("run_dir", metavar="RUN_DIR", help="the teacher run")
    parser.add_argument("-o", "--output", required=True, metavar="DIR",
                        help="where the student's corpus goes")
    parser.add_argument("--artifact", help="SavedModel or .tflite exported from RUN_DIR "
                                           "(an ensemble of it and other runs, say) that "
                                           "translates instead of the run's own SavedModel")
    parser.add_argument("--data-dir", metavar="DIR",
                        help="local copy of Multi30K (default: the teacher's data_dir)")
    parser.add_argument("--beam", action="store_true",
                        help="beam search (the artifact's) instead of greedy decoding")
    parser.add_argument("--batch-size", type=options.positive_int, default=64, metavar="N",
                        help="sentences per call (default: 64)")


def _distill(args):
    console.load_tensorflow(args.verbose)
    from keras_transformer.tools import distillation
    distillation.distill(args.run_dir, args.output, artifact=args.artifact,
                         data_dir=args.data_dir, beam=args.beam, batch_size=args.batch_size)


def _add_fuzz(parser):
    parser.add_argument("artifacts", nargs="+", metavar="ARTIFACT",
                        help="exported translators: SavedModel or CTranslate2 directories, "
                             ".tflite files, or run directories (their SavedModel)")
    parser.add_argument("--count", type=options.positive_int, default=10_000, metavar="N",
                        help="generated sentences per artifact (default: 10000)")
    parser.add_argument("--seed", type=int, default=0, help="generator seed")
    parser.add_argument("--max-batch", type=options.positive_int, default=fuzzing.MAX_BATCH,
                        metavar="N", help="largest batch of generated sentences, sent "
                                          f"once at least (default: {fuzzing.MAX_BATCH})")
    parser.add_argument("--max-seconds", type=float, default=60.0, metavar="S",
                        help="longest a call may take, in seconds (default: 60)")
    parser.add_argument("-o", "--output", metavar="FILE", help="write the reports here")


def _fuzz(args):
    files.check_output_file("--output", args.output, {
        f"artifact {artifact}": artifact for artifact in args.artifacts})
    if not all(artifact.endswith(".tflite") for artifact in args.artifacts):
        console.load_tensorflow(args.verbose)
    from keras_transformer.serving import artifacts, runners  # NumPy: see the docstring
    reports = {}
    for artifact in args.artifacts:
        runner = runners.open_runner(artifacts.resolve_artifact(artifact))
        reports[artifact] = fuzzing.fuzz(runner, fuzzing.generate_batches(
            args.seed, args.count, args.max_batch), args.max_seconds)
        print(json.dumps({artifact: reports[artifact]}, indent=2), flush=True)
    if args.output:
        files.write_text(args.output, json.dumps(reports, indent=2) + "\n")
    return 0 if all(report["passed"] for report in reports.values()) else 1


VERBS = {
    "distill": (_add_distill, _distill,
                "write a student's corpus: the teacher's translations of its training text"),
    "fuzz": (_add_fuzz, _fuzz, "send hostile input through exported translators"),
}
