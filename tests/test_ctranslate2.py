"""The CTranslate2 export computes the model's function: the in-memory translator's
greedy ids and scores, for every layer form the converter maps (post-LN and pre-LN,
tied and untied embeddings), and the exported translator's contract on any input."""

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest

from keras_transformer import files
from keras_transformer.data.text import read_lines
from keras_transformer.data.tokenizer import END_ID, START_ID
from keras_transformer.model import Transformer
from keras_transformer.serving import artifacts, runners
from keras_transformer.serving.self_check import token_sequences
from keras_transformer.serving.translator import Translator
from tests import export_helpers

pytest.importorskip("ctranslate2", reason="the ctranslate2 extra is not installed "
                                          "(pip install -e '.[test]' installs it)")

from keras_transformer.serving import ctranslate2_export  # noqa: E402  needs the extra

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SENTENCES = list(export_helpers.validation_sentences()[:40])


def _export(tmp_path, translator_options=None, **model_options):
    tokenizer = export_helpers.tiny_tokenizer()
    keras.utils.set_random_seed(0)
    model = Transformer.from_preset("tiny", vocabulary_size=tokenizer.vocabulary_size,
                                    **model_options)
    translator = Translator(model, tokenizer, **(translator_options or {}))
    entry = ctranslate2_export.export_ctranslate2(translator, str(tmp_path))
    return translator, entry


@pytest.mark.parametrize("model_options", [
    {"num_layers": 2},
    {"num_layers": 2, "normalize_first": True, "tie_embeddings": False},
], ids=["post-ln-tied", "pre-ln-untied"])
def test_ctranslate2_decodes_like_the_model(tmp_path, model_options):
    translator, _ = _export(tmp_path, **model_options)
    expected = runners.ModuleRunner(translator)(SENTENCES)
    found = runners.CTranslate2Runner(tmp_path / files.CTRANSLATE2)(SENTENCES)
    # A random model repeats one token, which still depends on the source; the trained
    # model of test_artifacts_agree.py gives each sentence its own translation.
    assert len(set(token_sequences(expected["token_ids"]))) >= 2
    assert token_sequences(found["token_ids"]) == token_sequences(expected["token_ids"])
    assert runners.translations(found) == runners.translations(expected)
    # CTranslate2 takes the suppressed PAD out of the softmax; the model keeps its
    # probability (≈ 1/V per token for a random model, nil once trained: the trained
    # model's scores agree to 1e-4 in test_artifacts_agree.py).
    np.testing.assert_allclose(found["scores"], expected["scores"], rtol=5e-3)


@pytest.mark.parametrize("model_options", [
    {"num_layers": 2},
    {"num_layers": 2, "normalize_first": True, "tie_embeddings": False},
], ids=["post-ln-tied", "pre-ln-untied"])
def test_ctranslate2_scores_a_reference_like_the_model(tmp_path, model_options):
    """Teacher-forced log-probabilities of real translations: every weight counts here,
    where a random model's greedy ids hardly depend on its cross-attention."""
    import ctranslate2
    import tensorflow as tf

    translator, _ = _export(tmp_path, **model_options)
    tokenizer, model = translator.tokenizer, translator.model
    targets = list(read_lines(export_helpers.CORPUS / "val.de.gz")[:len(SENTENCES)])
    source_pieces = tokenizer.tokenize(tf.constant(SENTENCES)).to_list()
    target_pieces = tokenizer.tokenize(tf.constant(targets)).to_list()
    scorer = ctranslate2.Translator(str(tmp_path / files.CTRANSLATE2))
    found = scorer.score_batch([[tokenizer.id_to_piece(i) for i in ids] for ids in source_pieces],
                               [[tokenizer.id_to_piece(i) for i in ids] for ids in target_pieces])
    for source, target, result in zip(source_pieces, target_pieces, found):
        logits = model({"source_ids": np.array([[START_ID, *source, END_ID]]),
                        "target_ids": np.array([[START_ID, *target]])})
        log_probs = tf.nn.log_softmax(logits[0]).numpy()  # (T, V)
        expected = log_probs[np.arange(len(target) + 1), [*target, END_ID]]
        np.testing.assert_allclose(result.log_probs, expected, rtol=1e-4, atol=1e-4)


