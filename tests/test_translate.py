"""Streaming translation: input order, bounded windows, batches by sentences or tokens."""

import io
import os
import subprocess
import sys

import hypothesis
import hypothesis.strategies as st
import pytest

from keras_transformer import cli, files, loading, translate
from keras_transformer.data.tokenizer import PAD_ID
from keras_transformer.serving import artifacts, runners
from tests.export_helpers import tiny_export, validation_sentences


def fake_runner(batch):
    """A translator that is a pure function of each sentence."""
    return {"translations": [sentence[::-1].upper() for sentence in batch]}


@hypothesis.settings(max_examples=200, deadline=None)
@hypothesis.example(lengths=[10, 10, 10, 10], batch_size=8, batch_tokens=30)
@hypothesis.given(lengths=st.lists(st.integers(1, 60), max_size=80),
                  batch_size=st.integers(1, 10),
                  batch_tokens=st.one_of(st.none(), st.integers(1, 120)))
def test_length_batches_cover_every_sentence_once_within_both_limits(lengths, batch_size,
                                                                     batch_tokens):
    batches = translate.length_batches(lengths, batch_size, batch_tokens)
    assert sorted(index for batch in batches for index in batch) == list(range(len(lengths)))
    order = [lengths[index] for batch in batches for index in batch]
    assert order == sorted(lengths)
    for batch in batches:
        assert 1 <= len(batch) <= batch_size
        padded = len(batch) * max(lengths[index] for index in batch)
        if batch_tokens is not None and len(batch) > 1:
            assert padded <= batch_tokens
    # Each batch is as full as the limits allow: the next sentence would not have fit.
    for batch, following in zip(batches, batches[1:]):
        widest = max(lengths[index] for index in batch + following[:1])
        assert len(batch) == batch_size or (
            batch_tokens is not None and widest * (len(batch) + 1) > batch_tokens)


@pytest.mark.parametrize("exported, asked, message", [
    # A report that records one of a pair: the other reads as asked.
    ({"beam_size": 4}, dict(beam_size=2, length_penalty=0.6),
     "exported with beam size 4 and length penalty 0.6"),
    ({"length_penalty": 1.0}, dict(beam_size=4, length_penalty=0.6),
     "exported with beam size 4 and length penalty 1.0"),
    ({"sampling_top_k": 0}, dict(sampling={"sampling_top_k": 5}),
     "samples among all tokens at temperature 1"),
    ({"sampling_temperature": 0.5}, dict(sampling={"sampling_top_k": 5,
                                                   "sampling_temperature": 1.0}),
     "samples among 5 tokens at temperature 0.5"),
    ({"n_best": 2}, dict(n_best=3), "holds n-best lists of 2 hypotheses"),
])
def test_what_an_export_cannot_do_is_said_from_what_it_records(exported, asked, message):
    options = {"beam_size": None, "length_penalty": None, "sampling": {}, "n_best": None,
               **asked}
    assert message in loading._unmet_by_export("model.tflite", exported, **options)
    # What it does not record is taken to be as asked.
    assert loading._unmet_by_export("model.tflite", {}, **options) is None


def test_a_damaged_ctranslate2_options_file_is_named(tmp_path):
    directory = tmp_path / files.CTRANSLATE2
    directory.mkdir()
    (directory / files.CTRANSLATE2_MODEL).write_bytes(b"weights")
    for damaged in ('{"beam_size": 4,', "[4]"):  # truncated, edited by hand
        (directory / files.CTRANSLATE2_OPTIONS).write_text(damaged, encoding="utf-8")
        # Every reader of the file: the options, the signatures held, the runner.
        for read in (artifacts.exported_options, runners.signature_names,
                     runners.CTranslate2Runner):
            with pytest.raises(ValueError, match=r"translator.json: not the options of a "
                                                 r"CTranslate2 export .* --ctranslate2"):
                read(str(directory))


def test_a_20k_line_stream_translates_like_line_by_line_in_a_bounded_window():
    lines = [b"line %d %s" % (i, b"x" * (i * 7919 % 23)) for i in range(20_000)]
    read = []

    def source():
        for line in lines:
            read.append(line)
            yield line

    translated = []
    window = 32 * translate.WINDOW_BATCHES

    def runner(batch):
        # Never more than one window read ahead of what is written.
        assert len(read) - len(translated) <= window
        assert len(batch) <= 32
        return fake_runner(batch)

    output = io.BytesIO()

    class Output:
        def write(self, data):
            output.write(data)
            translated.extend(data.splitlines())

        def flush(self):
            pass

    assert translate.translate_file(runner, source(), Output(), batch_size=32) == 20_000
    expected = [fake_runner([line])["translations"][0].decode() for line in lines]
    assert output.getvalue().decode().splitlines() == expected


@pytest.fixture(scope="module")
def exported():
    return tiny_export()


def test_batching_by_tokens_translates_like_one_sentence_a_call(exported, tmp_path,
                                                                monkeypatch):
    sentences = list(validation_sentences())[:40]
    count = artifacts.token_counter(exported.tflite)
    one_by_one = runners.TFLiteRunner(exported.tflite)
    expected = [runners.translations(one_by_one([sentence]))[0] for sentence in sentences]

    calls = []
    open_runner = runners.open_runner

    def spying(artifact, **options):
        runner = open_runner(artifact, **options)

        def call(batch):
            calls.append(len(batch) * max(count(batch)))
            return runner(batch)
        return call

    monkeypatch.setattr(runners, "open_runner", spying)
    source, target = tmp_path / "source.en", tmp_path / "target.de"
    source.write_text("".join(f"{sentence}\n" for sentence in sentences), encoding="utf-8")
    status = cli.main(["translate", exported.tflite, "-i", str(source), "-o", str(target),
                       "--batch-tokens", "60", "--no-progress"])
    assert status == 0
    assert target.read_text(encoding="utf-8").splitlines() == expected
    assert len(calls) > 1 and max(calls) <= 60


def test_the_token_count_is_the_source_ids_the_artifact_decodes(exported):
    sentences = list(validation_sentences())[:10]
    source_ids = exported.translator.source_ids(sentences).numpy()
    assert artifacts.token_counter(exported.saved_model)(sentences) == [
        int((row != PAD_ID).sum()) for row in source_ids]


def test_counting_tokens_without_the_tokenizer_names_where_to_put_it(exported, tmp_path):
    alone = tmp_path / files.TFLITE
    alone.write_bytes(open(exported.tflite, "rb").read())
    with pytest.raises(FileNotFoundError, match="tokenizer.model beside it"):
        loading.load_translator(str(alone), batch_tokens=100)


@pytest.mark.parametrize("threads, expected", [(None, runners.SAVED_MODEL_DEFAULT_THREADS),
                                               (2, 2)])
def test_a_saved_model_runs_on_the_threads_asked_for(exported, threads, expected):
    code = ("import sys, tensorflow as tf\n"
            "from keras_transformer.serving import runners\n"
            f"runner = runners.open_runner(sys.argv[1], threads={threads})\n"
            "runner(['A dog runs.'])\n"
            "print(tf.config.threading.get_intra_op_parallelism_threads(),"
            " tf.config.threading.get_inter_op_parallelism_threads())\n")
    result = subprocess.run([sys.executable, "-c", code, exported.saved_model],
                            capture_output=True, text=True, timeout=120,
                            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == [str(expected), str(expected)]
