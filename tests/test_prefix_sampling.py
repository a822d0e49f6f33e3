"""Target prefixes in beam search and seeded sampling, against references of their own.

Prefixes (`beam_search(..., prefix_ids=...)`): every hypothesis starts with the prefix's
tokens, scored by the model, and the search goes on after them by beam search's rules.
The reference is a NumPy beam search written from those rules (those of
`test_beam_search.py`) with the first tokens forced, run on one stub at a time in
float64; ids are compared where no near-tie of its rankings could flip them.

Sampling (`decoding.sampling`): a NumPy lowbias32 for the hash; greedy decoding for
top-k 1; a chi-square test of 10,000 seeded one-step draws against softmax(logits / T)
over the top k; seeds, batches and padding that change no sample; the scores as the
stub's log-probabilities of what was drawn.
"""

import math
import re

import numpy as np
import pytest
import tensorflow as tf

from keras_transformer import decoding
from keras_transformer.decoding import sampling
from tests.test_beam_search import (
    END,
    PAD,
    START,
    VOCABULARY,
    MarkovStubs,
    random_tables,
    sources,
)

# Compares float computations: also run on Eigen's kernels in CI (tests/numerics.py).
pytestmark = pytest.mark.numerics

STUBS = 40
# Tokens a prefix is made of: neither padding (which ends a prefix) nor the end token.
PREFIX_TOKENS = np.array([token for token in range(VOCABULARY) if token not in (PAD, END)])
# Rankings closer than this in float64 are near-ties that float32 (~1e-5 here, the
# scores being sums of a few log-probabilities of size ≤ 20) might order otherwise.
MARGIN = 1e-3


def log_softmax(logits):
    logits = np.asarray(logits, np.float64)
    largest = logits.max(-1, keepdims=True)
    return logits - largest - np.log(np.exp(logits - largest).sum(-1, keepdims=True))


def tokens_of(ids):
    """The tokens of an output row before its padding, as a tuple."""
    return tuple(int(token) for token in ids if token != PAD)


# Prefixes.

def reference_prefix_search(logits, prefix, beam_size, alpha):
    """Beam search by the rules of `test_beam_search.py` on one stub's `logits` `(L, V, V)`,
    its first `len(prefix)` tokens forced, in float64 and without the early stop (which
    never changes the result).

    Returns `(tokens, log_probability, normalized, margin)`: the best finished hypothesis
    and the smallest gap between two scores at a rank that decided anything (the `K`
    and `2K` cuts of the candidates, the `K` cut of the alive and finished ones, the best
    finished one against the next).
    """
    limit = logits.shape[0]
    log_probs = log_softmax(logits)

    def penalty(length):
        return ((5 + length) / 6) ** alpha

    def gap(values, cut):  # between ranks cut - 1 and cut of values sorted, largest first
        return values[cut - 1] - values[cut] if len(values) > cut else np.inf

    alive = [((), START, 0.0)]  # (tokens, last token, log P), best first
    finished = []  # (log P / lp, log P, tokens), best first, at most beam_size
    margin = np.inf
    for position in range(limit):
        length = position + 1
        if position < len(prefix):
            allowed = [int(prefix[position])]
        else:  # padding never, nor the end token first
            allowed = [token for token in range(VOCABULARY)
                       if token != PAD and not (position == 0 and token == END)]
        candidates = sorted(((score + log_probs[position, last, token], tokens + (token,))
                             for tokens, last, score in alive for token in allowed),
                            key=lambda candidate: -candidate[0])
        scores = [score for score, _ in candidates]
        margin = min(margin, gap(scores, beam_size), gap(scores, 2 * beam_size))
        candidates = candidates[:2 * beam_size]

        def ends(tokens):
            return tokens[-1] == END or length == limit

        finished = sorted(finished + [(score / penalty(length), score, tokens)
                                      for score, tokens in candidates[:beam_size]
                                      if ends(tokens)], key=lambda entry: -entry[0])
        margin = min(margin, gap([entry[0] for entry in finished], beam_size))
        finished = finished[:beam_size]
        staying = [(score, tokens) for score, tokens in candidates if not ends(tokens)]
        margin = min(margin, gap([score for score, _ in staying], beam_size))
        alive = [(tokens, tokens[-1], score) for score, tokens in staying[:beam_size]]
        if not alive:
            break
    margin = min(margin, gap([entry[0] for entry in finished], 1))
    normalized, score, tokens = finished[0]
    return tokens, score, normalized, margin


