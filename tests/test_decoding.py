"""Decoding contracts: cached = uncached, stub sequences, batching, graph and TFLite runs."""

import hypothesis
import hypothesis.strategies
import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_transformer import Transformer, decoding
from keras_transformer.decoding import portable
from tests.numerics import assert_close_in_ulps

# Compares float computations: also run on Eigen's kernels in CI (tests/numerics.py).
pytestmark = pytest.mark.numerics

PAD, START, END = 0, 2, 3
MAX_LENGTH = 10

# Three sentences of different lengths, padded: padding must change nothing.
SOURCES = [[5, 6, 7, END], [8, 9, 10, 11, 12, 13, END], [14, END]]


def padded(sentences, length=None):
    length = length or max(len(sentence) for sentence in sentences)
    return np.array([sentence + [PAD] * (length - len(sentence)) for sentence in sentences],
                    np.int32)


class PrefixTreeModel:
    """Stands in for `Transformer`: next-token probabilities are a table per prefix.

    `tree` maps a prefix to `{token: probability}`. A prefix starts with the sentence's
    first source token (so sentences of one batch can follow different trees), then the
    output tokens so far. Prefixes outside the tree emit `fallback_token` with
    probability 1. The decoding state (the prefix's row) lives in the cache, so beam
    search must reorder the cache for this model to work.
    """

    def __init__(self, tree, vocabulary_size=16, max_length=32, fallback_token=END):
        self.max_length = max_length
        self.vocabulary_size = vocabulary_size
        prefixes = sorted(set(tree) | {prefix + (token,) for prefix, options in tree.items()
                                       for token in options}, key=lambda p: (len(p), p))
        state = {prefix: i for i, prefix in enumerate(prefixes)}
        sink = len(prefixes)
        probabilities = np.full((sink + 1, vocabulary_size), 1e-9)
        probabilities[:, fallback_token] = 1.0
        transitions = np.full((sink + 1, vocabulary_size), sink)
        for prefix, options in tree.items():
            probabilities[state[prefix]] = 1e-9
            for token, probability in options.items():
                probabilities[state[prefix], token] = probability
                transitions[state[prefix], token] = state[prefix + (token,)]
        first_state = np.full(vocabulary_size, sink)
        for prefix in prefixes:
            if len(prefix) == 1:
                first_state[prefix[0]] = state[prefix]
        self.log_probabilities = tf.constant(np.log(probabilities), tf.float32)
        self.transitions = tf.constant(transitions, tf.int32)
        self.first_state = tf.constant(first_state, tf.int32)

    def encode(self, source_ids, training=None):
        return tf.zeros(tf.concat([tf.shape(source_ids), [1]], 0))  # (B, S, 1)

    def init_cache(self, encoder_output, source_ids, max_length):
        return {"state": tf.gather(self.first_state, source_ids[:, 0])}  # (B,)

    def decode_step(self, token_ids, cache, index):
        # The start token (index 0) leaves the state at the sentence's root.
        moved = tf.gather_nd(self.transitions, tf.stack([cache["state"], token_ids], 1))
        state = tf.where(index == 0, cache["state"], moved)  # (B,)
        return tf.gather(self.log_probabilities, state), {"state": state}


def sequence_tree(key, tokens, probability=0.9):
    """A tree in which sentence `key` spells `tokens`, each with `probability`."""
    return {(key, *tokens[:i]): {token: probability, 15: 1 - probability}
            for i, token in enumerate(tokens)}


@pytest.fixture(scope="module")
def model():
    keras.utils.set_random_seed(1)
    return Transformer.from_preset("tiny")


@pytest.fixture(scope="module")
def greedy(model):
    return decoding.decode_function(decoding.greedy_decode, model, max_length=MAX_LENGTH)


@pytest.fixture(scope="module")
def beam(model):
    return decoding.decode_function(decoding.beam_search, model, max_length=MAX_LENGTH)


def teacher_forced_log_probabilities(model, source_ids, ids):
    """Log-probabilities `(B, L)` the full decoder pass gives to `ids`, 0 at padding."""
    decoder_input = np.concatenate([np.full((len(ids), 1), START), ids[:, :-1]], axis=1)
    logits = model.decode(decoder_input, model.encode(source_ids), source_ids)
    log_probs = tf.nn.log_softmax(logits).numpy()
    chosen = np.take_along_axis(log_probs, ids[..., None], axis=-1)[..., 0]
    return np.where(ids == PAD, 0.0, chosen)


def test_cached_steps_match_the_full_decoder_pass(model, greedy):
    source_ids = padded(SOURCES)
    ids = greedy(source_ids).ids.numpy()
    decoder_input = np.concatenate([np.full((len(ids), 1), START), ids[:, :-1]], axis=1)
    encoder_output = model.encode(source_ids)
    full_logits = model.decode(decoder_input, encoder_output, source_ids).numpy()

    cache = model.init_cache(encoder_output, source_ids, ids.shape[1])
    decode_step = tf.function(model.decode_step)
    for index in range(ids.shape[1]):
        logits, cache = decode_step(tf.constant(decoder_input[:, index]), cache,
                                    tf.constant(index))
        assert_close_in_ulps(logits.numpy(), full_logits[:, index])
    np.testing.assert_array_equal(ids, np.argmax(full_logits[..., 1:], axis=-1) + 1)


