"""What greedy decoding and beam search share: the result type, length limits, scoring.

Shape legend: B batch, S source length, L output length, C the output cap, V
vocabulary, N decoder layers, H heads.
"""

import typing

import numpy as np
import tensorflow as tf
from keras import ops

from keras_transformer.data.tokenizer import PAD_ID, START_ID
from keras_transformer.files import FORBIDDEN_SCORE

# Log-probability of tokens that must never be chosen and score of empty beam slots
# (and of an n-best list's fillers, which readers of artifacts drop by it).
FORBIDDEN = FORBIDDEN_SCORE

# In the log-softmax's sum, logits further than this below their row's largest count
# as that far (`log_normalizers`).
LOGIT_FLOOR = 80.0

# Source widths an XLA-compiled decoder sees are multiples of this, so that a run
# compiles a few programs rather than one per source length.
XLA_SOURCE_WIDTH_STEP = 16


class Decoded(typing.NamedTuple):
    """What every decoder returns (batch on axis 0).

    Attributes:
        ids: int32 `(B, L)`: the output without the start token, the end token included
            where one was emitted, padding after it. `L` is the number of steps run.
        lengths: int32 `(B,)`: tokens before the padding (the end token counts).
        scores: float32 `(B,)`: sum of the log-probabilities of those tokens.
        normalized_scores: float32 `(B,)`: scores divided by the length penalty (beam
            search), or `None` (greedy decoding does not normalise).
        attention: float32 `(B, N, H, L, S)`: cross-attention weights of every decoder
            layer for each output token, or `None` unless requested.

    Beam search's n-best lists (`num_hypotheses`) add an axis after the batch to `ids`
    (`(B, n, L)`, n hypotheses), `lengths`, `scores` and `normalized_scores` (`(B, n)`).
    """

    ids: tf.Tensor
    lengths: tf.Tensor
    scores: tf.Tensor
    normalized_scores: typing.Optional[tf.Tensor] = None
    attention: typing.Optional[tf.Tensor] = None


def decode_function(decode, model, *, jit_compile=False, **options):
    """Returns `decode(model, source_ids, **options)` as a `tf.function` of `source_ids`.

    Traced once for int32 `(None, None)` ids, so batches of any size and length reuse the
    graph: the fast way to call a decoder outside a SavedModel (eager Keras calls cost
    10-100x more).

    Args:
        decode: a decoder such as `greedy_decode` or `beam_search`.
        model: the `Transformer` it decodes with.
        jit_compile: bool. Compile the decoder with XLA. A decoding step is many small
            ops, and XLA fuses them into few kernels, which pays most at small batches
            (BENCHMARKS.md, "Decoding throughput"). XLA compiles once per input shape,
            so source ids are padded to a multiple of `XLA_SOURCE_WIDTH_STEP` columns
            first, up to `model.max_length` (padding changes no output; attention
            weights, when returned, cover the padded width). Not for exported models:
            TF Serving runs XLA on CPU only behind an experimental flag.
        **options: keyword arguments of `decode`.

    Example:
        translate = decode_function(beam_search, model, beam_size=4)
        translate(source_ids).ids
    """
    compiled = tf.function(lambda source_ids: decode(model, source_ids, **options),
                           jit_compile=True) if jit_compile else None

    @tf.function(input_signature=[tf.TensorSpec((None, None), tf.int32)])
    def decode_ids(source_ids):
        if compiled is None:
            return decode(model, source_ids, **options)
        return compiled(pad_width(source_ids, XLA_SOURCE_WIDTH_STEP,
                                  options.get("pad_id", PAD_ID), limit=model.max_length))

    return decode_ids


def pad_width(ids, multiple, pad_id=PAD_ID, limit=None):
    """Returns `ids` `(B, S)` padded on the right to a multiple of `multiple` columns.

    With `limit`, to at most `max(S, limit)` columns (a model's `max_length`).
    """
    width = tf.shape(ids)[1]
    target = (width + multiple - 1) // multiple * multiple
    if limit is not None:
        target = tf.minimum(target, tf.maximum(width, limit))
    return tf.pad(ids, [[0, 0], [0, target - width]], constant_values=pad_id)