def random_prefixes(seed, count, limit):
    """`(count, limit + 1)` prefixes padded with PAD, of every length from 0 (nothing
    forced) to past the length limit."""
    rng = np.random.default_rng(seed)
    prefixes = np.full((count, limit + 1), PAD, np.int32)
    for row in range(count):
        length = row % (limit + 2)
        prefixes[row, :length] = rng.choice(PREFIX_TOKENS, size=length)
    return prefixes


def prefix_search(limit, **options):
    """`beam_search` on MarkovStubs as one graph: `(tables, source_ids, prefix_ids) ->
    (ids, scores, normalized_scores)`, for batches of any size and prefixes of any width."""
    @tf.function(input_signature=[
        tf.TensorSpec([None, limit, VOCABULARY, VOCABULARY]),
        tf.TensorSpec([None, 3], tf.int32), tf.TensorSpec([None, None], tf.int32)])
    def search(tables, source_ids, prefix_ids):
        found = decoding.beam_search(MarkovStubs(tables), source_ids, max_length=limit,
                                     extra_length=None, prefix_ids=prefix_ids, **options)
        return found.ids, found.scores, found.normalized_scores

    def run(tables, source_ids, prefix_ids):
        return tuple(value.numpy() for value in search(
            tf.constant(tables, tf.float32), tf.constant(source_ids, tf.int32),
            tf.constant(prefix_ids, tf.int32)))

    return run


PREFIX_CASES = [(1, 5, 0.6), (2, 6, 0.0), (3, 5, 0.6), (4, 6, 1.5)]


def prefix_case(beam_size, limit, alpha):
    tables = random_tables(seed=7000 + beam_size * 100 + limit * 10 + int(alpha * 10),
                           count=STUBS, limit=limit).astype(np.float32)
    prefixes = random_prefixes(seed=beam_size * 10 + limit, count=STUBS, limit=limit)
    return tables, prefixes


@pytest.mark.parametrize("beam_size, limit, alpha", PREFIX_CASES)
def test_prefix_search_continues_the_prefix_as_the_reference_does(beam_size, limit, alpha):
    tables, prefixes = prefix_case(beam_size, limit, alpha)
    ids, scores, normalized = prefix_search(limit, beam_size=beam_size,
                                            length_penalty=alpha)(
        tables, sources(STUBS), prefixes)
    compared = 0
    for stub in range(STUBS):
        prefix = tokens_of(prefixes[stub])
        tokens = tokens_of(ids[stub])
        # The contract itself: the output starts with the prefix, cut at the limit.
        assert tokens[:len(prefix)] == prefix[:limit], f"stub {stub}"
        expected_tokens, expected_score, expected_normalized, margin = (
            reference_prefix_search(tables[stub], prefix, beam_size, alpha))
        if margin > MARGIN:
            compared += 1
            assert tokens == expected_tokens, f"stub {stub}, prefix {prefix}"
            assert scores[stub] == pytest.approx(expected_score, rel=1e-5, abs=1e-5), (
                f"stub {stub}")
            assert normalized[stub] == pytest.approx(expected_normalized, rel=1e-5,
                                                     abs=1e-5), f"stub {stub}"
    # Near-ties are rare: nearly every stub of the batch is compared.
    assert compared >= STUBS * 3 // 4


def test_these_prefixes_force_and_the_search_then_prunes():
    # What makes the test above one of prefixes and pruning: the stubs' own best
    # (unforced) hypotheses rarely start with the prefix, and the beam keeps a fraction
    # of the continuations after it.
    differ = 0
    for beam_size, limit, alpha in PREFIX_CASES:
        tables, prefixes = prefix_case(beam_size, limit, alpha)
        for stub in range(STUBS):
            prefix = tokens_of(prefixes[stub])
            free, *_ = reference_prefix_search(tables[stub], (), beam_size, alpha)
            differ += len(prefix) > 0 and free[:len(prefix)] != prefix[:limit]
    assert differ >= len(PREFIX_CASES) * STUBS // 2


