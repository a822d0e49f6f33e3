"""Beam search over the key/value cache with the GNMT length penalty (§6.1).

The paper decodes with "beam search with a beam size of 4 and length penalty α = 0.6"
(Vaswani et al., 2017, §6.1), the penalty of Wu et al. (2016): lp(Y) = ((5 + |Y|) / 6)^α,
a hypothesis scoring log P(Y) / lp(Y).

Each sentence keeps `K` alive hypotheses (rows `b * K + k` of every tensor, so the cache
is reordered by one `tf.gather` per tensor; the entries that are the same for every
hypothesis, the encoder's keys and values, keep one row per sentence) and the `K` best
finished ones. A step expands the alive ones and takes the `2K` best candidates (at most
`K` of them end, so `K` alive ones always remain): those among the best `K` that ended
join the finished set, as in fairseq's beam search (so a beam of one is greedy
decoding), and the `K` best that did not end stay alive. Sizes stay fixed through the
loop, as in greedy decoding, but for sentences whose search is over, which leave the
batch between chunks of a growing cache.
Shape legend as in `common.py`; `K` is the beam size.
"""

import math

import tensorflow as tf

from keras_transformer.data.tokenizer import END_ID, PAD_ID, START_ID
from keras_transformer.decoding.common import (
    FORBIDDEN,
    chunked_loop,
    decoded,
    has_source,
    length_limits,
    log_normalizers,
    put_back,
    staying_and_leaving,
    step_options,
    token_bias,
    while_loop,
    write_position,
)
from keras_transformer.files import PAPER_BEAM_SIZE, PAPER_LENGTH_PENALTY


def gnmt_length_penalty(length, alpha):
    """Returns the float32 penalty lp = ((5 + length) / 6)^alpha of Wu et al. (2016)."""
    return ((5.0 + tf.cast(length, tf.float32)) / 6.0) ** alpha


