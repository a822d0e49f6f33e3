"""Tests for keras_transformer.data: token-budget batches of (inputs, targets, weights)."""

import collections

import numpy as np
import pytest
import tensorflow as tf

from keras_transformer.config import DataConfig
from keras_transformer.data import batching, corpus
from keras_transformer.data import pairs as pairs_lib
from keras_transformer.data.tokenizer import END_ID, PAD_ID, START_ID, train_tokenizer

BATCH_TOKENS = 160
MAX_LENGTH = 40


@pytest.fixture(scope="module")
def parallel_text(fixture_corpus_dir):
    return corpus.load_split(DataConfig(data_dir=str(fixture_corpus_dir)), "train",
                             verbose=False)


@pytest.fixture(scope="module")
def tokenizer(parallel_text):
    return train_tokenizer(parallel_text.source_lines + parallel_text.target_lines, 300,
                           verbose=False)


@pytest.fixture(scope="module")
def batches(parallel_text, tokenizer):
    dataset = batching.make_dataset(parallel_text, tokenizer, batch_tokens=BATCH_TOKENS,
                                max_length=MAX_LENGTH, seed=3, verbose=False)
    return [(inputs["source_ids"].numpy(), inputs["target_ids"].numpy(), targets.numpy(),
             weights.numpy()) for inputs, targets, weights in dataset]


def test_element_spec(parallel_text, tokenizer):
    dataset = batching.make_dataset(parallel_text, tokenizer, batch_tokens=BATCH_TOKENS,
                                max_length=MAX_LENGTH, verbose=False)
    matrix = tf.TensorSpec([None, None], tf.int32)
    assert dataset.element_spec == (
        {"source_ids": matrix, "target_ids": matrix}, matrix,
        tf.TensorSpec([None, None], tf.float32))


def test_every_batch_respects_the_token_budget_on_both_sides(batches):
    for source_ids, target_ids, targets, _ in batches:
        assert source_ids.shape[0] == target_ids.shape[0] == targets.shape[0] > 0
        assert source_ids.size <= BATCH_TOKENS
        assert target_ids.size <= BATCH_TOKENS and target_ids.shape == targets.shape
        assert max(source_ids.shape[1], target_ids.shape[1]) <= MAX_LENGTH


def test_batches_are_reasonably_full(batches):
    # Bucketing by length is the point: most of each batch is real tokens, not padding.
    real = sum(int((source_ids != PAD_ID).sum()) for source_ids, *_ in batches)
    assert real / (len(batches) * BATCH_TOKENS) > 0.5


def test_sequences_are_wrapped_and_padded_with_zeros(batches):
    for source_ids, target_ids, targets, weights in batches:
        for row in source_ids:
            length = int((row != PAD_ID).sum())
            assert row[0] == START_ID and row[length - 1] == END_ID
            assert (row[length:] == PAD_ID).all() and (row[1:length - 1] > END_ID).all()
        for row in targets:
            length = int((row != PAD_ID).sum())
            assert row[length - 1] == END_ID and (row[length:] == PAD_ID).all()
        np.testing.assert_array_equal(weights, (targets != PAD_ID).astype(np.float32))
        assert weights.dtype == np.float32


def test_decoder_input_is_the_target_shifted_right(batches):
    for _, target_ids, targets, _ in batches:
        np.testing.assert_array_equal(target_ids[:, 0], START_ID)
        shifted = np.where(targets[:, :-1] == END_ID, PAD_ID, targets[:, :-1])
        np.testing.assert_array_equal(target_ids[:, 1:], shifted)


def test_every_pair_appears_once_and_decodes_to_its_text(batches, parallel_text, tokenizer):
    every_pair = collections.Counter(zip(parallel_text.source_lines,
                                         parallel_text.target_lines))
    in_order = batching.make_dataset(parallel_text, tokenizer, batch_tokens=BATCH_TOKENS,
                                 max_length=MAX_LENGTH, shuffle=False, verbose=False)
    for stream, complete in (([(inputs["source_ids"], inputs["target_ids"])
                               for inputs, _, _ in in_order], True),
                             ([(source, target) for source, target, _, _ in batches], False)):
        decoded = collections.Counter()
        for source_ids, target_ids in stream:
            sources = tokenizer.detokenize(source_ids).numpy()
            targets = tokenizer.detokenize(target_ids).numpy()
            decoded.update(zip((s.decode() for s in sources), (t.decode() for t in targets)))
        if complete:
            assert decoded == every_pair
        else:  # a training pass leaves out its small partial batches, repeats nothing
            assert decoded <= every_pair and decoded.total() > 0.9 * every_pair.total()