@pytest.mark.parametrize("beam_size, limit, alpha", PREFIX_CASES[1:3])
def test_a_sentence_with_a_prefix_decodes_alone_as_in_its_batch(beam_size, limit, alpha):
    tables, prefixes = prefix_case(beam_size, limit, alpha)
    search = prefix_search(limit, beam_size=beam_size, length_penalty=alpha)
    ids, scores, normalized = search(tables, sources(STUBS), prefixes)
    for stub in range(STUBS):
        prefix = tokens_of(prefixes[stub])
        *_, margin = reference_prefix_search(tables[stub], prefix, beam_size, alpha)
        # Alone, its prefix without the batch's padding columns (one column at least).
        alone = prefixes[stub:stub + 1, :max(len(prefix), 1)]
        alone_ids, alone_scores, alone_normalized = search(tables[stub:stub + 1],
                                                           sources(1), alone)
        if margin > MARGIN:
            assert tokens_of(alone_ids[0]) == tokens_of(ids[stub]), f"stub {stub}"
        assert alone_scores[0] == pytest.approx(scores[stub], rel=1e-5, abs=1e-5)
        assert alone_normalized[0] == pytest.approx(normalized[stub], rel=1e-5, abs=1e-5)


@pytest.mark.parametrize("beam_size, num_hypotheses", [(1, None), (3, None), (4, 4)])
def test_prefixes_of_padding_alone_change_nothing(beam_size, num_hypotheses):
    limit = 6
    tables = random_tables(seed=8100 + beam_size, count=STUBS, limit=limit)
    model = MarkovStubs(tables.astype(np.float32))
    options = dict(beam_size=beam_size, length_penalty=0.6, max_length=limit,
                   extra_length=None, num_hypotheses=num_hypotheses)
    plain = decoding.beam_search(model, sources(STUBS), **options)
    padded = decoding.beam_search(model, sources(STUBS),
                                  prefix_ids=np.full((STUBS, 3), PAD, np.int32), **options)
    # Exactly: the forcing term is a zero added to every candidate.
    for name in ("ids", "lengths", "scores", "normalized_scores"):
        np.testing.assert_array_equal(getattr(padded, name).numpy(),
                                      getattr(plain, name).numpy(), err_msg=name)


class OneStub(MarkovStubs):
    """MarkovStubs whose every sentence follows stub 0, whatever its source (an empty
    one included)."""

    def init_cache(self, encoder_output, source_ids, max_length):
        return {"stub": tf.zeros(tf.shape(source_ids)[:1], tf.int32)}


def test_an_empty_source_with_a_prefix_is_searched_as_any_other():
    limit, beam_size, alpha = 6, 3, 0.6
    table = random_tables(seed=8200, count=1, limit=limit).astype(np.float32)
    model = OneStub(table)
    empty = np.array([[START, END, PAD]], np.int32)
    prefix = (5, 4)
    options = dict(beam_size=beam_size, length_penalty=alpha, max_length=limit,
                   extra_length=None)
    # Without a prefix, an empty source translates to the end token alone.
    assert tokens_of(decoding.beam_search(model, empty, **options).ids[0].numpy()) == (END,)
    found = decoding.beam_search(model, empty, prefix_ids=np.array([prefix], np.int32),
                                 **options)
    expected_tokens, expected_score, _, margin = reference_prefix_search(
        table[0], prefix, beam_size, alpha)
    assert margin > MARGIN
    assert tokens_of(found.ids[0].numpy()) == expected_tokens
    assert float(found.scores[0]) == pytest.approx(expected_score, rel=1e-5, abs=1e-5)


def test_prefixes_without_columns_force_nothing():
    limit = 5
    model = MarkovStubs(random_tables(seed=8300, count=3, limit=limit).astype(np.float32))
    options = dict(beam_size=2, max_length=limit, extra_length=None)
    found = decoding.beam_search(model, sources(3), prefix_ids=np.zeros((3, 0), np.int32),
                                 **options)
    np.testing.assert_array_equal(found.ids.numpy(),
                                  decoding.beam_search(model, sources(3), **options).ids)


