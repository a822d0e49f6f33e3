"""Evaluation: exported translators are run and scored exactly as sacreBLEU scores them."""

import gzip
import json
import os

import pytest
import sacrebleu
import tensorflow as tf

from keras_transformer import cli, evaluation, files, runs
from keras_transformer.data import multi30k
from keras_transformer.data.text import read_lines
from keras_transformer.serving import artifacts, runners
from keras_transformer.serving import export as exporting
from tests.export_helpers import CORPUS, tiny_export, validation_sentences

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


@pytest.fixture(scope="module")
def stand_in():
    return _StandInTranslator()


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory, stand_in):
    path = str(tmp_path_factory.mktemp("artifact") / "saved_model")
    tf.saved_model.save(stand_in, path, signatures={
        files.GREEDY_SIGNATURE: stand_in.greedy, files.BEAM_SIGNATURE: stand_in.beam})
    return path


@pytest.fixture(scope="module")
def tiny():
    """The tiny exported translator of the export tests (built once: `tiny_export`)."""
    return tiny_export()


@pytest.fixture()
def text_files(tmp_path):
    source, reference = tmp_path / "test.en.gz", tmp_path / "test.de"
    with gzip.open(source, "wt", encoding="utf-8") as file:
        file.writelines(f"{line}\n" for line in SOURCE)
    reference.write_text("".join(f"{line}\n" for line in REFERENCE), encoding="utf-8")
    return str(source), str(reference)


def _direct_outputs(saved_model, *signatures, sources=SOURCE):
    """Translations of `sources` by each signature, calling the SavedModel directly."""
    loaded = tf.saved_model.load(saved_model)
    outputs = [[value.decode("utf-8") for value in loaded.signatures[signature](
        sentences=tf.constant(sources))["translations"].numpy()] for signature in signatures]
    return outputs[0] if len(signatures) == 1 else outputs


def _assert_sacrebleu_scores(scores, hypotheses, references=REFERENCE):
    bleu = sacrebleu.corpus_bleu(hypotheses, [references])
    chrf = sacrebleu.corpus_chrf(hypotheses, [references])
    assert scores["bleu"]["score"] == pytest.approx(bleu.score, abs=1e-9)
    assert scores["chrf"]["score"] == pytest.approx(chrf.score, abs=1e-9)
    assert "tok:13a" in scores["bleu"]["signature"]
    assert "case:mixed" in scores["bleu"]["signature"]
    for metric in ("bleu", "chrf"):
        assert f"{scores[metric]['signature']} = " in scores[metric]["text"]


def test_saved_model_score_equals_sacrebleu_on_its_outputs(saved_model, text_files, tmp_path):
    output = tmp_path / "hypotheses.de"
    scores = evaluation.evaluate(saved_model, *text_files, batch_size=3, output=str(output),
                                 verbose=False)
    hypotheses = _direct_outputs(saved_model, files.GREEDY_SIGNATURE)
    assert output.read_text(encoding="utf-8").splitlines() == hypotheses
    _assert_sacrebleu_scores(scores, hypotheses)
    assert 0 < scores["bleu"]["score"] < 100
    assert scores["sentences"] == len(SOURCE)


def test_beam_uses_the_beam_signature(saved_model, text_files):
    scores = evaluation.evaluate(saved_model, *text_files, beam=True, verbose=False)
    _assert_sacrebleu_scores(scores, _direct_outputs(saved_model, files.BEAM_SIGNATURE))
    assert scores["beam"] is True


def test_mismatched_source_and_reference_name_both_files_and_counts(saved_model, text_files,
                                                                    tmp_path):
    short = tmp_path / "short.de"
    short.write_text("one line\n", encoding="utf-8")
    with pytest.raises(ValueError, match=rf"{text_files[0]} has 4 lines but {short} has 1"):
        evaluation.evaluate(saved_model, text_files[0], str(short), verbose=False)


def test_mismatched_hypotheses_and_references_are_an_error():
    with pytest.raises(ValueError, match=r"hyps\.de has 2 lines but refs\.de has 3"):
        evaluation.score(["a", "b"], ["a", "b", "c"], hypotheses_name="hyps.de",
                         references_name="refs.de")


