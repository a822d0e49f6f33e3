"""A briefly trained model translates alike in memory, in its SavedModel (both loaders)
and in its TFLite file: the same token ids and scores on real sentences, which differ."""

import numpy as np
import pytest

from keras_transformer import config as config_lib
from keras_transformer import files
from keras_transformer.data.text import read_lines
from keras_transformer.serving import export, runners
from keras_transformer.serving.translator import Translator
from keras_transformer.training import fit, runs
from tests.export_helpers import CORPUS

STEPS = 800
# The fixture corpus's training sources: a model of width 64 trained 800 steps without
# dropout has learnt them (95 of 100 translations differ; its translations of held-out
# sentences repeat a few templates of the small corpus).
SENTENCES = read_lines(CORPUS / "train.en.gz")[:100]


@pytest.fixture(scope="module")
def trained_export(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("trained") / "run"
    config = config_lib.override(config_lib.preset_config("tiny"), [
        f"data_dir={CORPUS}", "epochs=1", f"steps_per_epoch={STEPS}", "dropout=0",
        "vocabulary_size=300", "hidden_dim=64", "intermediate_dim=128",
        "checkpoint_every_steps=1000"])
    fit.train(config, str(run_dir), verbose=0)
    export_dir, _ = export.export_run(str(run_dir), weights="final", quantize=False)
    _, tokenizer, model = runs.load_run(str(run_dir), "final")
    return Translator(model, tokenizer), export_dir


@pytest.mark.timeout(900)  # 800 training steps, an export to both formats, 4 runtimes
@pytest.mark.parametrize("beam", [False, True], ids=["greedy", "beam"])
def test_every_runtime_gives_the_models_ids_and_scores(trained_export, beam):
    translator, export_dir = trained_export
    saved_model = f"{export_dir}/{files.SAVED_MODEL}"
    reference = runners.ModuleRunner(translator, beam=beam)(SENTENCES)
    translations = runners.translations(reference)
    assert len(SENTENCES) >= 50
    # A trained model, not a constant: nearly every sentence gets its own translation.
    assert len(set(translations)) >= 0.8 * len(SENTENCES)
    for runner in (runners.SavedModelRunner(saved_model, _signature(beam)),
                   runners.SessionRunner(saved_model, _signature(beam)),
                   runners.TFLiteRunner(f"{export_dir}/{files.TFLITE}", _signature(beam))):
        found = runner(SENTENCES)
        np.testing.assert_array_equal(found["token_ids"], reference["token_ids"])
        np.testing.assert_allclose(found["scores"], reference["scores"], rtol=1e-4,
                                   atol=1e-4)
        assert runners.translations(found) == translations


def _signature(beam):
    return files.BEAM_SIGNATURE if beam else files.GREEDY_SIGNATURE