# The hash.

def lowbias32(values):
    """Wellons's lowbias32 on uint32 (NumPy wraps uint32 products modulo 2^32), as int32."""
    x = np.asarray(values, np.int32).view(np.uint32).copy()
    x ^= x >> np.uint32(16)
    x *= np.uint32(0x7FEB352D)
    x ^= x >> np.uint32(15)
    x *= np.uint32(0x846CA68B)
    x ^= x >> np.uint32(16)
    return x.view(np.int32)


def lowbias32_inverse(values):
    """lowbias32's inverse (Wellons's `lowbias32_r`), as int32."""
    x = np.asarray(values, np.int32).view(np.uint32).copy()
    x ^= x >> np.uint32(16)
    x *= np.uint32(0x43021123)
    x ^= (x >> np.uint32(15)) ^ (x >> np.uint32(30))
    x *= np.uint32(0x1D69E2A5)
    x ^= x >> np.uint32(16)
    return x.view(np.int32)


def hash_inputs():
    """4,000 int32s: the edges (0, ±1, INT32_MIN/MAX, powers of two and their
    neighbours) and random ones of both signs."""
    info = np.iinfo(np.int32)
    powers = np.array([1 << bits for bits in range(31)], np.int64)
    edges = np.concatenate([[0, 1, -1, info.min, info.min + 1, info.max, info.max - 1],
                            powers, powers - 1, -powers, -powers - 1]).astype(np.int32)
    random = np.random.default_rng(9000).integers(info.min, info.max, size=4000 - len(edges),
                                                  dtype=np.int32, endpoint=True)
    return np.concatenate([edges, random])


def test_hash_int32_is_lowbias32():
    values = hash_inputs()
    # Any shape, element by element.
    hashed = sampling.hash_int32(tf.constant(values.reshape(40, 100))).numpy()
    assert hashed.dtype == np.int32
    np.testing.assert_array_equal(hashed.reshape(-1), lowbias32(values))
    assert lowbias32(np.array([0, 1]))[0] == 0 and lowbias32(np.array([1]))[0] != 1


def test_hash_int32_is_a_bijection():
    values = np.unique(hash_inputs())
    hashed = sampling.hash_int32(tf.constant(values)).numpy()
    assert len(np.unique(hashed)) == len(values)  # no collisions
    np.testing.assert_array_equal(lowbias32_inverse(hashed), values)


# Sampling.

def sample_ids(model, source_ids, seeds, limit, **options):
    found = sampling.sample(model, source_ids, np.asarray(seeds, np.int32), max_length=limit,
                            extra_length=None, **options)
    return found.ids.numpy(), found.scores.numpy()


@pytest.mark.parametrize("temperature", [0.25, 1.0, 10.0])
def test_sampling_from_the_top_token_is_greedy_decoding(temperature):
    limit = 6
    model = MarkovStubs(random_tables(seed=9100, count=STUBS, limit=limit).astype(np.float32))
    ids, scores = sample_ids(model, sources(STUBS), np.arange(STUBS) * 7 - 11, limit,
                             top_k=1, temperature=temperature)
    greedy = decoding.greedy_decode(model, sources(STUBS), max_length=limit,
                                    extra_length=None)
    # Exactly: both pick the largest of the same float32 logits.
    np.testing.assert_array_equal(ids, greedy.ids.numpy())
    np.testing.assert_array_equal(scores, greedy.scores.numpy())


class ConstantLogits:
    """Stands in for `Transformer`: the same logits `(V,)` at every step of every sentence."""

    def __init__(self, logits):
        self.logits = tf.constant(logits, tf.float32)  # (V,)
        self.max_length = 8

    def encode(self, source_ids, training=None):
        return tf.zeros(tf.concat([tf.shape(source_ids), [1]], 0))

    def init_cache(self, encoder_output, source_ids, max_length):
        return {"rows": tf.zeros(tf.shape(source_ids)[:1], tf.int32)}  # (B,)

    def decode_step(self, token_ids, cache, index):
        return tf.gather(self.logits[None, :], cache["rows"]), cache  # (B, V)