def test_cached_greedy_equals_uncached_greedy(model, greedy):
    source_ids = padded(SOURCES)
    uncached = tf.function(lambda ids: decoding.uncached_greedy_decode(
        model, ids, max_length=MAX_LENGTH))(source_ids)
    cached = greedy(source_ids)
    assert cached.ids.shape == (3, MAX_LENGTH)
    np.testing.assert_array_equal(cached.ids.numpy(), uncached.ids.numpy())
    assert_close_in_ulps(cached.scores.numpy(), uncached.scores.numpy())


def test_greedy_spells_the_stub_sequence_and_stops_at_end():
    stub = PrefixTreeModel(sequence_tree(5, [7, 8, 9, END]))
    decoded = decoding.greedy_decode(stub, padded([[5, 6]]), max_length=20)
    np.testing.assert_array_equal(decoded.ids.numpy(), [[7, 8, 9, END]])
    np.testing.assert_array_equal(decoded.lengths.numpy(), [4])
    np.testing.assert_allclose(decoded.scores.numpy(), [4 * np.log(0.9)], rtol=1e-5)
    assert decoded.normalized_scores is None and decoded.attention is None


def test_finished_sentences_emit_padding_until_the_last_ends():
    stub = PrefixTreeModel({**sequence_tree(5, [7, END]), **sequence_tree(6, [9, 10, 11, END])})
    decoded = decoding.greedy_decode(stub, padded([[5, 1, 1], [6]]))
    np.testing.assert_array_equal(decoded.ids.numpy(), [[7, END, PAD, PAD], [9, 10, 11, END]])
    np.testing.assert_array_equal(decoded.lengths.numpy(), [2, 4])
    np.testing.assert_allclose(decoded.scores.numpy(), np.log([0.9 ** 2, 0.9 ** 4]), rtol=1e-5)


def test_length_limit_is_source_length_plus_extra_capped_by_max_length():
    stub = PrefixTreeModel({}, fallback_token=4)  # never emits the end token
    source_ids = padded([[5, 6, 7], [5], [5, 6, 7, 8, 9, 10]])
    decoded = decoding.greedy_decode(stub, source_ids, extra_length=2, max_length=7)
    np.testing.assert_array_equal(decoded.lengths.numpy(), [5, 3, 7])
    np.testing.assert_array_equal(decoded.ids.numpy()[1], [4, 4, 4, PAD, PAD, PAD, PAD])
    # The model's own limit: start token + output must fit its positional table.
    unbounded = decoding.greedy_decode(PrefixTreeModel({}, fallback_token=4, max_length=9),
                                       source_ids, extra_length=None)
    np.testing.assert_array_equal(unbounded.lengths.numpy(), [8, 8, 8])


@pytest.mark.parametrize("decode", [decoding.greedy_decode, decoding.beam_search])
def test_unknown_source_width_sizes_the_buffer_by_the_batch(decode):
    stub = PrefixTreeModel({}, fallback_token=4, max_length=64)  # never ends
    source_ids = padded([[5, 6, 7], [5]])
    static = decode(stub, source_ids, extra_length=2)
    dynamic = tf.function(lambda ids: decode(stub, ids, extra_length=2),
                          input_signature=[tf.TensorSpec([None, None], tf.int32)])
    found = dynamic(source_ids)
    # The caches hold width + extra_length positions, not the model's 63.
    buffer, _ = tf.function(
        lambda ids: decoding.common.length_limits(stub, ids, None, 2, PAD),
        input_signature=[tf.TensorSpec([None, None], tf.int32)])(source_ids)
    assert int(buffer) == source_ids.shape[1] + 2
    np.testing.assert_array_equal(found.ids.numpy(), static.ids.numpy())
    np.testing.assert_array_equal(found.lengths.numpy(), [5, 3])


def test_pad_is_never_emitted():
    stub = PrefixTreeModel({(5,): {PAD: 0.6, 7: 0.4}, (5, 7): {END: 1.0}})
    np.testing.assert_array_equal(
        decoding.greedy_decode(stub, padded([[5]])).ids.numpy(), [[7, END]])


@pytest.mark.parametrize("decode", [decoding.greedy_decode, decoding.beam_search])
def test_a_sentence_with_a_source_is_never_translated_to_nothing(decode):
    # END first is the likeliest token and the one-token hypothesis: greedy decoding
    # would pick it, and beam search too (log 0.6 beats log 0.4 / lp(2) at α 0.6).
    stub = PrefixTreeModel({(5,): {END: 0.6, 7: 0.4}, (5, 7): {END: 1.0}})
    decoded = decode(stub, padded([[5, 6, END]]))
    np.testing.assert_array_equal(decoded.lengths.numpy(), [2])
    np.testing.assert_array_equal(decoded.ids.numpy()[:, :2], [[7, END]])
    # The score is the model's log-probability, not one renormalised without END.
    np.testing.assert_allclose(decoded.scores.numpy(), np.log([0.4]), rtol=1e-5)


