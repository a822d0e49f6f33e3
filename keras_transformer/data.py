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
    - `tokenize_split(parallel_text, tokenizer, *, max_length) -> TokenizedPairs` and
      `batch_pairs(pairs, *, batch_tokens, max_length, ...) -> tf.data.Dataset`, the two
      halves of `make_dataset`, and `batches_per_pass(pairs, ...) -> int`.
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

import numpy as np
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
                 seed=0, repeat=False, start_batch=0, verbose=True):
    """Builds the training (or evaluation) pipeline of one split.

    Tokenizes with `tokenize_pairs`, then batches with `batch_pairs` (see there for the
    order of the batches).

    Args:
        parallel_text: `keras_transformer.corpus.ParallelText`.
        tokenizer: `keras_transformer.tokenizer.Tokenizer`.
        batch_tokens: int. Token budget per batch and side (global under a strategy).
        max_length: int. The model's `max_length`; longer pairs are dropped.
        shuffle: bool. Shuffle the pairs of every pass before bucketing.
        seed: int. Shuffle seed: the same seed gives the same batches.
        repeat: bool. Pass over the data again and again, forever (then pass
            `steps_per_epoch` to `fit`).
        start_batch: int. Number of batches of the stream to leave out at its start.
        verbose: bool. Print one line with the number of pairs dropped as too long.

    Returns:
        A `tf.data.Dataset` of `(inputs, targets, loss_weights)` (see module docstring).
    """
    pairs = tokenize_split(parallel_text, tokenizer, max_length=max_length, verbose=verbose)
    return batch_pairs(pairs, batch_tokens=batch_tokens, max_length=max_length,
                       shuffle=shuffle, seed=seed, repeat=repeat, start_batch=start_batch)


def tokenize_split(parallel_text, tokenizer, *, max_length, verbose=True):
    """`tokenize_pairs` for batching: reports what was dropped, refuses an empty result.

    Args:
        parallel_text: `keras_transformer.corpus.ParallelText`.
        tokenizer: `keras_transformer.tokenizer.Tokenizer`.
        max_length: int. Longest sequence kept, START and END included.
        verbose: bool. Print one line with the number of pairs dropped as too long.

    Returns:
        A `TokenizedPairs` with at least one pair.
    """
    pairs = tokenize_pairs(parallel_text, tokenizer, max_length=max_length)
    count = int(pairs.source_ids.nrows())
    if verbose:
        print(f"Batching {count} pairs; {pairs.num_too_long} dropped as longer than "
              f"max_length={max_length}.", flush=True)
    if count == 0:
        raise ValueError(f"No pair of {parallel_text.source_file} / "
                         f"{parallel_text.target_file} fits max_length={max_length}.")
    return pairs


def batch_pairs(pairs, *, batch_tokens, max_length, shuffle=True, seed=0, repeat=False,
                start_batch=0):
    """Cuts tokenized pairs into length-bucketed batches, pass after pass.

    Pass `p` over the data (numbered from 0) visits the pairs in the order of a
    permutation drawn from `(seed, p)` by a stateless op: the batches are a function of
    the seed and their position in the stream alone, whatever ran before in this
    process (iterators made earlier, the global TensorFlow seed). So a training run that
    resumes in a fresh process gets, from `start_batch` on, exactly the batches the
    uninterrupted run got. Each pass is bucketed on its own, so no batch mixes two
    passes and every pass has `batches_per_pass` batches, its last ones partial.

    Args:
        pairs: `TokenizedPairs` with at least one pair.
        batch_tokens: int. Token budget per batch and side.
        max_length: int. The model's `max_length` (the last bucket's upper bound).
        shuffle: bool. Permute the pairs of each pass; if not, keep their order.
        seed: int. Seed of the permutations.
        repeat: bool. Passes 0, 1, 2, … forever; if not, pass 0 alone (the same batches
            each time the dataset is iterated).
        start_batch: int. Batches of the stream to leave out at its start: whole passes
            are skipped without being computed, the rest of one pass is.

    Returns:
        A `tf.data.Dataset` of `(inputs, targets, loss_weights)` (see module docstring).
    """
    count = pairs.source_ids.nrows()
    boundaries = bucket_boundaries(max_length)
    batch_sizes = bucket_batch_sizes(boundaries, max_length, batch_tokens)
    rows = (pairs.source_ids, pairs.target_ids, pairs.targets)

    def one_pass(pass_index):
        if shuffle:
            order = tf.random.experimental.stateless_shuffle(
                tf.range(count), seed=tf.stack([tf.cast(seed, tf.int64), pass_index]))
            # Rows of a RaggedTensor picked one by one come out as plain 1-D tensors,
            # the form `padded_batch` needs.
            dataset = tf.data.Dataset.from_tensor_slices(order).map(
                lambda index: tuple(row[index] for row in rows),
                num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        else:
            # Sliced rows arrive as ragged specs, which `padded_batch` refuses; a map
            # turns them into plain 1-D tensors.
            dataset = tf.data.Dataset.from_tensor_slices(rows).map(lambda *row: row)
        return dataset.bucket_by_sequence_length(
            element_length_func=_pair_length,
            bucket_boundaries=boundaries,
            bucket_batch_sizes=batch_sizes,
            padding_values=(PAD_ID, PAD_ID, PAD_ID))

    if repeat:
        per_pass = batches_per_pass(pairs, batch_tokens=batch_tokens, max_length=max_length)
        first_pass, start_batch = divmod(start_batch, per_pass)
        dataset = tf.data.Dataset.counter(first_pass).flat_map(one_pass)
    else:
        dataset = one_pass(tf.constant(0, tf.int64))
    dataset = dataset.skip(start_batch)
    dataset = dataset.map(_to_model_inputs, num_parallel_calls=tf.data.AUTOTUNE,
                          deterministic=True)
    return dataset.prefetch(tf.data.AUTOTUNE)


def batches_per_pass(pairs, *, batch_tokens, max_length):
    """Number of batches `batch_pairs` makes of one pass over `pairs`, whatever the order.

    Each bucket ends a pass with one partial batch (if its pair count is not a multiple
    of its batch size), so the count is the sum over buckets of ⌈pairs / batch size⌉.

    Args:
        pairs: `TokenizedPairs`.
        batch_tokens: int. Token budget per batch and side.
        max_length: int. The model's `max_length`.

    Returns:
        An int.
    """
    boundaries = bucket_boundaries(max_length)
    batch_sizes = bucket_batch_sizes(boundaries, max_length, batch_tokens)
    lengths = np.maximum(pairs.source_ids.row_lengths().numpy(),
                         pairs.target_ids.row_lengths().numpy())  # as `_pair_length`
    # Bucket i holds lengths in [boundaries[i-1], boundaries[i]).
    buckets = np.searchsorted(boundaries, lengths, side="right")
    counts = np.bincount(buckets, minlength=len(batch_sizes))
    return int(sum(-(-count // size) for count, size in zip(counts, batch_sizes)))


def _pair_length(source_ids, target_ids, targets):
    # Both sides share one batch size, so the longer side decides the bucket.
    del targets  # as long as target_ids
    return tf.maximum(tf.shape(source_ids)[0], tf.shape(target_ids)[0])


def _to_model_inputs(source_ids, target_ids, targets):
    loss_weights = tf.cast(targets != PAD_ID, tf.float32)  # (B, T)
    inputs = {"source_ids": tf.cast(source_ids, tf.int32),
              "target_ids": tf.cast(target_ids, tf.int32)}
    return inputs, tf.cast(targets, tf.int32), loss_weights
