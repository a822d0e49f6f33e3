"""Token ids → length-bucketed tf.data batches under a token budget.

The stage between the tokenized pairs (`pairs`) and `model.fit`: pairs of similar
length are grouped into batches whose padded size stays within a token budget, as the
paper batches "by approximate sequence length" with about 25,000 source and 25,000
target tokens per batch (Vaswani et al., 2017, §5.1).

Public API:
    - `make_dataset(parallel_text, tokenizer, *, batch_tokens, max_length, ...)
      -> tf.data.Dataset` of `(inputs, targets, loss_weights)`:
        inputs = {"source_ids": int32 (B, S), "target_ids": int32 (B, T)},
        targets: int32 (B, T), loss_weights: float32 (B, T), 1.0 on real target tokens
        and 0.0 on padding.
    - `batch_pairs(pairs, *, batch_tokens, max_length, ...) -> tf.data.Dataset`, the
      second half of `make_dataset` (the first is `pairs.tokenize_split`), and
      `batches_per_pass(pairs, ...) -> int`.
    - `bucket_boundaries(max_length)`, `bucket_lengths(boundaries, max_length)` and
      `bucket_batch_sizes(boundaries, max_length, batch_tokens)`.

Subword sampling (Kudo, 2018): for pairs with segmentation candidates, each training
pass of `batch_pairs` draws one segmentation per sentence, with probability ∝
P(segmentation)^`subword_alpha`, from a seed of its own `(seed, pass)`. A pair's bucket
is that of its longest candidates, so whichever are drawn, a batch stays within its
token budget and every pass has `batches_per_pass` batches. Evaluation passes use the
most likely segmentation, as the exported translator does.

Token budget: a batch holds B pairs padded to length L with B × L ≤ `batch_tokens` on
each side. By default a batch is padded to its own longest pair, so batches take many
shapes; with `pad_to_bucket=True` every batch of a bucket has the bucket's full size and
length, so that they take as few shapes as there are buckets (what XLA needs: it
compiles one program per input shape).

Under a `tf.distribute` strategy the budget is global: pass the dataset to `model.fit`
(or `strategy.experimental_distribute_dataset`), which splits each batch along B, so
each of N replicas sees about `batch_tokens / N` tokens per side.
"""

import numpy as np
import tensorflow as tf

from keras_transformer.config import DataConfig
from keras_transformer.data import pairs as pairs_lib
from keras_transformer.data.tokenizer import PAD_ID

