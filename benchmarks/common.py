"""What the benchmark scripts share: machine facts, memory, synthetic text, tables, JSON.

Every script measures the things it compares inside one run (ratios cancel most of
the machine's noise) and records, next to the numbers, the hardware, the load average
and the command, so that a row of BENCHMARKS.md can be traced back to how it was made.
"""

import argparse
import contextlib
import dataclasses
import datetime
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import time

import keras
import numpy as np

from keras_transformer import evaluation
from keras_transformer.data import corpus, text
from keras_transformer.serving import runners
from keras_transformer.training import cpu

# Subword lengths of Multi30K en-de with an 8k shared vocabulary are close to a gamma
# distribution with mean ≈ 15 (source) and ≈ 17 (target) pieces; synthetic sentences
# follow it so that padding and bucketing behave as on the real corpus.
SOURCE_MEAN_LENGTH = 15.0
TARGET_MEAN_LENGTH = 17.0
LENGTH_SHAPE = 6.0
FIRST_ORDINARY_ID = 4  # ids 0-3 are PAD, UNK, START, END


# Vector extensions that decide how fast TensorFlow's oneDNN kernels run on a CPU: two
# machines with the same `model name` ("AMD EPYC") differed 2.5x in training speed, the
# faster one having AVX-512 with bfloat16 instructions.
CPU_FEATURES = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16")


def machine():
    """Returns the CPU (model, family, vector extensions), cores, accelerators and versions."""
    fields = cpu.info()
    flags = set(fields.get("flags", "").split())
    facts = {"cpu": fields.get("model name", "unknown"),
             "cpu_family": fields.get("cpu family"), "cpu_model": fields.get("model"),
             "cpu_features": [name for name in CPU_FEATURES if name in flags],
             "cores": os.cpu_count(), "python": platform.python_version(),
             "keras": keras.__version__, "keras_backend": keras.backend.backend()}
    if facts["keras_backend"] == "jax":  # mfu and portable_greedy run there without TensorFlow
        import jax  # the backend's own library: a machine may have only one
        facts.update(jax=jax.__version__, gpus=[
            device.device_kind for device in jax.devices() if device.platform == "gpu"])
    else:
        import tensorflow as tf  # as above
        facts.update(tensorflow=tf.__version__, gpus=[
            device.name for device in tf.config.list_physical_devices("GPU")])
    return facts


def gpu_names():
    """Returns the GPU model names `nvidia-smi` reports (none without it)."""
    if shutil.which("nvidia-smi") is None:
        return []
    output = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                            capture_output=True, text=True, check=False).stdout
    return [line.strip() for line in output.splitlines() if line.strip()]


def accelerator_peak_memory_mb():
    """The process's peak accelerator memory, or `None` without one."""
    backend = keras.backend.backend()
    if backend == "jax":
        import jax  # the backend's own library: a machine may have only one
        stats = jax.devices()[0].memory_stats() or {}
        peak = stats.get("peak_bytes_in_use")
    elif backend == "tensorflow":
        import tensorflow as tf  # as above
        gpus = tf.config.list_logical_devices("GPU")
        peak = tf.config.experimental.get_memory_info(gpus[0].name)["peak"] if gpus else None
    else:
        peak = None
    return peak / 2**20 if peak is not None else None


@contextlib.contextmanager
def dtype_policy_restored():
    """Puts Keras's global dtype policy back on exit, for scripts that set one per variant."""
    previous = keras.config.dtype_policy()
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)


def describe_cpu(facts):
    """Returns one line for a table: `"AMD EPYC (family 25, model 17, AVX-512 bf16), 2 cores"`.

    Args:
        facts: dict from `machine()`; results written before it recorded the family,
            model and features give the model name and cores alone.
    """
    details = []
    if facts.get("cpu_family"):
        details += [f"family {facts['cpu_family']}", f"model {facts['cpu_model']}"]
    features = facts.get("cpu_features")
    if features is not None:
        details.append("AVX-512" + (" bf16" if "avx512_bf16" in features else "")
                       if "avx512f" in features else "no AVX-512")
    name = f"{facts['cpu']} ({', '.join(details)})" if details else facts["cpu"]
    return f"{name}, {facts['cores']} cores"


def load_average():
    """Returns the 1-, 5- and 15-minute load averages (what else the machine is doing)."""
    return list(os.getloadavg())


def memory_mb():
    """Returns `{"rss_mb", "peak_rss_mb"}` of this process from /proc/self/status.

    VmHWM is the resident-set high-water mark: unlike tracemalloc it sees TensorFlow's
    C++ allocations too. Run each measured model in its own process to separate peaks.
    """
    values = {}
    with open("/proc/self/status", encoding="utf-8") as file:
        for line in file:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                values[key] = int(rest.split()[0]) / 1024  # kB → MB
    return {"rss_mb": values.get("VmRSS"), "peak_rss_mb": values.get("VmHWM")}