@pytest.mark.parametrize("decode", [decoding.greedy_decode, decoding.beam_search])
def test_an_empty_source_is_translated_to_nothing_beside_others(decode):
    # Source ids of an empty sentence are START, END; the model prefers 7 to END there.
    stub = PrefixTreeModel({(START,): {7: 0.9, END: 0.1}, (START, 7): {END: 1.0},
                            **sequence_tree(5, [9, END])})
    decoded = decode(stub, padded([[START, END], [5, 6, END]]))
    np.testing.assert_array_equal(decoded.lengths.numpy(), [1, 2])
    np.testing.assert_array_equal(decoded.ids.numpy()[:, :2], [[END, PAD], [9, END]])
    np.testing.assert_allclose(decoded.scores.numpy(), np.log([0.1, 0.9 ** 2]), rtol=1e-5)


@pytest.mark.parametrize("decoder", ["greedy", "beam"])
def test_batch_decodes_like_each_sentence_alone(decoder, request):
    decode = request.getfixturevalue(decoder)
    batch = decode(padded(SOURCES, length=9))
    for i, sentence in enumerate(SOURCES):
        alone = decode(padded([sentence]))
        np.testing.assert_array_equal(batch.ids.numpy()[i], alone.ids.numpy()[0])
        assert_close_in_ulps(batch.scores.numpy()[i], alone.scores.numpy()[0])


def test_graph_decoding_equals_eager(model, greedy):
    source_ids = padded(SOURCES[:2])
    eager = decoding.greedy_decode(model, source_ids, max_length=4)
    graph = greedy(source_ids)
    np.testing.assert_array_equal(eager.ids.numpy(), graph.ids.numpy()[:, :4])


@pytest.mark.parametrize("decoder", ["greedy", "beam"])
def test_xla_compiled_decoding_equals_the_graph(model, decoder, request):
    decode = {"greedy": decoding.greedy_decode, "beam": decoding.beam_search}[decoder]
    compiled = decoding.decode_function(decode, model, jit_compile=True,
                                        max_length=MAX_LENGTH)
    for sources in (SOURCES, SOURCES[:1]):  # source widths 7 and 4, batches 3 and 1
        source_ids = padded(sources)
        expected = request.getfixturevalue(decoder)(source_ids)
        got = compiled(source_ids)
        np.testing.assert_array_equal(got.ids.numpy(), expected.ids.numpy())
        assert_close_in_ulps(got.scores.numpy(), expected.scores.numpy())


def test_pad_width_rounds_up_to_the_multiple_with_padding():
    ids = decoding.pad_width(tf.constant([[5, 6, END]]), 4).numpy()
    np.testing.assert_array_equal(ids, [[5, 6, END, PAD]])
    assert decoding.pad_width(tf.constant([[5, 6, 7, END]]), 4).shape == (1, 4)
    # Never past the limit (a model's max_length), never cut below the width.
    assert decoding.pad_width(tf.constant([[5, 6, 7, 8, 9, END]]), 4, limit=7).shape == (1, 7)
    assert decoding.pad_width(tf.constant([[5, 6, 7, END]]), 8, limit=3).shape == (1, 4)


def test_attention_covers_real_source_tokens_only(model, greedy):
    source_ids = padded(SOURCES)
    decoded = decoding.greedy_decode(model, source_ids, max_length=3, return_attention=True)
    attention = decoded.attention.numpy()
    assert attention.shape == (3, model.num_layers, model.num_heads, 3, source_ids.shape[1])
    np.testing.assert_allclose(attention.sum(axis=-1), 1.0, rtol=1e-5)
    padding = (source_ids == PAD)[:, None, None, None, :]
    assert np.all(np.where(padding, attention, 0.0) < 1e-6)


def test_beam_search_finds_the_sequence_greedy_misses():
    # The likelier first token (7) only leads to unlikely continuations.
    stub = PrefixTreeModel({(5,): {7: 0.6, 8: 0.4}, (5, 7): {9: 0.4, 10: 0.3, 11: 0.3},
                            (5, 8): {12: 1.0}})
    source_ids = padded([[5]])
    greedy = decoding.greedy_decode(stub, source_ids)
    np.testing.assert_array_equal(greedy.ids.numpy(), [[7, 9, END]])
    found = decoding.beam_search(stub, source_ids, beam_size=2, length_penalty=0.0)
    # Shape (1, 3): the search stopped once nothing alive could beat what had finished.
    np.testing.assert_array_equal(found.ids.numpy(), [[8, 12, END]])
    np.testing.assert_allclose(found.scores.numpy(), np.log([0.4]), rtol=1e-5)
    np.testing.assert_allclose(found.normalized_scores.numpy(), np.log([0.4]), rtol=1e-5)


