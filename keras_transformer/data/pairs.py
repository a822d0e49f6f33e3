"""Parallel text → token ids: tokenized, wrapped in START/END, too-long pairs dropped.

The stage between the corpus files and the batches: `ParallelText` (see `corpus`) is
tokenized once, and each pair becomes three id sequences (ids from `tokenizer`; padding
is `PAD_ID = 0`):

    source_ids = START source END
    target_ids = START target        (decoder input: the targets shifted right)
    targets    = target END

so `max_length` (the model's) bounds `len(source) + 2` and `len(target) + 2`; longer
pairs are dropped and counted. The wrapping is `tokenizer.add_start_end`, the one the
exported translator uses on its input.

Subword sampling (Kudo, 2018): with `nbest > 1`, `tokenize_pairs` also keeps the `nbest`
most likely segmentations of every sentence (`SegmentationCandidates`), from which each
training pass draws one per sentence (`sample_segmentations`, called by `batching`).

Public API:
    - `tokenize_pairs(parallel_text, tokenizer, *, max_length, nbest=1) -> TokenizedPairs`.
    - `tokenize_split(...)`: the same for training, reporting what was dropped.
    - `sample_segmentations(candidates, alpha, seed)`: one drawn segmentation per pair.
"""

import dataclasses
import logging
import time

import numpy as np
import tensorflow as tf

from keras_transformer.data.tokenizer import add_start_end

logger = logging.getLogger(__name__)

# Rows wrapped at a time: bounds the dense intermediate of `add_start_end` (rows × the
# longest row) on large corpora such as WMT14's 4.5 M pairs.
WRAP_CHUNK_ROWS = 65_536


@dataclasses.dataclass(frozen=True)
class TokenizedPairs:
    """Token ids of the pairs that fit `max_length`, and how many did not.

    Attributes:
        source_ids: int32 `tf.RaggedTensor` (N, None): START source END.
        target_ids: int32 `tf.RaggedTensor` (N, None): START target.
        targets: int32 `tf.RaggedTensor` (N, None): target END.
        num_too_long: int. Pairs dropped because a side exceeds `max_length`.
        candidates: `SegmentationCandidates` for subword sampling, or None.
    """

    source_ids: tf.RaggedTensor
    target_ids: tf.RaggedTensor
    targets: tf.RaggedTensor
    num_too_long: int
    candidates: "SegmentationCandidates | None" = None


@dataclasses.dataclass(frozen=True)
class SegmentationCandidates:
    """The most likely segmentations of each kept pair's sentences, without START/END.

    Only segmentations that fit `max_length` are kept; the most likely one always is.

    Attributes:
        source: int32 `tf.RaggedTensor` (N, None, None): pair, segmentation, piece; the
            most likely segmentation first.
        target: int32 `tf.RaggedTensor` (N, None, None), likewise.
        source_log_probs: float32 `tf.RaggedTensor` (N, None): log-probability of each
            source segmentation.
        target_log_probs: float32 `tf.RaggedTensor` (N, None), likewise.
    """

    source: tf.RaggedTensor
    target: tf.RaggedTensor
    source_log_probs: tf.RaggedTensor
    target_log_probs: tf.RaggedTensor


def tokenize_pairs(parallel_text, tokenizer, *, max_length, nbest=1):
    """Tokenizes every pair at once and drops pairs longer than `max_length`.

    Args:
        parallel_text: `corpus.ParallelText` (or anything with
            `source_lines` and `target_lines`).
        tokenizer: `tokenizer.Tokenizer`.
        max_length: int. Longest sequence kept, START and END included.
        nbest: int. With more than 1, also keep up to `nbest` segmentations of each
            sentence for subword sampling (see module docstring).

    Returns:
        A `TokenizedPairs`.
    """
    if not nbest >= 1:
        raise ValueError(f"nbest (DataConfig.subword_nbest) must be at least 1, got {nbest}.")
    source = tokenizer.tokenize(tf.constant(list(parallel_text.source_lines), tf.string))
    target = tokenizer.tokenize(tf.constant(list(parallel_text.target_lines), tf.string))
    fits = ((source.row_lengths() + 2 <= max_length)
            & (target.row_lengths() + 2 <= max_length))  # (N,)
    candidates = None
    if nbest > 1:
        kept = np.flatnonzero(fits.numpy())
        candidates = _segmentation_candidates(
            tokenizer, [parallel_text.source_lines[i] for i in kept],
            [parallel_text.target_lines[i] for i in kept], nbest, max_length)
    source_ids, target_ids, targets = _wrap(tf.ragged.boolean_mask(source, fits),
                                            tf.ragged.boolean_mask(target, fits))
    return TokenizedPairs(
        source_ids=source_ids, target_ids=target_ids, targets=targets,
        num_too_long=int(tf.size(fits) - tf.reduce_sum(tf.cast(fits, tf.int32))),
        candidates=candidates)


