"""Model FLOP utilisation (MFU) of our Transformer's training step, on any Keras backend.

Trains a preset's model (default `paper_base`: 6+6 layers, d 512, d_ff 2048, 37k
vocabulary) under `model.fit`, compiled as `train` compiles it (`losses.compile_model`:
the label-smoothed loss, the token metrics, the optimizer and its schedule), on
synthetic batches of the config's `batch_tokens` per side, one variant after the other in
one process, each a dtype policy, optionally `+fused` for `keras.ops.dot_product_attention`.
Every batch has the same shape `(batch, --length)` and no padding, so every token is
real and one compiled program serves every step. XLA compiles the step (`jit_compile`
on TensorFlow; JAX always compiles).

Nothing of this step imports TensorFlow, which the GPU machines this runs on may lack.

MFU = model FLOPs per second / the device's dense bf16 peak (for float32 rows too, so
that rows compare). Model FLOPs per target token are the
weight matmuls (`common.training_flops_per_target_token`) plus the attention scores and
weighted sums, forward and backward, counted in full (masked positions too).

    KERAS_BACKEND=jax python -m benchmarks.mfu                  # on a GPU
    python -m benchmarks.mfu --variants float32 mixed_bfloat16 mixed_bfloat16+fused
    python -m benchmarks.mfu batch_tokens=50000 --steps-per-execution 10 --steps 20 \
        --warmup-batches 10
"""

import argparse
import collections
import contextlib
import dataclasses
import glob
import gzip
import json
import os
import re
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks import common  # noqa: E402
from keras_transformer import config as config_lib  # noqa: E402
from keras_transformer.model import Transformer  # noqa: E402
from keras_transformer.training.losses import compile_model  # noqa: E402

# Dense bf16 tensor-core peaks in TFLOP/s (NVIDIA's data sheets, without sparsity), by
# the start of the name `nvidia-smi` reports. The H200 has the H100 SXM's compute.
PEAK_TFLOPS = (("NVIDIA H200", 989.4), ("NVIDIA H100 80GB HBM3", 989.4),
               ("NVIDIA H100 NVL", 835.0), ("NVIDIA H100 PCIe", 756.0),
               ("NVIDIA A100", 312.0))


def parse_arguments(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="paper_base", choices=sorted(config_lib.PRESETS))
    parser.add_argument("--variants", nargs="+", action=common.ListOption,
                        default=["mixed_bfloat16+fused"],
                        help="dtype policy, with '+fused' for the fused attention op")
    parser.add_argument("overrides", nargs="*", metavar="FIELD=VALUE",
                        help="config changes as train.py takes them, e.g. "
                             "batch_tokens=50000 (tokens per side and step)")
    parser.add_argument("--length", type=int, default=32,
                        help="source and target length of every sentence")
    parser.add_argument("--warmup-batches", type=int, default=5,
                        help="steps run before timing starts (compilation included)")
    parser.add_argument("--steps", type=int, default=20, help="steps per timed repeat")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps-per-execution", type=int, default=1)
    parser.add_argument("--peak-tflops", type=float, default=None,
                        help="device peak (default: looked up from nvidia-smi's name)")
    parser.add_argument("--trace-dir", default=None,
                        help="after timing each variant, trace 2 more steps into this "
                             "directory; on JAX with a GPU, print the time per kernel")
    parser.add_argument("--json", default=None, metavar="PATH", help="write results here")
    arguments = parser.parse_args(argv)
    if any("=" in variant for variant in arguments.variants):
        parser.error("FIELD=VALUE overrides go before --variants, which takes the rest.")
    for name in ("warmup_batches", "steps"):
        if getattr(arguments, name) % arguments.steps_per_execution:
            parser.error(f"--{name.replace('_', '-')} must be a multiple of "
                         "--steps-per-execution (Keras runs whole executions).")
    return arguments


def peak_tflops(names):
    """The dense bf16 peak of the first GPU named, from `PEAK_TFLOPS`; `None` if unknown."""
    for prefix, tflops in PEAK_TFLOPS:
        if names and names[0].startswith(prefix):
            return tflops
    return None


def attention_flops_per_target_token(model_config, source_length, target_length):
    """Attention scores (Q·Kᵀ) and weighted values (A·V), forward and backward.

    Each costs 2·L·D FLOPs per query token and layer over L keys: encoder self-attention
    on source tokens, decoder self- and cross-attention on target tokens.
    """
    per_key = 3 * 2 * 2 * model_config.hidden_dim * model_config.num_layers
    encoder = per_key * source_length * source_length / target_length
    decoder = per_key * (target_length + source_length)
    return encoder + decoder


