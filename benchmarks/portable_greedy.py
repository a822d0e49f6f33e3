"""Greedy decoding throughput of a preset's model on any Keras backend: cached vs uncached.

`keras_transformer.decoding` is TensorFlow code (`tf.while_loop`, and the exported
graphs); this script measures the model's own decoding ops (`Transformer.encode`,
`init_cache`, `decode_step`, `decode`, all `keras.ops`) on backends and machines where
TensorFlow is missing, a GPU with only JAX, say. Two loops, each a `keras.ops.fori_loop`
over exactly `--output-length` steps compiled whole (`jax.jit` on JAX,
`tf.function(jit_compile=True)` on TensorFlow): cached (one `decode_step` per token)
and uncached (the whole prefix through `decode` per token, the tutorial's way). END and
PAD are never chosen, so every output has the same length, as in
`benchmarks.decode_throughput`. Weights are a random initialisation: speed does not
depend on them. On TensorFlow both loops' ids equal `decoding.greedy_decode`'s (a test
checks this), so they do the work the shipped decoder does. On a GPU, JAX computes
float32 matmuls in TF32 by default, and where the best logits nearly tie (random
weights, a large vocabulary) the two loops' ids can differ. With
`JAX_DEFAULT_MATMUL_PRECISION=float32` they were equal (`paper_base` at batch 32 on an
H100, BENCHMARKS.md), at slower compilation and decoding.

    KERAS_BACKEND=jax python -m benchmarks.portable_greedy      # on a GPU
    python -m benchmarks.portable_greedy --preset paper_base --batch-sizes 1 32 128 \
        --variants float32 mixed_bfloat16 --decoders cached --json results.json
"""

import argparse
import dataclasses
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from keras import ops  # noqa: E402

from benchmarks import common  # noqa: E402
from keras_transformer import config as config_lib  # noqa: E402
from keras_transformer.model import Transformer  # noqa: E402

# The ids `keras_transformer.tokenizer` reserves; importing it would import TensorFlow.
START_ID, END_ID = 2, 3


def parse_arguments(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="paper_base", choices=sorted(config_lib.PRESETS))
    parser.add_argument("overrides", nargs="*", metavar="FIELD=VALUE",
                        help="model config changes as train.py takes them, e.g. num_layers=2")
    parser.add_argument("--variants", nargs="+", action=common.ListOption,
                        default=["float32", "mixed_bfloat16"],
                        help="dtype policies, one model each")
    parser.add_argument("--decoders", nargs="+", action=common.ListOption,
                        choices=sorted(DECODERS), default=["cached", "uncached"])
    parser.add_argument("--batch-sizes", nargs="+", action=common.ListOption, type=int,
                        default=[1, 32, 128])
    parser.add_argument("--source-length", type=int, default=20,
                        help="tokens of every source sentence (START and END included)")
    parser.add_argument("--output-length", type=int, default=50)
    parser.add_argument("--calls", type=int, default=5,
                        help="timed calls per variant, decoder and batch size (after a "
                             "warm-up)")
    parser.add_argument("--json", default=None, metavar="PATH", help="write results here")
    arguments = parser.parse_args(argv)
    if any("=" in variant for variant in arguments.variants):
        parser.error("FIELD=VALUE overrides go before --variants, which takes the rest.")
    return arguments


def greedy_ids(model, source_ids, output_length):
    """Output ids `(B, output_length)` of cached greedy decoding, END and PAD excluded."""
    encoder_output = model.encode(source_ids, training=False)  # (B, S, D)
    cache = model.init_cache(encoder_output, source_ids, output_length)
    batch = ops.shape(source_ids)[0]
    never = _never_chosen(model)

    def step(index, state):
        tokens, ids, cache = state
        logits, cache = model.decode_step(tokens, cache, index)  # (B, V)
        tokens = _most_likely(logits, never)
        return tokens, _write(ids, index, tokens), cache

    start = ops.full((batch,), START_ID, "int32")
    ids = ops.zeros((batch, output_length), "int32")
    _, ids, _ = ops.fori_loop(0, output_length, step, (start, ids, cache))
    return ids


def uncached_greedy_ids(model, source_ids, output_length):
    """The same ids, re-running `model.decode` over the whole prefix at every step.

    The tutorial's way, O(L²) work. The prefix has a fixed width (START, then the
    tokens so far, then PAD, which the masks hide), so one compiled step serves every
    position, as in `decoding.uncached_greedy_decode` under XLA.
    """
    encoder_output = model.encode(source_ids, training=False)  # (B, S, D)
    batch = ops.shape(source_ids)[0]
    never = _never_chosen(model)
    start = ops.full((batch, 1), START_ID, "int32")

    def step(index, ids):
        prefix = ops.concatenate([start, ids[:, :-1]], axis=1)  # (B, L)
        logits = model.decode(prefix, encoder_output, source_ids, training=False)  # (B, L, V)
        tokens = _most_likely(ops.take(logits, index, axis=1), never)  # (B,)
        return _write(ids, index, tokens)

    return ops.fori_loop(0, output_length, step, ops.zeros((batch, output_length), "int32"))


DECODERS = {"cached": greedy_ids, "uncached": uncached_greedy_ids}


def _never_chosen(model):
    """Bool `(V,)`: PAD and END, never chosen, so every output has the same length."""
    vocabulary = ops.arange(model.vocabulary_size)
    return ops.logical_or(vocabulary == model.pad_id, vocabulary == END_ID)