# Smallest bucket upper bound and growth between buckets: ~10 % more padding at most
# while keeping the number of buckets (and of partial batches per epoch) small.
MIN_BUCKET_LENGTH = 8
BUCKET_GROWTH = 1.1
# Training leaves out a pass's partial batches that hold less than this fraction of a
# full batch: a batch of one or two sentences is a full-size Adam step on almost no
# data, and under a strategy it leaves replicas without a share of it. The pairs left
# out are others in every pass, each pass being permuted anew.
MIN_PARTIAL_BATCH_FILL = 0.5
# Folded into a pass's seed to draw its segmentations from a stream of their own.
SAMPLING_STREAM = 1


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
    if batch_tokens < max_length:
        raise ValueError(
            f"batch_tokens={batch_tokens} cannot hold one sequence of max_length="
            f"{max_length}: raise DataConfig.batch_tokens or lower ModelConfig.max_length.")
    return [batch_tokens // length for length in bucket_lengths(boundaries, max_length)]


def bucket_lengths(boundaries, max_length):
    """Longest sequence of each bucket: `len(boundaries) + 1` ints, the last `max_length`."""
    return [bound - 1 for bound in boundaries] + [max_length]


def make_dataset(parallel_text, tokenizer, *, batch_tokens, max_length, shuffle=True,
                 seed=0, repeat=False, start_batch=0, pad_to_bucket=False, rows_multiple=1,
                 verbose=True):
    """Builds the training (or evaluation) pipeline of one split.

    Tokenizes with `tokenize_pairs`, then batches with `batch_pairs` (see there for the
    order of the batches).

    Args:
        parallel_text: `data.text.ParallelText`.
        tokenizer: `data.tokenizer.Tokenizer`.
        batch_tokens: int. Token budget per batch and side (global under a strategy).
        max_length: int. The model's `max_length`; longer pairs are dropped.
        shuffle: bool. Shuffle the pairs of every pass before bucketing.
        seed: int. Shuffle seed: the same seed gives the same batches.
        repeat: bool. Pass over the data again and again, forever (then pass
            `steps_per_epoch` to `fit`).
        start_batch: int. Number of batches of the stream to leave out at its start.
        pad_to_bucket: bool. Pad every batch to its bucket's full size and length.
        rows_multiple: int. See `batch_pairs`.
        verbose: bool. Print one line with the number of pairs dropped as too long.

    Returns:
        A `tf.data.Dataset` of `(inputs, targets, loss_weights)` (see module docstring).
    """
    pairs = pairs_lib.tokenize_split(parallel_text, tokenizer, max_length=max_length,
                                     verbose=verbose)
    return batch_pairs(pairs, batch_tokens=batch_tokens, max_length=max_length,
                       shuffle=shuffle, seed=seed, repeat=repeat, start_batch=start_batch,
                       pad_to_bucket=pad_to_bucket, rows_multiple=rows_multiple)


def batch_pairs(pairs, *, batch_tokens, max_length, shuffle=True, seed=0, repeat=False,
                start_batch=0, pad_to_bucket=False, rows_multiple=1,
                subword_alpha=DataConfig.subword_alpha, accumulation=1):
    """Cuts tokenized pairs into length-bucketed batches, pass after pass.

    Pass `p` over the data (numbered from 0) visits the pairs in the order of a
    permutation drawn from `(seed, p)` by a stateless op: the batches are a function of
    the seed and their position in the stream alone, whatever ran before in this
    process (iterators made earlier, the global TensorFlow seed). So a training run that
    resumes in a fresh process gets, from `start_batch` on, exactly the batches the
    uninterrupted run got. Each pass is bucketed on its own, so no batch mixes two
    passes and every pass has `batches_per_pass` batches. Within a bucket, pairs are
    batched in the order the permutation visits them, as
    `tf.data.Dataset.bucket_by_sequence_length` would; the batches of a pass are then put
    in an order drawn from the same seed, so that the partial batches (one per bucket)
    are spread over the pass.

    Args:
        pairs: `TokenizedPairs` with at least one pair.
        batch_tokens: int. Token budget per batch and side.
        max_length: int. The model's `max_length` (the last bucket's upper bound).
        shuffle: bool. Permute the pairs and the batches of each pass, and leave out
            partial batches under `MIN_PARTIAL_BATCH_FILL` (training); if not, keep the
            pairs' order and every pair (evaluation).
        seed: int. Seed of the permutations.
        repeat: bool. Passes 0, 1, 2, … forever; if not, pass 0 alone (the same batches
            each time the dataset is iterated).
        start_batch: int. Batches of the stream to leave out at its start: whole passes
            are skipped without being computed, the rest of one pass is.
        pad_to_bucket: bool. Pad every batch to its bucket's full batch size and longest
            length, with rows and positions of `PAD_ID` (loss weight 0), so that the
            batches take one shape per bucket: for `jit_compile`, where each new shape
            is a new XLA compilation. The pairs and their order are the same either way.
        rows_multiple: int. With `pad_to_bucket`, pad the rows further, to a multiple
            of this (the devices that share each batch); the pairs stay the same.
        subword_alpha: float > 0. For pairs with `candidates` and `shuffle`: each pass
            draws a segmentation of every sentence with probability ∝ P^`subword_alpha`
            (values near 0 draw almost uniformly, large ones the most likely one).
        accumulation: int. The optimizer's `gradient_accumulation_steps`: weigh the
            micro-batches of each update by their target tokens (`weigh_micro_batches`).

    Returns:
        A `tf.data.Dataset` of `(inputs, targets, loss_weights)` (see module docstring).
    """
    if pairs.candidates is not None and not subword_alpha > 0:
        raise ValueError(f"subword_alpha (DataConfig.subword_alpha) must be positive, "
                         f"got {subword_alpha}.")
    boundaries = bucket_boundaries(max_length)
    batch_sizes = tf.constant(bucket_batch_sizes(boundaries, max_length, batch_tokens),
                              tf.int64)
    buckets = tf.constant(_buckets(pairs, boundaries), tf.int64)  # (N,)
    padded_rows = -(-batch_sizes // rows_multiple) * rows_multiple  # rounded up
    shapes = (tf.stack([padded_rows, tf.constant(bucket_lengths(boundaries, max_length),
                                                 tf.int64)], axis=1)
              if pad_to_bucket else None)  # (buckets, 2): rows and length of a full batch

    def one_pass(pass_index):
        rows = (pairs.source_ids, pairs.target_ids, pairs.targets)
        pass_seed = _pass_seed(seed, pass_index)
        if shuffle and pairs.candidates is not None:
            # A stream of its own: the pairs are visited as without sampling.
            rows = pairs_lib.sample_segmentations(
                pairs.candidates, subword_alpha,
                tf.random.experimental.stateless_fold_in(pass_seed, SAMPLING_STREAM))
        batches = _batches_of_pass(buckets, batch_sizes, pass_seed, shuffle)
        return tf.data.Dataset.from_tensor_slices(batches).map(
            _gather_padded(rows, buckets, shapes), num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=True)

    # The stream starts at the update `start_batch` is part of, so that its windows of
    # micro-batches are the uninterrupted run's; the ones already trained are left out
    # after their tokens are counted.
    window_start = start_batch - start_batch % accumulation
    if repeat:
        per_pass = batches_per_pass(pairs, batch_tokens=batch_tokens, max_length=max_length,
                                    shuffle=shuffle)
        first_pass, skipped = divmod(window_start, per_pass)
        dataset = tf.data.Dataset.counter(first_pass).flat_map(one_pass)
    else:
        skipped = window_start
        dataset = one_pass(tf.constant(0, tf.int64))
    dataset = dataset.skip(skipped)
    dataset = dataset.map(_to_model_inputs, num_parallel_calls=tf.data.AUTOTUNE,
                          deterministic=True)
    if accumulation > 1:
        dataset = weigh_micro_batches(dataset, accumulation)
    dataset = dataset.skip(start_batch - window_start)
    return dataset.prefetch(tf.data.AUTOTUNE)


def weigh_micro_batches(dataset, accumulation):
    """Scales the loss weights of each window of `accumulation` batches by their tokens.

    Keras's gradient accumulation applies the plain mean of the micro-batches'
    gradients, and each micro-batch's loss is a mean over its own target tokens, so a
    micro-batch of few tokens would count as much as one of many. Micro-batch `i` of a
    window holding `N` target tokens in all, `n_i` of them its own, gets weights
    `accumulation · n_i / N` on its tokens instead of 1; the loss then divides the
    weighted sum by `n_i` (`LabelSmoothedCrossEntropy`), and the mean of the window's
    gradients is the gradient of the union of its batches: the sum over all its tokens
    divided by `N`. Windows are counted from the dataset's first batch, which must be
    the first micro-batch of an update.

    Args:
        dataset: of `(inputs, targets, loss_weights)` batches, as `make_dataset`'s.
        accumulation: int ≥ 2. Micro-batches per weight update.

    Returns:
        The dataset with the same batches, their loss weights scaled.
    """
    def weigh(inputs, targets, loss_weights):  # each a dataset of the window's batches
        tokens = loss_weights.map(tf.reduce_sum)  # n_i
        total = tokens.reduce(tf.constant(0.0), lambda sum, count: sum + count)  # N
        return tf.data.Dataset.zip((inputs, targets, loss_weights, tokens)).map(
            lambda inputs, targets, weights, count: (
                inputs, targets,
                weights * tf.math.divide_no_nan(accumulation * count, total)))

    return dataset.window(accumulation).flat_map(weigh)


def batches_per_pass(pairs, *, batch_tokens, max_length, shuffle=True):
    """Number of batches `batch_pairs` makes of one pass over `pairs`, whatever the order.

    Each bucket makes ⌊pairs / batch size⌋ full batches and one partial batch of the
    remaining pairs, if there are any and, for shuffled (training) passes, if they fill
    at least `MIN_PARTIAL_BATCH_FILL` of a batch.

    Args:
        pairs: `TokenizedPairs`.
        batch_tokens: int. Token budget per batch and side.
        max_length: int. The model's `max_length`.
        shuffle: bool. As for `batch_pairs`.

    Returns:
        An int.
    """
    boundaries = bucket_boundaries(max_length)
    batch_sizes = bucket_batch_sizes(boundaries, max_length, batch_tokens)
    counts = np.bincount(_buckets(pairs, boundaries), minlength=len(batch_sizes))
    minimum = [MIN_PARTIAL_BATCH_FILL * size if shuffle else 1 for size in batch_sizes]
    return int(sum(count // size + (count % size >= max(least, 1))
                   for count, size, least in zip(counts, batch_sizes, minimum)))


def _pass_seed(seed, pass_index):
    """The stateless seed `(seed, pass)` from which a pass draws its permutations."""
    return tf.stack([tf.cast(seed, tf.int64), tf.cast(pass_index, tf.int64)])


def _batches_of_pass(buckets, batch_sizes, pass_seed, shuffle):
    """Pair indices of each batch of one pass: int64 `tf.RaggedTensor` `(batches, None)`.

    Args:
        buckets: int64 `(N,)`, the bucket of each pair (see `_buckets`).
        batch_sizes: int64 `(buckets,)`, pairs per full batch in each bucket.
        pass_seed: int64 `(2,)`, from `_pass_seed`.
        shuffle: bool. Permute pairs and batches and leave out small partial batches
            (see `batch_pairs`); if not, keep the pairs' order and every pair.
    """
    count = tf.size(buckets, tf.int64)
    if shuffle:
        pair_seed, batch_seed = tf.unstack(
            tf.random.experimental.stateless_split(pass_seed, num=2))
        order = tf.random.experimental.stateless_shuffle(tf.range(count), seed=pair_seed)
    else:
        order = tf.range(count)
    batches = _group_by_bucket(order, buckets, batch_sizes)  # (batches, None) indices
    if shuffle:
        # Each bucket has a partial batch. When they all came at the end of a pass
        # (as `bucket_by_sequence_length` emits them), dozens of small batches in a
        # row, each a full-size Adam step on a few sentences, took the model on
        # Multi30K from 12.4 BLEU to 1.2 at every epoch's end.
        batches = _drop_small_partial_batches(batches, buckets, batch_sizes)
        batches = tf.gather(batches, tf.random.experimental.stateless_shuffle(
            tf.range(batches.nrows()), seed=batch_seed))
    return batches


def _buckets(pairs, boundaries):
    """Bucket index of every pair: bucket i holds lengths in [boundaries[i-1], boundaries[i]).

    Both sides share one batch size, so the longer side decides the bucket; with
    segmentation candidates, the longest candidate of either side.
    """
    if pairs.candidates is None:
        lengths = np.maximum(pairs.source_ids.row_lengths().numpy(),
                             pairs.target_ids.row_lengths().numpy())
    else:
        # START source END is 2 longer than a source candidate, START target 1.
        lengths = np.maximum(
            tf.reduce_max(pairs.candidates.source.row_lengths(axis=2), axis=1).numpy() + 2,
            tf.reduce_max(pairs.candidates.target.row_lengths(axis=2), axis=1).numpy() + 1)
    return np.searchsorted(boundaries, lengths, side="right")


def _group_by_bucket(order, buckets, batch_sizes):
    """Cuts the pairs visited in `order` into batches of one bucket each.

    Args:
        order: int64 `(N,)`, the pair indices in visiting order.
        buckets: int64 `(N,)`, the bucket of each pair (see `_buckets`).
        batch_sizes: int64 `(buckets,)`, pairs per full batch in each bucket.

    Returns:
        An int64 `tf.RaggedTensor` `(batches, None)` of pair indices: bucket by bucket,
        each bucket's pairs in visiting order, cut into full batches and a last partial one.
    """
    visited_buckets = tf.gather(buckets, order)
    grouped = tf.argsort(visited_buckets, stable=True)  # keeps the visiting order inside
    sorted_buckets = tf.gather(visited_buckets, grouped)
    bucket_starts = tf.searchsorted(sorted_buckets, sorted_buckets, side="left")
    position_in_bucket = tf.range(tf.size(order, tf.int64)) - tf.cast(bucket_starts, tf.int64)
    batch_in_bucket = position_in_bucket // tf.gather(batch_sizes, sorted_buckets)
    starts_batch = tf.concat([[True], tf.logical_or(
        sorted_buckets[1:] != sorted_buckets[:-1],
        batch_in_bucket[1:] != batch_in_bucket[:-1])], axis=0)
    batch_ids = tf.cumsum(tf.cast(starts_batch, tf.int64)) - 1
    return tf.RaggedTensor.from_value_rowids(tf.gather(order, grouped), batch_ids)


def _drop_small_partial_batches(batches, buckets, batch_sizes):
    """Leaves out the batches holding less than `MIN_PARTIAL_BATCH_FILL` of a full one."""
    first_pairs = tf.gather(batches.values, batches.row_starts())
    full_sizes = tf.gather(batch_sizes, tf.gather(buckets, first_pairs))
    keep = tf.cast(batches.row_lengths(), tf.float64) >= (
        MIN_PARTIAL_BATCH_FILL * tf.cast(full_sizes, tf.float64))
    return tf.ragged.boolean_mask(batches, keep)


def _gather_padded(rows, buckets, shapes=None):
    """Returns the map from a batch's pair indices to its padded id matrices.

    Args:
        rows: `(source_ids, target_ids, targets)`, ragged `(N, None)` each.
        buckets: int64 `(N,)`, the bucket of each pair (see `_buckets`).
        shapes: optional int64 `(buckets, 2)`: pad a batch of bucket i to `shapes[i]`
            (rows, length); without it, to the batch's own longest row.
    """
    def gather(indices):
        # All the pairs of a batch share its bucket: the first one tells it.
        shape = None if shapes is None else tf.gather(shapes, buckets[indices[0]])
        return tuple(tf.gather(row, indices).to_tensor(PAD_ID, shape=shape) for row in rows)

    return gather


def _to_model_inputs(source_ids, target_ids, targets):
    loss_weights = tf.cast(targets != PAD_ID, tf.float32)  # (B, T)
    inputs = {"source_ids": tf.cast(source_ids, tf.int32),
              "target_ids": tf.cast(target_ids, tf.int32)}
    return inputs, tf.cast(targets, tf.int32), loss_weights