def model_flops_per_target_token(model_config, length):
    weights = common.training_flops_per_target_token(model_config, source_per_target=1.0)
    return weights + attention_flops_per_target_token(model_config, length, length)


def synthetic_batches(vocabulary_size, batch_size, length, count, seed=0):
    """`count` batches of random ordinary ids, stacked: `(inputs, target outputs)`.

    As many as one `fit` call uses: Keras stops an epoch early when arrays run out.
    """
    rng = np.random.default_rng(seed)
    rows = count * batch_size

    def ids():
        return rng.integers(common.FIRST_ORDINARY_ID, vocabulary_size,
                            size=(rows, length)).astype("int32")

    return {"source_ids": ids(), "target_ids": ids()}, ids()


def build_and_compile(model_config, train_config, variant, arguments):
    policy, _, option = variant.partition("+")
    if option not in ("", "fused"):
        raise ValueError(f"Unknown variant option {option!r} in {variant!r}: "
                         "write a dtype policy, optionally followed by '+fused'.")
    keras.config.set_dtype_policy(policy)
    keras.utils.set_random_seed(0)
    model = Transformer(**dict(dataclasses.asdict(model_config),
                               max_length=max(model_config.max_length, arguments.length),
                               use_fused_attention=option == "fused"))
    # One XLA program per step on TensorFlow too (JAX always compiles).
    compile_model(model, dataclasses.replace(train_config, jit_compile=True),
                  steps_per_execution=arguments.steps_per_execution)
    return model


def timed_fit(model, inputs, targets, batch_size, steps):
    """Seconds of `model.fit` over `steps` steps, waiting for the device to finish."""
    start = time.perf_counter()
    model.fit(inputs, targets, batch_size=batch_size, steps_per_epoch=steps, epochs=1,
              shuffle=False, verbose=0)
    # Reading a value the last step wrote waits for the queued device work.
    keras.ops.convert_to_numpy(model.optimizer.iterations)
    return time.perf_counter() - start