def _most_likely(logits, never):
    return ops.cast(ops.argmax(ops.where(never, -1e9, logits), axis=-1), "int32")  # (B,)


def _write(ids, index, tokens):
    """`ids` `(B, L)` with column `index` set to `tokens` `(B,)`."""
    column = ops.arange(ops.shape(ids)[1]) == index  # (L,)
    return ops.where(column[None, :], tokens[:, None], ids)


def compiled_greedy(model, output_length, decoder="cached"):
    """A `DECODERS` loop as one compiled function of source ids, for the current backend."""
    decode = DECODERS[decoder]
    backend = keras.backend.backend()
    if backend == "jax":
        import jax  # the backend's own compiler: a GPU machine may have only that one

        @jax.jit
        def run(values, source_ids):
            # Weights enter as arguments, not as constants baked into the program.
            with keras.StatelessScope(state_mapping=list(zip(model.variables, values))):
                return decode(model, source_ids, output_length)

        values = [variable.value for variable in model.variables]
        return lambda source_ids: run(values, source_ids)
    if backend == "tensorflow":
        import tensorflow as tf  # as above
        return tf.function(lambda source_ids: decode(model, source_ids, output_length),
                           jit_compile=True)
    raise ValueError(f"benchmarks.portable_greedy runs on the jax and tensorflow backends, "
                     f"not {backend!r}: set KERAS_BACKEND.")


def random_sources(vocabulary_size, batch, length, seed):
    """Source ids `(batch, length)`: START, ordinary ids, END; no padding."""
    rng = np.random.default_rng(seed)
    middle = rng.integers(common.FIRST_ORDINARY_ID, vocabulary_size, size=(batch, length - 2))
    return np.concatenate([np.full((batch, 1), START_ID), middle,
                           np.full((batch, 1), END_ID)], axis=1).astype("int32")


def measure(decode, sources, calls, output_length):
    """Times `calls` calls after a warm-up (compilation); waits for the device each call."""
    started = time.perf_counter()
    ids = ops.convert_to_numpy(decode(sources))
    warmup_seconds = time.perf_counter() - started
    seconds = []
    for _ in range(calls):
        started = time.perf_counter()
        ops.convert_to_numpy(decode(sources))
        seconds.append(time.perf_counter() - started)
    per_call = statistics.median(seconds)
    batch = len(sources)
    return {"batch": batch, "seconds_per_call": per_call,
            "sentences_per_second": batch / per_call,
            "tokens_per_second": batch * output_length / per_call,
            "warmup_seconds": warmup_seconds}, ids


def cached_over_uncached(rows):
    """Tokens/s of cached over uncached decoding, per variant and batch, where both ran."""
    speed = {(row["variant"], row["batch"], row["decoder"]): row["tokens_per_second"]
             for row in rows}
    return {f"{variant}_batch_{batch}": speed[(variant, batch, "cached")] / uncached
            for (variant, batch, decoder), uncached in speed.items()
            if decoder == "uncached" and (variant, batch, "cached") in speed}


def build(model_config, policy):
    keras.config.set_dtype_policy(policy)
    keras.utils.set_random_seed(0)
    model = Transformer(**dict(dataclasses.asdict(model_config), dropout=0.0))
    ids = np.full((1, 2), START_ID, "int32")
    model({"source_ids": ids, "target_ids": ids})  # creates the weights
    return model


COLUMNS = [("variant", "variant"), ("decoder", "decoder"), ("batch", "batch"),
           ("seconds_per_call", "s/call"), ("sentences_per_second", "sent/s"),
           ("tokens_per_second", "tok/s"),
           ("same_as_cached", "= cached"), ("warmup_seconds", "warm-up s")]


def main(argv=None):
    arguments = parse_arguments(argv)
    model_config = config_lib.override(config_lib.preset_config(arguments.preset),
                                       arguments.overrides).model
    names = common.gpu_names()
    result = common.header(arguments)
    result.update(model_config=dataclasses.asdict(model_config), gpu_models=names)
    print(f"{arguments.preset} on {names[0] if names else 'no GPU'} "
          f"(Keras backend {keras.backend.backend()}): greedy, sources of "
          f"{arguments.source_length} tokens, outputs of {arguments.output_length}")
    rows = []
    with common.dtype_policy_restored():  # each variant sets its own
        for variant in arguments.variants:
            model = build(model_config, variant)
            for batch in arguments.batch_sizes:
                sources = random_sources(model_config.vocabulary_size, batch,
                                         arguments.source_length, seed=batch)
                outputs = {}
                for decoder in arguments.decoders:
                    decode = compiled_greedy(model, arguments.output_length, decoder)
                    row, outputs[decoder] = measure(decode, sources, arguments.calls,
                                                    arguments.output_length)
                    rows.append({"variant": variant, "decoder": decoder, **row,
                                 "same_as_cached": bool(np.array_equal(
                                     outputs[decoder], outputs["cached"]))
                                 if "cached" in outputs else None})
                    common.print_table(rows[-1:], COLUMNS)
    print()
    common.print_table(rows, COLUMNS)
    ratios = cached_over_uncached(rows)
    for key, value in ratios.items():
        print(f"cached / uncached, {key}: {value:.1f}x")
    result.update(rows=rows, cached_over_uncached=ratios,
                  peak_accelerator_memory_mb=common.accelerator_peak_memory_mb(),
                  load_average_end=common.load_average())
    common.write_json(arguments.json, result)


if __name__ == "__main__":
    sys.exit(main())