def test_length_penalty_ranks_hypotheses_by_the_gnmt_formula():
    short, long = [7, END], [8, 9, 10, END]
    stub = PrefixTreeModel({(5,): {7: 0.5, 8: 0.45, 15: 0.05}, (5, 7): {END: 1.0},
                            (5, 8): {9: 0.9, 15: 0.1}, (5, 8, 9): {10: 0.9, 15: 0.1},
                            (5, 8, 9, 10): {END: 1.0}})
    log_probabilities = {tuple(short): np.log(0.5), tuple(long): np.log(0.45 * 0.9 * 0.9)}
    chosen = {}
    for alpha in (0.0, 0.6, 2.0):
        # lp(Y) = ((5 + |Y|) / 6)^α (Wu et al., 2016), |Y| counting the end token.
        normalized = {ids: score / ((5 + len(ids)) / 6) ** alpha
                      for ids, score in log_probabilities.items()}
        best = max(normalized, key=normalized.get)
        found = decoding.beam_search(stub, padded([[5]]), beam_size=4, length_penalty=alpha)
        np.testing.assert_array_equal(found.ids.numpy()[0, :len(best)], best)
        np.testing.assert_allclose(found.scores.numpy(), [log_probabilities[best]], rtol=1e-5)
        np.testing.assert_allclose(found.normalized_scores.numpy(), [normalized[best]],
                                   rtol=1e-5)
        chosen[alpha] = best
    assert chosen == {0.0: tuple(short), 0.6: tuple(short), 2.0: tuple(long)}


def test_beam_of_one_without_penalty_is_greedy(model, greedy):
    source_ids = padded(SOURCES[:2])
    eager = decoding.beam_search(model, source_ids, beam_size=1, length_penalty=0.0,
                                 max_length=4)
    np.testing.assert_array_equal(eager.ids.numpy(), greedy(source_ids).ids.numpy()[:, :4])


def test_beam_scores_are_the_models_log_probabilities(model, beam):
    # Scores of the returned hypotheses (built through cache reordering) must equal what
    # one full decoder pass gives them.
    source_ids = padded(SOURCES)
    found = beam(source_ids)
    ids = found.ids.numpy()
    expected = teacher_forced_log_probabilities(model, source_ids, ids).sum(axis=1)
    assert_close_in_ulps(found.scores.numpy(), expected)
    penalty = ((5 + found.lengths.numpy()) / 6) ** 0.6
    assert_close_in_ulps(found.normalized_scores.numpy(), expected / penalty)


def test_beam_attention_is_the_models_attention_reading_the_chosen_output(model):
    source_ids = padded(SOURCES)
    found = decoding.beam_search(model, source_ids, beam_size=3, max_length=6,
                                 return_attention=True)
    ids = found.ids.numpy()
    assert found.attention.shape == (3, model.num_layers, model.num_heads, ids.shape[1],
                                     source_ids.shape[1])
    # The reference: the model's own weights while it reads START + the chosen ids,
    # computed sentence by sentence, without padding.
    for row, (source, output) in enumerate(zip(SOURCES, ids)):
        length = int(found.lengths[row])
        decoder_input = np.array([[START, *output[:length - 1]]], np.int32)
        one_source = np.array([source], np.int32)
        expected = model.cross_attention_weights(decoder_input, model.encode(one_source),
                                                 one_source).numpy()[0]  # (N, H, L, S)
        np.testing.assert_allclose(
            found.attention.numpy()[row, :, :, :length, :len(source)], expected,
            atol=1e-5)
        assert np.all(found.attention.numpy()[row, :, :, :length, len(source):] < 1e-6)


@pytest.mark.parametrize("decode", [
    decoding.greedy_decode,
    pytest.param(decoding.beam_search, marks=pytest.mark.slow)])
def test_decoding_converts_to_tflite_builtins_with_the_same_ids(model, decode):
    from ai_edge_litert.interpreter import Interpreter

    # One padded sentence of a fixed shape, as an on-device export would trace it.
    source_ids = padded(SOURCES[:1], length=7)
    module = tf.Module()
    module.model = model
    # Keras 3 variables tracked only through a tf.Module do not reach the converter's
    # SavedModel: track the raw variables too, or the WHILE body reads unset variables.
    module.model_variables = [variable.value for variable in model.variables]
    module.translate = tf.function(
        lambda ids: decode(model, ids, max_length=MAX_LENGTH).ids,
        input_signature=[tf.TensorSpec(source_ids.shape, tf.int32)])
    converter = tf.lite.TFLiteConverter.from_concrete_functions(
        [module.translate.get_concrete_function()], module)
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
    interpreter = Interpreter(model_content=converter.convert())
    interpreter.allocate_tensors()
    interpreter.set_tensor(interpreter.get_input_details()[0]["index"], source_ids)
    interpreter.invoke()
    ids = interpreter.get_tensor(interpreter.get_output_details()[0]["index"])
    np.testing.assert_array_equal(ids, module.translate(source_ids).numpy())


def test_beam_search_traces_with_a_static_batch_of_one(model):
    # A fixed input shape of one sentence is what an on-device export traces (the
    # TFLite test covers greedy decoding in that setting).
    source_ids = padded(SOURCES[:1])
    traced = tf.function(lambda ids: decoding.beam_search(model, ids, max_length=3).ids,
                         input_signature=[tf.TensorSpec(source_ids.shape, tf.int32)])
    np.testing.assert_array_equal(
        traced(source_ids).numpy(),
        decoding.beam_search(model, source_ids, max_length=3).ids.numpy())


