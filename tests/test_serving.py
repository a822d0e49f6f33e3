"""The exported SavedModel: signatures, both loaders, bad input, op allow-list."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from keras_transformer import files
from keras_transformer.data.tokenizer import END_ID, PAD_ID, START_ID
from keras_transformer.serving import op_checks as export_checks
from keras_transformer.serving import runners
from tests.conftest import REPOSITORY
from tests.export_helpers import (
    BAD_INPUTS,
    EMPTY_AND_NOT,
    batch_of,
    check_only_empty_sentences_translate_to_nothing,
    tiny_export,
)

CASES = {**BAD_INPUTS, "batch_of_512": None}


@pytest.fixture(scope="module")
def exported():
    return tiny_export()


@pytest.fixture(scope="module")
def tf2_runner(exported):
    return runners.SavedModelRunner(exported.saved_model)


@pytest.fixture(scope="module")
def session_runner(exported):
    runner = runners.SessionRunner(exported.saved_model)
    yield runner
    runner.close()


def _inputs(case):
    return batch_of(512) if case == "batch_of_512" else CASES[case]


def _check_outputs(outputs, sentences):
    assert outputs["translations"].shape == (len(sentences),)
    assert all(isinstance(text, bytes) for text in outputs["translations"])
    assert outputs["token_ids"].shape[0] == len(sentences)
    assert outputs["scores"].shape == (len(sentences),)


def test_source_ids_wrap_pieces_in_start_and_end_and_truncate(exported):
    translator = exported.translator
    max_length = translator.model.max_length
    ids = translator.source_ids(tf.constant(["", "A dog.", "x " * 5000])).numpy()
    assert ids.shape == (3, max_length)
    assert (ids[:, 0] == START_ID).all()
    assert list(ids[0, :3]) == [START_ID, END_ID, PAD_ID]
    assert ids[2, -1] == END_ID and (ids[2, 1:-1] != PAD_ID).all()
    short = translator.source_ids(tf.constant(["A dog."])).numpy()
    assert short.shape[1] < max_length and short[0, -1] == END_ID


def test_xla_translator_translates_like_the_exported_graph_and_refuses_export(exported):
    from keras_transformer.serving import translator as translator_lib
    translator = exported.translator
    compiled = translator_lib.Translator(translator.model, translator.tokenizer, jit_compile=True,
                                  max_output_length=translator.max_output_length)
    sentences = tf.constant(["A dog runs.", "", "Two men play football in a park."])
    for method in ("translate", "translate_beam"):
        expected = getattr(translator, method)(sentences)
        got = getattr(compiled, method)(sentences)
        np.testing.assert_array_equal(got["token_ids"].numpy(),
                                      expected["token_ids"].numpy())
        assert list(got["translations"].numpy()) == list(expected["translations"].numpy())
    with pytest.raises(ValueError, match="jit_compile=False"):
        compiled.signatures()
    with pytest.raises(ValueError, match="jit_compile=False"):
        translator_lib.convert_to_tflite(compiled)


@pytest.mark.parametrize("case", list(CASES))
def test_saved_model_answers_one_string_per_input(tf2_runner, case):
    sentences = _inputs(case)
    _check_outputs(tf2_runner(sentences), sentences)


@pytest.mark.parametrize("case", list(CASES))
def test_session_loader_translates_like_tf2_loader(tf2_runner, session_runner, case):
    sentences = _inputs(case)
    outputs = session_runner(sentences)
    _check_outputs(outputs, sentences)
    np.testing.assert_array_equal(outputs["token_ids"], tf2_runner(sentences)["token_ids"])


def test_beam_signature_answers_every_bad_input(exported):
    beam = runners.SavedModelRunner(exported.saved_model, files.BEAM_SIGNATURE)
    for sentences in BAD_INPUTS.values():
        _check_outputs(beam(sentences), sentences)


@pytest.mark.parametrize("signature", [files.GREEDY_SIGNATURE, files.BEAM_SIGNATURE])
def test_saved_model_translates_only_empty_sentences_to_nothing(exported, signature):
    runner = runners.SavedModelRunner(exported.saved_model, signature)
    check_only_empty_sentences_translate_to_nothing(runner(EMPTY_AND_NOT))


def test_fresh_process_with_only_tensorflow_and_tf_text_translates(exported, tf2_runner):
    script = (
        "import json, sys\n"
        "import tensorflow as tf, tensorflow_text\n"
        f"loaded = tf.saved_model.load({exported.saved_model!r})\n"
        "out = loaded.signatures['serving_default'](sentences=tf.constant(['A dog runs.']))\n"
        "assert not any(m.startswith('keras_transformer') for m in sys.modules)\n"
        "print(json.dumps(out['token_ids'].numpy().tolist()))\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=120, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert result.returncode == 0, result.stderr[-2000:]
    ids = json.loads(result.stdout.strip().splitlines()[-1])
    assert ids == tf2_runner(["A dog runs."])["token_ids"].tolist()


def test_saved_model_cli_wrapper_runs_the_signature(exported):
    result = subprocess.run(
        [sys.executable, "-m", "export.saved_model_cli", "run", "--dir",
         exported.saved_model, "--tag_set", "serve", "--signature_def", "serving_default",
         "--input_exprs", 'sentences=["A dog runs.", ""]'],
        capture_output=True, text=True, timeout=120, cwd=REPOSITORY,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Result for output key translations" in result.stdout


def test_saved_model_ops_are_core_or_tf_text(exported):
    ops = export_checks.saved_model_ops(exported.saved_model)
    assert "While" in ops
    assert export_checks.check_saved_model_ops(ops) == [
        "TFText>FastSentencepieceDetokenize", "TFText>FastSentencepieceTokenize"]


def test_report_lists_tf_text_ops_sizes_and_versions(exported):
    with open(os.path.join(exported.directory, "export_report.json")) as file:
        report = json.load(file)
    assert report["saved_model"]["tf_text_ops"] == [
        "TFText>FastSentencepieceDetokenize", "TFText>FastSentencepieceTokenize"]
    assert report["saved_model"]["bytes"] > 0 and report["tflite"]["bytes"] > 0
    assert report["versions"]["tensorflow_text"]
    with open(os.path.join(exported.directory, "export_report.md")) as file:
        assert "TFText>FastSentencepieceTokenize" in file.read()


def test_python_callback_fails_the_op_check(tmp_path):
    module = tf.Module()
    module.f = tf.function(
        lambda x: tf.py_function(lambda v: v + 1, [x], tf.float32),
        input_signature=[tf.TensorSpec([None], tf.float32)])
    tf.saved_model.save(module, str(tmp_path), signatures=module.f.get_concrete_function())
    with pytest.raises(export_checks.UnsupportedOpsError, match="EagerPyFunc"):
        export_checks.check_saved_model_ops(export_checks.saved_model_ops(str(tmp_path)))


def test_ops_of_other_libraries_fail_the_op_check():
    with pytest.raises(export_checks.UnsupportedOpsError, match="SomeLibraryOp"):
        export_checks.check_saved_model_ops(["AddV2", "SomeLibraryOp"])


def test_tflite_op_check_accepts_tf_text_kernels_only():
    assert export_checks.check_tflite_ops(
        {"ADD": 3, "RaggedTensorToTensor": 1, "TFText>FastSentencepieceTokenize": 1}) == [
        "RaggedTensorToTensor", "TFText>FastSentencepieceTokenize"]
    for op in ("StridedSlice", "FlexStringJoin"):
        with pytest.raises(export_checks.UnsupportedOpsError, match=op):
            export_checks.check_tflite_ops({"ADD": 1, op: 1})