def length_limits(model, source_ids, max_length, extra_length, pad_id):
    """Returns `(buffer_length, limits)`: the output cap and each sentence's limit.

    `buffer_length` (`C`) sizes the token buffers and the caches: min(`model.max_length`
    - 1, `max_length`, source width + `extra_length`). It is a Python int when the
    source width is static, else an int32 scalar: an exported translator then bounds its
    caches by the widest source of each batch rather than by the model's `max_length`
    (with the `multi30k` preset, 70 positions instead of 255 for a sentence of 20
    pieces), and grows them up to that bound as it decodes (`chunked_loop`). `limits` (int32
    `(B,)`) is how many output tokens each sentence may have: min(its source length +
    `extra_length`, `C`) (§6.1: "input length + 50").
    """
    # Positions 0..C-1 are fed to the decoder, and the start token plus C tokens must fit
    # the model's `max_length`, which counts start and end tokens.
    buffer_length = model.max_length - 1
    if max_length is not None:
        buffer_length = min(buffer_length, max_length)
    if buffer_length < 1:
        raise ValueError(f"No output token fits: max_length={max_length}, "
                         f"model.max_length={model.max_length}.")
    if extra_length is not None:
        width = source_ids.shape[1]
        if width is not None:
            buffer_length = min(buffer_length, width + extra_length)
        else:
            buffer_length = tf.minimum(buffer_length, tf.shape(source_ids)[1] + extra_length)
    limits = tf.fill(tf.shape(source_ids)[:1], buffer_length)  # (B,)
    if extra_length is not None:
        source_lengths = tf.reduce_sum(tf.cast(source_ids != pad_id, tf.int32), axis=1)
        limits = tf.minimum(source_lengths + extra_length, limits)
    return buffer_length, limits


def log_normalizers(logits):
    """Returns float32 `(B, 1)`: log Σ exp of each row of float32 `logits` `(B, V)`.

    The log-softmax is `logits - log_normalizers(logits)`: decoders add their own terms
    to it (`token_bias`, beam scores) before reading a `(B, V)` tensor out, and each
    addition is a pass over it at every step.

    Written out as m + log Σ exp(x - m), m the row's largest logit, rather than with
    `tf.nn.log_softmax`, for LiteRT: its LOG_SOFTMAX kernel computes exp() one element
    at a time outside XNNPACK, while XNNPACK runs SUB, MAXIMUM, EXP, SUM and LOG with
    vector code (1.75 ms against 0.65 ms for 128 × 8,000 logits on one core, a sixth
    of an int8 beam step at batch 32). In the sum, logits more than `LOGIT_FLOOR` below
    m count as that far: exp() of an exponent below -87 is a subnormal float, which x86
    CPUs compute several times slower (TensorFlow flushes subnormals to zero in its
    threads; LiteRT does not). Each of those tokens adds at most e^-80 to a sum of at
    least 1, which float32 cannot tell apart, and keeps its own exact log-probability.
    """
    largest = tf.reduce_max(logits, axis=-1, keepdims=True)  # (B, 1)
    return largest + tf.math.log(tf.reduce_sum(
        tf.exp(tf.maximum(logits - largest, -LOGIT_FLOOR)), axis=-1, keepdims=True))


