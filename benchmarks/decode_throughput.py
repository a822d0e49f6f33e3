"""Decoding throughput: cached and uncached greedy, beam search, SavedModel and TFLite.

Every decoder translates the same sentences with the same randomly initialised
Transformer, and every output is exactly `--output-length` tokens long: the model is
wrapped so that END never wins (its logit is replaced by -1e9), which is what makes the
cached/uncached ratio a statement about length-50 outputs rather than about when a
random model happens to stop. In-process decoders run inside one `tf.function`
(`decoding.decode_function`), the `_xla` ones compiled with XLA; the SavedModel is
loaded back with `tf.saved_model.load` and the `.tflite` files (float, and with the
export's dynamic-range quantization: int8 weights) run in LiteRT, all through their
`serving_default` signature (tokenize → decode → detokenize). The first call of each is
a warm-up (tracing, and XLA compilation).

    python -m benchmarks.decode_throughput                        # all, batch 1 and 32
    python -m benchmarks.decode_throughput --decoders cached uncached --batch-sizes 1
    python -m benchmarks.decode_throughput --decoders cached cached_xla uncached uncached_xla
"""

import argparse
import functools
import os
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from benchmarks import common  # noqa: E402
from keras_transformer import decoding, files
from keras_transformer.data.tokenizer import END_ID  # noqa: E402
from keras_transformer.model import Transformer  # noqa: E402
from keras_transformer.serving import litert  # noqa: E402
from keras_transformer.serving import translator as translator_lib  # noqa: E402

DECODERS = ("cached", "uncached", "beam4", "cached_xla", "uncached_xla", "beam4_xla",
            "saved_model", "tflite", "tflite_quantized")


def parse_arguments(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--decoders", nargs="+", action=common.ListOption, choices=DECODERS,
                        default=list(DECODERS))
    parser.add_argument("--batch-sizes", nargs="+", action=common.ListOption, type=int,
                        default=[1, 32])
    parser.add_argument("--output-length", type=int, default=50)
    parser.add_argument("--calls", type=int, default=3,
                        help="timed calls per decoder and batch size (after a warm-up)")
    common.add_model_arguments(parser)
    parser.add_argument("--json", default=None, metavar="PATH", help="write results here")
    return parser.parse_args(argv)


class EndlessModel(tf.Module):
    """A `Transformer` whose END logit never wins, so every output reaches its limit.

    Offers what the decoders and `serving.Translator` use: `encode`, `init_cache`,
    `decode_step`, `decode`, `cross_attention_weights` (for the `align` signature),
    `max_length` and `variables`.
    """

    def __init__(self, model):
        super().__init__(name="endless_model")
        self.model = model
        self.max_length = model.max_length

    @property
    def variables(self):
        return self.model.variables

    def encode(self, source_ids, training=None):
        return self.model.encode(source_ids, training=training)

    def init_cache(self, encoder_output, source_ids, max_length):
        return self.model.init_cache(encoder_output, source_ids, max_length)

    def decode_step(self, token_ids, cache, index, **options):
        # `options`: how the cache is written, which a TFLite export asks for.
        logits, cache = self.model.decode_step(token_ids, cache, index, **options)
        return _without_end(logits), cache

    def decode(self, target_ids, encoder_output, source_ids, training=None):
        return _without_end(self.model.decode(target_ids, encoder_output, source_ids,
                                              training=training))

    def cross_attention_weights(self, target_ids, encoder_output, source_ids):
        # Attention does not depend on the END logit: the wrapped model's, as it is.
        return self.model.cross_attention_weights(target_ids, encoder_output, source_ids)


def _without_end(logits):
    is_end = tf.range(tf.shape(logits)[-1]) == END_ID  # (V,)
    return tf.where(is_end, tf.constant(-1e9, logits.dtype), logits)


def make_decoders(names, model, translator, scratch):
    """Returns `{name: function(sentences) -> int32 output ids (B, L)}`."""
    options = dict(max_length=translator.max_output_length, extra_length=None)
    decoders_in_graph = {"cached": decoding.greedy_decode,
                         "uncached": decoding.uncached_greedy_decode,
                         "beam4": functools.partial(decoding.beam_search, beam_size=4,
                                                    length_penalty=0.6)}
    in_graph = {}
    for name, decode in decoders_in_graph.items():
        in_graph[name] = decoding.decode_function(decode, model, **options)
        in_graph[f"{name}_xla"] = decoding.decode_function(decode, model, jit_compile=True,
                                                           **options)
    decoders = {}
    for name in names:
        if name in in_graph:
            decode = in_graph[name]
            decoders[name] = lambda sentences, decode=decode: decode(
                translator.source_ids(tf.constant(sentences))).ids.numpy()
        elif name == "saved_model":
            decoders[name] = _saved_model_decoder(translator, scratch)
        else:
            decoders[name] = _tflite_decoder(translator, scratch,
                                             quantize=name == "tflite_quantized")
    return decoders


def _saved_model_decoder(translator, scratch):
    directory = os.path.join(scratch, "saved_model")
    translator_lib.save_saved_model(translator, directory)
    function = tf.saved_model.load(directory).signatures[files.GREEDY_SIGNATURE]
    return lambda sentences: function(sentences=tf.constant(sentences))["token_ids"].numpy()


