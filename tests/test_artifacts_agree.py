"""A briefly trained model translates alike in memory, in its SavedModel (both loaders),
in its TFLite file and in CTranslate2: the same token ids and scores on real sentences,
which differ."""

import importlib.util

import numpy as np
import pytest
import tensorflow as tf

from keras_transformer import config as config_lib
from keras_transformer import files, runs
from keras_transformer.data.text import read_lines
from keras_transformer.data.tokenizer import PAD_ID, add_start_end
from keras_transformer.serving import export, runners, self_check
from keras_transformer.serving.translator import Translator
from keras_transformer.training import fit
from tests.export_helpers import CORPUS

STEPS = 1200
# The fixture corpus's training sources: a model of width 64 trained 1200 steps without
# dropout has learnt them (92 of 100 translations differ, greedy and beam; 86 after 800
# steps, 91 after 1600; its translations of held-out sentences repeat a few templates of
# the small corpus).
SENTENCES = read_lines(CORPUS / "train.en.gz")[:100]
DISTINCT = 0.8  # the least share of sentences that must get a translation of their own
HAS_CTRANSLATE2 = importlib.util.find_spec("ctranslate2") is not None


@pytest.fixture(scope="module")
def trained_export(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("trained") / "run"
    config = config_lib.override(config_lib.preset_config("tiny"), [
        f"data_dir={CORPUS}", "epochs=1", f"steps_per_epoch={STEPS}", "dropout=0",
        "vocabulary_size=300", "hidden_dim=64", "intermediate_dim=128",
        "checkpoint_every_steps=1000"])
    fit.train(config, str(run_dir), verbose=0)
    export_dir, _ = export.export_run(str(run_dir), weights="final", quantize=False,
                                      ctranslate2=HAS_CTRANSLATE2)
    _, tokenizer, model = runs.load_run(str(run_dir), "final")
    return Translator(model, tokenizer), export_dir


@pytest.mark.timeout(900)  # 1200 training steps, exports, 4 runtimes: 5 min on 2 busy cores
@pytest.mark.parametrize("beam", [False, True], ids=["greedy", "beam"])
def test_every_runtime_gives_the_models_ids_and_scores(trained_export, beam):
    translator, export_dir = trained_export
    saved_model = f"{export_dir}/{files.SAVED_MODEL}"
    reference = runners.ModuleRunner(translator, beam=beam)(SENTENCES)
    translations = runners.translations(reference)
    assert len(SENTENCES) >= 50
    # A trained model, not a constant: nearly every sentence gets its own translation.
    assert len(set(translations)) >= DISTINCT * len(SENTENCES)
    for runner in (runners.SavedModelRunner(saved_model, _signature(beam)),
                   runners.SessionRunner(saved_model, _signature(beam)),
                   runners.TFLiteRunner(f"{export_dir}/{files.TFLITE}", _signature(beam))):
        found = runner(SENTENCES)
        np.testing.assert_array_equal(found["token_ids"], reference["token_ids"])
        np.testing.assert_allclose(found["scores"], reference["scores"], rtol=1e-4,
                                   atol=1e-4)
        assert runners.translations(found) == translations


@pytest.mark.skipif(not HAS_CTRANSLATE2, reason="the ctranslate2 extra is not installed "
                                                "(pip install -e '.[test]' installs it)")
def test_ctranslate2_gives_the_models_greedy_ids_and_scores(trained_export):
    translator, export_dir = trained_export
    reference = runners.ModuleRunner(translator)(SENTENCES)
    found = runners.CTranslate2Runner(f"{export_dir}/{files.CTRANSLATE2}")(SENTENCES)
    assert (self_check.token_sequences(found["token_ids"])
            == self_check.token_sequences(reference["token_ids"]))
    # CTranslate2 takes the suppressed PAD out of its softmax; label smoothing left PAD
    # about 0.1/V of each token's probability, which the model's scores keep.
    np.testing.assert_allclose(found["scores"], reference["scores"], rtol=1e-2)
    assert runners.translations(found) == runners.translations(reference)
    checks = self_check.ctranslate2_checks(
        export_dir, SENTENCES, self_check.token_sequences(reference["token_ids"]),
        batch_size=32)
    assert checks[0].passed, checks[0].detail
    assert checks[0].detail.startswith(f"{len(SENTENCES)}/{len(SENTENCES)} ")


def _signature(beam):
    return files.BEAM_SIGNATURE if beam else files.GREEDY_SIGNATURE


def test_the_trained_model_reads_its_sources(trained_export):
    # A decoder that learnt only the target language (a model whose cross-attention
    # carries nothing) scores a target as well after any source. This one must predict
    # each target far better after its own source than after another sentence's.
    translator, _ = trained_export
    model, tokenizer = translator.model, translator.tokenizer
    targets = tokenizer.tokenize(read_lines(CORPUS / "train.de.gz")[:len(SENTENCES)])
    decoder_input = add_start_end(targets, end=False).to_tensor(PAD_ID)  # (B, T)
    expected = add_start_end(targets, start=False).to_tensor(PAD_ID)  # (B, T)
    source_ids = translator.source_ids(SENTENCES).numpy()

    def loss_per_token(sources):
        logits = model({"source_ids": sources, "target_ids": decoder_input})
        log_probs = tf.nn.log_softmax(logits)
        chosen = tf.gather(log_probs, expected, batch_dims=2)  # (B, T)
        mask = tf.cast(expected != PAD_ID, tf.float32)
        return float(-tf.reduce_sum(chosen * mask) / tf.reduce_sum(mask))

    own = loss_per_token(source_ids)
    others = loss_per_token(np.roll(source_ids, 1, axis=0))
    assert others > 2 * own, (own, others)


def test_a_trained_models_n_best_lists_and_scores_agree_with_its_beam_search(
        trained_export):
    # The n-best list starts with the beam translation on real sentences, and scoring
    # the model's own translations (as text, tokenized again) gives beam search's scores.
    translator, export_dir = trained_export
    tflite = f"{export_dir}/{files.TFLITE}"
    beam = runners.TFLiteRunner(tflite, files.BEAM_SIGNATURE)(SENTENCES)
    listed = runners.TFLiteRunner(tflite, files.N_BEST_SIGNATURE)(SENTENCES)
    np.testing.assert_array_equal(listed["translations"][:, 0], beam["translations"])
    # Distinct hypotheses: no two of a list have the same pieces (two lists of pieces
    # may detokenize to one text).
    for row in listed["token_ids"]:
        sequences = self_check.token_sequences(row)
        assert len(set(sequences)) == len(sequences)
    texts = runners.translations(beam)
    scored = runners.TFLiteRunner(tflite, files.SCORE_SIGNATURE)(SENTENCES, texts)
    retokenized = [a == b for a, b in zip(self_check.token_sequences(scored["token_ids"]),
                                          self_check.token_sequences(beam["token_ids"]))]
    # SentencePiece may cut a detokenized text into other pieces; rarely, here.
    assert sum(retokenized) >= 0.9 * len(SENTENCES)
    same = np.array(retokenized)
    np.testing.assert_allclose(scored["scores"][same], beam["scores"][same],
                               rtol=self_check.SCORE_RTOL, atol=self_check.SCORE_ATOL)