def token_bias(vocabulary, index, end_id, pad_id):
    """Returns float32 `(V,)`: what a decoding step adds to its log-probabilities.

    FORBIDDEN (a log-probability's few units vanish in it) at `pad_id` at every step,
    and at `end_id` at the first (`index` 0); 0 elsewhere, so that chosen tokens keep
    the model's log-probabilities and scores stay the model's. Added rather than
    selected: TFLite runs a broadcast select with its slow reference kernel.

    Padding: a model never learns to predict it (the loss ignores it); forbidding it
    keeps padding meaning "after the end token" in every output.

    The end token first: a model gives the empty output a small but real probability,
    and beam search, dividing every other hypothesis's log-probability by its length
    penalty, returns it whenever that probability beats a whole translation's (the
    "empty translation" of Stahlberg and Byrne, 2019): the `multi30k` preset's model
    translated 11 of Multi30K's 29,000 training sentences to nothing. fairseq forbids
    the end token at the first step for the same reason. An empty source (`has_source`)
    has nothing to translate, and its translation is the end token alone, which each
    decoder sets after choosing, with the end token's log-probability as its score.
    """
    def one_hot(token):
        if isinstance(vocabulary, int):  # a constant in the graph
            return tf.constant(np.arange(vocabulary) == token, tf.float32)
        return tf.one_hot(token, vocabulary)

    first = tf.cast(tf.equal(index, 0), tf.float32)
    return FORBIDDEN * (one_hot(pad_id) + first * one_hot(end_id))


def has_source(source_ids, start_id, end_id, pad_id):
    """Returns bool `(B,)`: whether each source holds a token besides START, END, PAD.

    In `keras.ops`, which are TensorFlow's ops on that backend, so that `portable`'s
    decoder shares it on any backend.
    """
    special = (source_ids == start_id) | (source_ids == end_id) | (source_ids == pad_id)
    return ops.any(ops.logical_not(special), axis=1)


def step_options(hypotheses=1, write_cache=None):
    """The keyword arguments of a `model.decode_step` call, only those not at their
    defaults: a model that has neither (a test's stub, a user's model) is called as
    `decode_step(token_ids, cache, index)`."""
    options = {"hypotheses": hypotheses} if hypotheses > 1 else {}
    if write_cache is not None:
        options["write_cache"] = write_cache
    return options


def write_position(tokens, index, new_ids):
    """Returns `tokens` `(B, C + 1)` with column `index` set to `new_ids` `(B,)`.

    A select on a one-hot position rather than a scatter: static shapes and builtin ops,
    so the loop converts to TFLite.
    """
    positions = tf.range(tf.shape(tokens)[1])  # (C + 1,)
    return tf.where(positions[None, :] == index, new_ids[:, None], tokens)


def while_loop(condition, body, loop_vars, growing_cache=False):
    """`tf.while_loop` whose loop variables may change their batch size (axis 0).

    Keeps the static shape of every other axis, so the loop still lowers to TFLite
    builtins, while ops that lose the static batch inside the body (a reshape by
    `tf.shape`, say) cannot fail the shape check when the batch is static (batch 1).
    With `growing_cache`, the last loop variable (the decoding cache) keeps only the
    rank of its tensors: `chunked_loop` grows it between iterations.
    """
    loop_vars = tf.nest.map_structure(tf.convert_to_tensor, loop_vars)
    invariants = tf.nest.map_structure(
        lambda tensor: tf.TensorShape([None, *tensor.shape[1:]]) if tensor.shape.rank
        else tensor.shape, loop_vars)
    if growing_cache:
        invariants = (*invariants[:-1], tf.nest.map_structure(
            lambda tensor: tf.TensorShape([None] * tensor.shape.rank), loop_vars[-1]))
    return tf.while_loop(condition, body, loop_vars, shape_invariants=invariants)


