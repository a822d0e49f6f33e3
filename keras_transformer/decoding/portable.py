"""Greedy decoding in `keras.ops` alone, for validation BLEU on any Keras backend.

`greedy.greedy_decode` is TensorFlow code, because it is what the SavedModel and the
TFLite file run (`tf.while_loop` with shape invariants, TFLite-friendly writes). A model
trained on the JAX backend holds JAX arrays, which a TensorFlow graph cannot read, so
training on JAX translates its validation sentences with this decoder instead: the
same rule (cached steps, PAD never chosen, END not first unless the source is empty,
each sentence stopped at min(source length + `extra_length`, the cap)), the same ids
(tests compare the two on the TensorFlow backend), written with `keras.ops`.

Public API:
    - `greedy_ids(model, source_ids, ...)`: int32 `(B, C)` output ids, padded.
    - `compiled_greedy_ids(model, ...)`: the same as one compiled function of NumPy
      source ids (`jax.jit` on JAX, XLA on TensorFlow), reading the current weights at
      every call.
"""

import keras
import numpy as np
from keras import ops

from keras_transformer.data.tokenizer import END_ID, PAD_ID, START_ID
from keras_transformer.decoding.common import FORBIDDEN, has_source


def greedy_ids(model, source_ids, *, max_length=None, extra_length=50, start_id=START_ID,
               end_id=END_ID, pad_id=PAD_ID):
    """Returns the greedy output ids `(B, C)` of `source_ids` `(B, S)` (static shape).

    `C` = min(`model.max_length` - 1, `max_length`, S + `extra_length`); each row holds
    its tokens (END included where one was emitted), then `pad_id`: the ids of
    `greedy.greedy_decode`, padded to `C` columns.
    """
    batch, width = source_ids.shape
    buffer = model.max_length - 1
    if max_length is not None:
        buffer = min(buffer, max_length)
    if extra_length is not None:
        buffer = min(buffer, width + extra_length)
    source_ids = ops.cast(source_ids, "int32")
    limits = ops.full((batch,), buffer, "int32")
    if extra_length is not None:
        lengths = ops.sum(ops.cast(ops.not_equal(source_ids, pad_id), "int32"), axis=1)
        limits = ops.minimum(lengths + extra_length, limits)  # (B,)
    nonempty = has_source(source_ids, start_id, end_id, pad_id)  # (B,)
    encoder_output = model.encode(source_ids, training=False)  # (B, S, D)
    cache = model.init_cache(encoder_output, source_ids, buffer)
    vocabulary = ops.arange(model.vocabulary_size)
    is_pad, is_end = vocabulary == pad_id, vocabulary == end_id  # (V,)
    # END is forbidden first where there is a source, and is the only choice where not.
    first_forbidden = ops.where(nonempty[:, None], is_end[None, :],
                                ops.logical_not(is_end)[None, :])  # (B, V)
    positions = ops.arange(buffer + 1)
    tokens = ops.where(positions[None, :] == 0, start_id,
                       ops.full((batch, buffer + 1), pad_id, "int32"))  # (B, C + 1)

    def not_done(index, tokens, finished, cache):
        return ops.logical_and(index < buffer, ops.logical_not(ops.all(finished)))

    def step(index, tokens, finished, cache):
        current = ops.take(tokens, index, axis=1)  # (B,)
        logits, cache = model.decode_step(current, cache, index)  # (B, V)
        forbidden = is_pad[None, :] | (first_forbidden & (index == 0))
        logits = ops.where(forbidden, FORBIDDEN, ops.cast(logits, "float32"))
        next_ids = ops.where(finished, pad_id,
                             ops.cast(ops.argmax(logits, axis=-1), "int32"))  # (B,)
        tokens = ops.where(positions[None, :] == index + 1, next_ids[:, None], tokens)
        finished = finished | (next_ids == end_id) | (index + 1 >= limits)
        return index + 1, tokens, finished, cache

    _, tokens, _, _ = ops.while_loop(
        not_done, step, (ops.convert_to_tensor(0, "int32"), tokens,
                         ops.zeros((batch,), "bool"), cache))
    return tokens[:, 1:]


def compiled_greedy_ids(model, **options):
    """Returns `decode(source_ids) -> np.ndarray` (int32 `(B, C)`) compiled for the backend.

    On JAX, the weights are arguments of the compiled program, read at every call (a
    closure would bake the weights of the first call in as constants); one program is
    compiled per source shape, so callers should pad to few shapes. On TensorFlow, one
    XLA-compiled `tf.function`. Other backends run the loop eagerly.

    Args:
        model: a `Transformer`.
        **options: keyword arguments of `greedy_ids`.
    """
    backend = keras.backend.backend()
    if backend == "jax":
        import jax  # here: the backend's own compiler, present only on that backend

        @jax.jit
        def run(values, source_ids):
            with keras.StatelessScope(state_mapping=list(zip(model.variables, values))):
                return greedy_ids(model, source_ids, **options)

        def decode(source_ids):
            values = [variable.value for variable in model.variables]
            return np.asarray(run(values, np.asarray(source_ids, np.int32)))
        return decode
    if backend == "tensorflow":
        import tensorflow as tf  # here, as above

        compiled = tf.function(lambda source_ids: greedy_ids(model, source_ids, **options),
                               jit_compile=True)
        return lambda source_ids: compiled(np.asarray(source_ids, np.int32)).numpy()
    return lambda source_ids: ops.convert_to_numpy(
        greedy_ids(model, np.asarray(source_ids, np.int32), **options))
