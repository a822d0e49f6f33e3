"""Beam search where it prunes, against a NumPy beam search written from its rules.

The rules (`decoding/beam.py`'s docstring; fairseq's beam search): each step expands
the alive hypotheses and ranks the candidates; those among the best `K` that end (the
end token, or the length limit) join the finished set, which keeps the `K` best by
log P / lp; the `K` best candidates that did not end stay alive. The search may stop
once the worst of `K` finished hypotheses beats what the best alive one could reach at
the length limit. The answer is the best finished hypothesis.

Beams of 2 to 4 over a vocabulary of 8 and 5 or 6 steps keep a fraction of the
hypotheses only, so every rule above decides outputs here, the early stop included.
"""

import numpy as np
import pytest
import tensorflow as tf

from keras_transformer import decoding
from keras_transformer.decoding import beam as beam_lib

# Compares float computations: also run on Eigen's kernels in CI (tests/numerics.py).
pytestmark = pytest.mark.numerics

PAD, START, END = 0, 2, 3
VOCABULARY = 8
STUBS = 40  # random stubs decoded together, one sentence each


class MarkovStubs:
    """Stands in for `Transformer`: sentence `n` follows stub `n`'s table of logits.

    `tables[n, i, token]` holds stub `n`'s logits after `token` at output position `i`
    (the start token at position 0). A sentence names its stub by its second source id;
    the stub's number rides in the cache, so beam search must reorder it with the
    hypotheses.
    """

    def __init__(self, tables):
        self.tables = tf.convert_to_tensor(tables, tf.float32)  # (N, L, V, V)
        self.max_length = tables.shape[1] + 1

    def encode(self, source_ids, training=None):
        return tf.zeros(tf.concat([tf.shape(source_ids), [1]], 0))

    def init_cache(self, encoder_output, source_ids, max_length):
        return {"stub": source_ids[:, 1] - VOCABULARY}  # (B,)

    def decode_step(self, token_ids, cache, index):
        stub = cache["stub"]
        positions = tf.fill(tf.shape(stub), index)
        return tf.gather_nd(self.tables, tf.stack([stub, positions, token_ids], 1)), cache


def sources(count):
    """Source ids naming stubs 0 … count-1 (ids from VOCABULARY on, so never special)."""
    return np.array([[START, VOCABULARY + n, END] for n in range(count)], np.int32)


def random_tables(seed, count, limit):
    rng = np.random.default_rng(seed)
    sharpness = rng.uniform(0.5, 4.0, size=(count, 1, 1, 1))
    return sharpness * rng.normal(size=(count, limit, VOCABULARY, VOCABULARY))


def reference_beam_search(logits, beam_size, alpha, early_stop=True):
    """The beam search of the rules above on one stub's `logits` `(L, V, V)`, in float64.

    Returns `(tokens, log_probability, normalized, steps)`: the best finished hypothesis
    and the number of steps searched.
    """
    limit = logits.shape[0]
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))

    def penalty(length):  # Wu et al. (2016)
        return ((5 + length) / 6) ** alpha

    alive = [((), START, 0.0)]  # (tokens, last token, log P), best first
    finished = []  # (log P / lp, log P, tokens), best first, at most beam_size
    for position in range(limit):
        length = position + 1
        candidates = [(score + log_probs[position, last, token], tokens + (token,))
                      for tokens, last, score in alive for token in range(VOCABULARY)
                      # Padding is never emitted, nor the end token first.
                      if token != PAD and not (position == 0 and token == END)]
        # Stable: ties keep the order of the hypotheses, then of the tokens.
        candidates = sorted(candidates, key=lambda candidate: -candidate[0])
        candidates = candidates[:2 * beam_size]

        def ends(tokens):
            return tokens[-1] == END or length == limit

        finished += [(score / penalty(length), score, tokens)
                     for score, tokens in candidates[:beam_size] if ends(tokens)]
        finished = sorted(finished, key=lambda entry: -entry[0])[:beam_size]
        alive = [(tokens, tokens[-1], score) for score, tokens in candidates
                 if not ends(tokens)][:beam_size]
        if not alive:
            break
        if (early_stop and len(finished) == beam_size
                and finished[-1][0] >= alive[0][2] / penalty(limit)):
            break
    normalized, score, tokens = finished[0]
    return tokens, score, normalized, length


def searched(tables, beam_size, alpha):
    """Our beam search on each stub of `tables` alone: `[(tokens, log P, normalized)]`.

    Alone, because a sentence whose search is over goes on through the steps of the
    others in its batch, which would hide a search that stops too early.
    """
    limit = tables.shape[1]

    @tf.function(input_signature=[tf.TensorSpec([1, limit, VOCABULARY, VOCABULARY])])
    def search(table):
        found = decoding.beam_search(MarkovStubs(table), sources(1), beam_size=beam_size,
                                     length_penalty=alpha, max_length=limit,
                                     extra_length=None)
        return found.ids[0], found.scores[0], found.normalized_scores[0]

    results = []
    for table in tables:
        ids, score, normalized = search(tf.constant(table[None], tf.float32))
        results.append((tuple(int(token) for token in ids.numpy() if token != PAD),
                        float(score), float(normalized)))
    return results


CASES = [(beam_size, limit, alpha) for beam_size in (2, 3, 4) for limit in (5, 6)
         for alpha in (0.0, 0.6, 1.5)]


@pytest.mark.parametrize("beam_size, limit, alpha", CASES)
def test_beam_search_prunes_as_the_reference_does(beam_size, limit, alpha):
    tables = random_tables(seed=beam_size * 100 + limit * 10 + int(alpha * 10),
                           count=STUBS, limit=limit)
    found = searched(tables, beam_size, alpha)
    for stub, (tokens, score, normalized) in enumerate(found):
        expected_tokens, expected_score, expected_normalized, _ = reference_beam_search(
            tables[stub], beam_size, alpha)
        assert tokens == expected_tokens, f"stub {stub}"
        assert score == pytest.approx(expected_score, rel=1e-5, abs=1e-5), f"stub {stub}"
        assert normalized == pytest.approx(expected_normalized, rel=1e-5,
                                           abs=1e-5), f"stub {stub}"


def test_the_reference_prunes_and_stops_early_on_these_stubs():
    # What makes the test above one of pruning: a beam narrower than the hypotheses
    # (8 − 2 tokens a step), finished sets that fill, and stops before the limit.
    early = 0
    for beam_size, limit, alpha in CASES:
        tables = random_tables(seed=beam_size * 100 + limit * 10 + int(alpha * 10),
                               count=STUBS, limit=limit)
        for table in tables:
            *_, steps = reference_beam_search(table, beam_size, alpha)
            early += steps < limit
    assert early >= len(CASES) * STUBS // 10


@pytest.mark.parametrize("beam_size, limit, alpha", CASES)
def test_stopping_early_never_changes_the_result(beam_size, limit, alpha, monkeypatch):
    tables = random_tables(seed=beam_size * 100 + limit * 10 + int(alpha * 10) + 1,
                           count=STUBS, limit=limit)
    for table in tables:  # the bound in the rules themselves
        assert (reference_beam_search(table, beam_size, alpha)[:3]
                == reference_beam_search(table, beam_size, alpha, early_stop=False)[:3])
    stopping = searched(tables, beam_size, alpha)
    # Ours with the bound removed: every sentence runs to its length limit.
    monkeypatch.setattr(beam_lib._BeamSearch, "_best_reachable",
                        lambda self, scores, limits: tf.fill(tf.shape(scores), np.inf))
    assert searched(tables, beam_size, alpha) == stopping