def test_gathering_cache_rows_reorders_the_hypotheses(model):
    # Beam search reorders hypotheses by gathering axis 0 of every cache tensor: after
    # the gather, steps must continue exactly as if the reordered rows had been decoded
    # from the start.
    source_ids = padded(SOURCES[:2])
    targets = np.array([[START, 20, 21, 22, 23], [START, 30, 31, 32, 33]], np.int32)
    rows = np.array([1, 0, 1])
    step = tf.function(model.decode_step)

    def run(source_ids, cache, targets, indices):
        logits = []
        for index in indices:
            step_logits, cache = step(tf.constant(targets[:, index]), cache,
                                      tf.constant(index))
            logits.append(step_logits.numpy())
        return logits, cache

    cache = model.init_cache(model.encode(source_ids), source_ids, 6)
    _, cache = run(source_ids, cache, targets, range(3))
    cache = tf.nest.map_structure(lambda tensor: tf.gather(tensor, rows), cache)
    reordered, _ = run(source_ids, cache, targets[rows], range(3, 5))

    fresh_sources = source_ids[rows]
    fresh = model.init_cache(model.encode(fresh_sources), fresh_sources, 6)
    expected, _ = run(fresh_sources, fresh, targets[rows], range(5))
    assert_close_in_ulps(reordered, expected[3:])


@pytest.mark.parametrize("decode", [decoding.greedy_decode, decoding.beam_search])
@pytest.mark.parametrize("chunk", [1, 3, 100])
def test_a_cache_grown_chunk_by_chunk_decodes_like_one_allocated_at_once(model, decode,
                                                                         chunk):
    # The untrained tiny model runs every sentence to its limit (source + 50, capped at
    # 30): several chunks, and a last one cut short by the limit.
    source_ids = padded(SOURCES)
    options = dict(max_length=30)
    expected = decoding.decode_function(decode, model, **options)(source_ids)
    found = decoding.decode_function(decode, model, cache_chunk=chunk,
                                     **options)(source_ids)
    assert expected.ids.shape[1] > 3
    np.testing.assert_array_equal(found.ids.numpy(), expected.ids.numpy())
    assert_close_in_ulps(found.scores.numpy(), expected.scores.numpy())


@pytest.mark.parametrize("decode", [decoding.greedy_decode, decoding.beam_search])
@pytest.mark.parametrize("chunk", [1, 2])
def test_finished_sentences_leave_the_batch_without_changing_any_output(model, decode,
                                                                         chunk):
    # Limits of source length + 2 end the three sentences at different steps (the
    # untrained model runs each to its limit), the middle one last: finished rows leave
    # the batch between chunks, and their outputs must come back in their places.
    source_ids = padded(SOURCES)
    expected = decoding.decode_function(decode, model, extra_length=2)(source_ids)
    found = decoding.decode_function(decode, model, extra_length=2,
                                     cache_chunk=chunk)(source_ids)
    assert len(set(expected.lengths.numpy().tolist())) == len(SOURCES)
    np.testing.assert_array_equal(found.ids.numpy(), expected.ids.numpy())
    assert_close_in_ulps(found.scores.numpy(), expected.scores.numpy())
    if expected.normalized_scores is not None:
        assert_close_in_ulps(found.normalized_scores.numpy(),
                             expected.normalized_scores.numpy())


def test_grow_cache_keeps_what_was_written_and_appends_empty_positions(model):
    source_ids = padded(SOURCES)
    cache = model.init_cache(model.encode(source_ids), source_ids, 2)
    cache = {**cache, "self_keys": [keys + 1.0 for keys in cache["self_keys"]],
             "self_values": [values + 2.0 for values in cache["self_values"]]}
    grown = model.grow_cache(cache, 5)
    for keys, values in zip(grown["self_keys"], grown["self_values"]):
        np.testing.assert_array_equal(keys.numpy()[..., :2], 1.0)
        np.testing.assert_array_equal(keys.numpy()[..., 2:], 0.0)
        assert keys.shape[3] == 5 and values.shape[2] == 5
        np.testing.assert_array_equal(values.numpy()[:, :, :2], 2.0)
        np.testing.assert_array_equal(values.numpy()[:, :, 2:], 0.0)
    np.testing.assert_array_equal(grown["cross_keys"][0], cache["cross_keys"][0])
    assert model.grow_cache(grown, 3)["self_values"][0].shape[2] == 5


class GatherEveryCacheEntry:
    """The model, with beam search told to reorder every entry of its cache."""

    sentence_cache_entries = ()

    def __init__(self, model):
        self.model = model

    def __getattr__(self, name):
        return getattr(self.model, name)


@pytest.mark.parametrize("cache_chunk", [None, 2])
def test_beam_search_shares_only_cache_entries_shared_by_a_sentences_hypotheses(
        model, cache_chunk):
    # Entries in `sentence_cache_entries` keep one row per sentence, read by all of its
    # hypotheses, and are not reordered between steps. The reference copies every entry
    # to every hypothesis and reorders it. Sharing an entry that differs between
    # hypotheses (the self-attention cache), reading the shared rows for the wrong
    # hypotheses, or gathering them wrongly when finished sentences leave the batch
    # (chunks of 2) changes outputs.
    source_ids = padded(SOURCES)
    options = dict(beam_size=3, max_length=MAX_LENGTH, cache_chunk=cache_chunk)
    found = decoding.decode_function(decoding.beam_search, model, **options)(source_ids)
    expected = decoding.decode_function(decoding.beam_search, GatherEveryCacheEntry(model),
                                        **options)(source_ids)
    np.testing.assert_array_equal(found.ids.numpy(), expected.ids.numpy())
    assert_close_in_ulps(found.scores.numpy(), expected.scores.numpy())


