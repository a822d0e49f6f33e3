"""Greedy decoding over the Transformer's key/value cache (Vaswani et al., 2017, §6.1).

The decoder runs one new token per step (`model.decode_step`) against cached keys and
values of the earlier positions and encoder keys/values projected once per sentence
(`model.init_cache`). Every tensor the loop carries has a static shape apart from the
batch: a `(B, C + 1)` token buffer written at step `i` with a select, fixed-size caches,
no `tf.TensorArray`, nothing ragged. That is what lets the same loop run eagerly, inside
a `tf.function` or SavedModel, and convert to TFLite with builtin ops only.

The output length follows the paper: at most the source length + 50 tokens (§6.1), capped
by `max_length` and by what the model's positional table holds.

Eager Keras calls cost 10-100x more than graph ones: wrap decoding in a `tf.function`
(`decode_function` does it) for anything but a quick look.
"""

import typing

import tensorflow as tf

# Token ids of the project's vocabulary; arguments below default to these.
PAD_ID, START_ID, END_ID = 0, 2, 3

# Log-probability given to tokens that must never be chosen. Finite, unlike -inf, so that
# sums and divisions of scores stay finite.
_FORBIDDEN = -1e9


class Decoded(typing.NamedTuple):
    """What every decoder returns (batch on axis 0).

    Attributes:
        ids: int32 `(B, L)`: the output without the start token, the end token included
            where one was emitted, padding after it. `L` is the number of steps run.
        lengths: int32 `(B,)`: tokens before the padding (the end token counts).
        scores: float32 `(B,)`: sum of the log-probabilities of those tokens.
        normalized_scores: float32 `(B,)` scores divided by the length penalty (beam
            search), or `None` (greedy decoding does not normalise).
        attention: float32 `(B, N, H, L, S)` cross-attention weights of every decoder
            layer for each output token, or `None` unless requested.
    """

    ids: tf.Tensor
    lengths: tf.Tensor
    scores: tf.Tensor
    normalized_scores: typing.Optional[tf.Tensor] = None
    attention: typing.Optional[tf.Tensor] = None


def greedy_decode(model, source_ids, *, max_length=None, extra_length=50,
                  start_id=START_ID, end_id=END_ID, pad_id=PAD_ID, return_attention=False):
    """Translates `source_ids` by picking the most probable token at each step (cached).

    Each sentence stops at its end token (then emits `pad_id`) or at its length limit
    `min(source length + extra_length, max_length, model.max_length - 1)`; the loop stops
    when every sentence has. The padding token is never chosen.

    Args:
        model: a `Transformer`, or any object with its `encode`, `init_cache`,
            `decode_step`, `decode` (for attention) and `max_length`.
        source_ids: int `(B, S)`, padded with `pad_id`.
        max_length: int or `None`. Most output tokens (end token included). The token
            buffer and the caches are allocated at this size, so a smaller value also
            makes each step cheaper.
        extra_length: int or `None`. Output tokens allowed beyond the source length
            (50 in the paper); `None` for no source-relative limit.
        start_id, end_id, pad_id: int. Special token ids.
        return_attention: bool. Also fill `Decoded.attention`.

    Returns:
        A `Decoded` with `normalized_scores=None`.
    """
    source_ids = tf.cast(source_ids, tf.int32)
    buffer_length, limits = length_limits(model, source_ids, max_length, extra_length,
                                          pad_id)
    encoder_output = model.encode(source_ids, training=False)  # (B, S, D)
    cache = model.init_cache(encoder_output, source_ids, buffer_length)

    def step(tokens, index, cache):
        return model.decode_step(tokens[:, index], cache, index)  # (B, V)

    ids, scores = _greedy_loop(step, cache, limits, buffer_length, start_id, end_id, pad_id)
    return _decoded(model, ids, scores, None, encoder_output, source_ids, start_id, pad_id,
                    return_attention)


def uncached_greedy_decode(model, source_ids, *, max_length=None, extra_length=50,
                           start_id=START_ID, end_id=END_ID, pad_id=PAD_ID,
                           return_attention=False):
    """Reference greedy decoder: re-runs `model.decode` on the whole prefix every step.

    This is how the TensorFlow tutorial's translator decodes, O(L²) per sentence instead
    of O(L). It exists to check `greedy_decode` and to measure what the cache saves; use
    `greedy_decode` to translate. Arguments and result as `greedy_decode`.
    """
    source_ids = tf.cast(source_ids, tf.int32)
    buffer_length, limits = length_limits(model, source_ids, max_length, extra_length,
                                          pad_id)
    encoder_output = model.encode(source_ids, training=False)  # (B, S, D)

    def step(tokens, index, state):
        logits = model.decode(tokens[:, :index + 1], encoder_output, source_ids,
                              training=False)  # (B, index + 1, V)
        return logits[:, -1, :], state

    ids, scores = _greedy_loop(step, (), limits, buffer_length, start_id, end_id, pad_id)
    return _decoded(model, ids, scores, None, encoder_output, source_ids, start_id, pad_id,
                    return_attention)