def header(arguments):
    """Returns the metadata every result file starts with."""
    # shlex.join quotes what needs it, so the recorded command can be pasted back.
    return {"command": shlex.join([os.path.basename(sys.executable), "-m",
                                   _module_name()] + sys.argv[1:]),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "machine": machine(), "load_average_start": load_average(),
            "arguments": vars(arguments)}


def _module_name():
    main = sys.modules["__main__"]
    spec = getattr(main, "__spec__", None)
    return spec.name if spec is not None else os.path.basename(sys.argv[0])


def write_json(path, result):
    """Writes `result` as indented JSON (`path=None` writes nothing)."""
    if path is None:
        return
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    with open(path, "w", encoding="utf-8") as file:
        json.dump(result, file, indent=2, sort_keys=True)
        file.write("\n")


def print_table(rows, columns):
    """Prints `rows` (dicts) as an aligned text table of `columns` (key, title) pairs."""
    cells = [[title for _, title in columns]]
    for row in rows:
        cells.append([_format(row.get(key)) for key, _ in columns])
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    for number, line in enumerate(cells):
        print("  ".join(cell.rjust(width) for cell, width in zip(line, widths)))
        if number == 0:
            print("  ".join("-" * width for width in widths))
    sys.stdout.flush()


def _format(value):
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.3g}" if abs(value) < 100 else f"{value:,.0f}"
    return str(value)


def run_json_subprocess(module, arguments, json_path, timeout=None):
    """Runs `python -m module *arguments --json json_path` and returns its JSON.

    Each model measured in its own process has its own memory high-water mark and its
    own TensorFlow runtime, so neither inherits the other's caches or allocations.
    """
    command = [sys.executable, "-m", module, *arguments, "--json", json_path]
    # Its table goes to the JSON; the caller prints what it gathered.
    completed = subprocess.run(command, timeout=timeout, stdout=subprocess.DEVNULL)
    if completed.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited with {completed.returncode}.")
    with open(json_path, encoding="utf-8") as file:
        return json.load(file)


@dataclasses.dataclass(frozen=True)
class SyntheticText:
    """Parallel "sentences" of space-separated token ids, shaped like `ParallelText`.

    `batching.make_dataset` reads `source_lines`/`target_lines` and, on error, the file
    names; with `IdTokenizer` it yields exactly the batches it yields for real text.
    """

    source_lines: tuple
    target_lines: tuple
    source_file: str = "<synthetic source>"
    target_file: str = "<synthetic target>"

    def __len__(self):
        return len(self.source_lines)


def synthetic_text(num_pairs, vocabulary_size, max_length, seed=0):
    """Returns `SyntheticText` with gamma-distributed lengths and uniform ids."""
    generator = np.random.default_rng(seed)
    longest = max_length - 2  # room for START and END

    def lines(mean):
        lengths = generator.gamma(LENGTH_SHAPE, mean / LENGTH_SHAPE, num_pairs)
        lengths = np.clip(np.rint(lengths), 1, longest).astype(int)
        return tuple(" ".join(map(str, generator.integers(
            FIRST_ORDINARY_ID, vocabulary_size, length))) for length in lengths)

    return SyntheticText(lines(SOURCE_MEAN_LENGTH), lines(TARGET_MEAN_LENGTH))


class IdTokenizer:
    """Tokenizes space-separated ids ("5 17 33") into a ragged int32 tensor."""

    def tokenize(self, strings):
        import tensorflow as tf  # here: JAX-only scripts import this module too
        return tf.strings.to_number(tf.strings.split(strings), tf.int32)


def pseudo_sentences(count, mean_words=SOURCE_MEAN_LENGTH, seed=0, vocabulary=200):
    """Returns `count` sentences of made-up lowercase words (gamma-distributed lengths).

    Source text for decoding benchmarks that need real strings (the exported
    translators tokenize them): its length, not its meaning, is what matters.
    """
    words = _pseudo_words(vocabulary)
    generator = np.random.default_rng(seed)
    lengths = np.clip(np.rint(generator.gamma(LENGTH_SHAPE, mean_words / LENGTH_SHAPE,
                                              count)), 1, None).astype(int)
    return [" ".join(generator.choice(words, size=length)) + "." for length in lengths]


def _pseudo_words(count):
    # One fixed word list whatever the seed, so that every sentence has the same words.
    generator = np.random.default_rng(12345)
    letters = np.array(list("abcdefghiklmnoprstuvw"))
    return ["".join(generator.choice(letters, size=generator.integers(3, 8)))
            for _ in range(count)]


def small_tokenizer(seed=0):
    """Returns a `Tokenizer` trained on `pseudo_sentences`: about one piece per word."""
    from keras_transformer.data import tokenizer as tokenizer_lib  # loads TensorFlow
    return tokenizer_lib.train_tokenizer(pseudo_sentences(3000, seed=seed), 512,
                                         verbose=False)