def test_command_line_prints_signatures_and_writes_json(saved_model, text_files, tmp_path,
                                                        capsys):
    json_path = tmp_path / "scores.json"
    status = cli.main(["evaluate", saved_model, "--source", text_files[0],
                       "--reference", text_files[1], "--json", str(json_path)])
    assert status == 0
    written = json.loads(json_path.read_text(encoding="utf-8"))
    assert written["artifact"] == saved_model and written["decoder"] == "greedy"
    scores = written["splits"][os.path.basename(text_files[0])]
    printed = capsys.readouterr().out
    assert printed.startswith("greedy:\n")
    assert f"{scores['bleu']['score']:.2f}" in printed
    for metric in ("bleu", "chrf"):
        assert scores[metric]["signature"] in printed
    _assert_sacrebleu_scores(scores, _direct_outputs(saved_model, files.GREEDY_SIGNATURE))


def test_command_line_reports_mismatched_files(saved_model, text_files, tmp_path, capsys):
    short = tmp_path / "short.de"
    short.write_text("one line\n", encoding="utf-8")
    status = cli.main(["evaluate", saved_model, "--source", text_files[0],
                       "--reference", str(short)])
    assert status == 2
    assert f"{short} has 1" in capsys.readouterr().err


def test_session_loader_scores_the_same(saved_model, text_files):
    scores = evaluation.evaluate(saved_model, *text_files, session=True, verbose=False)
    _assert_sacrebleu_scores(scores, _direct_outputs(saved_model, files.GREEDY_SIGNATURE))


def test_missing_beam_signature_is_a_clear_error(tmp_path, stand_in, text_files):
    path = str(tmp_path / "greedy_only")
    tf.saved_model.save(stand_in, path, signatures={files.GREEDY_SIGNATURE: stand_in.greedy})
    with pytest.raises(ValueError, match="has no signature 'beam_search'.*export RUN_DIR"):
        evaluation.evaluate(path, *text_files, beam=True, verbose=False)


def test_run_directory_stands_for_its_export_and_is_exported_when_missing(
        tmp_path, stand_in, text_files, monkeypatch):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.json").write_text("{}", encoding="utf-8")
    with pytest.raises(FileNotFoundError, match=f"keras-transformer export {run_dir}"):
        artifacts.resolve_artifact(str(run_dir))
    exports = []

    def export_run(path, **options):
        exports.append((path, options))
        tf.saved_model.save(stand_in, runs.saved_model_dir(path), signatures={
            files.GREEDY_SIGNATURE: stand_in.greedy})

    monkeypatch.setattr(exporting, "export_run", export_run)
    scores = evaluation.evaluate(str(run_dir), *text_files, verbose=False)
    assert exports == [(str(run_dir), {"tflite": False})]  # the SavedModel, all it reads
    assert scores["artifact"] == str(run_dir / "export" / "saved_model")
    _assert_sacrebleu_scores(scores, _direct_outputs(scores["artifact"],
                                                     files.GREEDY_SIGNATURE))
    evaluation.evaluate(str(run_dir), *text_files, verbose=False)
    assert len(exports) == 1


def test_real_export_is_scored_on_what_it_serves(tiny, tmp_path):
    sources = list(validation_sentences()[:6])
    greedy = _direct_outputs(tiny.saved_model, files.GREEDY_SIGNATURE, sources=sources)
    # Half the references are the greedy output itself, so chrF is well above 0 (BLEU
    # stays 0: an untrained model's outputs are one long "word", with no 4-grams).
    german = read_lines(CORPUS / "val.de.gz")[:6]
    references = [greedy[i] if i % 2 else line for i, line in enumerate(german)]
    source_file, reference_file = tmp_path / "val.en", tmp_path / "val.de"
    source_file.write_text("".join(f"{line}\n" for line in sources), encoding="utf-8")
    reference_file.write_text("".join(f"{line}\n" for line in references), encoding="utf-8")
    scores = evaluation.evaluate(tiny.saved_model, str(source_file), str(reference_file),
                                 batch_size=4, verbose=False)
    _assert_sacrebleu_scores(scores, greedy, references)
    assert scores["chrf"]["score"] > 10
    # The TFLite translator is scored on its own outputs (the same, up to float error).
    tflite = runners.translations(runners.TFLiteRunner(tiny.tflite)(sources))
    scores = evaluation.evaluate(tiny.tflite, str(source_file), str(reference_file),
                                 batch_size=4, verbose=False)
    _assert_sacrebleu_scores(scores, tflite, references)


# --- BLEU as the literature scores Multi30K (lowercased, Moses-tokenized) ---------------

