"""The exported `prefix`, `sample` and `align` signatures, in every artifact, runner,
`LoadedTranslator` method and command-line option.

References: the in-memory `Translator` (whose decoding `tests/test_prefix_sampling.py`
and `tests/test_alignment.py` check against brute force and NumPy), each artifact's own
`beam_search`, and the tokenizer. The int8 file computes another function: it is held
to the contracts, not to the float outputs.
"""

import numpy as np
import pytest

from keras_transformer import cli, files, formats, loading
from keras_transformer.serving import runners, self_check
from tests.export_helpers import BAD_INPUTS, artifact_runner, batch_of, tiny_export

SENTENCES = [*batch_of(6), "", "x"]
PREFIXES = ["Ein Mann", "", "zwei Hunde laufen", "x", "Die", "", "Hallo", ""]
TOLERANCE = dict(rtol=self_check.SCORE_RTOL, atol=self_check.SCORE_ATOL)
FLOAT_ARTIFACTS = ["saved_model", "session", "tflite"]
ALL_ARTIFACTS = [*FLOAT_ARTIFACTS, "tflite_quantized"]
SECOND = {files.PREFIX_SIGNATURE: PREFIXES, files.SAMPLE_SIGNATURE: list(range(8)),
          files.ALIGN_SIGNATURE: None}


@pytest.fixture(scope="module")
def exported():
    return tiny_export()


def _runner(exported, artifact, signature):
    return artifact_runner(exported.directory, artifact, signature)


def _pieces(exported, texts):
    return exported.translator.tokenizer.tokenize(texts).to_list()


@pytest.mark.parametrize("signature", list(SECOND))
@pytest.mark.parametrize("artifact", FLOAT_ARTIFACTS)
def test_every_artifact_decodes_as_the_in_memory_model(exported, artifact, signature):
    found = _runner(exported, artifact, signature)(SENTENCES, SECOND[signature])
    expected = runners.ModuleRunner(exported.translator, signature=signature)(
        SENTENCES, SECOND[signature])
    assert sorted(found) == sorted(expected)
    for name in found:
        if name in ("scores", "attention"):
            np.testing.assert_allclose(found[name], expected[name], **TOLERANCE)
        else:
            np.testing.assert_array_equal(found[name], expected[name])


@pytest.mark.parametrize("artifact", ALL_ARTIFACTS)
def test_each_artifacts_translations_start_with_their_prefix(exported, artifact):
    found = _runner(exported, artifact, files.PREFIX_SIGNATURE)(SENTENCES, PREFIXES)
    beam = _runner(exported, artifact, files.BEAM_SIGNATURE)(SENTENCES)
    for i, pieces in enumerate(_pieces(exported, PREFIXES)):
        assert list(found["token_ids"][i, :len(pieces)]) == pieces, PREFIXES[i]
        assert formats.text(found["translations"][i]).startswith(PREFIXES[i])
        if not pieces:  # no prefix: beam search's own translation
            assert found["translations"][i] == beam["translations"][i]
    # A prefix does not change its sentence's neighbours.
    alone = _runner(exported, artifact, files.PREFIX_SIGNATURE)([SENTENCES[2]],
                                                                 [PREFIXES[2]])
    assert alone["translations"][0] == found["translations"][2]


@pytest.mark.parametrize("artifact", ALL_ARTIFACTS)
def test_each_artifacts_samples_follow_their_seed_and_sentence_alone(exported, artifact):
    runner = _runner(exported, artifact, files.SAMPLE_SIGNATURE)
    first = runner(SENTENCES, [7] * len(SENTENCES))
    again = runner(SENTENCES, [7] * len(SENTENCES))
    np.testing.assert_array_equal(first["token_ids"], again["token_ids"])
    other = runner(SENTENCES, [8] * len(SENTENCES))
    # A random model's distribution is almost flat: another seed draws other tokens.
    assert list(other["translations"]) != list(first["translations"])
    # Neither the batch nor the place in it: reversed, and one sentence alone.
    reversed_ = runner(SENTENCES[::-1], [7] * len(SENTENCES))
    np.testing.assert_array_equal(reversed_["translations"][::-1], first["translations"])
    alone = runner([SENTENCES[3]], [7])
    assert alone["translations"][0] == first["translations"][3]
    # A seed per sentence: equal sentences with equal seeds sample alike.
    mixed = runner([SENTENCES[0], SENTENCES[0], SENTENCES[0]], [7, 7, 8])
    assert mixed["translations"][0] == mixed["translations"][1] == first["translations"][0]
    assert mixed["translations"][2] == other["translations"][0]