def test_both_directories_hold_what_a_runner_needs(tmp_path):
    _, entry = _export(tmp_path, num_layers=1)
    for name, quantization in ((files.CTRANSLATE2, "float32"),
                               (files.CTRANSLATE2_INT8, "int8")):
        directory = tmp_path / name
        assert files.is_ctranslate2_dir(directory)
        assert not files.is_run_dir(directory)  # it has a config.json of its own
        assert artifacts.resolve_artifact(str(directory)) == str(directory)
        assert entry[name]["quantization"] == quantization
        tokenizer_model = (directory / files.TOKENIZER_MODEL).read_bytes()
        assert tokenizer_model == export_helpers.tiny_tokenizer().model_proto
    # int8 matrices (the position tables, biases and norms stay float32).
    assert entry[files.CTRANSLATE2_INT8]["bytes"] < 0.8 * entry[files.CTRANSLATE2]["bytes"]
    assert not [name for name in os.listdir(tmp_path)
                if name.startswith(files.PARTIAL_PREFIX)]


def test_bad_input_gets_one_translation_per_sentence(tmp_path):
    _export(tmp_path, num_layers=1)
    runner = runners.CTranslate2Runner(tmp_path / files.CTRANSLATE2)
    for name, sentences in export_helpers.BAD_INPUTS.items():
        outputs = runner(sentences)
        assert len(outputs["translations"]) == len(sentences), name
        assert outputs["token_ids"].shape[0] == len(sentences), name
    outputs = runner(export_helpers.EMPTY_AND_NOT)
    export_helpers.check_only_empty_sentences_translate_to_nothing(outputs)
    # Outputs stop at the exported limit: source ids + extra_length, END included.
    long = runner(["x" * 10_000])["token_ids"]
    assert long.shape[1] <= runner.options["max_source_length"] - 1


def test_output_limit_is_each_sentences_own(tmp_path):
    # A limit of 3 tokens past the source: random models run to it, so batching a short
    # sentence with a long one shows whether each keeps its own limit.
    translator, _ = _export(tmp_path, {"extra_length": 3}, num_layers=1)
    sentences = ["A dog.", SENTENCES[0] + " " + SENTENCES[1]]
    expected = runners.ModuleRunner(translator)(sentences)
    found = runners.CTranslate2Runner(tmp_path / files.CTRANSLATE2)(sentences)
    assert token_sequences(found["token_ids"]) == token_sequences(expected["token_ids"])
    assert len(token_sequences(expected["token_ids"])[0]) < len(
        token_sequences(expected["token_ids"])[1])
    # The scores are those of each sentence's own tokens (the PAD share aside, as in
    # test_ctranslate2_decodes_like_the_model), none of a longer limit's.
    np.testing.assert_allclose(found["scores"], expected["scores"], rtol=5e-3)


def test_an_ensemble_is_refused(tmp_path):
    from keras_transformer.decoding.ensemble import Ensemble

    tokenizer = export_helpers.tiny_tokenizer()
    models = [Transformer.from_preset("tiny", vocabulary_size=tokenizer.vocabulary_size,
                                      num_layers=1) for _ in range(2)]
    with pytest.raises(ValueError, match="ensemble"):
        ctranslate2_export.model_spec(Ensemble(models), tokenizer)