def chunked_loop(condition, body, loop_vars, *, grow, chunk, buffer_length, compact=None):
    """Runs `while_loop(condition, body, loop_vars)`, growing the cache as it goes.

    Loop states are `(index, *rest, cache)`. The cache starts with no positions; before
    position `index` is decoded, `grow(cache, length)` (the model's `grow_cache`) gives
    it room up to `min(index + chunk, buffer_length)`, and an inner loop decodes until
    that room is full. The outputs are those of `while_loop` over a cache of
    `buffer_length` positions: the positions not yet written are masked either way.
    Before each chunk, `compact(*rest, cache)`, when given, returns the state without
    the rows that have finished (having put their results aside): the next steps then
    decode only the sentences still being translated.

    Why: every step reads its whole cache (attention) and writes it whole (TFLite's WHILE
    copies every loop variable at every iteration; beam search reorders it), so a cache
    sized for the longest output allowed (source length + 50, §6.1) costs most of a
    step at large batches, where the translations end after 10 to 30 tokens; and a
    batch runs as many steps as its longest translation, which finished rows would
    otherwise pay for at every one of them.
    """
    def grow_then_decode(index, *state):
        if compact is not None:
            state = compact(*state)
        length = tf.minimum(index + chunk, buffer_length)
        cache = grow(state[-1], length)

        def room_left(index, *state):
            return tf.logical_and(index < length, condition(index, *state))

        return while_loop(room_left, body, (index, *state[:-1], cache))

    return while_loop(condition, grow_then_decode, loop_vars, growing_cache=True)


def staying_and_leaving(finished):
    """Returns int32 `(rows that stay, rows that leave)` for a bool `(B,)` `finished`."""
    def rows(condition):
        return tf.cast(tf.reshape(tf.where(condition), [-1]), tf.int32)
    return rows(tf.logical_not(finished)), rows(finished)


def put_back(results, rows, values):
    """Returns `results` with the entries of `rows` replaced by `values`.

    Decoders that let finished sentences leave the batch keep every sentence's result
    in full-size `results` (a structure of tensors, one entry per sentence of the batch
    on axis 0), written back by each sentence's original place `rows` (int32 `(n,)`)
    from `values` (the same structure, `n` entries). Fixed-size results keep every loop
    variable but the shrinking batch of one shape, which TFLite's loops need.

    A gather and a select rather than a scatter: TFLite has no in-place scatter, and
    its converter turns one into arithmetic over the whole tensor.
    """
    batch = tf.shape(tf.nest.flatten(results)[0])[0]
    count = tf.shape(rows)[0]
    # 2 where an entry's place is in `rows`, then a column of 1s: the argmax is the
    # entry's index in `values`, or `count` for entries not in `rows` (and defined when
    # `count` is 0). Those read one row past the values, then keep their result.
    matches = 2 * tf.cast(tf.equal(tf.range(batch)[:, None], rows[None, :]), tf.int32)
    sources = tf.argmax(tf.concat([matches, tf.ones([batch, 1], tf.int32)], axis=1),
                        axis=1, output_type=tf.int32)  # (B,)
    present = sources < count  # (B,)

    def put(result, value):
        gathered = tf.gather(tf.concat([value, result[:1]], axis=0), sources)
        keep = tf.reshape(present, [-1] + [1] * (result.shape.rank - 1))
        return tf.where(keep, gathered, result)

    return tf.nest.map_structure(put, results, values)


def decoded(model, ids, scores, normalized_scores, encoder_output, source_ids, start_id,
            pad_id, return_attention):
    """Packs a `Decoded`, computing the attention weights when asked."""
    lengths = tf.reduce_sum(tf.cast(ids != pad_id, tf.int32), axis=-1)  # (B,) or (B, n)
    attention = None
    if return_attention:
        attention = cross_attention(model, ids, encoder_output, source_ids, start_id)
    return Decoded(ids, lengths, scores, normalized_scores, attention)


def cross_attention(model, ids, encoder_output, source_ids, start_id=START_ID):
    """Returns the cross-attention weights `(B, N, H, L, S)` behind output `ids` `(B, L)`.

    One teacher-forced pass over the output (`model.cross_attention_weights`): with the
    same prefixes it computes exactly the weights the cached steps used, for the price
    of one extra decoder pass.
    """
    batch = tf.shape(ids)[0]
    decoder_input = tf.concat([tf.fill([batch, 1], start_id), ids[:, :-1]], axis=1)  # (B, L)
    return model.cross_attention_weights(decoder_input, encoder_output, source_ids)