@pytest.mark.parametrize("language, line, expected", [
    # Lowercased; German quotes straightened and escaped; the stop after a closing
    # quote moved outside it (de, fr); a second space dropped.
    ("de", 'Ein Mann sagt  "Hallo."', "ein mann sagt &quot; hallo &quot; ."),
    # English splits before the apostrophe, French after it.
    ("en", "It's a dog, isn't it?", "it &apos;s a dog , isn &apos;t it ?"),
    ("fr", "Un homme l’a vu.", "un homme l&apos; a vu ."),
    # An en dash becomes a hyphen, „…“ plain quotes; hyphenated words stay whole.
    ("de", "Zwei Hunde – „spielen“ im saftig-grünen Schnee.",
     "zwei hunde - &quot; spielen &quot; im saftig-grünen schnee ."),
])
def test_literature_tokenization_follows_the_moses_scripts(language, line, expected):
    assert evaluation.tokenize_as_literature([line], language) == [expected]


def test_literature_bleu_is_sacrebleu_without_tokenization_on_tokenized_text():
    # Text that is already lowercased and tokenized (no character Moses would escape)
    # passes the tokenization unchanged, so the score is sacreBLEU's with tok "none".
    hypotheses = ["a man rides a horse .", "two dogs play in snow .", "a girl reads ."]
    references = ["a man rides a brown horse .", "two dogs play in the snow .",
                  "a girl is reading a book ."]
    assert evaluation.tokenize_as_literature(hypotheses, "en") == hypotheses
    scores = evaluation.score_tokenized(hypotheses, references, "en")
    expected = sacrebleu.corpus_bleu(hypotheses, [references], tokenize="none")
    assert scores["score"] == pytest.approx(expected.score, abs=1e-9)
    assert scores["score"] != pytest.approx(
        sacrebleu.corpus_bleu([h.upper() for h in hypotheses], [references],
                              tokenize="none").score)
    # Cased, detokenized output scores as its lowercased tokens do.
    cased = ["A man rides a horse.", "Two dogs play in snow.", "A girl reads."]
    assert evaluation.score_tokenized(cased, references, "en")["score"] == scores["score"]
    assert scores["signature"].startswith("lc.norm.tok:sacremoses-")
    assert "|tok:none|" in scores["signature"]


def test_literature_tokenization_of_the_raw_references_gives_multi30k_tok_files(
        multi30k_dir):
    tok = multi30k_dir / "tok"
    if not tok.is_dir():
        pytest.skip(f"{tok} is missing: Multi30K's tokenized files are not in this copy")
    for split in multi30k.TEST_SPLITS:
        for language in multi30k.LANGUAGES:
            raw = read_lines(multi30k_dir / f"{split}.{language}.gz")
            published = read_lines(tok / multi30k.tokenized_file_name(split, language))
            assert evaluation.tokenize_as_literature(raw, language) == published, (
                split, language)


def test_a_reference_with_tokenized_text_beside_it_gets_the_literature_bleu(
        saved_model, tmp_path):
    # Multi30K's layout: DIR/<split>.<language>.gz and DIR/tok/<split>.lc.norm.tok.<language>.
    source, reference = tmp_path / "test_2016_flickr.en", tmp_path / "test_2016_flickr.de"
    source.write_text("".join(f"{line}\n" for line in SOURCE), encoding="utf-8")
    reference.write_text("".join(f"{line}\n" for line in REFERENCE), encoding="utf-8")
    plain = evaluation.evaluate(saved_model, str(source), str(reference), verbose=False)
    assert "bleu_tok" not in plain  # no tok/ folder: cased sacreBLEU alone
    (tmp_path / "tok").mkdir()
    tokenized = evaluation.tokenize_as_literature(REFERENCE, "de")
    tokenized_path = tmp_path / "tok" / "test_2016_flickr.lc.norm.tok.de"
    tokenized_path.write_text("".join(f"{line}\n" for line in tokenized), encoding="utf-8")
    scores = evaluation.evaluate(saved_model, str(source), str(reference), verbose=False)
    hypotheses = _direct_outputs(saved_model, files.GREEDY_SIGNATURE)
    expected = sacrebleu.corpus_bleu(evaluation.tokenize_as_literature(hypotheses, "de"),
                                     [tokenized], tokenize="none")
    assert scores["bleu_tok"]["score"] == pytest.approx(expected.score, abs=1e-9)
    assert scores["tokenized_reference"] == str(tokenized_path)
    assert scores["bleu"] == plain["bleu"]
    table = evaluation.format_table({"test_2016_flickr": scores}, "greedy")
    assert "BLEU lc.tok" in table and f"{expected.score:.2f}" in table
    assert scores["bleu_tok"]["signature"] in table
    assert evaluation.score_tokenized(hypotheses, tokenized, "de") == scores["bleu_tok"]
