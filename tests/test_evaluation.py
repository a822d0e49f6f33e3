"""Evaluation: exported translators are run and scored exactly as sacreBLEU scores them."""

import gzip
import json

import keras
import pytest
import sacrebleu
import tensorflow as tf

from keras_transformer import Transformer, evaluation, exported, serving
from keras_transformer.tokenizer import train_tokenizer

SOURCE = ["a man rides a horse .", "two dogs play in the snow .",
          "a girl is reading a book .", "the boy jumps into the water ."]
REFERENCE = ["A man rides a horse.", "Two dogs are playing in the snow.",
             "A girl is reading a book .", "The boy jumps into the lake."]


def _outputs(translations):
    """The outputs of an exported translator's signatures, for `translations`."""
    batch = tf.shape(translations)[0]
    return {"translations": translations, "token_ids": tf.zeros([batch, 2], tf.int32),
            "scores": tf.zeros([batch])}


class _StandInTranslator(tf.Module):
    """Has the exported translator's signatures; its "translation" is a string op."""

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def greedy(self, sentences):
        return _outputs(tf.strings.regex_replace(sentences, " \\.$", "."))

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def beam(self, sentences):
        return _outputs(tf.strings.upper(sentences))

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def identity(self, sentences):
        return _outputs(tf.identity(sentences))


@pytest.fixture(scope="module")
def stand_in():
    return _StandInTranslator()


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory, stand_in):
    path = str(tmp_path_factory.mktemp("artifact") / "saved_model")
    tf.saved_model.save(stand_in, path, signatures={
        exported.GREEDY_SIGNATURE: stand_in.greedy, exported.BEAM_SIGNATURE: stand_in.beam})
    return path


@pytest.fixture(scope="module")
def tflite_file(tmp_path_factory, stand_in):
    # String ops other than identity would need Flex kernels, which LiteRT lacks.
    converter = tf.lite.TFLiteConverter.from_concrete_functions(
        [stand_in.identity.get_concrete_function()], stand_in)
    path = tmp_path_factory.mktemp("tflite") / "translator.tflite"
    path.write_bytes(converter.convert())
    return str(path)


@pytest.fixture()
def files(tmp_path):
    source, reference = tmp_path / "test.en.gz", tmp_path / "test.de"
    with gzip.open(source, "wt", encoding="utf-8") as file:
        file.writelines(f"{line}\n" for line in SOURCE)
    reference.write_text("".join(f"{line}\n" for line in REFERENCE), encoding="utf-8")
    return str(source), str(reference)


def _direct_outputs(saved_model, *signatures):
    """Translations of SOURCE by each signature, called without `exported`'s help."""
    loaded = tf.saved_model.load(saved_model)
    outputs = [[value.decode("utf-8") for value in loaded.signatures[signature](
        sentences=tf.constant(SOURCE))["translations"].numpy()] for signature in signatures]
    return outputs[0] if len(signatures) == 1 else outputs


def _assert_sacrebleu_scores(scores, hypotheses):
    bleu = sacrebleu.corpus_bleu(hypotheses, [REFERENCE])
    chrf = sacrebleu.corpus_chrf(hypotheses, [REFERENCE])
    assert scores["bleu"]["score"] == pytest.approx(bleu.score, abs=1e-9)
    assert scores["chrf"]["score"] == pytest.approx(chrf.score, abs=1e-9)
    assert "tok:13a" in scores["bleu"]["signature"]
    assert "case:mixed" in scores["bleu"]["signature"]
    for metric in ("bleu", "chrf"):
        assert f"{scores[metric]['signature']} = " in scores[metric]["text"]


def test_saved_model_score_equals_sacrebleu_on_its_outputs(saved_model, files, tmp_path):
    output = tmp_path / "hypotheses.de"
    scores = evaluation.evaluate(saved_model, *files, batch_size=3, output=str(output),
                                 verbose=False)
    hypotheses = _direct_outputs(saved_model, exported.GREEDY_SIGNATURE)
    assert output.read_text(encoding="utf-8").splitlines() == hypotheses
    _assert_sacrebleu_scores(scores, hypotheses)
    assert 0 < scores["bleu"]["score"] < 100
    assert scores["sentences"] == len(SOURCE)