def measure(variant, config, arguments, flops_per_token, peak):
    batch_size = max(1, config.data.batch_tokens // arguments.length)
    count = max(arguments.warmup_batches, arguments.steps)
    inputs, targets = synthetic_batches(config.model.vocabulary_size, batch_size,
                                        arguments.length, count)
    model = build_and_compile(config.model, config.train, variant, arguments)
    warmup_seconds = timed_fit(model, inputs, targets, batch_size, arguments.warmup_batches)
    seconds = [timed_fit(model, inputs, targets, batch_size, arguments.steps)
               for _ in range(arguments.repeats)]
    kernels = None
    if arguments.trace_dir:
        traced_steps = 2 * arguments.steps_per_execution
        with profiler_trace(arguments.trace_dir):
            timed_fit(model, inputs, targets, batch_size, traced_steps)
        kernels = device_kernel_times(arguments.trace_dir, traced_steps)
    step_seconds = statistics.median(seconds) / arguments.steps
    tokens_per_second = batch_size * arguments.length / step_seconds
    tflops = tokens_per_second * flops_per_token / 1e12
    return {"variant": variant, "batch": f"{batch_size}×{arguments.length}",
            "parameters": model.count_params(), "warmup_seconds": warmup_seconds,
            "step_ms": step_seconds * 1e3, "tokens_per_second": tokens_per_second,
            "tflops_per_second": tflops, "mfu": tflops / peak if peak else None,
            "repeat_seconds": seconds, "device_kernels": kernels}


@contextlib.contextmanager
def profiler_trace(directory):
    """Records what runs on the devices meanwhile, in the backend's own profiler."""
    if keras.backend.backend() == "jax":
        import jax  # the backend's own library: a GPU machine may have only that one
        options = jax.profiler.ProfileOptions()
        options.python_tracer_level = 0  # device kernels are what is wanted
        with jax.profiler.trace(directory, create_perfetto_trace=True,
                                profiler_options=options):
            yield
    else:
        import tensorflow as tf  # as above
        tf.profiler.experimental.start(directory)
        try:
            yield
        finally:
            tf.profiler.experimental.stop()


# What a GPU kernel does, read from its name, first match wins: cuBLAS's matmuls (nvjet,
# sm90_xmma, cutlass) and XLA's GEMM fusions; XLA's fusions by their kind (reductions:
# norms, softmax, the loss, bias gradients; loops: element-wise work such as dropout,
# residual adds and activations).
KERNEL_CATEGORIES = (("matmul", r"gemm|nvjet|xmma|cutlass|cublas|matmul"),
                     ("reduction fusion", r"reduce"), ("transpose", r"transpose"),
                     ("element-wise fusion", r"^loop_"), ("other fusion", r"fusion"),
                     ("other", r""))


def kernel_category(family):
    """The first of `KERNEL_CATEGORIES` whose pattern the kernel family's name matches."""
    return next(category for category, pattern in KERNEL_CATEGORIES
                if re.search(pattern, family, re.IGNORECASE))


def device_kernel_times(directory, steps, top=15):
    """Sums the GPU kernel time in the perfetto trace under `directory`, per step.

    Kernels are grouped in families, trailing numbers dropped (`loop_add_fusion_12` and
    `fusion.3` count as `loop_add_fusion` and `fusion`), and families in the categories
    of `KERNEL_CATEGORIES`.

    Returns:
        `{"kernel_ms_per_step", "categories": {category: ms per step}, "kernels":
        [{"kernel", "category", "ms", "calls"}]}` (the `top` longest families, per step),
        or `None` where the trace holds no GPU kernel.
    """
    paths = glob.glob(os.path.join(directory, "**", "perfetto_trace.json.gz"), recursive=True)
    if not paths:
        return None
    with gzip.open(max(paths, key=os.path.getmtime), "rt", encoding="utf-8") as file:
        events = json.load(file)["traceEvents"]
    gpu_processes = {event["pid"] for event in events
                     if event.get("ph") == "M" and event.get("name") == "process_name"
                     and "GPU" in event.get("args", {}).get("name", "")}
    total_us, calls = collections.Counter(), collections.Counter()
    for event in events:
        if event.get("ph") == "X" and event.get("pid") in gpu_processes:
            family = re.sub(r"([._]\d+)+$", "", event["name"])
            total_us[family] += event.get("dur", 0.0)
            calls[family] += 1
    if not total_us:
        return None
    categories = collections.Counter()
    for family, us in total_us.items():
        categories[kernel_category(family)] += us / 1e3 / steps
    return {"kernel_ms_per_step": sum(total_us.values()) / 1e3 / steps,
            "categories": dict(categories.most_common()),
            "kernels": [{"kernel": family, "category": kernel_category(family),
                         "ms": us / 1e3 / steps, "calls": calls[family] / steps}
                        for family, us in total_us.most_common(top)]}


def main(argv=None):
    arguments = parse_arguments(argv)
    config = config_lib.override(config_lib.preset_config(arguments.preset),
                                 arguments.overrides)
    names = common.gpu_names()
    peak = arguments.peak_tflops or peak_tflops(names)
    flops_per_token = model_flops_per_target_token(config.model, arguments.length)
    result = common.header(arguments)
    result.update(config=dataclasses.asdict(config),
                  gpu_models=names, peak_tflops=peak,
                  model_flops_per_target_token=flops_per_token)
    print(f"{arguments.preset} on {names[0] if names else 'no GPU'} "
          f"(Keras backend {keras.backend.backend()}; peak {peak} TFLOP/s); "
          f"{flops_per_token:.3e} model FLOPs per target token")
    rows = []
    with common.dtype_policy_restored():  # each variant sets its own
        for variant in arguments.variants:
            rows.append(measure(variant, config, arguments, flops_per_token, peak))
            common.print_table(rows[-1:], COLUMNS)
    print()
    common.print_table(rows, COLUMNS)
    for row in rows:
        kernels = row["device_kernels"]
        if kernels:
            print(f"\n{row['variant']}: GPU kernels {kernels['kernel_ms_per_step']:.1f} ms "
                  "per step")
            common.print_table([{"category": category, "ms": ms}
                                for category, ms in kernels["categories"].items()],
                               [("category", "category"), ("ms", "ms/step")])
            common.print_table(kernels["kernels"], [
                ("kernel", "kernel"), ("category", "category"), ("ms", "ms/step"),
                ("calls", "calls/step")])
    result.update(rows=rows, peak_accelerator_memory_mb=common.accelerator_peak_memory_mb(),
                  load_average_end=common.load_average())
    common.write_json(arguments.json, result)


COLUMNS = [("variant", "variant"), ("batch", "batch"), ("step_ms", "ms/step"),
           ("tokens_per_second", "target tok/s"), ("tflops_per_second", "TFLOP/s"),
           ("mfu", "MFU"), ("warmup_seconds", "warm-up s")]


if __name__ == "__main__":
    sys.exit(main())
