"""Ensembles: the mean of the members' probabilities, in memory and exported."""

import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_transformer import Transformer, cli, decoding, files, runs
from keras_transformer import config as config_lib
from keras_transformer.data import corpus
from keras_transformer.decoding.ensemble import Ensemble
from keras_transformer.runs import TokenizerMismatchError, load_ensemble
from keras_transformer.serving import export as exporting
from keras_transformer.serving import runners, self_check
from keras_transformer.serving import translator as translator_lib
from keras_transformer.training import fit
from tests.export_helpers import validation_sentences
from tests.numerics import assert_close_in_ulps
from tests.test_decoding import END, PrefixTreeModel, padded

# Compares float computations: also run on Eigen's kernels in CI (tests/numerics.py).
pytestmark = pytest.mark.numerics

SOURCES = [[5, 6, 7, END], [8, 9, 10, 11, 12, 13, END], [14, END]]


def stub(tree):
    model = PrefixTreeModel(tree)
    model.vocabulary_size, model.pad_id = 16, 0
    return model


@pytest.fixture(scope="module")
def members():
    """Two tiny models with different random weights."""
    models = []
    for seed in (1, 2):
        keras.utils.set_random_seed(seed)
        models.append(Transformer.from_preset("tiny", num_layers=1))
    return models


def test_greedy_takes_the_token_of_the_mean_probability_which_neither_member_takes():
    # Each member prefers its own token; on average token 7 is the most probable.
    first = stub({(5,): {8: 0.45, 7: 0.40, 9: 0.15}})
    second = stub({(5,): {9: 0.45, 7: 0.40, 8: 0.15}})
    for member, token in ((first, 8), (second, 9)):
        assert decoding.greedy_decode(member, padded([[5]])).ids.numpy()[0, 0] == token
    decoded = decoding.greedy_decode(Ensemble([first, second]), padded([[5]]))
    # After 7 both members leave their trees and end with probability 1.
    np.testing.assert_array_equal(decoded.ids.numpy(), [[7, END]])
    np.testing.assert_allclose(decoded.scores.numpy(), [np.log(0.40)], rtol=1e-5)


def test_steps_give_the_log_of_the_mean_of_the_members_softmax(members):
    ensemble = Ensemble(members)
    source_ids = padded(SOURCES)
    target_ids = np.array([[2, 17, 40, 99], [2, 5, 5, 5], [2, 300, 7, 8]], np.int32)
    encoder_outputs = ensemble.encode(source_ids)
    caches = ensemble.init_cache(encoder_outputs, source_ids, target_ids.shape[1])
    full = ensemble.decode(target_ids, encoder_outputs, source_ids).numpy()
    member_logits = [model.decode(target_ids, model.encode(source_ids), source_ids).numpy()
                     for model in members]
    # NumPy softmax of each member, then the log of their mean.
    exponentials = [np.exp(logits - logits.max(-1, keepdims=True)) for logits in member_logits]
    expected = np.log(np.mean([e / e.sum(-1, keepdims=True) for e in exponentials], axis=0))
    assert_close_in_ulps(full, expected)
    step = tf.function(ensemble.decode_step)
    for index in range(target_ids.shape[1]):
        log_probs, caches = step(tf.constant(target_ids[:, index]), caches,
                                 tf.constant(index))
        assert_close_in_ulps(log_probs.numpy(), expected[:, index])


def test_a_model_twice_decodes_as_the_model_alone(members):
    model, source_ids = members[0], padded(SOURCES)
    for decode in (decoding.greedy_decode, decoding.beam_search):
        alone = decoding.decode_function(decode, model, max_length=12)(source_ids)
        twice = decoding.decode_function(decode, Ensemble([model, model]),
                                         max_length=12)(source_ids)
        np.testing.assert_array_equal(twice.ids.numpy(), alone.ids.numpy())
        assert_close_in_ulps(twice.scores.numpy(), alone.scores.numpy())


def test_cached_greedy_equals_uncached_greedy_and_attention_is_the_members_mean(members):
    ensemble, source_ids = Ensemble(members), padded(SOURCES)
    cached = decoding.greedy_decode(ensemble, source_ids, max_length=12,
                                    return_attention=True)
    uncached = decoding.uncached_greedy_decode(ensemble, source_ids, max_length=12)
    np.testing.assert_array_equal(cached.ids.numpy(), uncached.ids.numpy())
    member_attention = [decoding.common.cross_attention(
        model, cached.ids, model.encode(source_ids), source_ids) for model in members]
    np.testing.assert_allclose(cached.attention.numpy(),
                               np.mean([a.numpy() for a in member_attention], axis=0),
                               atol=1e-6)


def test_members_must_be_two_or_more_and_share_the_vocabulary(members):
    with pytest.raises(ValueError, match="two or more models, got 1"):
        Ensemble(members[:1])
    other = Transformer.from_preset("tiny", vocabulary_size=999, num_layers=1)
    with pytest.raises(ValueError, match=r"share vocabulary_size; got \[1000, 999\]"):
        Ensemble([members[0], other])