class ListOption(argparse.Action):
    """A list option (`nargs="+"`) that may be repeated: `--alphas 0.6 --alphas 1.0`.

    argparse's "store" keeps only the last flag's values, silently; its "extend" adds
    them to the default list instead of replacing it. Here the first flag replaces the
    default and every later one adds to it.
    """

    def __call__(self, parser, namespace, values, option_string=None):
        given = getattr(namespace, self.dest)
        setattr(namespace, self.dest,
                list(values) if given is self.default else [*given, *values])


def add_run_arguments(parser, default_weights=None):
    """Adds the options of scripts that read a trained run: `run_dir` and `--weights`."""
    parser.add_argument("run_dir", help="a run directory with weights and a tokenizer")
    parser.add_argument("--weights", default=default_weights,
                        help="weights of the run: averaged, final, latest or a path "
                             f"(default: {default_weights or 'the newest'})")


def read_split(data_config, split, sentences=None):
    """Returns `(sources, references)`: the first `sentences` lines (all for `None`) of a split."""
    source_path, reference_path = corpus.corpus_files(data_config, split)
    return (text.read_lines(source_path)[:sentences],
            text.read_lines(reference_path)[:sentences])


def score_beam_search(translator, sources, references, batch_size=64):
    """Translates `sources` with `translator`'s beam search and scores them with sacreBLEU.

    Returns:
        dict: `bleu`, `chrf`, `length_ratio` (hypothesis / reference length), `seconds`
        spent translating, and `bleu_text` (sacreBLEU's line with its signature).
    """
    runner = runners.ModuleRunner(translator, beam=True)
    started = time.perf_counter()
    hypotheses = evaluation.translate_file_lines(runner, sources, batch_size, verbose=False)
    seconds = time.perf_counter() - started
    scores = evaluation.score(hypotheses, references)
    bleu_text = scores["bleu"]["text"]
    return {"bleu": scores["bleu"]["score"], "chrf": scores["chrf"]["score"],
            # sacreBLEU's line holds `ratio = x`, the hypothesis / reference length.
            "length_ratio": float(bleu_text.split("ratio = ")[1].split()[0]),
            "seconds": seconds, "bleu_text": bleu_text}


def report_scores(result, rows, first_column, split, sentences, json_path):
    """Prints rows of `score_beam_search` results as a table and writes the JSON.

    Args:
        result: dict from `header`, completed here with the rows and the split.
        rows: list of dicts, each a `score_beam_search` result plus `first_column`'s key.
        first_column: `(key, title)` of what the rows vary (e.g. `("alpha", "α")`).
        split: str, the corpus split scored; sentences: int, how many of its sentences.
        json_path: str or `None`.
    """
    print_table(rows, [first_column, ("bleu", "BLEU"), ("chrf", "chrF"),
                       ("length_ratio", "length ratio"), ("seconds", "s")])
    result.update(split=split, sentences=sentences, rows=rows,
                  load_average_end=load_average())
    write_json(json_path, result)


def add_model_arguments(parser):
    """Adds the Transformer size options every script shares (defaults: CPU-friendly)."""
    parser.add_argument("--vocabulary-size", type=int, default=8000)
    parser.add_argument("--num-layers", type=int, default=3)
    parser.add_argument("--hidden-dim", type=int, default=256)
    parser.add_argument("--intermediate-dim", type=int, default=1024)
    parser.add_argument("--num-heads", type=int, default=4)
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--use-fused-attention", action="store_true",
                        help="keras.ops.dot_product_attention (GPU kernels)")


def training_flops_per_target_token(arguments, source_per_target=(
        SOURCE_MEAN_LENGTH + 2) / (TARGET_MEAN_LENGTH + 1)):
    """Matmul FLOPs of one training step per real target token (forward + backward).

    Forward, per token: 2 FLOPs per multiply-add of every weight matrix it passes
    through: encoder layers (4·D² attention + 2·D·F feed-forward) on each source token;
    decoder layers (4·D² self-attention, 2·D² cross-attention queries/outputs,
    2·D·F) on each target token plus the cross-attention keys/values (2·D²) on each
    source token; the output projection (D·V) on each target token. Backward costs
    twice the forward (×3 in all). Attention scores (4·L·D per token and layer) and
    element-wise work are left out: at L ≈ 20 they are under 2 % of the total.
    """
    d, f = arguments.hidden_dim, arguments.intermediate_dim
    n, v = arguments.num_layers, arguments.vocabulary_size
    source = n * (4 * d * d + 2 * d * f + 2 * d * d)  # encoder + cross keys/values
    target = n * (4 * d * d + 2 * d * d + 2 * d * f) + d * v
    return 3 * 2 * (target + source_per_target * source)
