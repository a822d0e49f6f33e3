"""Greedy decoding over the key/value cache, and the uncached reference it is checked by.

Shape legend as in `common.py`.
"""

import tensorflow as tf

from keras_transformer.data.tokenizer import END_ID, PAD_ID, START_ID
from keras_transformer.decoding.common import (
    chunked_loop,
    decoded,
    has_source,
    length_limits,
    log_normalizers,
    put_back,
    staying_and_leaving,
    step_options,
    token_bias,
    while_loop,
    write_position,
)


def greedy_decode(model, source_ids, *, max_length=None, extra_length=50,
                  start_id=START_ID, end_id=END_ID, pad_id=PAD_ID, return_attention=False,
                  cache_chunk=None, write_cache=None, choose=None):
    """Translates `source_ids` by picking the most probable token at each step (cached).

    Each step feeds one token to `model.decode_step`. A sentence stops at its end token
    (then emits `pad_id`) or at its length limit, `min(source length + extra_length,
    max_length, model.max_length - 1)`; the loop stops when every sentence has. The
    padding token is never chosen, nor the end token first, unless the source is empty
    (then it is the whole output; see `common.token_bias`).

    Args:
        model: a `Transformer`, or any object with its `encode`, `init_cache`,
            `decode_step`, `max_length` (and `decode` for attention).
        source_ids: int `(B, S)`, padded with `pad_id`.
        max_length: int or `None`. Most output tokens (end token included). The token
            buffer and the caches are allocated at this size, so a smaller value also
            makes every step cheaper.
        extra_length: int or `None`. Output tokens allowed beyond the source length
            (50 in the paper, §6.1); `None` for no source-relative limit.
        start_id, end_id, pad_id: int. Special token ids.
        return_attention: bool. Also fill `Decoded.attention`.
        cache_chunk: int or `None`. Grow the cache by this many positions at a time
            (`common.chunked_loop`, for a model with `grow_cache`) instead of
            allocating all `max_length` at the start: the same outputs, for less memory
            traffic at every step. Not under XLA, which needs the cache's size fixed.
        write_cache: how each step writes the cache (`Transformer.decode_step`); the
            model's default when `None`.
        choose: `choose(logits (B, V), index, sentences (B,)) -> ids (B,)`, the rule
            that picks each step's tokens instead of the argmax (`sampling.sample`);
            `logits` carry FORBIDDEN at tokens that must not be picked, and
            `sentences` says which sentence of the batch each row is.

    Returns:
        A `Decoded` with `normalized_scores=None`.
    """
    source_ids = tf.cast(source_ids, tf.int32)
    buffer_length, limits = length_limits(model, source_ids, max_length, extra_length,
                                          pad_id)
    encoder_output = model.encode(source_ids, training=False)  # (B, S, D)
    grow = getattr(model, "grow_cache", None) if cache_chunk else None
    cache = model.init_cache(encoder_output, source_ids, 0 if grow else buffer_length)

    options = step_options(write_cache=write_cache)

    def step(tokens, index, cache):
        return model.decode_step(tokens[:, index], cache, index, **options)  # (B, V), cache

    nonempty = has_source(source_ids, start_id, end_id, pad_id)
    ids, scores = _greedy_loop(step, cache, limits, nonempty, buffer_length, start_id,
                               end_id, pad_id, grow=grow, cache_chunk=cache_chunk,
                               choose=choose)
    return decoded(model, ids, scores, None, encoder_output, source_ids, start_id, pad_id,
                   return_attention)


def uncached_greedy_decode(model, source_ids, *, max_length=None, extra_length=50,
                           start_id=START_ID, end_id=END_ID, pad_id=PAD_ID,
                           return_attention=False):
    """Reference greedy decoder: re-runs `model.decode` on the whole prefix every step.

    This is how the TensorFlow tutorial's translator decodes: O(L²) work per sentence
    instead of O(L). It exists to check `greedy_decode` and to measure what the cache
    saves; translate with `greedy_decode`. Arguments and result as `greedy_decode`.
    """
    source_ids = tf.cast(source_ids, tf.int32)
    buffer_length, limits = length_limits(model, source_ids, max_length, extra_length,
                                          pad_id)
    encoder_output = model.encode(source_ids, training=False)  # (B, S, D)

    def step(tokens, index, state):
        logits = model.decode(tokens[:, :index + 1], encoder_output, source_ids,
                              training=False)  # (B, index + 1, V)
        return logits[:, -1, :], state

    nonempty = has_source(source_ids, start_id, end_id, pad_id)
    ids, scores = _greedy_loop(step, (), limits, nonempty, buffer_length, start_id,
                               end_id, pad_id)
    return decoded(model, ids, scores, None, encoder_output, source_ids, start_id, pad_id,
                   return_attention)