class MarkovModel:
    """A stub whose next-token logits depend on the position and the previous token.

    `table[i, token]` holds the logits after `token` at position `i` (the start token at
    position 0): greedy choices can miss the best sequence, which beam search must find.
    """

    def __init__(self, table):
        self.table = tf.constant(table, tf.float32)  # (L, V, V)
        self.max_length = table.shape[0] + 1

    def encode(self, source_ids, training=None):
        return tf.zeros(tf.concat([tf.shape(source_ids), [1]], 0))

    def init_cache(self, encoder_output, source_ids, max_length):
        return {"rows": tf.zeros(tf.shape(source_ids)[:1])}  # nothing to carry

    def decode_step(self, token_ids, cache, index):
        return tf.gather(self.table[index], token_ids), cache


def markov_log_probs(table):
    """`table`'s logits as log-probabilities: a softmax over the whole vocabulary."""
    return table - np.log(np.exp(table).sum(-1, keepdims=True))


def penalized_score(table, sequence, alpha):
    """log P(sequence) / ((5 + |Y|) / 6)^α under the `MarkovModel` of `table`, read
    token by token from the table; `sequence` must be an output the decoders may give."""
    limit = table.shape[0]
    assert sequence and len(sequence) <= limit, sequence
    assert PAD not in sequence and END not in sequence[:-1], sequence
    assert sequence[-1] == END or len(sequence) == limit, sequence
    assert sequence[0] != END, sequence  # an empty translation of a real source
    log_probs = markov_log_probs(table)
    previous, total = START, 0.0
    for position, token in enumerate(sequence):
        total += log_probs[position, previous, token]
        previous = token
    return total / ((5 + len(sequence)) / 6) ** alpha


def brute_force_ranking(table, alpha):
    """Every output the decoders may give (PAD never, END not first, END or the length
    limit ends it), scored by log P / ((5 + |Y|) / 6)^α, best first: `[(score, ids)]`."""
    limit, vocabulary = table.shape[0], table.shape[1]
    log_probs = markov_log_probs(table)
    scored = []
    stack = [((), START, 0.0)]
    while stack:
        prefix, previous, score = stack.pop()
        position = len(prefix)
        for token in range(vocabulary):
            if token == PAD or (position == 0 and token == END):
                continue
            total = score + log_probs[position, previous, token]
            sequence = prefix + (token,)
            if token == END or len(sequence) == limit:
                scored.append((total / ((5 + len(sequence)) / 6) ** alpha, sequence))
            else:
                stack.append((sequence, token, total))
    return sorted(scored, reverse=True)


@hypothesis.settings(max_examples=25, deadline=None)
@hypothesis.given(seed=hypothesis.strategies.integers(0, 2**31 - 1),
                  limit=hypothesis.strategies.integers(1, 3),
                  alpha=hypothesis.strategies.floats(0.0, 2.0),
                  sharpness=hypothesis.strategies.floats(0.5, 4.0))
def test_a_beam_as_wide_as_every_hypothesis_finds_the_best_one(seed, limit, alpha,
                                                               sharpness):
    vocabulary = 6  # PAD, UNK, START, END and two words
    table = sharpness * np.random.default_rng(seed).normal(
        size=(limit, vocabulary, vocabulary))
    ranking = brute_force_ranking(table, alpha)
    (best_score, best), runner_up = ranking[0], ranking[1:2]
    source_ids = np.array([[START, 5, END]], np.int32)
    found = decoding.beam_search(MarkovModel(table), source_ids, beam_size=5 ** limit,
                                 length_penalty=alpha, max_length=limit, extra_length=None)
    ids = tuple(int(token) for token in found.ids.numpy()[0] if token != PAD)
    # The ids it returns score, by the table itself, as well as the best output does
    # (a tie may pick another), and the score it reports is theirs.
    own_score = penalized_score(table, ids, alpha)
    assert own_score == pytest.approx(best_score, abs=1e-4)
    assert float(found.normalized_scores[0]) == pytest.approx(own_score, abs=1e-4)
    if not runner_up or best_score - runner_up[0][0] > 1e-3:  # the best is unique
        assert ids == best


@hypothesis.settings(max_examples=25, deadline=None)
@hypothesis.given(seed=hypothesis.strategies.integers(0, 2**31 - 1),
                  limit=hypothesis.strategies.integers(1, 4))
def test_a_beam_of_one_without_length_penalty_is_greedy_on_any_stub(seed, limit):
    table = 3 * np.random.default_rng(seed).normal(size=(limit, 6, 6))
    model, source_ids = MarkovModel(table), np.array([[START, 4, END]], np.int32)
    options = dict(max_length=limit, extra_length=None)
    beam = decoding.beam_search(model, source_ids, beam_size=1, length_penalty=0.0,
                                **options)
    greedy = decoding.greedy_decode(model, source_ids, **options)
    np.testing.assert_array_equal(beam.ids.numpy(), greedy.ids.numpy())
    np.testing.assert_allclose(beam.scores.numpy(), greedy.scores.numpy(), atol=1e-5)