def test_long_pairs_are_dropped_and_counted(parallel_text, tokenizer, caplog):
    max_length = 20
    source = tokenizer.tokenize(list(parallel_text.source_lines)).row_lengths().numpy()
    target = tokenizer.tokenize(list(parallel_text.target_lines)).row_lengths().numpy()
    too_long = int((np.maximum(source, target) + 2 > max_length).sum())
    assert 0 < too_long < len(parallel_text)
    pairs = pairs_lib.tokenize_pairs(parallel_text, tokenizer, max_length=max_length)
    assert pairs.num_too_long == too_long
    assert int(pairs.source_ids.nrows()) == len(parallel_text) - too_long
    caplog.set_level("INFO", "keras_transformer")
    dataset = batching.make_dataset(parallel_text, tokenizer, batch_tokens=BATCH_TOKENS,
                                    max_length=max_length, shuffle=False)
    assert caplog.messages == [
        f"Batching {len(parallel_text) - too_long} pairs; {too_long} dropped as longer "
        f"than max_length={max_length}."]
    kept = 0
    for inputs, targets, _ in dataset:
        assert inputs["source_ids"].shape[1] <= max_length >= targets.shape[1]
        kept += int(targets.shape[0])
    assert kept == len(parallel_text) - too_long


def stream_targets(parallel_text, tokenizer, count, **options):
    dataset = batching.make_dataset(parallel_text, tokenizer, batch_tokens=BATCH_TOKENS,
                                max_length=MAX_LENGTH, verbose=False, **options)
    return [targets.numpy().tolist() for _, targets, _ in dataset.take(count)]


def test_same_seed_gives_the_same_batches_and_passes_differ(parallel_text, tokenizer,
                                                           batches):
    count = len(batches)
    first = stream_targets(parallel_text, tokenizer, count, seed=3)
    assert first == [targets.tolist() for _, _, targets, _ in batches]
    assert stream_targets(parallel_text, tokenizer, count, seed=3) == first
    assert stream_targets(parallel_text, tokenizer, count, seed=4) != first
    two_passes = stream_targets(parallel_text, tokenizer, 2 * count, seed=3, repeat=True)
    assert two_passes[:count] == first
    assert two_passes[count:] != first  # each pass has its own order


def test_batches_do_not_depend_on_the_global_seed_or_earlier_iterators(
        parallel_text, tokenizer, batches):
    # What a training run resumed in a fresh process relies on.
    dataset = batching.make_dataset(parallel_text, tokenizer, batch_tokens=BATCH_TOKENS,
                                max_length=MAX_LENGTH, seed=3, verbose=False)
    tf.random.set_seed(1234)
    next(iter(dataset))
    assert [targets.numpy().tolist() for _, targets, _ in dataset] == [
        targets.tolist() for _, _, targets, _ in batches]


def test_a_stream_started_later_goes_on_with_the_same_batches(parallel_text, tokenizer):
    pairs = pairs_lib.tokenize_pairs(parallel_text, tokenizer, max_length=MAX_LENGTH)
    per_pass = batching.batches_per_pass(pairs, batch_tokens=BATCH_TOKENS,
                                     max_length=MAX_LENGTH)
    whole = stream_targets(parallel_text, tokenizer, 3 * per_pass, repeat=True)
    for start in (1, per_pass - 1, per_pass, 2 * per_pass + 5):
        later = stream_targets(parallel_text, tokenizer, 8, repeat=True, start_batch=start)
        assert later == whole[start:start + 8], start


def test_batches_per_pass_counts_the_batches_of_a_pass(parallel_text, tokenizer, batches):
    pairs = pairs_lib.tokenize_pairs(parallel_text, tokenizer, max_length=MAX_LENGTH)
    assert batching.batches_per_pass(pairs, batch_tokens=BATCH_TOKENS,
                                 max_length=MAX_LENGTH) == len(batches)


def test_repeat_goes_past_one_epoch(parallel_text, tokenizer, batches):
    dataset = batching.make_dataset(parallel_text, tokenizer, batch_tokens=BATCH_TOKENS,
                                max_length=MAX_LENGTH, repeat=True, verbose=False)
    assert len(list(dataset.take(2 * len(batches)))) == 2 * len(batches)


def test_bucket_batch_sizes_fit_the_budget():
    boundaries = batching.bucket_boundaries(256)
    assert boundaries == sorted(set(boundaries)) and boundaries[-1] <= 256
    sizes = batching.bucket_batch_sizes(boundaries, 256, 4096)
    longest = [bound - 1 for bound in boundaries] + [256]
    assert all(size * length <= 4096 < (size + 1) * length
               for size, length in zip(sizes, longest))
    with pytest.raises(ValueError, match="batch_tokens=100 cannot hold one sequence"):
        batching.bucket_batch_sizes(boundaries, 256, 100)