def test_an_ensemble_aligns_with_its_members_layers():
    from tests.export_helpers import tiny_tokenizer

    tokenizer = tiny_tokenizer()
    three = [Transformer.from_preset("tiny", vocabulary_size=tokenizer.vocabulary_size,
                                     num_layers=3) for _ in range(2)]
    ensemble = Ensemble(three)
    # The penultimate layer, as for one model; a layer the members lack is refused.
    assert translator_lib.Translator(ensemble, tokenizer).alignment_layer == 1
    with pytest.raises(ValueError, match="alignment_layer=3 must lie in 0..2"):
        translator_lib.Translator(ensemble, tokenizer, alignment_layer=3)
    one = Transformer.from_preset("tiny", vocabulary_size=tokenizer.vocabulary_size,
                                  num_layers=1)
    assert Ensemble([three[0], one]).num_layers is None  # no attention to average


@pytest.fixture(scope="module")
def run_dirs(tmp_path_factory, fixture_corpus_dir):
    """Two run directories of one tokenizer with different weights, and one of another."""
    root = tmp_path_factory.mktemp("ensemble_runs")
    made = {}
    for name, seed, vocabulary in (("a", 1, 200), ("b", 2, 200), ("other", 3, 180)):
        config = config_lib.override(config_lib.preset_config("tiny"), [
            f"data_dir={fixture_corpus_dir}", "num_layers=1",
            f"vocabulary_size={vocabulary}"])
        train_text = corpus.load_split(config.data, "train", verbose=False)
        config, _ = fit.prepare_run_dir(config, str(root / name), train_text)
        keras.utils.set_random_seed(seed)
        runs.build_model(config).save_weights(str(root / name / files.FINAL_WEIGHTS))
        made[name] = str(root / name)
    return made


def test_a_run_with_another_tokenizer_is_refused_by_name(run_dirs, tmp_path, capsys):
    with pytest.raises(TokenizerMismatchError,
                       match=r"other/tokenizer/tokenizer.model differs from"):
        load_ensemble([run_dirs["a"], run_dirs["other"]], "final")
    output = ["--output", str(tmp_path / "ensemble")]
    status = cli.main(["export", run_dirs["a"], "--ensemble", run_dirs["other"], *output])
    assert status == 2 and "tokenizer.model differs from" in capsys.readouterr().err
    # A repeated flag adds its runs: the mismatched run named first is not dropped.
    status = cli.main(["export", run_dirs["a"], "--ensemble", run_dirs["other"],
                       "--ensemble", run_dirs["b"], *output])
    assert status == 2 and "tokenizer.model differs from" in capsys.readouterr().err


def test_an_ensemble_is_refused_its_members_own_export_folders(run_dirs, capsys):
    """RUN_DIR/export is what translate, evaluate and the recipe read as the run's own
    model: an ensemble written there would replace it and pass for the run."""
    run_export = f"{run_dirs['a']}/{files.EXPORT_DIR}"
    member_export = f"{run_dirs['b']}/{files.EXPORT_DIR}"  # a member's: the same
    for output in ([], ["--output", ""], ["--output", run_export],
                   ["--output", f"{run_export}/"], ["--output", member_export]):
        status = cli.main(["export", run_dirs["a"], "--ensemble", run_dirs["b"], *output])
        assert status == 2
        assert "--ensemble needs --output DIR" in capsys.readouterr().err
    for output_dir in (None, "", run_export, member_export):
        with pytest.raises(ValueError, match="An ensemble needs a folder of its own"):
            exporting.export_run(run_dirs["a"], weights="final", output_dir=output_dir,
                                 ensemble=[run_dirs["b"]])
    assert not os.path.exists(run_export) and not os.path.exists(member_export)


@pytest.mark.slow
def test_the_exported_ensemble_translates_as_the_ensemble_in_memory(run_dirs, tmp_path):
    output_dir, report = exporting.export_run(
        run_dirs["a"], weights="final", output_dir=str(tmp_path / "export"),
        quantize=False, ensemble=[run_dirs["b"]], max_output_length=16,
        signatures=files.TRANSLATING_SIGNATURES)
    assert [member["run_dir"] for member in report["run"]["ensemble"]] == [run_dirs["b"]]
    with open(tmp_path / "export" / files.REPORT_JSON, encoding="utf-8") as file:
        assert json.load(file)["run"]["ensemble"][0]["weights"].endswith(files.FINAL_WEIGHTS)

    _, tokenizer, ensemble, _ = load_ensemble([run_dirs["a"], run_dirs["b"]], "final")
    sentences = list(validation_sentences())[:8]
    in_memory = decoding.decode_function(decoding.greedy_decode, ensemble, max_length=16)
    source_ids = translator_lib.Translator(ensemble, tokenizer).source_ids(
        tf.constant(runners.encode_sentences(sentences)))
    saved = runners.SavedModelRunner(f"{output_dir}/{files.SAVED_MODEL}")(sentences)
    expected = in_memory(source_ids).ids.numpy()
    assert self_check.token_sequences(saved["token_ids"]) == \
        self_check.token_sequences(expected)
    # The ensemble differs from its first member alone on these sentences.
    first = decoding.decode_function(decoding.greedy_decode, ensemble.models[0],
                                     max_length=16)(source_ids).ids.numpy()
    assert self_check.token_sequences(first) != self_check.token_sequences(expected)

    checks = self_check.check_run(run_dirs["a"], export_dir=output_dir, count=8)
    assert all(check.passed is not False for check in checks), self_check.format_table(checks)