def beam_search(model, source_ids, *, beam_size=PAPER_BEAM_SIZE,
                length_penalty=PAPER_LENGTH_PENALTY, max_length=None, extra_length=50,
                start_id=START_ID, end_id=END_ID, pad_id=PAD_ID, return_attention=False,
                cache_chunk=None, write_cache=None, num_hypotheses=None, prefix_ids=None):
    """Translates `source_ids` with beam search; returns the best hypothesis per sentence
    (or the `num_hypotheses` best).

    The best hypothesis maximises log P(Y) / lp(Y). Hypotheses end at the end token or
    at the sentence's length limit, and are never empty unless the source is (as in
    `greedy_decode`). A sentence stops searching once its worst finished hypothesis
    beats what any alive one could still reach (its log-probability can only fall, and
    lp is largest at the length limit); the loop stops when every sentence has.

    Args:
        model: a `Transformer`, or any object with its `encode`, `init_cache`,
            `decode_step`, `max_length` (and `decode` for attention).
        source_ids: int `(B, S)`, padded with `pad_id`.
        beam_size: int. Hypotheses kept per sentence (`K`; 4 in the paper).
        length_penalty: float ≥ 0. The exponent α of the length penalty (0.6 in the
            paper; 0 ranks by log-probability alone).
        max_length, extra_length, start_id, end_id, pad_id, return_attention,
            cache_chunk, write_cache: as in `greedy_decode`.
        num_hypotheses: int n with 1 ≤ n ≤ `beam_size`, or `None`. Return each
            sentence's n best finished hypotheses (an n-best list, best first) instead
            of the best alone. A sentence with fewer than n (an empty source has one)
            fills the rest with empty outputs (padding only) scored `FORBIDDEN`.
        prefix_ids: int `(B, P)` or `None`. Target pieces every hypothesis starts with
            (a target prefix, padded with `pad_id`; a row of padding forces nothing):
            the search goes on after them, and scores count them. The length limit
            still cuts; a sentence with an empty source and a prefix is searched as
            any other.

    Returns:
        A `Decoded`: the best hypothesis, its log-probability (`scores`) and its
        length-normalised score (`normalized_scores`); with `num_hypotheses`, ids
        `(B, n, L)`, lengths, scores and normalised scores `(B, n)`.
    """
    if beam_size < 1 or length_penalty < 0:
        raise ValueError(f"beam_size={beam_size} must be ≥ 1 and "
                         f"length_penalty={length_penalty} ≥ 0.")
    if num_hypotheses is not None and not 1 <= num_hypotheses <= beam_size:
        raise ValueError(f"num_hypotheses={num_hypotheses} must lie in 1..beam_size "
                         f"({beam_size}): beam search keeps no more finished ones.")
    if num_hypotheses is not None and return_attention:
        raise ValueError("return_attention covers one hypothesis per sentence: leave "
                         "num_hypotheses at None.")
    source_ids = tf.cast(source_ids, tf.int32)
    buffer_length, limits = length_limits(model, source_ids, max_length, extra_length,
                                          pad_id)
    encoder_output = model.encode(source_ids, training=False)  # (B, S, D)
    grow = getattr(model, "grow_cache", None) if cache_chunk else None
    cache = model.init_cache(encoder_output, source_ids, 0 if grow else buffer_length)
    batch = tf.shape(source_ids)[0]
    # Every hypothesis of a sentence starts from the sentence's cache; the entries that
    # stay the same for all of them (the model's `sentence_cache_entries`) are not copied.
    beam_rows = tf.range(batch * beam_size) // beam_size  # (B*K,)
    cache = _gather_cache(cache, beam_rows, None, _sentence_entries(model))
    nonempty = has_source(source_ids, start_id, end_id, pad_id)  # (B,)
    prefix = ()  # or the ids and lengths of each row's prefix, (B*K, P) and (B*K,)
    if prefix_ids is not None:
        # A column of padding more: `_prefix_bias` reads a column even where P is 0.
        prefix_ids = tf.pad(tf.cast(prefix_ids, tf.int32), [[0, 0], [0, 1]],
                            constant_values=pad_id)
        prefix_lengths = tf.reduce_sum(tf.cast(prefix_ids != pad_id, tf.int32), axis=1)
        nonempty = nonempty | (prefix_lengths > 0)
        prefix = (tf.gather(prefix_ids, beam_rows), tf.gather(prefix_lengths, beam_rows))
    row_terms = (tf.gather(nonempty, beam_rows), prefix)
    search = _BeamSearch(model, beam_size, length_penalty, end_id, pad_id, write_cache,
                         num_hypotheses)
    steps, (tokens, scores, normalized) = search.run(cache, limits, row_terms, buffer_length,
                                                     start_id, grow, cache_chunk)
    return decoded(model, tokens[..., 1:steps + 1], scores, normalized, encoder_output,
                   source_ids, start_id, pad_id, return_attention)