def test_batches_hold_one_bucket_each_and_partial_ones_are_spread_over_the_pass(batches):
    boundaries = batching.bucket_boundaries(MAX_LENGTH)
    sizes = batching.bucket_batch_sizes(boundaries, MAX_LENGTH, BATCH_TOKENS)
    partial_positions, partial_buckets, batch_buckets = [], [], []
    for position, (source_ids, target_ids, _, _) in enumerate(batches):
        lengths = np.maximum((source_ids != PAD_ID).sum(1), (target_ids != PAD_ID).sum(1))
        bucket, = set(np.searchsorted(boundaries, lengths, side="right"))
        assert len(lengths) <= sizes[bucket]
        batch_buckets.append(bucket)
        if len(lengths) < sizes[bucket]:
            partial_positions.append(position)
            partial_buckets.append(bucket)
    assert len(partial_buckets) == len(set(partial_buckets)) >= 2  # one per bucket at most
    # Batches in bucket order (what grouping alone gives) would train on short sentences
    # first and long ones last, each bucket ending with its partial batch, changing
    # bucket k - 1 times; and `bucket_by_sequence_length` emits all the partial batches
    # last, in a row. A random order of n batches, c_b in bucket b, changes bucket
    # (n - 1)(1 - Σ c_b (c_b - 1) / (n (n - 1))) times on average.
    changes = sum(a != b for a, b in zip(batch_buckets, batch_buckets[1:]))
    counts, n = collections.Counter(batch_buckets).values(), len(batch_buckets)
    random_order = (n - 1) * (1 - sum(c * (c - 1) for c in counts) / (n * (n - 1)))
    assert changes > max(len(counts) - 1, random_order / 2)
    assert partial_positions != list(range(len(batches) - len(partial_positions),
                                           len(batches)))


def test_small_partial_batches_are_left_out_of_training_passes_only(parallel_text,
                                                                    tokenizer):
    pairs = pairs_lib.tokenize_pairs(parallel_text, tokenizer, max_length=MAX_LENGTH)
    boundaries = batching.bucket_boundaries(MAX_LENGTH)
    sizes = batching.bucket_batch_sizes(boundaries, MAX_LENGTH, BATCH_TOKENS)
    counts = {}
    for shuffle in (False, True):
        dataset = batching.batch_pairs(pairs, batch_tokens=BATCH_TOKENS, max_length=MAX_LENGTH,
                                   seed=3, shuffle=shuffle)
        fills = []
        for inputs, targets, _ in dataset:
            lengths = np.maximum((inputs["source_ids"].numpy() != PAD_ID).sum(1),
                                 (inputs["target_ids"].numpy() != PAD_ID).sum(1))
            bucket, = set(np.searchsorted(boundaries, lengths, side="right"))
            fills.append(len(targets) / sizes[bucket])
        counts[shuffle] = len(fills)
        assert batching.batches_per_pass(pairs, batch_tokens=BATCH_TOKENS, max_length=MAX_LENGTH,
                                     shuffle=shuffle) == len(fills)
        if shuffle:
            assert min(fills) >= batching.MIN_PARTIAL_BATCH_FILL
        else:  # evaluation keeps every pair
            assert min(fills) < batching.MIN_PARTIAL_BATCH_FILL
            assert sum(int(len(t)) for _, t, _ in dataset) == int(pairs.source_ids.nrows())
    assert counts[True] < counts[False]