def decode_function(decode, model, **options):
    """Returns `decode(model, source_ids, **options)` as a `tf.function` of `source_ids`.

    Traced once for int32 `(None, None)` ids, so batches of any size and length reuse the
    graph: this is the fast way to call a decoder outside a SavedModel.

    Example:
    >>> translate = decode_function(greedy_decode, model, max_length=64)
    >>> translate(source_ids).ids
    """
    @tf.function(input_signature=[tf.TensorSpec((None, None), tf.int32)])
    def decode_ids(source_ids):
        return decode(model, source_ids, **options)

    return decode_ids


def length_limits(model, source_ids, max_length, extra_length, pad_id):
    """Returns `(buffer_length, limits)`: the static cap and each sentence's limit.

    `buffer_length` (a Python int) sizes the token buffer and the caches; it is as small
    as the static shapes allow. `limits` (int32 `(B,)`) is the number of output tokens
    each sentence may have: min(its source length + `extra_length`, `buffer_length`).
    """
    # Output positions 0..L-1 are fed to the decoder, and the start token plus L tokens
    # must fit the model's `max_length` (which counts start and end tokens).
    buffer_length = model.max_length - 1
    if max_length is not None:
        buffer_length = min(buffer_length, max_length)
    static_source_length = source_ids.shape[1]
    if extra_length is not None and static_source_length is not None:
        buffer_length = min(buffer_length, static_source_length + extra_length)
    if buffer_length < 1:
        raise ValueError(f"No output token fits: max_length={max_length}, "
                         f"model.max_length={model.max_length}.")
    limits = tf.fill(tf.shape(source_ids)[:1], buffer_length)  # (B,)
    if extra_length is not None:
        source_lengths = tf.reduce_sum(tf.cast(source_ids != pad_id, tf.int32), axis=1)
        limits = tf.minimum(source_lengths + extra_length, limits)
    return buffer_length, limits


def log_probabilities(logits, pad_id):
    """Returns float32 log-softmax `(B, V)` of `logits` with `pad_id` made unchoosable.

    A model never learns to predict padding (the loss ignores it); forbidding it keeps
    padding meaning "after the end token" in every output.
    """
    log_probs = tf.nn.log_softmax(tf.cast(logits, tf.float32), axis=-1)  # (B, V)
    is_pad = tf.range(tf.shape(log_probs)[-1]) == pad_id  # (V,)
    return tf.where(is_pad[None, :], _FORBIDDEN, log_probs)


def _greedy_loop(step, state, limits, buffer_length, start_id, end_id, pad_id):
    """Runs `step(tokens, index, state) -> (logits, state)` greedily; returns (ids, scores).

    `tokens` is the `(B, buffer_length + 1)` buffer holding the start token and the
    outputs so far; `ids` is `(B, steps)`, `scores` `(B,)` the summed log-probabilities.
    """
    batch = tf.shape(limits)[0]
    positions = tf.range(buffer_length + 1)  # (C + 1,)
    tokens = tf.where(positions[None, :] == 0, start_id,
                      tf.fill([batch, buffer_length + 1], pad_id))  # (B, C + 1)
    finished = tf.zeros([batch], tf.bool)
    scores = tf.zeros([batch], tf.float32)
    loop_length = tf.reduce_max(limits)

    def not_done(index, tokens, finished, scores, state):
        return tf.logical_and(index < loop_length,
                              tf.logical_not(tf.reduce_all(finished)))

    def decode_one(index, tokens, finished, scores, state):
        logits, state = step(tokens, index, state)  # (B, V)
        log_probs = log_probabilities(logits, pad_id)  # (B, V)
        next_ids = tf.where(finished, pad_id,
                            tf.argmax(log_probs, axis=-1, output_type=tf.int32))  # (B,)
        scores += tf.where(finished, 0.0, tf.reduce_max(log_probs, axis=-1))
        # A select on a one-hot position, not a scatter: static shapes, builtin ops.
        tokens = tf.where(positions[None, :] == index + 1, next_ids[:, None], tokens)
        finished = finished | (next_ids == end_id) | (index + 1 >= limits)
        return index + 1, tokens, finished, scores, state

    steps, tokens, _, scores, _ = tf.while_loop(
        not_done, decode_one, (tf.constant(0), tokens, finished, scores, state))
    return tokens[:, 1:steps + 1], scores  # (B, L), (B,)


def _decoded(model, ids, scores, normalized_scores, encoder_output, source_ids, start_id,
             pad_id, return_attention):
    """Packs a `Decoded`, computing the attention weights when asked."""
    lengths = tf.reduce_sum(tf.cast(ids != pad_id, tf.int32), axis=1)  # (B,)
    attention = None
    if return_attention:
        attention = cross_attention(model, ids, encoder_output, source_ids, start_id)
    return Decoded(ids, lengths, scores, normalized_scores, attention)


def cross_attention(model, ids, encoder_output, source_ids, start_id=START_ID):
    """Returns the cross-attention weights `(B, N, H, L, S)` behind output `ids` `(B, L)`.

    One teacher-forced `model.decode` over the output: with the same prefixes it computes
    exactly the weights the cached steps used, at the cost of one extra decoder pass.
    """
    batch = tf.shape(ids)[0]
    decoder_input = tf.concat(
        [tf.fill([batch, 1], start_id), ids[:, :-1]], axis=1)  # (B, L)
    _, layer_scores = model.decode(decoder_input, encoder_output, source_ids,
                                   training=False, return_attention_scores=True)
    return tf.stack([scores["cross_attention"] for scores in layer_scores], axis=1)
