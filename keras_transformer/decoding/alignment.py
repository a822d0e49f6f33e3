"""Word alignments from cross-attention: which source word each output word came from.

What carries markup, tags and placeholders across a translation (fairseq's
`--print-alignment`, Marian's `--alignment`). The attention of one decoder layer,
averaged over its heads, is read for each output token (`common.cross_attention`: a
teacher-forced pass over the output); each output token aligns to the source position
it attends to most, among those that hold a word's piece (START, END and padding,
which draw much of the attention, are left out, as fairseq's hard alignments do).

Words are whitespace words, the pieces between two that start one (SentencePiece marks
those with "▁"). Pharaoh pairs `i-j` (source word i, output word j) are the distinct
(source word, output word) pairs of the output's pieces (`formats.pharaoh`).

Which layer: `default_layer`, the penultimate, as fairseq (Garg et al., 2019); on a
copy task with reordering it aligned as well as the last and far better than the
first (docs/serving.md, `benchmarks/alignment_layers.py`).

Shape legend as in `common.py`.
"""

import tensorflow as tf

from keras_transformer.data.tokenizer import END_ID, PAD_ID, START_ID


def default_layer(num_layers):
    """The decoder layer (0-based) alignments are read from unless asked: the
    penultimate one (the last of a one-layer decoder)."""
    return max(num_layers - 2, 0)


def layer_attention(attention, layer):
    """Returns float32 `(B, L, S)`: `layer`'s attention `(B, N, H, L, S)` over its heads."""
    return tf.reduce_mean(tf.gather(attention, layer, axis=1), axis=1)


def word_indices(ids, word_starts, special_ids=(PAD_ID, START_ID, END_ID)):
    """Returns int32 `(B, T)`: the whitespace word each token of `ids` `(B, T)` is in
    (from 0), -1 at special tokens.

    Args:
        ids: int token ids, a sentence per row.
        word_starts: bool `(V,)`: whether each piece starts a word.
        special_ids: ids that belong to no word.
    """
    ids = tf.cast(ids, tf.int32)
    real = tf.reduce_all(tf.stack([ids != special for special in special_ids]), axis=0)
    real_count = tf.cumsum(tf.cast(real, tf.int32), axis=1)
    # The first real piece opens word 0 even without SentencePiece's leading "▁" (an
    # output or prefix that starts mid-word): "xyz ▁abc" detokenizes to two words.
    opens = (tf.gather(word_starts, ids) | (real_count == 1)) & real
    words = tf.cumsum(tf.cast(opens, tf.int32), axis=1) - 1
    return tf.where(real, words, -1)


def hard_alignment(attention, source_words, target_words):
    """Returns int32 `(B, L)`: the source word each output token aligns to, -1 where
    the token is in no word (or the source has none).

    Args:
        attention: float `(B, L, S)`: each output token's attention over the source.
        source_words: int32 `(B, S)`: `word_indices` of the source ids.
        target_words: int32 `(B, L)`: `word_indices` of the output ids.
    """
    # expand_dims, not [:, None]: TFLite has no builtin for a slice that adds an axis.
    in_words = tf.expand_dims(source_words, 1) >= 0  # (B, 1, S)
    # Below any weight, so that positions outside words never win.
    weights = tf.where(in_words, tf.cast(attention, tf.float32), -1.0)  # (B, L, S)
    positions = tf.argmax(weights, axis=-1, output_type=tf.int32)  # (B, L)
    aligned = tf.gather(source_words, positions, batch_dims=1)  # (B, L)
    return tf.where(target_words >= 0, aligned, -1)
