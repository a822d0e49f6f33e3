"""Scoring given outputs (forced decoding): the log-probability a model gives each token.

What fairseq's `--score-reference`, Marian's scorer and CTranslate2's `score_batch` do:
corpus filtering by cross-entropy, reranking an n-best list, quality estimation. One
teacher-forced decoder pass, as in training, no loop. Shape legend as in `common.py`;
`T` is the length of the outputs scored.
"""

import tensorflow as tf

from keras_transformer.data.tokenizer import PAD_ID, START_ID
from keras_transformer.decoding.common import log_normalizers


def score_outputs(model, source_ids, output_ids, *, start_id=START_ID, pad_id=PAD_ID):
    """Returns `(token_scores (B, T), scores (B,))` of `output_ids` as translations of
    `source_ids`.

    `token_scores` holds log P(y_t | y_<t, x) for every token of the output, 0 at its
    padding; `scores` is their sum. The log-probabilities are those the decoders add
    up (the full softmax, padding's share included), so scoring a decoder's own output
    gives the score it reported.

    Args:
        model: a `Transformer` (or an object with its `encode` and `decode`).
        source_ids: int `(B, S)`, padded with `pad_id`.
        output_ids: int `(B, T)`: outputs as the decoders return them, without the
            start token, the end token included where the translation ends, padding
            after it.
        start_id, pad_id: int. Special token ids.
    """
    source_ids = tf.cast(source_ids, tf.int32)
    output_ids = tf.cast(output_ids, tf.int32)
    encoder_output = model.encode(source_ids, training=False)  # (B, S, D)
    batch = tf.shape(output_ids)[0]
    decoder_input = tf.concat([tf.fill([batch, 1], start_id), output_ids[:, :-1]],
                              axis=1)  # (B, T)
    logits = tf.cast(model.decode(decoder_input, encoder_output, source_ids,
                                  training=False), tf.float32)  # (B, T, V)
    # The chosen logits by a one-hot product: elementwise ops, seen converting to
    # TFLite builtins and running in LiteRT (a gather with batch dimensions was not tried).
    chosen = tf.reduce_sum(logits * tf.one_hot(output_ids, tf.shape(logits)[-1]),
                           axis=-1)  # (B, T)
    token_scores = tf.where(output_ids != pad_id,
                            chosen - log_normalizers(logits)[..., 0], 0.0)  # (B, T)
    return token_scores, tf.reduce_sum(token_scores, axis=1)