@pytest.mark.parametrize("artifact", ALL_ARTIFACTS)
def test_each_artifacts_alignments_follow_its_attention_and_words(exported, artifact):
    found = _runner(exported, artifact, files.ALIGN_SIGNATURE)(SENTENCES)
    beam = _runner(exported, artifact, files.BEAM_SIGNATURE)(SENTENCES)
    np.testing.assert_array_equal(found["translations"], beam["translations"])
    for i, sentence in enumerate(SENTENCES):
        source = found["source_words"][i]
        words = source[source >= 0]
        # Source words count the sentence's whitespace words, in order, from 0.
        assert list(np.unique(words)) == list(range(len(sentence.split())))
        assert np.all(np.diff(words) >= 0)
        attention = found["attention"][i]
        np.testing.assert_allclose(attention.sum(axis=-1)[found["token_ids"][i] != 0], 1.0,
                                   atol=1e-3)
        targets = found["target_words"][i]
        aligned = found["alignments"][i]
        assert np.all((aligned >= 0) == (targets >= 0))
        for row in np.flatnonzero(targets >= 0):
            # The source word of the most attended piece among the words' pieces.
            columns = np.flatnonzero(source >= 0)
            assert aligned[row] == source[columns[np.argmax(attention[row, columns])]]


def test_bad_second_inputs_are_clear_errors_everywhere(exported):
    for artifact in ALL_ARTIFACTS:
        prefix = _runner(exported, artifact, files.PREFIX_SIGNATURE)
        with pytest.raises(ValueError, match="3 sentences but 2 prefixes"):
            prefix(SENTENCES[:3], PREFIXES[:2])
        sample = _runner(exported, artifact, files.SAMPLE_SIGNATURE)
        with pytest.raises(ValueError, match="seeds"):
            sample(SENTENCES[:2], ["a", "b"])
        with pytest.raises(ValueError, match="3 sentences but 1 seeds"):
            sample(SENTENCES[:3], [1])
        with pytest.raises(ValueError, match="align"):
            _runner(exported, artifact, files.ALIGN_SIGNATURE)(SENTENCES[:2], ["a", "b"])


@pytest.mark.parametrize("artifact", ["saved_model", "tflite", "tflite_quantized"])
@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_decoding_signatures_answer_every_bad_input_once(exported, artifact, case):
    sentences = BAD_INPUTS[case]
    count = len(sentences)
    for second in (sentences, [""] * count):  # bad prefixes, and bad sentences alone
        outputs = _runner(exported, artifact, files.PREFIX_SIGNATURE)(
            ["A dog runs."] * count if second is sentences else sentences, second)
        assert outputs["translations"].shape == (count,)
    sampled = _runner(exported, artifact, files.SAMPLE_SIGNATURE)(sentences,
                                                                  list(range(count)))
    assert sampled["translations"].shape == (count,)
    assert np.all(np.isfinite(sampled["scores"]))
    aligned = _runner(exported, artifact, files.ALIGN_SIGNATURE)(sentences)
    assert aligned["translations"].shape == (count,)
    assert aligned["alignments"].shape == aligned["target_words"].shape
    assert aligned["attention"].shape[0] == count
    if count:  # (an empty batch's attention keeps a row of width)
        assert aligned["attention"].shape[:2] == aligned["target_words"].shape


