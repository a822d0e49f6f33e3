"""Artifacts made by an earlier version still load and translate exactly as they did."""

import json

import keras
import numpy as np
import pytest

from keras_transformer import files, runs
from keras_transformer.serving import runners
from keras_transformer.serving.translator import Translator
from tests.conftest import FIXTURES

OLD = FIXTURES / "artifacts_v0_1"
EXPECTED = json.loads((OLD / "expected.json").read_text(encoding="utf-8"))
SENTENCES = EXPECTED["sentences"]


def test_a_saved_keras_file_loads_and_gives_the_same_logits():
    # Importing the class registers it with Keras: `import keras_transformer` alone
    # imports no model code. Without this line the test passed only after another
    # test file had imported it.
    from keras_transformer.model import Transformer  # noqa: F401

    model = keras.saving.load_model(OLD / "model.keras")
    ids = np.array(EXPECTED["logits_inputs"], np.int32)
    logits = keras.ops.convert_to_numpy(model({"source_ids": ids, "target_ids": ids}))
    np.testing.assert_allclose(logits, np.load(OLD / "logits.npy"), rtol=1e-5, atol=1e-5)


def test_a_run_directory_loads_and_translates_greedily_as_its_export_did():
    _, tokenizer, model = runs.load_run(str(OLD / "run"), "final")
    ids = np.array(EXPECTED["logits_inputs"], np.int32)
    logits = keras.ops.convert_to_numpy(model({"source_ids": ids, "target_ids": ids}))
    np.testing.assert_allclose(logits, np.load(OLD / "logits.npy"), rtol=1e-5, atol=1e-5)
    outputs = runners.ModuleRunner(Translator(model, tokenizer))(SENTENCES)
    assert runners.translations(outputs) == EXPECTED["greedy"]["translations"]
    np.testing.assert_array_equal(outputs["token_ids"], EXPECTED["greedy"]["token_ids"])
    # Beam search itself changed since: an ended candidate joins the finished set only
    # from the step's best K (fairseq's rule, which makes a beam of one greedy), so a run
    # exported again may end some beam translations elsewhere. The old export keeps its
    # own graph, and translates as it did (below).


@pytest.mark.parametrize("artifact, session", [
    (files.SAVED_MODEL, False), (files.SAVED_MODEL, True), (files.TFLITE, False)])
def test_an_old_export_translates_as_it_did(artifact, session):
    path = str(OLD / "export" / artifact)
    for decoder, beam in (("greedy", False), ("beam", True)):
        outputs = runners.open_runner(path, beam=beam, session=session)(SENTENCES)
        assert runners.translations(outputs) == EXPECTED[decoder]["translations"]
        np.testing.assert_array_equal(outputs["token_ids"], EXPECTED[decoder]["token_ids"])
        np.testing.assert_allclose(outputs["scores"], EXPECTED[decoder]["scores"], rtol=1e-4,
                                   atol=1e-4)


def test_the_expected_outputs_differ_across_sentences():
    # Guards the test itself: identical outputs would let a broken model pass.
    assert len(set(EXPECTED["greedy"]["translations"])) >= 4