DRAWS = 10_000
# 128 tokens: top-k then runs `top_k_by_blocks` over blocks of 8 (16 blocks ≥ 4k).
WIDE_VOCABULARY = 128
# The allowed tokens ranked first, with their logits: the fourth close to the third.
LEADERS = {17: 3.0, 60: 2.6, 101: 2.0, 44: 1.9}


def wide_logits():
    """Logits over WIDE_VOCABULARY tokens: LEADERS first among those a first step may
    draw, while PAD and END, never drawn there, have the largest of all."""
    logits = np.clip(np.random.default_rng(9200).normal(0.0, 0.5, WIDE_VOCABULARY),
                     -1.5, 1.5)
    for token, value in LEADERS.items():
        logits[token] = value
    logits[END], logits[PAD] = 5.0, 4.0
    return logits.astype(np.float32)


def one_step_draws(logits, top_k, temperature, vary="seeds"):
    """First tokens of DRAWS sentences: one source with seeds 0 … DRAWS - 1, or (`vary`
    "sources") DRAWS different sources with seed 0."""
    if vary == "seeds":
        source_ids = np.tile(np.array([[START, 40, 41, END]], np.int32), (DRAWS, 1))
        seeds = np.arange(DRAWS)
    else:
        rows = np.arange(DRAWS)
        source_ids = np.stack([np.full(DRAWS, START), 4 + rows % 120, 4 + rows // 120,
                               np.full(DRAWS, END)], axis=1).astype(np.int32)
        seeds = np.zeros(DRAWS)
    ids, _ = sample_ids(ConstantLogits(logits), source_ids, seeds, limit=1, top_k=top_k,
                        temperature=temperature)
    return ids[:, 0]


def expected_first_token_probabilities(logits, top_k, temperature):
    """softmax(logits / T) over the `top_k` largest allowed tokens (PAD and END are not
    allowed at the first step), renormalised; 0 elsewhere. From float64 logits."""
    allowed = np.array([token not in (PAD, END) for token in range(len(logits))])
    values = np.where(allowed, logits.astype(np.float64), -np.inf)
    if top_k:
        values[np.argsort(-values, kind="stable")[top_k:]] = -np.inf
    weights = np.exp((values - values.max()) / temperature)
    return weights / weights.sum()


def chi_square_critical(df):
    """The chi-square distribution's 0.999 quantile (Wilson–Hilferty; within 2.5 % above
    the exact value for df ≥ 2, so a slightly stricter p)."""
    z = 3.090232306167813  # the standard normal's 0.999 quantile
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def chi_square(counts, expected):
    """Pearson's statistic and degrees of freedom, cells expecting < 5 pooled in one."""
    small = expected < 5
    observed = np.append(counts[~small], counts[small].sum())
    wanted = np.append(expected[~small], expected[small].sum())
    if wanted[-1] < 5:  # too small a pool: add it to the smallest cell
        observed, wanted = observed[:-1].copy(), wanted[:-1].copy()
        smallest = np.argmin(wanted)
        observed[smallest] += counts[small].sum()
        wanted[smallest] += expected[small].sum()
    return float(((observed - wanted) ** 2 / wanted).sum()), len(wanted) - 1


@pytest.mark.parametrize("top_k, temperature, vary", [
    (0, 1.0, "seeds"), (3, 0.5, "seeds"),
    # One seed for a whole corpus: the sources alone make the draws independent.
    (3, 0.5, "sources")])
def test_draws_follow_the_tempered_top_k_distribution(top_k, temperature, vary):
    logits = wide_logits()
    draws = one_step_draws(logits, top_k, temperature, vary)
    probabilities = expected_first_token_probabilities(logits, top_k, temperature)
    counts = np.bincount(draws, minlength=WIDE_VOCABULARY)
    # Never a token outside the top k (nor PAD or END at the first step).
    assert counts[probabilities == 0].sum() == 0, np.flatnonzero(counts * (probabilities == 0))
    if top_k:
        assert set(np.flatnonzero(probabilities)) == set(list(LEADERS)[:top_k])
    support = probabilities > 0
    statistic, df = chi_square(counts[support], DRAWS * probabilities[support])
    assert df >= (top_k or WIDE_VOCABULARY - 3) - 1
    assert statistic < chi_square_critical(df), (statistic, df)