def _tflite_decoder(translator, scratch, quantize=False):
    # Here: LiteRT, and tf-text's kernels for it, serve the TFLite rows alone.
    import tensorflow_text
    from ai_edge_litert.interpreter import InterpreterWithCustomOps
    path = os.path.join(scratch, "translator-quantized.tflite" if quantize
                        else "translator.tflite")
    with open(path, "wb") as file:
        file.write(translator_lib.convert_to_tflite(translator, quantize=quantize))
    interpreter = InterpreterWithCustomOps(
        model_path=path, custom_op_registerers=tensorflow_text.tflite_registrar.SELECT_TFTEXT_OPS,
        **litert.INTERPRETER_OPTIONS)
    runner = interpreter.get_signature_runner(files.GREEDY_SIGNATURE)
    return lambda sentences: runner(sentences=np.array(
        [sentence.encode() for sentence in sentences], dtype=object))["token_ids"]


def measure(name, decode, sentences, calls):
    """Times `calls` calls after one warm-up; returns sentences/s, tokens/s and the ids."""
    started = time.perf_counter()
    ids = decode(sentences)
    warmup_seconds = time.perf_counter() - started
    tokens = 0
    started = time.perf_counter()
    for _ in range(calls):
        tokens += int(np.sum(decode(sentences) != 0))
    seconds = (time.perf_counter() - started) / calls
    tokens /= calls
    return {"decoder": name, "batch": len(sentences), "seconds_per_call": seconds,
            "sentences_per_second": len(sentences) / seconds,
            "tokens_per_second": tokens / seconds,
            "mean_output_length": tokens / len(sentences),
            "warmup_seconds": warmup_seconds}, ids


def build(arguments):
    """Returns `(model, translator)`: a random-init model that never ends, and its translator."""
    keras.utils.set_random_seed(0)
    transformer = Transformer(
        arguments.vocabulary_size, num_layers=arguments.num_layers,
        hidden_dim=arguments.hidden_dim, intermediate_dim=arguments.intermediate_dim,
        num_heads=arguments.num_heads, dropout=0.0, max_length=arguments.max_length,
        use_fused_attention=arguments.use_fused_attention)
    model = EndlessModel(transformer)
    # Sources are made-up words; ids above the small tokenizer's vocabulary read as <unk>.
    translator = translator_lib.Translator(model, common.small_tokenizer(),
                                    max_output_length=arguments.output_length,
                                    extra_length=arguments.output_length)
    return model, translator


COLUMNS = [("decoder", "decoder"), ("batch", "batch"),
           ("seconds_per_call", "s/call"), ("sentences_per_second", "sent/s"),
           ("tokens_per_second", "tok/s"), ("mean_output_length", "out len"),
           ("mean_source_length", "src len"), ("same_as_cached", "= cached"),
           ("warmup_seconds", "warm-up s")]


def main(argv=None):
    arguments = parse_arguments(argv)
    result = common.header(arguments)
    model, translator = build(arguments)
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        decoders = make_decoders(arguments.decoders, model, translator, scratch)
        for batch in arguments.batch_sizes:
            sentences = common.pseudo_sentences(batch, seed=batch)
            source_length = float(np.mean(np.sum(
                translator.source_ids(tf.constant(sentences)).numpy() != 0, axis=1)))
            outputs = {}
            for name, decode in decoders.items():
                row, outputs[name] = measure(name, decode, sentences, arguments.calls)
                rows.append({**row, "mean_source_length": source_length})
            _compare_with_cached(rows[-len(decoders):], outputs)
    common.print_table(rows, COLUMNS)
    result.update(rows=rows, ratios=_ratios(rows), **common.memory_mb(),
                  load_average_end=common.load_average())
    for key, value in result["ratios"].items():
        print(f"{key}: {value:.1f}x")
    common.write_json(arguments.json, result)


# Decoders whose ids need not equal the cached greedy decoder's: beam search, and the
# int8 weights of the quantized TFLite model.
NOT_COMPARED = ("beam4", "beam4_xla", "tflite_quantized")


def _compare_with_cached(rows, outputs):
    """Marks whether each greedy decoder's ids equal the cached decoder's."""
    for row in rows:
        if row["decoder"] not in NOT_COMPARED and "cached" in outputs:
            row["same_as_cached"] = bool(np.array_equal(outputs[row["decoder"]],
                                                        outputs["cached"]))


# (faster, reference) decoder pairs whose tokens/s ratio is reported at each batch size.
RATIOS = [("cached", "uncached"), ("cached_xla", "uncached"), ("cached_xla", "uncached_xla"),
          ("cached_xla", "cached"), ("beam4_xla", "beam4"), ("tflite", "uncached"),
          ("tflite_quantized", "uncached")]


def _ratios(rows):
    """Tokens/s of each pair of `RATIOS` measured in this run, at each batch size."""
    speed = {(row["decoder"], row["batch"]): row["tokens_per_second"] for row in rows}
    batches = sorted({row["batch"] for row in rows})
    return {f"{fast}_over_{reference}_batch_{batch}":
            speed[(fast, batch)] / speed[(reference, batch)]
            for fast, reference in RATIOS for batch in batches
            if (fast, batch) in speed and (reference, batch) in speed}


if __name__ == "__main__":
    sys.exit(main())