def _greedy_loop(step, state, limits, nonempty, buffer_length, start_id, end_id, pad_id,
                 grow=None, cache_chunk=None, choose=None):
    """Runs `step(tokens, index, state) -> (logits, state)` greedily (or by `choose`).

    `tokens` is the `(B, C + 1)` buffer holding the start token and the outputs so far;
    `nonempty` (bool `(B,)`) says which sentences have a source (`has_source`). With
    `grow`, the state (the cache) grows by `cache_chunk` positions at a time, and
    sentences that have finished leave the batch before each chunk (`chunked_loop`).

    Returns:
        `(ids, scores)`: int32 `(B, L)` outputs of the `L` steps run and float32 `(B,)`
        summed log-probabilities.
    """
    batch = tf.shape(limits)[0]
    tokens = tf.fill([batch, buffer_length + 1], pad_id)
    tokens = write_position(tokens, 0, tf.fill([batch], start_id))  # (B, C + 1)
    finished = tf.zeros([batch], tf.bool)
    scores = tf.zeros([batch], tf.float32)
    rows = tf.range(batch)  # each row's sentence
    results = (tokens, scores)  # each sentence's, put back when it leaves the batch
    loop_length = tf.reduce_max(limits)

    def not_done(index, tokens, finished, *_):
        return tf.logical_and(index < loop_length,
                              tf.logical_not(tf.reduce_all(finished)))

    def decode_one(index, tokens, finished, scores, limits, nonempty, rows, results, state):
        logits, state = step(tokens, index, state)
        logits = tf.cast(logits, tf.float32)  # (B, V)
        normalizers = log_normalizers(logits)  # (B, 1)
        biased = logits + token_bias(logits.shape[-1] or tf.shape(logits)[-1], index,
                                     end_id, pad_id)[None, :]  # (B, V)
        if choose is None:
            best_ids = tf.argmax(biased, axis=-1, output_type=tf.int32)  # (B,)
            best_scores = tf.reduce_max(biased, axis=-1) - normalizers[:, 0]  # (B,)
        else:
            best_ids = choose(biased, index, rows)  # (B,)
            best_scores = (tf.gather(biased, best_ids, batch_dims=1)
                           - normalizers[:, 0])  # (B,)
        # An empty source's translation is the end token alone (see `token_bias`).
        forced = tf.logical_and(tf.equal(index, 0), tf.logical_not(nonempty))  # (B,)
        end_scores = logits[:, end_id] - normalizers[:, 0]  # (B,)
        next_ids = tf.where(finished, pad_id, tf.where(forced, end_id, best_ids))
        scores += tf.where(finished, 0.0, tf.where(forced, end_scores, best_scores))
        tokens = write_position(tokens, index + 1, next_ids)
        finished = finished | (next_ids == end_id) | (index + 1 >= limits)
        return index + 1, tokens, finished, scores, limits, nonempty, rows, results, state

    def set_finished_aside(tokens, finished, scores, limits, nonempty, rows, results, state):
        staying, leaving = staying_and_leaving(finished)
        results = put_back(results, tf.gather(rows, leaving),
                           (tf.gather(tokens, leaving), tf.gather(scores, leaving)))
        tokens, finished, scores, limits, nonempty, rows, state = tf.nest.map_structure(
            lambda value: tf.gather(value, staying),
            (tokens, finished, scores, limits, nonempty, rows, state))
        return tokens, finished, scores, limits, nonempty, rows, results, state

    loop_vars = (tf.constant(0), tokens, finished, scores, limits, nonempty, rows, results,
                 state)
    if grow is None:
        steps, tokens, _, scores, _, _, rows, results, _ = while_loop(not_done, decode_one,
                                                                      loop_vars)
    else:
        steps, tokens, _, scores, _, _, rows, results, _ = chunked_loop(
            not_done, decode_one, loop_vars, grow=grow, chunk=cache_chunk,
            buffer_length=buffer_length, compact=set_finished_aside)
    tokens, scores = put_back(results, rows, (tokens, scores))
    return tokens[:, 1:steps + 1], scores