def test_every_step_draws_afresh():
    # The same logits at every step: consecutive tokens of a sentence are independent
    # draws, equal with probability Σ p², not copies of one noise.
    logits = wide_logits()
    logits[END] = -30.0  # so that sentences go on
    limit, count = 4, 2_000
    source_ids = np.tile(np.array([[START, 40, 41, END]], np.int32), (count, 1))
    ids, _ = sample_ids(ConstantLogits(logits), source_ids, np.arange(count), limit,
                        top_k=3, temperature=1.0)
    assert (ids != PAD).all() and (ids != END).all()
    p = expected_first_token_probabilities(logits, 3, 1.0)
    rate, trials = np.mean(ids[:, 1:] == ids[:, :-1]), count * (limit - 1)
    expected = (p ** 2).sum()
    assert abs(rate - expected) < 5 * math.sqrt(expected * (1 - expected) / trials), (
        rate, expected)


def test_the_largest_temperature_still_never_draws_forbidden_tokens():
    # FORBIDDEN / MAX_TEMPERATURE stays far below any Gumbel noise of 24-bit uniforms.
    draws = one_step_draws(wide_logits(), 0, sampling.MAX_TEMPERATURE)
    assert not np.isin(draws, [PAD, END]).any()
    # Nearly uniform over the other 126 tokens: every one of them drawn.
    assert len(np.unique(draws)) == WIDE_VOCABULARY - 2


def test_the_whole_vocabulary_or_more_samples_as_top_k_zero():
    limit = 6
    model = MarkovStubs(random_tables(seed=9300, count=STUBS, limit=limit).astype(np.float32))
    seeds = np.arange(STUBS) + 100
    everything, _ = sample_ids(model, sources(STUBS), seeds, limit, top_k=0)
    for top_k in (VOCABULARY, VOCABULARY + 5):
        np.testing.assert_array_equal(
            sample_ids(model, sources(STUBS), seeds, limit, top_k=top_k)[0], everything)


SAMPLING_OPTIONS = [dict(top_k=0, temperature=1.0), dict(top_k=3, temperature=1.5)]


@pytest.mark.parametrize("options", SAMPLING_OPTIONS)
def test_a_seed_repeats_its_sample_and_another_seed_changes_it(options):
    limit = 6
    model = MarkovStubs(random_tables(seed=9400, count=STUBS, limit=limit).astype(np.float32))
    seeds = np.arange(STUBS) * 3 + 5
    first, _ = sample_ids(model, sources(STUBS), seeds, limit, **options)
    np.testing.assert_array_equal(sample_ids(model, sources(STUBS), seeds, limit,
                                             **options)[0], first)
    # The same in a graph as eagerly.
    graph = tf.function(lambda source_ids, seeds: sampling.sample(
        model, source_ids, seeds, max_length=limit, extra_length=None, **options).ids)
    np.testing.assert_array_equal(graph(tf.constant(sources(STUBS)),
                                        tf.constant(seeds, tf.int32)).numpy(), first)
    other, _ = sample_ids(model, sources(STUBS), seeds + 1, limit, **options)
    changed = sum(tokens_of(a) != tokens_of(b) for a, b in zip(first, other))
    assert changed >= STUBS // 4


def padded_sources(stubs, extra):
    """Sources naming `stubs`, each followed by `extra[i]` more ids, padded to one width."""
    width = 3 + max(extra)
    rows = np.full((len(stubs), width), PAD, np.int32)
    for row, (stub, more) in enumerate(zip(stubs, extra)):
        rows[row, :3 + more] = [START, VOCABULARY + stub, *range(4, 4 + more), END]
    return rows


