"""Token ids → length-bucketed tf.data batches under a token budget.

The stage between the tokenizer and `model.fit`: `ParallelText` (see `corpus`) is
tokenized once, wrapped in START/END, and grouped into batches of similar length whose
padded size stays within a token budget, as the paper batches "by approximate sequence
length" with about 25,000 source and 25,000 target tokens per batch
(Vaswani et al., 2017, §5.1).

Public API:
    - `make_dataset(parallel_text, tokenizer, *, batch_tokens, max_length, ...)
      -> tf.data.Dataset` of `(inputs, targets, loss_weights)`:
        inputs = {"source_ids": int32 (B, S), "target_ids": int32 (B, T)},
        targets: int32 (B, T), loss_weights: float32 (B, T).
    - `tokenize_pairs(parallel_text, tokenizer, *, max_length) -> TokenizedPairs`.
    - `bucket_boundaries(max_length)` and `bucket_batch_sizes(boundaries, batch_tokens)`.

Sequences (ids from `keras_transformer.tokenizer`; padding is `PAD_ID = 0`):
    source_ids = START source END
    target_ids = START target        (decoder input: the targets shifted right)
    targets    = target END
so `max_length` (the model's) bounds `len(source) + 2` and `len(target) + 2`; longer
pairs are dropped and counted. `loss_weights` is 1.0 on real target tokens and 0.0 on
padding.

Token budget: a batch holds B pairs padded to length L with B × L ≤ `batch_tokens` on
each side. Under a `tf.distribute` strategy the budget is global: pass the dataset to
`model.fit` (or `strategy.experimental_distribute_dataset`), which splits each batch along
B, so each of N replicas sees about `batch_tokens / N` tokens per side.
"""

import dataclasses

import tensorflow as tf

from keras_transformer.tokenizer import END_ID, PAD_ID, START_ID

# Smallest bucket upper bound and growth between buckets: ~10 % more padding at most
# while keeping the number of buckets (and of partial batches per epoch) small.
MIN_BUCKET_LENGTH = 8
BUCKET_GROWTH = 1.1


@dataclasses.dataclass(frozen=True)
class TokenizedPairs:
    """Token ids of the pairs that fit `max_length`, and how many did not.

    Attributes:
        source_ids: int32 `tf.RaggedTensor` (N, None): START source END.
        target_ids: int32 `tf.RaggedTensor` (N, None): START target.
        targets: int32 `tf.RaggedTensor` (N, None): target END.
        num_too_long: int. Pairs dropped because a side exceeds `max_length`.
    """

    source_ids: tf.RaggedTensor
    target_ids: tf.RaggedTensor
    targets: tf.RaggedTensor
    num_too_long: int


def tokenize_pairs(parallel_text, tokenizer, *, max_length):
    """Tokenizes every pair at once and drops pairs longer than `max_length`.

    Args:
        parallel_text: `keras_transformer.corpus.ParallelText` (or anything with
            `source_lines` and `target_lines`).
        tokenizer: `keras_transformer.tokenizer.Tokenizer`.
        max_length: int. Longest sequence kept, START and END included.

    Returns:
        A `TokenizedPairs`.
    """
    source = tokenizer.tokenize(tf.constant(list(parallel_text.source_lines), tf.string))
    target = tokenizer.tokenize(tf.constant(list(parallel_text.target_lines), tf.string))
    fits = ((source.row_lengths() + 2 <= max_length)
            & (target.row_lengths() + 2 <= max_length))  # (N,)
    source = tf.ragged.boolean_mask(source, fits)
    target = tf.ragged.boolean_mask(target, fits)
    count = tf.shape(source.row_splits)[0] - 1
    start = tf.fill([count, 1], START_ID)
    end = tf.fill([count, 1], END_ID)
    return TokenizedPairs(
        source_ids=tf.concat([start, source, end], axis=1),
        target_ids=tf.concat([start, target], axis=1),
        targets=tf.concat([target, end], axis=1),
        num_too_long=int(tf.size(fits) - tf.reduce_sum(tf.cast(fits, tf.int32))))