def test_translating_with_ctranslate2_never_imports_tensorflow(tmp_path):
    _export(tmp_path, num_layers=1)
    directory = str(tmp_path / files.CTRANSLATE2)
    code = (
        "import sys\n"
        "import keras_transformer as kt\n"
        f"translate = kt.load_translator({directory!r})\n"
        "translations = translate(['A dog runs.', ''])\n"
        "loaded = [m for m in ('tensorflow', 'keras', 'tensorflow_text') if m in sys.modules]\n"
        "print(len(translations), repr(translations[1]), loaded)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120, cwd=REPOSITORY)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[-2] == "2 '' []"


def test_the_export_report_names_each_ctranslate2_directory_and_its_weights(tmp_path):
    from keras_transformer.serving import export

    _, entry = _export(tmp_path, num_layers=1)
    report = {"created": "now", "versions": {"tensorflow_text": "x", "ctranslate2": "4.x"},
              "translator": {}, "ctranslate2": entry,
              "saved_model": {"path": "saved_model", "bytes": 1, "signatures": {},
                              "tf_text_ops": [], "ops": []}}
    rows = [line for line in export.report_markdown(report).splitlines()
            if line.startswith("| `ctranslate2")]
    assert rows == ["| `ctranslate2/` | " + export._megabytes(entry["ctranslate2"]["bytes"])
                    + " | CTranslate2, float32 |",
                    "| `ctranslate2_int8/` | "
                    + export._megabytes(entry["ctranslate2_int8"]["bytes"])
                    + " | CTranslate2, int8 |"]


def test_ctranslate2_scores_given_translations_like_the_exported_score(tmp_path):
    translator, _ = _export(tmp_path, num_layers=1)
    targets = [*read_lines(export_helpers.CORPUS / "val.de.gz")[:len(SENTENCES) - 2], "",
               "x" * 500]
    expected = runners.ModuleRunner(translator, signature=files.SCORE_SIGNATURE)(
        SENTENCES, targets)
    found = runners.open_runner(tmp_path / files.CTRANSLATE2,
                                signature=files.SCORE_SIGNATURE)(SENTENCES, targets)
    for name in ("token_ids", "tokens"):
        np.testing.assert_array_equal(found[name], expected[name])
    # score_batch's softmax is the whole one, PAD's share included, as the model's.
    np.testing.assert_allclose(found["token_scores"], expected["token_scores"],
                               rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(found["scores"], expected["scores"], rtol=1e-4, atol=1e-3)
    with pytest.raises(ValueError, match="1 translations: give one per sentence"):
        runners.CTranslate2Runner(tmp_path / files.CTRANSLATE2,
                                  signature=files.SCORE_SIGNATURE)(SENTENCES, targets[:1])


def test_ctranslate2_n_best_lists_are_the_models_without_a_length_penalty(tmp_path):
    # With α = 0 both length penalties are 1: the lists must be the exported n_best's.
    translator, _ = _export(tmp_path, {"length_penalty": 0.0, "max_output_length": 12},
                            num_layers=1)
    sentences = [*SENTENCES[:20], ""]
    expected = runners.ModuleRunner(translator, signature=files.N_BEST_SIGNATURE)(sentences)
    found = runners.CTranslate2Runner(tmp_path / files.CTRANSLATE2,
                                      signature=files.N_BEST_SIGNATURE)(sentences)
    assert found["translations"].shape == expected["translations"].shape == (21, 4)
    same = [token_sequences(a) == token_sequences(b)
            for a, b in zip(found["token_ids"], expected["token_ids"])]
    # CTranslate2 searches without PAD's share of each softmax (about 1/V per token
    # for a random model): a near-tie may order two hypotheses the other way.
    assert sum(same) >= 0.9 * len(sentences), same
    rows = np.array(same)
    np.testing.assert_allclose(found["scores"][rows], expected["scores"][rows],
                               rtol=1e-4, atol=1e-3)
    np.testing.assert_array_equal(found["translations"][:, 0], runners.CTranslate2Runner(
        tmp_path / files.CTRANSLATE2, beam=True)(sentences)["translations"])


def test_a_ctranslate2_directory_alone_translates_only_as_exported(tmp_path):
    # Copied out of its export folder, it has no report beside it: its own
    # translator.json must still refuse decoding options it was not exported with.
    from keras_transformer import loading

    _export(tmp_path, {"beam_size": 2, "length_penalty": 0.8, "n_best": 2}, num_layers=1)
    directory = str(tmp_path / files.CTRANSLATE2)
    assert artifacts.export_report(directory) is None
    assert loading.load_translator(directory, beam=True).decoder == (
        "beam search (beam 2, length penalty 0.8)")
    for options in ({"beam_size": 5}, {"length_penalty": 0.6}, {"n_best": 3},
                    {"sampling_top_k": 7}):
        with pytest.raises(ValueError, match="was exported with|holds n-best|samples"):
            loading.load_translator(directory, **options)


def test_ctranslate2_prefix_sample_and_align_follow_the_exported_signatures(tmp_path):
    """One export, three signatures: CTranslate2's `target_prefix` (α = 0, where both
    beam searches rank alike), its sampling at top-k 1 (greedy decoding), and its
    attention, which must be the exported `align`'s layer with its heads averaged."""
    translator, _ = _export(tmp_path, {"length_penalty": 0.0, "max_output_length": 12,
                                       "sampling_top_k": 1}, num_layers=2)
    directory = tmp_path / files.CTRANSLATE2
    sentences = [*SENTENCES[:12], ""]
    prefixes = ["Ein Mann", "", "zwei", *["die"] * 9, "Hallo"]
    runner = runners.CTranslate2Runner(directory, signature=files.PREFIX_SIGNATURE)
    found = runner(sentences, prefixes)
    expected = runners.ModuleRunner(translator, signature=files.PREFIX_SIGNATURE)(
        sentences, prefixes)
    for row, prefix in zip(found["token_ids"], prefixes):
        pieces = translator.tokenizer.tokenize([prefix]).to_list()[0]
        assert list(row[:len(pieces)]) == pieces
    same = [a == b for a, b in zip(token_sequences(found["token_ids"]),
                                   token_sequences(expected["token_ids"]))]
    assert sum(same) >= 0.9 * len(sentences), same
    np.testing.assert_allclose(found["scores"][same], expected["scores"][same],
                               rtol=1e-4, atol=1e-3)
    with pytest.raises(ValueError, match="13 sentences but 1 prefixes"):
        runner(sentences, prefixes[:1])

    sampled = runners.CTranslate2Runner(directory, signature=files.SAMPLE_SIGNATURE)(
        sentences, list(range(len(sentences))))
    greedy = runners.ModuleRunner(translator)(sentences)
    assert token_sequences(sampled["token_ids"]) == token_sequences(greedy["token_ids"])

    found = runners.CTranslate2Runner(directory, signature=files.ALIGN_SIGNATURE)(sentences)
    expected = runners.ModuleRunner(translator, signature=files.ALIGN_SIGNATURE)(sentences)
    same = [a == b for a, b in zip(token_sequences(found["token_ids"]),
                                   token_sequences(expected["token_ids"]))]
    assert sum(same) >= 0.9 * len(sentences), same
    for i in np.flatnonzero(same):
        for name in ("source_words", "target_words"):
            width = min(found[name].shape[1], expected[name].shape[1])
            np.testing.assert_array_equal(found[name][i, :width], expected[name][i, :width])
        # The weights of the pieces (CTranslate2 gives none for START and END).
        rows = min(found["attention"].shape[1], expected["attention"].shape[1])
        pieces = np.flatnonzero(expected["source_words"][i] >= 0)
        if not pieces.size:  # the empty source: no word to align to
            assert (found["alignments"][i] == -1).all()
            continue
        weights = expected["attention"][i, :rows][:, pieces]  # (rows, pieces)
        np.testing.assert_allclose(found["attention"][i, :rows][:, pieces], weights,
                                   atol=1e-4)
        # The same alignments where no near-tie (a random model's attention is almost
        # uniform) lets float rounding pick another piece.
        ranked = np.sort(weights, axis=1)
        clear = ranked[:, -1] - ranked[:, -2] > 1e-3
        np.testing.assert_array_equal(found["alignments"][i, :rows][clear],
                                      expected["alignments"][i, :rows][clear])


def test_ctranslate2_directories_exported_before_sampling_say_so(tmp_path):
    _export(tmp_path, num_layers=1)
    options_path = tmp_path / files.CTRANSLATE2 / files.CTRANSLATE2_OPTIONS
    options = json.loads(options_path.read_text(encoding="utf-8"))
    for key in ("sampling_top_k", "sampling_temperature", "alignment_layer"):
        del options[key]
    options_path.write_text(json.dumps(options), encoding="utf-8")
    for signature in (files.SAMPLE_SIGNATURE, files.ALIGN_SIGNATURE):
        with pytest.raises(runners.MissingSignatureError, match="export the run again"):
            runners.CTranslate2Runner(tmp_path / files.CTRANSLATE2, signature=signature)