@pytest.mark.parametrize("options", SAMPLING_OPTIONS)
def test_a_sentence_samples_alike_alone_and_in_any_batch(options):
    limit = 6
    model = MarkovStubs(random_tables(seed=9500, count=8, limit=limit).astype(np.float32))
    # Stubs 0-3 with short sources; 4-7 with longer ones that pad the others in a batch;
    # then stubs 0 and 1 again with their seeds (equal sentences) and with other seeds.
    stubs = [0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 0, 1]
    extra = [0, 0, 0, 0, 3, 1, 2, 3, 0, 0, 0, 0]
    seeds = np.array([11, 12, 13, 14, 15, 16, 17, 18, 11, 12, 99, 98], np.int32)
    batch_sources = padded_sources(stubs, extra)
    batch, batch_scores = sample_ids(model, batch_sources, seeds, limit, **options)
    for row in range(len(stubs)):
        alone, alone_scores = sample_ids(model, padded_sources([stubs[row]], [extra[row]]),
                                         seeds[row:row + 1], limit, **options)
        assert tokens_of(alone[0]) == tokens_of(batch[row]), f"row {row}"
        assert alone_scores[0] == pytest.approx(batch_scores[row], rel=1e-6, abs=1e-6)
    # Equal sentences with equal seeds draw alike.
    assert tokens_of(batch[8]) == tokens_of(batch[0])
    assert tokens_of(batch[9]) == tokens_of(batch[1])
    # The place in the batch changes nothing either.
    order = np.random.default_rng(9501).permutation(len(stubs))
    shuffled, _ = sample_ids(model, batch_sources[order], seeds[order], limit, **options)
    for place, row in enumerate(order):
        assert tokens_of(shuffled[place]) == tokens_of(batch[row]), f"row {row}"


def test_scores_are_the_log_probabilities_of_the_drawn_tokens():
    limit, top_k = 6, 3
    tables = random_tables(seed=9600, count=STUBS, limit=limit).astype(np.float32)
    ids, scores = sample_ids(MarkovStubs(tables), sources(STUBS), np.arange(STUBS), limit,
                             top_k=top_k, temperature=0.7)
    log_probs = log_softmax(tables)  # (N, L, V, V): at temperature 1, over all V tokens
    ended = 0
    for stub in range(STUBS):
        tokens = tokens_of(ids[stub])
        assert PAD not in tokens and len(tokens) >= 1
        assert END not in tokens[:-1] and (tokens[-1] == END or len(tokens) == limit)
        ended += tokens[-1] == END
        previous, expected = START, 0.0
        for position, token in enumerate(tokens):
            step = tables[stub, position, previous]
            # Drawn among the top k of the allowed tokens (the end token not first).
            allowed = np.flatnonzero([t != PAD and (position > 0 or t != END)
                                      for t in range(VOCABULARY)])
            assert token in allowed[np.argsort(-step[allowed], kind="stable")[:top_k]]
            expected += log_probs[stub, position, previous, token]  # END's included
            previous = token
        assert scores[stub] == pytest.approx(expected, rel=1e-5, abs=1e-5), f"stub {stub}"
    assert STUBS // 4 <= ended < STUBS  # both ways of ending are scored


@pytest.mark.parametrize("top_k, temperature, named", [
    (-1, 1.0, "top_k=-1"), (-5, 0.5, "top_k=-5"), (0, 0.0, "temperature=0.0"),
    (3, -0.5, "temperature=-0.5"), (0, sampling.MAX_TEMPERATURE * 1.5, "temperature=1500.0"),
    (0, float("nan"), "temperature=nan")])
def test_bad_sampling_settings_are_refused_by_name(top_k, temperature, named):
    with pytest.raises(ValueError, match=re.escape(named)):
        sampling.check_sampling(top_k, temperature)
    model = MarkovStubs(random_tables(seed=9700, count=1, limit=3).astype(np.float32))
    with pytest.raises(ValueError, match=re.escape(named)):
        sampling.sample(model, sources(1), np.zeros([1], np.int32), top_k=top_k,
                        temperature=temperature)


@pytest.mark.parametrize("top_k, temperature", [(0, 1e-3), (1, 1.0), (50, 0.5),
                                                (0, sampling.MAX_TEMPERATURE)])
def test_sampling_settings_in_range_are_accepted(top_k, temperature):
    sampling.check_sampling(top_k, temperature)  # raises nothing