def _without_padding(ids):
    return [tuple(int(token) for token in row if token != PAD) for row in np.asarray(ids)]


@pytest.mark.parametrize("options", [{}, {"max_length": 4}, {"extra_length": 2}],
                         ids=["default", "max_length", "extra_length"])
def test_portable_greedy_gives_the_tensorflow_decoders_ids(model, options):
    source_ids = padded(SOURCES + [[END]])  # the last one has nothing to translate
    expected = decoding.greedy_decode(model, source_ids, **options).ids
    found = portable.compiled_greedy_ids(model, **options)(source_ids)
    assert _without_padding(found) == _without_padding(expected)
    assert _without_padding(found)[-1] == (END,)


def test_portable_greedy_stops_each_sentence_at_its_end_or_limit():
    tree = {**sequence_tree(5, [7, 8, END]), **sequence_tree(8, [9, END]),
            **sequence_tree(14, [10, 11, 12, 13, 12, 11])}  # the last never ends
    stub = PrefixTreeModel(tree)
    source_ids = padded([[5, 6, END], [8, END], [14, END]])
    expected = decoding.greedy_decode(stub, source_ids, extra_length=3).ids
    found = portable.greedy_ids(stub, source_ids, extra_length=3)
    assert _without_padding(found) == _without_padding(expected) == [
        (7, 8, END), (9, END), (10, 11, 12, 13, 12)]


def test_log_normalizers_give_the_exact_log_softmax():
    # One row of tokens 0..200 below the largest logit against NumPy's log-softmax in
    # float64: every token keeps its own value, also those so far below that the
    # written-out sum counts them as 80 below (their exp() would be subnormal).
    from keras_transformer.decoding.common import log_normalizers

    logits = -np.linspace(0.0, 200.0, 101)[None, :] + 7.0  # (1, V), token 0 the largest
    found = logits - log_normalizers(tf.constant(logits, tf.float32)).numpy()
    exact = logits - np.log(np.exp(logits).sum())
    np.testing.assert_allclose(found, exact, rtol=1e-6)


@pytest.mark.parametrize("static_vocabulary", [True, False])
@pytest.mark.parametrize("index", [0, 3])
def test_token_bias_forbids_padding_and_the_end_token_first(static_vocabulary, index):
    from keras_transformer.decoding.common import token_bias

    vocabulary, end, pad = 6, 2, 0
    if static_vocabulary:
        found = token_bias(vocabulary, tf.constant(index), end, pad)
    else:
        found = tf.function(lambda v, i: token_bias(v, i, end, pad), input_signature=[
            tf.TensorSpec([], tf.int32), tf.TensorSpec([], tf.int32)])(vocabulary, index)
    expected = np.zeros(vocabulary, np.float32)
    expected[pad] = decoding.common.FORBIDDEN
    if index == 0:
        expected[end] = decoding.common.FORBIDDEN
    np.testing.assert_array_equal(found.numpy(), expected)


@pytest.mark.parametrize("length, k, width", [(3000, 6, 50), (32000, 8, 160), (96, 3, 8),
                                              (4 * 997, 2, None)])
@pytest.mark.parametrize("values", ["ties", "normal"])
def test_top_k_by_blocks_is_top_k_ties_included(length, k, width, values):
    # Beam search's top-k over K x V candidates, against TensorFlow's own top_k: the
    # same values and the same indices, ties going to the lower index. Small integers
    # tie everywhere, including across the blocks chosen and left out.
    from keras_transformer.decoding.beam import _block_width, top_k_by_blocks

    rng = np.random.default_rng(length + k)
    rows = (rng.integers(0, 4, (5, length)) if values == "ties"
            else rng.normal(size=(5, length))).astype(np.float32)
    rows[0, :] = decoding.common.FORBIDDEN  # a row of empty beam slots
    found = top_k_by_blocks(tf.constant(rows), k)
    expected = tf.math.top_k(tf.constant(rows), k)
    np.testing.assert_array_equal(found[0].numpy(), expected[0].numpy())
    np.testing.assert_array_equal(found[1].numpy(), expected[1].numpy())
    assert _block_width(length, k) == width  # blocks where they pay (none for 4 x 997)


def test_top_k_by_blocks_breaks_a_tie_across_blocks_by_index():
    # Blocks of 8: the largest value (9) is in block 5, beside a 4 at index 41; block 0
    # holds a 5 and a 4 at index 1. The third value is the 4 at index 1, as in top_k,
    # though block 5 ranks first.
    from keras_transformer.decoding.beam import top_k_by_blocks

    row = np.zeros((1, 96), np.float32)
    row[0, [0, 1, 40, 41]] = [5.0, 4.0, 9.0, 4.0]
    values, indices = top_k_by_blocks(tf.constant(row), 3)
    np.testing.assert_array_equal(values.numpy(), [[9.0, 5.0, 4.0]])
    np.testing.assert_array_equal(indices.numpy(), [[40, 0, 1]])


# --- n-best lists and scoring given outputs ---------------------------------------------