@pytest.mark.parametrize("shuffle", [True, False])
def test_padding_to_the_bucket_gives_one_shape_per_bucket_and_the_same_pairs(
        parallel_text, tokenizer, shuffle):
    pairs = pairs_lib.tokenize_pairs(parallel_text, tokenizer, max_length=MAX_LENGTH)
    boundaries = batching.bucket_boundaries(MAX_LENGTH)
    bucket_shapes = set(zip(batching.bucket_batch_sizes(boundaries, MAX_LENGTH, BATCH_TOKENS),
                            batching.bucket_lengths(boundaries, MAX_LENGTH)))
    options = dict(batch_tokens=BATCH_TOKENS, max_length=MAX_LENGTH, seed=3, shuffle=shuffle)
    plain = list(batching.batch_pairs(pairs, **options))
    padded = list(batching.batch_pairs(pairs, pad_to_bucket=True, **options))
    assert len(padded) == len(plain)
    plain_shapes, padded_shapes = set(), set()
    for (inputs, targets, weights), (padded_inputs, padded_targets, padded_weights) in zip(
            plain, padded):
        plain_shapes.add((tuple(inputs["source_ids"].shape), tuple(targets.shape)))
        shape = tuple(padded_targets.shape)
        assert shape in bucket_shapes
        padded_shapes.add(shape)
        # The unpadded batch is the top-left corner; everything else is PAD, weight 0.
        for plain_ids, padded_ids in ((inputs["source_ids"], padded_inputs["source_ids"]),
                                      (inputs["target_ids"], padded_inputs["target_ids"]),
                                      (targets, padded_targets), (weights, padded_weights)):
            assert tuple(padded_ids.shape) == shape
            rows, length = plain_ids.shape
            np.testing.assert_array_equal(padded_ids[:rows, :length], plain_ids)
            rest = padded_ids.numpy().copy()
            rest[:rows, :length] = PAD_ID
            assert (rest == PAD_ID).all()
    assert len(padded_shapes) < len(plain_shapes)


NBEST = 8


@pytest.fixture(scope="module")
def sampled_pairs(parallel_text, tokenizer):
    return pairs_lib.tokenize_pairs(parallel_text, tokenizer, max_length=MAX_LENGTH, nbest=NBEST)


def sampled_stream(pairs, count, **options):
    dataset = batching.batch_pairs(pairs, batch_tokens=BATCH_TOKENS, max_length=MAX_LENGTH,
                               **options)
    return [(inputs["source_ids"].numpy(), inputs["target_ids"].numpy(), targets.numpy())
            for inputs, targets, _ in dataset.take(count)]


def decode(strings):
    return [text.decode("utf-8") for text in np.asarray(strings).reshape(-1)]


def pieces(rows, first):
    """The pieces of padded rows, from column `first` on, without PAD, START and END."""
    return [tuple(int(i) for i in row[first:] if i not in (PAD_ID, START_ID, END_ID))
            for row in rows]


def kept_in_a_pass(pairs):
    """Pairs a shuffled pass keeps: all but those of partial batches under
    `MIN_PARTIAL_BATCH_FILL`, bucketed by the longest candidate of either side."""
    boundaries = batching.bucket_boundaries(MAX_LENGTH)
    sizes = batching.bucket_batch_sizes(boundaries, MAX_LENGTH, BATCH_TOKENS)
    longest = [max(max(map(len, source)) + 2, max(map(len, target)) + 1)  # START, END
               for source, target in zip(pairs.candidates.source.to_list(),
                                         pairs.candidates.target.to_list())]
    kept = 0
    for bucket, count in collections.Counter(
            np.searchsorted(boundaries, longest, side="right")).items():
        rest = count % sizes[bucket]
        kept += count - (rest if rest < batching.MIN_PARTIAL_BATCH_FILL * sizes[bucket] else 0)
    return kept


def test_subword_sampling_trains_on_other_segmentations_of_the_same_text(
        parallel_text, tokenizer, sampled_pairs):
    per_pass = batching.batches_per_pass(sampled_pairs, batch_tokens=BATCH_TOKENS,
                                     max_length=MAX_LENGTH)
    kept = kept_in_a_pass(sampled_pairs)
    assert kept > 0.8 * len(parallel_text.source_lines)
    stream = sampled_stream(sampled_pairs, 2 * per_pass, seed=3, repeat=True)
    every_pair = collections.Counter(zip(parallel_text.source_lines,
                                         parallel_text.target_lines))
    most_likely = set(map(tuple, tokenizer.tokenize(
        list(parallel_text.source_lines) + list(parallel_text.target_lines)).to_list()))
    drawn = []
    for first in (0, per_pass):
        decoded, segmentations = collections.Counter(), []
        for source_ids, target_ids, targets in stream[first:first + per_pass]:
            assert source_ids.size <= BATCH_TOKENS and target_ids.size <= BATCH_TOKENS
            assert pieces(target_ids, 1) == pieces(targets, 0)  # the same drawn target
            assert (source_ids[:, 0] == START_ID).all() and (target_ids[:, 0] == START_ID).all()
            decoded.update(zip(decode(tokenizer.detokenize(source_ids)),
                               decode(tokenizer.detokenize(target_ids))))
            segmentations += pieces(source_ids, 1) + pieces(targets, 0)
        # Other pieces, the same sentences: a pass is still each pair once at most, and
        # every pair but those of the small partial batches left out.
        assert decoded <= every_pair and decoded.total() == kept
        other = sum(segmentation not in most_likely for segmentation in segmentations)
        assert 0.3 < other / len(segmentations) < 1.0
        drawn.append(collections.Counter(segmentations))
    assert drawn[0] != drawn[1]  # each pass draws anew


