"""Seeded sampling (top-k, temperature) from integer hashes: the same in every runtime.

Sampling is the decoding of back-translation at scale (Edunov et al., 2018): each step
draws the next token from the model's distribution, sharpened or flattened by a
temperature, over the `k` most probable tokens (all of them for `k` = 0).

Why not `tf.random`: its stateless ops (`StatelessRandomGetKeyCounter`) have no TFLite
kernel, and its stateful ones keep their state in the process, so a SavedModel would not
repeat itself. Here the randomness is a counter-based hash instead, written with the
int32 ops every runtime has and computes alike (XOR, arithmetic shift, wrapping
multiplication; checked in TensorFlow and LiteRT): the noise of token rank `j` at step
`t` of a sentence is a hash of (the sentence's key, `t`, `j`), its key a hash of the
seed and the source ids. So a sentence's sample depends on its seed and its source
only: not on the batch it is in, its place there, or the runtime, and the same seed
repeats it (two equal sentences with one seed get the same sample). The draw is the
Gumbel-max trick: argmax of log-probabilities / temperature plus Gumbel noise picks
token `i` with probability softmax(logits / temperature)_i.

Shape legend as in `common.py`; `k` the tokens sampled from.
"""

import tensorflow as tf

from keras_transformer.data.tokenizer import PAD_ID
from keras_transformer.decoding.beam import top_k_by_blocks
from keras_transformer.decoding.greedy import greedy_decode

# lowbias32's multipliers (Wellons, "Prospecting for hash functions", 2018), the second
# written as the int32 with its bits.
_MULTIPLIERS = (0x7FEB352D, 0x846CA68B - (1 << 32))
# Weyl increment (2^32 / golden ratio, as int32) that spreads counters before hashing.
_GOLDEN = 0x9E3779B9 - (1 << 32)

# Largest temperature accepted: FORBIDDEN tokens (-1e9) must stay far below any noise.
MAX_TEMPERATURE = 1e3


def check_sampling(top_k, temperature):
    """Raises ValueError unless `top_k` ≥ 0 and 0 < `temperature` ≤ MAX_TEMPERATURE."""
    if top_k < 0 or not 0 < temperature <= MAX_TEMPERATURE:
        raise ValueError(f"top_k={top_k} must be ≥ 0 (0: the whole vocabulary) and "
                         f"temperature={temperature} in (0, {MAX_TEMPERATURE:g}].")


def hash_int32(x):
    """Returns lowbias32 of int32 `x` (any shape) as int32: a bijection mixing every bit.

    Unsigned 32-bit arithmetic in int32: multiplication wraps the same way, and the
    logical right shift is the arithmetic one modulo 2^(32 - shift).
    """
    x = tf.bitwise.bitwise_xor(x, _logical_shift(x, 16)) * _MULTIPLIERS[0]
    x = tf.bitwise.bitwise_xor(x, _logical_shift(x, 15)) * _MULTIPLIERS[1]
    return tf.bitwise.bitwise_xor(x, _logical_shift(x, 16))


def _logical_shift(x, bits):
    return tf.math.floormod(tf.bitwise.right_shift(x, bits), 1 << (32 - bits))


def sentence_keys(seeds, source_ids, pad_id=PAD_ID):
    """Returns int32 `(B,)`: each sentence's key, from its seed `(B,)` and source ids
    `(B, S)` padded with `pad_id` (the padding a batch adds changes no key)."""
    positions = tf.range(tf.shape(source_ids)[1])[None, :]  # (1, S)
    # Each position's id hashed with its position, padding left out of the sum.
    terms = hash_int32(source_ids * _GOLDEN + positions + 1)
    fingerprint = tf.reduce_sum(tf.where(source_ids != pad_id, terms, 0), axis=1)  # (B,)
    return hash_int32(tf.bitwise.bitwise_xor(hash_int32(tf.cast(seeds, tf.int32)),
                                             fingerprint))


def uniform_noise(keys, index, count):
    """Returns float32 `(B, count)` uniforms in (0, 1) for step `index` of sentences
    with `keys` `(B,)`: 24 bits of a hash of (key, step, rank)."""
    step_keys = hash_int32(tf.bitwise.bitwise_xor(keys, hash_int32(index * _GOLDEN + 1)))
    bits = _logical_shift(hash_int32(step_keys[:, None] + tf.range(count)[None, :]), 8)
    return (tf.cast(bits, tf.float32) + 0.5) * (1.0 / (1 << 24))


def sample_tokens(log_probs, keys, index, top_k, temperature):
    """Returns int32 `(B,)`: one token drawn per row of `log_probs` `(B, V)`.

    Token `i` is drawn with probability softmax(log_probs / temperature)_i among the
    row's `top_k` largest (all for `top_k` 0 or ≥ V); `log_probs` may be logits or
    carry FORBIDDEN terms (never drawn). `top_k` 1 is the argmax.
    """
    vocabulary = log_probs.shape[-1]
    if top_k and (vocabulary is None or top_k < vocabulary):
        values, tokens = top_k_by_blocks(log_probs, top_k)  # (B, k)
    else:
        values, tokens = log_probs, None
    count = values.shape[-1] or tf.shape(values)[-1]
    gumbel = -tf.math.log(-tf.math.log(uniform_noise(keys, index, count)))  # (B, k)
    choices = tf.argmax(values / temperature + gumbel, axis=-1, output_type=tf.int32)
    if tokens is None:
        return choices
    return tf.gather(tokens, choices, batch_dims=1)


def sample(model, source_ids, seeds, *, top_k=0, temperature=1.0, pad_id=PAD_ID,
           **options):
    """Translates `source_ids` by drawing each token (seeded top-k sampling).

    `greedy_decode`'s loop, limits and rules (PAD never drawn, END not first unless the
    source is empty), each step's token drawn by `sample_tokens`. `scores` are the
    model's log-probabilities of the drawn tokens (at temperature 1, over the whole
    vocabulary), as `greedy_decode`'s.

    Args:
        model, source_ids, pad_id: as in `greedy_decode`.
        seeds: int `(B,)`: each sentence's seed.
        top_k: int ≥ 0. Draw among the `top_k` most probable tokens; 0 for all.
        temperature: float in (0, MAX_TEMPERATURE]. Below 1 sharpens the distribution,
            above 1 flattens it.
        **options: the other keyword arguments of `greedy_decode`.
    """
    check_sampling(top_k, temperature)
    keys = sentence_keys(seeds, tf.cast(source_ids, tf.int32), pad_id)  # (B,)

    def choose(logits, index, sentences):
        return sample_tokens(logits, tf.gather(keys, sentences), index, top_k, temperature)

    return greedy_decode(model, source_ids, pad_id=pad_id, choose=choose, **options)
