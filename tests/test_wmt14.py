"""WMT14 through TensorFlow Datasets, offline: TFDS's mock data stands in for the corpus."""

import pytest

tfds = pytest.importorskip("tensorflow_datasets")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from keras_transformer.config import DataConfig  # noqa: E402
from keras_transformer.data import batching, corpus, text, wmt14  # noqa: E402
from keras_transformer.data.tokenizer import END_ID, PAD_ID, START_ID, train_tokenizer  # noqa: E402

# English and German sides of a tiny "split": an empty side and an over-long side.
PAIRS = [("A house.", "Ein Haus."), ("", "Leer."), ("Long " * 300, "Lang."),
         ("Two cats.", "Zwei Katzen.")]
WMT14 = DataConfig(corpus="wmt14")


def _as_dataset(self, *args, **kwargs):
    """Replaces the TFDS builder's reader: every split yields `PAIRS`."""
    return tf.data.Dataset.from_tensor_slices(
        {"en": [english for english, _ in PAIRS], "de": [german for _, german in PAIRS]})


def test_tfds_name_covers_both_directions_and_refuses_others():
    assert wmt14.tfds_name("en", "de") == "wmt14_translate/de-en"
    assert wmt14.tfds_name("de", "en") == "wmt14_translate/de-en"
    with pytest.raises(ValueError, match="no fr-de direction"):
        wmt14.tfds_name("fr", "de")


def test_load_split_reads_the_configured_direction():
    with tfds.testing.mock_data(as_dataset_fn=_as_dataset):
        english_german = corpus.load_split(WMT14, "validation", verbose=False)
        german_english = corpus.load_split(
            DataConfig(corpus="wmt14", source_language="de", target_language="en"),
            "validation", verbose=False)
    # Validation keeps every pair, so that no reference line goes missing.
    assert english_german.source_lines == tuple(english for english, _ in PAIRS)
    assert english_german.target_lines == tuple(german for _, german in PAIRS)
    assert german_english.source_lines == english_german.target_lines
    assert english_german.source_file == "tfds:wmt14_translate/de-en:validation:en"


def test_training_split_drops_empty_and_overlong_pairs():
    with tfds.testing.mock_data(as_dataset_fn=_as_dataset):
        train = corpus.load_split(WMT14, "train", verbose=False)
    assert train.source_lines == ("A house.", "Two cats.")
    assert train.target_lines == ("Ein Haus.", "Zwei Katzen.")
    assert train.stats == text.FilterStats(read=4, kept=2, empty=1, too_long=1)


def test_write_split_gives_line_aligned_files_for_evaluation(tmp_path):
    with tfds.testing.mock_data(as_dataset_fn=_as_dataset):
        paths = wmt14.write_split(WMT14, "test", str(tmp_path))
    assert paths == (str(tmp_path / "test.en"), str(tmp_path / "test.de"))
    assert text.read_parallel(tmp_path / "test.en", tmp_path / "test.de",
                                filter_pairs=False).target_lines == tuple(
        german for _, german in PAIRS)


def test_unknown_split_is_refused():
    with pytest.raises(ValueError, match="Unknown split 'dev'"):
        wmt14.load_split(WMT14, "dev")


def test_mock_corpus_flows_into_token_budget_batches():
    with tfds.testing.mock_data(num_examples=64, policy=tfds.testing.MockPolicy.USE_CODE):
        text = corpus.load_split(WMT14, "train", verbose=False)
    assert 0 < len(text) <= 64
    tokenizer = train_tokenizer(text.source_lines + text.target_lines, 100, verbose=False)
    batches = list(batching.make_dataset(text, tokenizer, batch_tokens=256, max_length=64,
                                      shuffle=False, verbose=False))
    pairs = 0
    for inputs, targets, loss_weights in batches:
        source_ids = inputs["source_ids"].numpy()
        assert source_ids.size <= 256 and targets.numpy().size <= 256
        assert np.all(source_ids[:, 0] == START_ID)
        assert np.all(inputs["target_ids"].numpy()[:, 0] == START_ID)
        assert np.all(np.sum(targets.numpy() == END_ID, axis=1) == 1)
        np.testing.assert_array_equal(loss_weights.numpy(), targets.numpy() != PAD_ID)
        pairs += len(source_ids)
    expected = sum(len(tokenizer.tokenize(line).numpy()) + 2 <= 64
                   and len(tokenizer.tokenize(target).numpy()) + 2 <= 64
                   for line, target in zip(text.source_lines, text.target_lines))
    assert pairs == expected