def test_subword_sampling_is_a_function_of_seed_and_position(sampled_pairs):
    # What a training run resumed in a fresh process relies on.
    per_pass = batching.batches_per_pass(sampled_pairs, batch_tokens=BATCH_TOKENS,
                                     max_length=MAX_LENGTH)
    whole = sampled_stream(sampled_pairs, 2 * per_pass + 8, seed=3, repeat=True)
    tf.random.set_seed(99)
    for start in (1, per_pass + 3):
        later = sampled_stream(sampled_pairs, 8, seed=3, repeat=True, start_batch=start)
        for got, expected in zip(later, whole[start:start + 8]):
            for got_ids, expected_ids in zip(got, expected):
                np.testing.assert_array_equal(got_ids, expected_ids)
    other_seed = sampled_stream(sampled_pairs, per_pass, seed=4, repeat=True)
    assert [pieces(targets, 0) for _, _, targets in other_seed] != [
        pieces(targets, 0) for _, _, targets in whole[:per_pass]]


def test_evaluation_passes_use_the_most_likely_segmentation(sampled_pairs):
    plain = pairs_lib.TokenizedPairs(sampled_pairs.source_ids, sampled_pairs.target_ids,
                                sampled_pairs.targets, sampled_pairs.num_too_long)
    streams = []
    for pairs in (sampled_pairs, plain):
        # Buckets differ (those of the longest candidates), so the batches are compared
        # by what they hold.
        streams.append(collections.Counter(
            (source, target) for source_ids, _, targets in sampled_stream(
                pairs, 1000, shuffle=False)
            for source, target in zip(pieces(source_ids, 1), pieces(targets, 0))))
    assert streams[0] == streams[1]
    assert streams[0].total() == int(sampled_pairs.source_ids.nrows())


def test_a_pass_with_sampling_has_the_batches_counted_within_budget(sampled_pairs):
    per_pass = batching.batches_per_pass(sampled_pairs, batch_tokens=BATCH_TOKENS,
                                     max_length=MAX_LENGTH)
    for pad_to_bucket in (False, True):
        batches = sampled_stream(sampled_pairs, 10 * per_pass, seed=5,
                                 pad_to_bucket=pad_to_bucket)
        assert len(batches) == per_pass
        assert max(max(s.size, t.size) for s, t, _ in batches) <= BATCH_TOKENS


def test_segmentations_are_drawn_with_probability_proportional_to_p_to_the_alpha():
    log_probs = [-1.0, -2.0, -4.0]
    count = 20000
    candidates = pairs_lib.SegmentationCandidates(
        source=tf.ragged.constant([[[5], [6], [7]]] * count, tf.int32),
        target=tf.ragged.constant([[[8, 9], [10]]] * count, tf.int32),
        source_log_probs=tf.ragged.constant([log_probs] * count, tf.float32),
        target_log_probs=tf.ragged.constant([[-3.0, -3.0]] * count, tf.float32))
    for alpha in (0.5, 2.0):
        source_ids, target_ids, targets = pairs_lib.sample_segmentations(
            candidates, alpha, tf.constant([1, 2], tf.int64))
        drawn = source_ids.to_tensor().numpy()
        assert (drawn[:, 0] == START_ID).all() and (drawn[:, 2] == END_ID).all()
        frequencies = np.bincount(drawn[:, 1] - 5, minlength=3) / count
        expected = np.exp(alpha * np.array(log_probs))
        np.testing.assert_allclose(frequencies, expected / expected.sum(), atol=0.015)
        first_target = np.mean([row == [START_ID, 8, 9] for row in target_ids.to_list()])
        assert abs(first_target - 0.5) < 0.015  # equal probabilities
        assert [row[1:] for row in target_ids.to_list()] == [
            row[:-1] for row in targets.to_list()]


def test_bad_subword_sampling_settings_name_the_config_field(parallel_text, tokenizer,
                                                             sampled_pairs):
    with pytest.raises(ValueError, match=r"DataConfig.subword_nbest\) must be at least 1"):
        pairs_lib.tokenize_pairs(parallel_text, tokenizer, max_length=MAX_LENGTH, nbest=0)
    with pytest.raises(ValueError, match=r"DataConfig.subword_alpha\) must be positive"):
        batching.batch_pairs(sampled_pairs, batch_tokens=BATCH_TOKENS, max_length=MAX_LENGTH,
                         subword_alpha=0.0)
