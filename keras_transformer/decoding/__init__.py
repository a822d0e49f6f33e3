"""Greedy decoding and beam search over the Transformer's key/value cache (§6.1).

The decoder runs one new token per step (`model.decode_step`) against cached keys and
values of the earlier positions and encoder keys/values projected once per sentence
(`model.init_cache`). Every tensor a decoding loop carries keeps its size through the
loop: a `(B, C + 1)` token buffer written at step `i` with a select, caches of `C`
positions (`C` fixed before the loop, from the batch's source width; with
`cache_chunk`, an outer loop grows them a chunk at a time), no `tf.TensorArray`,
nothing ragged. So the same loop runs eagerly, inside a `tf.function` or SavedModel,
and converts to TFLite with builtin ops only.

Public API (every decoder returns a `Decoded`):
    - `greedy_decode(model, source_ids, *, max_length, extra_length, ...)`.
    - `beam_search(model, source_ids, *, beam_size=4, length_penalty=0.6, ...)`.
    - `uncached_greedy_decode(...)`: the O(L²) reference, for tests and benchmarks.
    - `score_outputs(model, source_ids, output_ids)`: each given output token's
      log-probability (forced decoding), and their sum.
    - `decode_function(decode, model, *, jit_compile=False, **options)`: a decoder as one
      `tf.function`, optionally compiled with XLA.
    - `pad_width(ids, multiple)`: right-pads ids to a multiple of columns.
    - `cross_attention(model, ids, encoder_output, source_ids)`: attention behind ids.
    - `Ensemble(models)`: several models that decode as one.

Call decoders inside a `tf.function` (`decode_function`): eager Keras calls cost 10-100x
more than graph ones.
"""

from keras_transformer.decoding.beam import beam_search, gnmt_length_penalty
from keras_transformer.decoding.common import Decoded, cross_attention, decode_function, pad_width
from keras_transformer.decoding.ensemble import Ensemble
from keras_transformer.decoding.greedy import greedy_decode, uncached_greedy_decode
from keras_transformer.decoding.scoring import score_outputs

__all__ = ["Decoded", "Ensemble", "beam_search", "cross_attention",
           "decode_function", "gnmt_length_penalty", "greedy_decode",
           "pad_width", "score_outputs", "uncached_greedy_decode"]