@hypothesis.settings(max_examples=15, deadline=None)
@hypothesis.given(seed=hypothesis.strategies.integers(0, 2**31 - 1),
                  limit=hypothesis.strategies.integers(1, 3),
                  alpha=hypothesis.strategies.floats(0.0, 2.0))
def test_an_n_best_list_is_the_brute_force_top_n(seed, limit, alpha):
    vocabulary = 6  # PAD, UNK, START, END and two words
    table = 2.0 * np.random.default_rng(seed).normal(size=(limit, vocabulary, vocabulary))
    ranking = brute_force_ranking(table, alpha)
    count = min(4, len(ranking))
    found = decoding.beam_search(MarkovModel(table), np.array([[START, 5, END]], np.int32),
                                 beam_size=5 ** limit, length_penalty=alpha,
                                 max_length=limit, extra_length=None,
                                 num_hypotheses=count)
    assert found.ids.shape[:2] == (1, count)
    sequences = [tuple(int(t) for t in row if t != PAD) for row in found.ids.numpy()[0]]
    assert len(set(sequences)) == count
    # Each entry scores by the table as the brute force's entry of its rank does (ties
    # may swap outputs of one score), and reports its own score.
    own = [penalized_score(table, sequence, alpha) for sequence in sequences]
    np.testing.assert_allclose(own, [score for score, _ in ranking[:count]], atol=1e-4)
    np.testing.assert_allclose(found.normalized_scores.numpy()[0], own, atol=1e-4)


def test_an_n_best_list_starts_with_the_beam_output(model, beam):
    source_ids = padded(SOURCES)
    best = beam(source_ids)
    listed = decoding.decode_function(decoding.beam_search, model, max_length=MAX_LENGTH,
                                      num_hypotheses=3)(source_ids)
    assert listed.ids.shape[:2] == (3, 3) and listed.scores.shape == (3, 3)
    np.testing.assert_array_equal(listed.ids.numpy()[:, 0], best.ids.numpy())
    assert_close_in_ulps(listed.scores.numpy()[:, 0], best.scores.numpy())
    normalized = listed.normalized_scores.numpy()
    assert np.all(np.diff(normalized, axis=1) <= 0)  # best first
    # Every entry's score is the model's log-probability of its output.
    for rank in range(3):
        ids = listed.ids.numpy()[:, rank]
        expected = teacher_forced_log_probabilities(model, source_ids, ids).sum(axis=1)
        assert_close_in_ulps(listed.scores.numpy()[:, rank], expected)


def test_an_n_best_list_is_the_same_when_finished_sentences_leave_the_batch(model):
    source_ids = padded(SOURCES)
    whole, chunked = (decoding.decode_function(
        decoding.beam_search, model, max_length=MAX_LENGTH, num_hypotheses=4,
        cache_chunk=chunk)(source_ids) for chunk in (None, 2))
    np.testing.assert_array_equal(chunked.ids.numpy(), whole.ids.numpy())
    assert_close_in_ulps(chunked.normalized_scores.numpy(), whole.normalized_scores.numpy())


def test_an_empty_source_has_one_hypothesis_and_forbidden_fillers(model):
    source_ids = padded([[START, END], SOURCES[0]])
    found = decoding.beam_search(model, source_ids, max_length=MAX_LENGTH,
                                 num_hypotheses=3)
    ids, scores = found.ids.numpy(), found.scores.numpy()
    assert list(ids[0, 0][ids[0, 0] != PAD]) == [END]
    assert np.all(ids[0, 1:] == PAD) and np.all(scores[0, 1:] == decoding.common.FORBIDDEN)
    assert np.all(scores[1] > decoding.common.FORBIDDEN / 2)  # a real sentence: 3 of them


@pytest.mark.parametrize("count", [0, 5])
def test_more_hypotheses_than_the_beam_keeps_is_an_error(model, count):
    with pytest.raises(ValueError, match="num_hypotheses"):
        decoding.beam_search(model, padded(SOURCES), beam_size=4, num_hypotheses=count)


def numpy_log_softmax(logits):
    logits = np.asarray(logits, np.float64)
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def test_scores_of_given_outputs_are_the_teacher_forced_log_probabilities(model, beam):
    source_ids = padded(SOURCES)
    ids = beam(source_ids).ids.numpy()
    ids[1, 1] = 20  # not the model's choice: scored all the same
    decoder_input = np.concatenate([np.full((len(ids), 1), START), ids[:, :-1]], axis=1)
    log_probs = numpy_log_softmax(model({"source_ids": source_ids,
                                         "target_ids": decoder_input}))
    expected = np.where(ids == PAD, 0.0,
                        np.take_along_axis(log_probs, ids[..., None], axis=-1)[..., 0])
    token_scores, scores = tf.function(decoding.score_outputs)(model, source_ids, ids)
    assert_close_in_ulps(token_scores.numpy(), expected)
    assert_close_in_ulps(scores.numpy(), expected.sum(axis=1))


def test_scoring_a_decoders_own_output_gives_its_score(model, greedy):
    source_ids = padded(SOURCES)
    found = greedy(source_ids)
    _, scores = decoding.score_outputs(model, source_ids, found.ids)
    assert_close_in_ulps(scores.numpy(), found.scores.numpy())