def _wrap(source, target):
    """Adds START/END: `(START source END, START target, target END)`, each `(N, None)`."""
    return (_wrap_rows(source, start=True, end=True), _wrap_rows(target, start=True, end=False),
            _wrap_rows(target, start=False, end=True))


def _wrap_rows(pieces, *, start, end):
    """`add_start_end` on ragged rows, `WRAP_CHUNK_ROWS` at a time when the count is known."""
    rows = pieces.shape[0]
    if rows is None or rows <= WRAP_CHUNK_ROWS:
        return add_start_end(pieces, start=start, end=end)
    return tf.concat([add_start_end(pieces[first:first + WRAP_CHUNK_ROWS], start=start,
                                    end=end)
                      for first in range(0, rows, WRAP_CHUNK_ROWS)], axis=0)


def _segmentation_candidates(tokenizer, source_lines, target_lines, nbest, max_length):
    """The `nbest` segmentations of each side that fit `max_length` (see `tokenize_pairs`)."""
    sides = []
    for lines in (source_lines, target_lines):
        ids, log_probs = tokenizer.nbest_tokenize(lines, nbest)  # (N, None, None), (N, None)
        most_likely = tf.ragged.range(ids.row_lengths()) == 0  # (N, None)
        # The most likely segmentation is the one the kept pair was measured by: it fits.
        keep = (ids.row_lengths(axis=2) + 2 <= max_length) | most_likely
        sides.append((tf.ragged.boolean_mask(ids, keep),
                      tf.ragged.boolean_mask(log_probs, keep)))
    (source, source_log_probs), (target, target_log_probs) = sides
    return SegmentationCandidates(source=source, target=target,
                                  source_log_probs=source_log_probs,
                                  target_log_probs=target_log_probs)


def tokenize_split(parallel_text, tokenizer, *, max_length, nbest=1, verbose=True):
    """`tokenize_pairs` for batching: reports what was dropped, refuses an empty result.

    Args:
        parallel_text: `corpus.ParallelText`.
        tokenizer: `tokenizer.Tokenizer`.
        max_length: int. Longest sequence kept, START and END included.
        nbest: int. Segmentations kept per sentence for subword sampling (1: none).
        verbose: bool. Log one line with the number of pairs dropped as too long (and,
            with `nbest > 1`, one before and after finding the segmentations).

    Returns:
        A `TokenizedPairs` with at least one pair.
    """
    start = time.perf_counter()
    if verbose and nbest > 1:
        logger.info("Finding up to %d segmentations of each sentence of %s and %s for "
                    "subword sampling...", nbest, parallel_text.source_file,
                    parallel_text.target_file)
    pairs = tokenize_pairs(parallel_text, tokenizer, max_length=max_length, nbest=nbest)
    count = int(pairs.source_ids.nrows())
    if verbose:
        if nbest > 1:
            segmentations = int(pairs.candidates.source.values.nrows()
                                + pairs.candidates.target.values.nrows())
            logger.info("Found %.1f segmentations per sentence on average in %.0f s.",
                        segmentations / max(2 * count, 1), time.perf_counter() - start)
        logger.info("Batching %d pairs; %d dropped as longer than max_length=%d.", count,
                    pairs.num_too_long, max_length)
    if count == 0:
        raise ValueError(f"No pair of {parallel_text.source_file} / "
                         f"{parallel_text.target_file} fits max_length={max_length}.")
    return pairs


def sample_segmentations(candidates, alpha, seed):
    """Draws one segmentation per sentence: `(source_ids, target_ids, targets)`, wrapped.

    Args:
        candidates: `SegmentationCandidates` of N pairs.
        alpha: float. Draw probability ∝ P(segmentation)^alpha.
        seed: int64 `(2,)`, a stateless seed.

    Returns:
        Three int32 `tf.RaggedTensor` `(N, None)`, as in `TokenizedPairs`.
    """
    source_seed, target_seed = tf.unstack(
        tf.random.experimental.stateless_split(seed, num=2))
    drawn = []
    for segmentations, log_probs, side_seed in (
            (candidates.source, candidates.source_log_probs, source_seed),
            (candidates.target, candidates.target_log_probs, target_seed)):
        # Padding columns get a logit no draw can pick.
        logits = (alpha * log_probs).to_tensor(default_value=-1e9)  # (N, K)
        choice = tf.random.stateless_categorical(logits, 1, seed=side_seed)[:, 0]  # (N,)
        drawn.append(tf.gather(segmentations.values,
                               segmentations.row_starts() + choice))  # (N, None)
    return _wrap(*drawn)