def test_beam_uses_the_beam_signature(saved_model, files):
    scores = evaluation.evaluate(saved_model, *files, beam=True, verbose=False)
    _assert_sacrebleu_scores(scores, _direct_outputs(saved_model, exported.BEAM_SIGNATURE))
    assert scores["beam"] is True


def test_tflite_score_equals_sacrebleu_on_its_outputs(tflite_file, files):
    scores = evaluation.evaluate(tflite_file, *files, batch_size=2, verbose=False)
    _assert_sacrebleu_scores(scores, SOURCE)


def test_mismatched_source_and_reference_name_both_files_and_counts(saved_model, files,
                                                                    tmp_path):
    short = tmp_path / "short.de"
    short.write_text("one line\n", encoding="utf-8")
    with pytest.raises(ValueError, match=rf"{files[0]} has 4 lines but {short} has 1"):
        evaluation.evaluate(saved_model, files[0], str(short), verbose=False)


def test_mismatched_hypotheses_and_references_are_an_error():
    with pytest.raises(ValueError, match=r"hyps\.de has 2 lines but refs\.de has 3"):
        evaluation.score(["a", "b"], ["a", "b", "c"], hypotheses_name="hyps.de",
                         references_name="refs.de")


def test_batches_keep_the_order_of_lines():
    lines = [str(number) for number in range(10)]
    translations = evaluation.translate_lines(
        lambda batch: [f"<{line}>" for line in batch], lines, batch_size=4, verbose=False)
    assert translations == [f"<{line}>" for line in lines]


def test_command_line_prints_signatures_and_writes_json(saved_model, files, tmp_path,
                                                        capsys):
    json_path = tmp_path / "scores.json"
    status = evaluation.main(["--artifact", saved_model, "--source", files[0],
                              "--reference", files[1], "--json", str(json_path), "--quiet"])
    assert status == 0
    written = json.loads(json_path.read_text(encoding="utf-8"))
    printed = capsys.readouterr().out
    for metric in ("bleu", "chrf"):
        assert f"{written[metric]['signature']} = " in printed
    _assert_sacrebleu_scores(written, _direct_outputs(saved_model, exported.GREEDY_SIGNATURE))


def test_command_line_reports_mismatched_files(saved_model, files, tmp_path, capsys):
    short = tmp_path / "short.de"
    short.write_text("one line\n", encoding="utf-8")
    status = evaluation.main(["--artifact", saved_model, "--source", files[0],
                              "--reference", str(short), "--quiet"])
    assert status == 2
    assert f"{short} has 1" in capsys.readouterr().err


def test_run_directory_uses_its_exported_saved_model(tmp_path, stand_in):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.json").write_text("{}", encoding="utf-8")
    with pytest.raises(FileNotFoundError, match="python -m export"):
        exported.resolve_artifact(str(run_dir))
    saved_model = str(run_dir / "export" / "saved_model")
    tf.saved_model.save(stand_in, saved_model, signatures={
        exported.GREEDY_SIGNATURE: stand_in.greedy})
    assert exported.resolve_artifact(str(run_dir)) == saved_model


def test_real_exported_translator_is_scored_on_what_it_serves(tmp_path, files):
    tokenizer = train_tokenizer(SOURCE + REFERENCE, 60, verbose=False)
    keras.utils.set_random_seed(0)
    model = Transformer.from_preset("tiny", vocabulary_size=tokenizer.vocabulary_size,
                                    num_layers=1)
    translator = serving.Translator(model, tokenizer, max_output_length=8)
    saved_model = str(tmp_path / "saved_model")
    serving.save_saved_model(translator, saved_model)
    expected = _direct_outputs(saved_model, serving.GREEDY_SIGNATURE,
                               serving.BEAM_SIGNATURE)
    for beam, hypotheses in zip((False, True), expected):
        scores = evaluation.evaluate(saved_model, *files, batch_size=3, beam=beam,
                                     verbose=False)
        _assert_sacrebleu_scores(scores, hypotheses)


def test_missing_signature_lists_the_available_ones(tmp_path, stand_in):
    path = str(tmp_path / "greedy_only")
    tf.saved_model.save(stand_in, path, signatures={"serving_default": stand_in.greedy})
    with pytest.raises(ValueError, match=r"no signature 'beam_search'.*serving_default"):
        exported.load_translator(path, beam=True)