def test_loaded_translator_prefixes_samples_and_aligns_like_the_signatures(exported):
    loaded = loading.load_translator(exported.tflite, batch_size=3)
    raw = _runner(exported, "tflite", files.PREFIX_SIGNATURE)(SENTENCES, PREFIXES)
    assert loaded.prefix(SENTENCES, PREFIXES) == [formats.one_line(t) for t in
                                                  raw["translations"]]
    with pytest.raises(ValueError, match="8 sentences but 1 prefixes"):
        loaded.prefix(SENTENCES, PREFIXES[:1])
    raw = _runner(exported, "tflite", files.SAMPLE_SIGNATURE)(SENTENCES, [5] * 8)
    assert loaded.sample(SENTENCES, seed=5) == [formats.one_line(t) for t in
                                                raw["translations"]]
    assert loaded.sample(SENTENCES, seed=[5] * 8) == loaded.sample(SENTENCES, seed=5)
    with pytest.raises(ValueError, match="8 sentences but 2 seeds"):
        loaded.sample(SENTENCES, seed=[1, 2])
    raw = _runner(exported, "tflite", files.ALIGN_SIGNATURE)(SENTENCES)
    aligned = loaded.align(SENTENCES)
    for i, entry in enumerate(aligned):
        assert entry.translation == formats.one_line(raw["translations"][i])
        assert entry.alignment == formats.alignment_pairs(
            {name: value[i] for name, value in raw.items()})
        pieces = int(np.count_nonzero(raw["token_ids"][i]))
        assert entry.attention.shape[0] == pieces
        width = entry.attention.shape[1]
        np.testing.assert_array_equal(entry.attention, raw["attention"][i, :pieces, :width])
    with pytest.raises(ValueError, match="samples among all tokens at "
                       "temperature 1: .*export the run again with --sampling-topk"):
        loading.load_translator(exported.tflite, sampling_top_k=5)


def _lines(path, lines):
    path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    return str(path)


def test_translate_with_a_prefix_file_writes_what_prefix_gives(exported, tmp_path, capsys):
    source = _lines(tmp_path / "source.txt", SENTENCES)
    prefixes = _lines(tmp_path / "prefixes.txt", PREFIXES)
    output = tmp_path / "out.txt"
    assert cli.main(["translate", exported.saved_model, "--input", source, "--prefix-file",
                     prefixes, "--output", str(output), "--batch-size", "3",
                     "--no-progress"]) == 0
    expected = loading.load_translator(exported.saved_model).prefix(SENTENCES, PREFIXES)
    assert output.read_text(encoding="utf-8").splitlines() == expected
    short = _lines(tmp_path / "short.txt", PREFIXES[:3])
    assert cli.main(["translate", exported.saved_model, "--input", source,
                     "--prefix-file", short, "--no-progress"]) == 2
    assert f"--prefix-file {short} has 3 lines" in capsys.readouterr().err


def test_translate_alignment_writes_pharaoh_pairs(exported, tmp_path, capsysbinary):
    source = _lines(tmp_path / "source.txt", SENTENCES)
    assert cli.main(["translate", exported.tflite, "--input", source, "--alignment",
                     "--no-progress"]) == 0
    lines = capsysbinary.readouterr().out.decode("utf-8").splitlines()
    expected = loading.load_translator(exported.tflite).align(SENTENCES)
    assert len(lines) == len(SENTENCES)
    for line, entry in zip(lines, expected):
        text, pairs = line.split(" ||| ")
        assert text == entry.translation
        assert formats.parse_pharaoh(pairs) == entry.alignment


def test_translate_sampling_repeats_its_seed_and_refuses_what_the_artifact_lacks(
        exported, tmp_path, capsysbinary):
    source = _lines(tmp_path / "source.txt", SENTENCES)
    outputs = []
    for seed in ("3", "3", "4"):
        assert cli.main(["translate", exported.tflite, "--input", source, "--seed", seed,
                         "--no-progress"]) == 0
        outputs.append(capsysbinary.readouterr().out.decode("utf-8").splitlines())
    assert outputs[0] == outputs[1] == loading.load_translator(exported.tflite).sample(
        SENTENCES, seed=3)
    assert outputs[2] != outputs[0]
    for refused in (["--sampling-topk", "5"], ["--seed", "1", "--beam"],
                    ["--seed", "1", "--alignment"]):
        assert cli.main(["translate", exported.tflite, "--input", source, *refused,
                         "--no-progress"]) == 2, refused
