"""Attention masks derived from token ids (Vaswani et al., 2017, §3.2.3).

Masks are boolean: `True` where attention is allowed. They are computed from ids inside
the model, never passed through Keras's implicit masking (which Keras 3's attention
drops, see the project notes), so every attention sees exactly the mask meant for it.
"""

from keras import ops


def padding_mask(token_ids, pad_id=0):
    """Returns `(B, L)` bool, `True` at real tokens and `False` at padding."""
    return ops.not_equal(token_ids, pad_id)


def causal_mask(query_length, key_length=None, query_offset=0):
    """Returns `(T, K)` bool, `True` where query position may see key position.

    Query `i` (absolute position `query_offset + i`) may see every key position at or
    before it: the look-ahead mask of §3.2.3 that keeps decoding auto-regressive.
    """
    key_length = query_length if key_length is None else key_length
    query_positions = ops.expand_dims(ops.arange(query_length), 1) + query_offset  # (T, 1)
    key_positions = ops.expand_dims(ops.arange(key_length), 0)  # (1, K)
    return ops.greater_equal(query_positions, key_positions)


def key_padding_attention_mask(key_padding_mask):
    """Returns `(B, 1, S)` bool from a `(B, S)` key padding mask, broadcast over queries.

    Only keys are masked: queries at padding still attend to the real keys, so every
    softmax row stays non-empty (their outputs are ignored by the loss).
    """
    return ops.expand_dims(key_padding_mask, 1)


def decoder_self_attention_mask(target_padding_mask):
    """Returns `(B, T, T)` bool: look-ahead mask combined with target key padding."""
    length = ops.shape(target_padding_mask)[1]
    return ops.logical_and(ops.expand_dims(causal_mask(length), 0),
                           ops.expand_dims(target_padding_mask, 1))  # (B, T, T)