class _BeamSearch:
    """The loop of `beam_search`: one `step` per output position.

    Sizes stay fixed through the loop, except where the cache grows by chunks: then
    sentences whose search is over leave the batch before each chunk, their best
    hypothesis put back into the results (`set_finished_aside`).
    """

    def __init__(self, model, beam_size, length_penalty, end_id, pad_id, write_cache=None,
                 num_hypotheses=None):
        self.model = model
        self.num_hypotheses = num_hypotheses
        self.beam_size = beam_size
        self.length_penalty = length_penalty
        self.end_id = end_id
        self.pad_id = pad_id
        self.sentence_entries = _sentence_entries(model)
        # The cross-attention entries are read once per sentence when the model keeps
        # one row of them per sentence (`Transformer.decode_step`'s `hypotheses`).
        self.step_options = step_options(
            self.beam_size if self.sentence_entries else 1, write_cache)

    def run(self, cache, limits, row_terms, buffer_length, start_id, grow=None,
            cache_chunk=None):
        """Returns `(steps, (tokens (B, C+1), scores (B,), normalized (B,)))`: each
        sentence's best hypothesis.

        Args:
            cache: the cache, `B*K` rows (row `b * K + k`: hypothesis `k` of sentence `b`).
            limits: int32 `(B,)`, each sentence's most output tokens.
            row_terms: `(nonempty, prefix)`: bool `(B*K,)`, whether the row's sentence
                has a source (or a prefix), and `()` or the ids `(B*K, P)` and lengths
                `(B*K,)` of its prefix.
            grow, cache_chunk: grow the cache by `cache_chunk` positions at a time.
        """
        batch = tf.shape(limits)[0]
        tokens = write_position(tf.fill([batch * self.beam_size, buffer_length + 1],
                                        self.pad_id), 0,
                                tf.fill([batch * self.beam_size], start_id))  # (B*K, C+1)
        # Only the first beam is alive at the start: K copies would fill the beam with
        # K copies of the same candidates.
        first = tf.range(self.beam_size) == 0  # (K,)
        alive_scores = tf.where(first[None, :], 0.0, tf.fill([batch, 1], FORBIDDEN))
        empty = tf.fill([batch, self.beam_size], FORBIDDEN)  # (B, K)
        finished = (tokens, empty, empty)
        done = tf.zeros([batch], tf.bool)
        sentences = tf.range(batch)  # each sentence's place in the batch
        results = self._best(finished)  # put back when a sentence leaves the batch
        loop_length = tf.reduce_max(limits)

        def not_done(index, alive_tokens, alive_scores, finished, done, *_):
            return tf.logical_and(index < loop_length, tf.logical_not(tf.reduce_all(done)))

        def step(index, alive_tokens, alive_scores, finished, done, limits, row_terms,
                 sentences, results, cache):
            del done  # recomputed from the new state
            index, alive_tokens, alive_scores, finished, done, cache = self.step(
                index, alive_tokens, alive_scores, finished, limits, row_terms, cache)
            return (index, alive_tokens, alive_scores, finished, done, limits, row_terms,
                    sentences, results, cache)

        loop_vars = (tf.constant(0), tokens, alive_scores, finished, done, limits, row_terms,
                     sentences, results, cache)
        if grow is None:
            outputs = while_loop(not_done, step, loop_vars)
        else:
            outputs = chunked_loop(not_done, step, loop_vars, grow=grow, chunk=cache_chunk,
                                   buffer_length=buffer_length,
                                   compact=self.set_finished_aside)
        steps, _, _, finished, _, _, _, sentences, results, _ = outputs
        return steps, put_back(results, sentences, self._best(finished))

    def _best(self, finished):
        """Returns the best finished hypothesis of each sentence: `(tokens (B, C+1),
        scores (B,), normalized (B,))` (finished ones are sorted, best first); with
        `num_hypotheses` n, the n best: `(tokens (B, n, C+1), scores (B, n),
        normalized (B, n))`."""
        finished_tokens, finished_scores, finished_normalized = finished
        if self.num_hypotheses is not None:
            width = finished_tokens.shape[-1] or tf.shape(finished_tokens)[-1]
            count = self.num_hypotheses
            return (tf.reshape(finished_tokens, [-1, self.beam_size, width])[:, :count],
                    finished_scores[:, :count], finished_normalized[:, :count])
        rows = tf.range(tf.shape(finished_scores)[0]) * self.beam_size  # (B,)
        return (tf.gather(finished_tokens, rows), finished_scores[:, 0],
                finished_normalized[:, 0])

    def set_finished_aside(self, alive_tokens, alive_scores, finished, done, limits,
                           row_terms, sentences, results, cache):
        """Returns the loop state without the sentences that are `done`, their best
        hypotheses put back into `results`."""
        staying, leaving = staying_and_leaving(done)  # sentences
        results = put_back(results, tf.gather(sentences, leaving), tf.nest.map_structure(
            lambda value: tf.gather(value, leaving), self._best(finished)))
        staying_rows = tf.reshape(staying[:, None] * self.beam_size
                               + tf.range(self.beam_size)[None, :], [-1])  # (B'*K,)
        finished_tokens, finished_scores, finished_normalized = finished
        by_sentence = tf.nest.map_structure(
            lambda value: tf.gather(value, staying),
            (alive_scores, finished_scores, finished_normalized, done, limits, sentences))
        by_row = tf.nest.map_structure(
            lambda value: tf.gather(value, staying_rows),
            (alive_tokens, finished_tokens, row_terms))
        cache = _gather_cache(cache, staying_rows, staying, self.sentence_entries)
        alive_scores, finished_scores, finished_normalized, done, limits, sentences = (
            by_sentence)
        alive_tokens, finished_tokens, row_terms = by_row
        return (alive_tokens, alive_scores,
                (finished_tokens, finished_scores, finished_normalized), done, limits,
                row_terms, sentences, results, cache)

    def step(self, index, alive_tokens, alive_scores, finished, limits, row_terms, cache):
        """Decodes position `index` for every alive hypothesis; returns the loop state."""
        nonempty, prefix = row_terms
        batch = tf.shape(alive_scores)[0]
        logits, cache = self.model.decode_step(alive_tokens[:, index], cache, index,
                                               **self.step_options)
        logits = tf.cast(logits, tf.float32)  # (B*K, V)
        vocabulary = logits.shape[1] or tf.shape(logits)[1]
        normalizers = log_normalizers(logits)  # (B*K, 1)
        # The log-probabilities plus the scores so far, the row terms added at once.
        candidates = (logits + token_bias(vocabulary, index, self.end_id, self.pad_id)
                      + (tf.reshape(alive_scores, [-1, 1]) - normalizers))  # (B*K, V)
        if prefix:
            candidates += _prefix_bias(*prefix, index, vocabulary)
        top_scores, top_indices = top_k_by_blocks(
            tf.reshape(candidates, [batch, self.beam_size * vocabulary]),
            2 * self.beam_size)  # (B, 2K)
        # An empty source's translation is the end token alone (see `token_bias`), set
        # at the first step only; the column is taken outside the tf.cond, whose
        # operands LiteRT's IF copies at every step.
        end_log_probs = logits[:, self.end_id] - normalizers[:, 0]  # (B*K,)
        top_scores, top_indices = tf.cond(
            tf.equal(index, 0),
            lambda: self._end_empty_sources(top_scores, top_indices, nonempty,
                                            end_log_probs),
            lambda: (top_scores, top_indices))
        origins = _flat_rows(top_indices // vocabulary, self.beam_size)  # (B*2K,)
        top_ids = top_indices % vocabulary  # (B, 2K)
        top_tokens = write_position(tf.gather(alive_tokens, origins), index + 1,
                                    tf.reshape(top_ids, [-1]))  # (B*2K, C + 1)
        length = index + 1
        ended = (top_ids == self.end_id) | (length >= limits)[:, None]  # (B, 2K)

        # Alive: the K best candidates that did not end.
        alive_scores, picks = tf.math.top_k(tf.where(ended, FORBIDDEN, top_scores),
                                            self.beam_size)  # (B, K)
        rows = _flat_rows(picks, 2 * self.beam_size)  # (B*K,)
        alive_tokens = tf.gather(top_tokens, rows)
        # Hypotheses move only within their sentence: its entries stay where they are.
        cache = _gather_cache(cache, tf.gather(origins, rows), None, self.sentence_entries)

        # Finished: real candidates (not from empty slots or forbidden tokens) among the
        # step's best K that ended within their sentence's limit compete with the finished
        # ones. An ended candidate ranked below K would not have been kept by a beam of K.
        in_beam = tf.range(2 * self.beam_size) < self.beam_size  # (2K,): top_k sorts
        entering = (ended & in_beam[None, :] & (top_scores > FORBIDDEN / 2)
                    & (length <= limits)[:, None])
        finished = self._merge(finished, top_tokens, top_scores, entering, length)
        worst_finished = finished[2][:, -1]  # (B,)
        # Nothing alive is left when only forbidden tokens remain (an empty source).
        done = (length >= limits) | (alive_scores[:, 0] <= FORBIDDEN / 2) | (
            worst_finished >= self._best_reachable(alive_scores[:, 0], limits))
        return length, alive_tokens, alive_scores, finished, done, cache

    def _end_empty_sources(self, top_scores, top_indices, nonempty, end_log_probs):
        """Returns the first step's `(top_scores, top_indices)` `(B, 2K)`, those of a
        sentence whose source is empty (`nonempty` False) replaced by one candidate, the
        end token after its first hypothesis (the only one alive, scored 0), and empty
        slots (FORBIDDEN, padding). `nonempty` and `end_log_probs` have `B*K` rows."""
        empty = tf.logical_not(nonempty[::self.beam_size])[:, None]  # (B, 1)
        first_slot = tf.range(2 * self.beam_size)[None, :] == 0  # (1, 2K)
        forced_scores = tf.where(first_slot, end_log_probs[::self.beam_size, None],
                                 FORBIDDEN)  # (B, 2K)
        forced_indices = tf.where(first_slot, self.end_id, self.pad_id)  # (1, 2K)
        return (tf.where(empty, forced_scores, top_scores),
                tf.where(empty, forced_indices, top_indices))

    def _merge(self, finished, tokens, scores, entering, length):
        """Returns the K best of the finished hypotheses and the `entering` candidates."""
        finished_tokens, finished_scores, finished_normalized = finished
        batch = tf.shape(finished_scores)[0]
        penalty = gnmt_length_penalty(length, self.length_penalty)
        normalized = tf.where(entering, scores / penalty, FORBIDDEN)  # (B, 2K)
        width = tokens.shape[-1] or tf.shape(tokens)[-1]  # C + 1, static when it can be
        all_tokens = tf.reshape(tf.concat(
            [tf.reshape(finished_tokens, [batch, -1, width]),
             tf.reshape(tokens, [batch, -1, width])], axis=1), [-1, width])  # (B*3K, C+1)
        all_scores = tf.reshape(tf.concat([finished_scores, scores], axis=1), [-1])  # (B*3K,)
        finished_normalized, picks = tf.math.top_k(
            tf.concat([finished_normalized, normalized], axis=1), self.beam_size)  # (B, K)
        rows = _flat_rows(picks, 3 * self.beam_size)  # (B*K,)
        finished_scores = tf.reshape(tf.gather(all_scores, rows), [-1, self.beam_size])
        return tf.gather(all_tokens, rows), finished_scores, finished_normalized

    def _best_reachable(self, best_alive_scores, limits):
        """Upper bound `(B,)` on the normalised score any alive hypothesis can reach.

        Log-probabilities only fall as tokens are added, and for α ≥ 0 dividing a
        negative score by the largest penalty (at the length limit) raises it the most.
        """
        return best_alive_scores / gnmt_length_penalty(limits, self.length_penalty)


def _prefix_bias(prefix_ids, prefix_lengths, index, vocabulary):
    """Returns float32 `(B*K, V)`: FORBIDDEN at every token but the prefix's at `index`
    in the rows whose prefix `(B*K, P)` is longer than `index` (`prefix_lengths`), 0
    elsewhere. Candidates from other tokens then rank with the empty slots, below every
    real one, so a step inside the prefix keeps one alive hypothesis per sentence."""
    last = tf.shape(prefix_ids)[1] - 1
    forced = tf.gather(prefix_ids, tf.minimum(index, last), axis=1)  # (B*K,)
    forcing = tf.cast(index < prefix_lengths, tf.float32)[:, None]  # (B*K, 1)
    return FORBIDDEN * forcing * (1.0 - tf.one_hot(forced, vocabulary))


def top_k_by_blocks(values, k):
    """Returns `tf.math.top_k(values, k)` of float `(B, L)` values, ties included.

    Why not `tf.math.top_k` itself: LiteRT's TOPK_V2 visits the elements one by one,
    and over the `K × V` candidates of a beam step (32,000 per sentence at beam 4 and
    a vocabulary of 8,000) it was an eighth of a step at batch 32. Here the row is cut
    into blocks of `width` columns, and a vectorised max of each block picks the `k`
    blocks with the largest maxima, which hold the `k` largest values: a block left
    out has `k` blocks before it whose maxima rank above its every element. `top_k`
    then runs over those `k` blocks, kept in their order along the row, so ties go to
    the lower index as in `tf.math.top_k`. Falls back to `tf.math.top_k` when `L` is
    not static or the blocks would save nothing.
    """
    length = values.shape[-1]
    width = _block_width(length, k)
    if width is None:
        return tf.math.top_k(values, k)
    blocks = tf.reshape(values, [-1, length // width, width])  # (B, L/w, w)
    _, chosen = tf.math.top_k(tf.reduce_max(blocks, axis=-1), k)  # (B, k)
    chosen = tf.sort(chosen, axis=-1)  # along the row, for the ties
    candidates = tf.reshape(tf.gather(blocks, chosen, batch_dims=1), [-1, k * width])
    top_values, positions = tf.math.top_k(candidates, k)  # (B, k)
    indices = tf.gather(chosen, positions // width, batch_dims=1) * width + positions % width
    return top_values, indices


def _block_width(length, k):
    """The block width of `top_k_by_blocks` for rows of `length`, or `None`.

    The largest divisor of `length` up to √length (√length blocks of √length columns
    when it has one), so long as blocks are 8 columns or more and there are `4k` or more.
    """
    if length is None:
        return None
    width = next(w for w in range(math.isqrt(length), 0, -1) if length % w == 0)
    return width if width >= 8 and length // width >= 4 * k else None


def _flat_rows(indices, width):
    """Returns rows `(B*n,)` of a `(B*width, ...)` tensor for per-sentence `indices` `(B, n)`."""
    offsets = tf.range(tf.shape(indices)[0]) * width  # (B,)
    return tf.reshape(indices + offsets[:, None], [-1])


def _sentence_entries(model):
    """Returns the names of the cache entries `model` keeps one row of per sentence."""
    return tuple(getattr(model, "sentence_cache_entries", ()))


def _gather_cache(cache, rows, sentence_rows, sentence_entries):
    """Gathers `rows` (axis 0) of the cache's per-hypothesis entries.

    Entries named in `sentence_entries` (the model's `sentence_cache_entries`: the
    projected encoder output, the source mask) hold one row per sentence, read by all
    of its hypotheses (`decode_step`'s `hypotheses`): they gather `sentence_rows`, or
    stay as they are when it is `None` (hypotheses reordered within their sentences).
    Why: at beam 4, copies of the cross-attention keys and values for every hypothesis
    were as many bytes as the self-attention cache, copied by TFLite's loop at every
    step and read by 4 matrix-vector products where one small matmul does.
    """
    if isinstance(cache, dict):
        return {name: (value if sentence_rows is None else tf.nest.map_structure(
                    lambda tensor: tf.gather(tensor, sentence_rows), value))
                if name in sentence_entries
                else _gather_cache(value, rows, sentence_rows, sentence_entries)
                for name, value in cache.items()}
    if isinstance(cache, (list, tuple)):
        return type(cache)(_gather_cache(value, rows, sentence_rows, sentence_entries)
                           for value in cache)
    return tf.gather(cache, rows)