def bucket_boundaries(max_length):
    """Returns increasing bucket bounds; bucket i holds lengths in [b[i-1], b[i])."""
    boundaries = []
    bound = MIN_BUCKET_LENGTH
    while bound <= max_length:
        boundaries.append(bound)
        bound = max(bound + 1, int(bound * BUCKET_GROWTH))
    return boundaries


def bucket_batch_sizes(boundaries, max_length, batch_tokens):
    """Pairs per batch in each bucket, so that B × (longest length in bucket) ≤ budget.

    Args:
        boundaries: list of int from `bucket_boundaries`.
        max_length: int. Longest sequence (the last bucket's upper bound).
        batch_tokens: int. Token budget per side.

    Returns:
        A list of `len(boundaries) + 1` ints.
    """
    longest = [bound - 1 for bound in boundaries] + [max_length]
    if batch_tokens < max_length:
        raise ValueError(
            f"batch_tokens={batch_tokens} cannot hold one sequence of max_length="
            f"{max_length}: raise DataConfig.batch_tokens or lower ModelConfig.max_length.")
    return [batch_tokens // length for length in longest]


def make_dataset(parallel_text, tokenizer, *, batch_tokens, max_length, shuffle=True,
                 shuffle_buffer=None, seed=0, repeat=False, verbose=True):
    """Builds the training (or evaluation) pipeline of one split.

    Args:
        parallel_text: `keras_transformer.corpus.ParallelText`.
        tokenizer: `keras_transformer.tokenizer.Tokenizer`.
        batch_tokens: int. Token budget per batch and side (global under a strategy).
        max_length: int. The model's `max_length`; longer pairs are dropped.
        shuffle: bool. Shuffle pairs (anew each epoch) before bucketing.
        shuffle_buffer: int. Shuffle buffer size; defaults to the whole split.
        seed: int. Shuffle seed: the same seed gives the same batches.
        repeat: bool. Repeat forever (then pass `steps_per_epoch` to `fit`).
        verbose: bool. Print one line with the number of pairs dropped as too long.

    Returns:
        A `tf.data.Dataset` of `(inputs, targets, loss_weights)` (see module docstring).
    """
    pairs = tokenize_pairs(parallel_text, tokenizer, max_length=max_length)
    count = pairs.source_ids.nrows()
    if verbose:
        print(f"Batching {int(count)} pairs; {pairs.num_too_long} dropped as longer than "
              f"max_length={max_length}.", flush=True)
    if int(count) == 0:
        raise ValueError(f"No pair of {parallel_text.source_file} / "
                         f"{parallel_text.target_file} fits max_length={max_length}.")
    dataset = tf.data.Dataset.from_tensor_slices(
        (pairs.source_ids, pairs.target_ids, pairs.targets))
    # Rows of a RaggedTensor arrive as ragged specs, which `padded_batch` refuses; a map
    # turns them into plain 1-D tensors.
    dataset = dataset.map(lambda *row: row)
    if shuffle:
        dataset = dataset.shuffle(shuffle_buffer or int(count), seed=seed,
                                  reshuffle_each_iteration=True)
    if repeat:
        dataset = dataset.repeat()
    boundaries = bucket_boundaries(max_length)
    dataset = dataset.bucket_by_sequence_length(
        element_length_func=_pair_length,
        bucket_boundaries=boundaries,
        bucket_batch_sizes=bucket_batch_sizes(boundaries, max_length, batch_tokens),
        padding_values=(PAD_ID, PAD_ID, PAD_ID))
    dataset = dataset.map(_to_model_inputs, num_parallel_calls=tf.data.AUTOTUNE,
                          deterministic=True)
    return dataset.prefetch(tf.data.AUTOTUNE)


def _pair_length(source_ids, target_ids, targets):
    # Both sides share one batch size, so the longer side decides the bucket.
    del targets  # as long as target_ids
    return tf.maximum(tf.shape(source_ids)[0], tf.shape(target_ids)[0])


def _to_model_inputs(source_ids, target_ids, targets):
    loss_weights = tf.cast(targets != PAD_ID, tf.float32)  # (B, T)
    inputs = {"source_ids": tf.cast(source_ids, tf.int32),
              "target_ids": tf.cast(target_ids, tf.int32)}
    return inputs, tf.cast(targets, tf.int32), loss_weights
