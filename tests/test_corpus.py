"""Tests for keras_transformer.corpus: finding, downloading and validating parallel text."""

import functools
import gzip
import hashlib
import http.server
import os
import shutil
import threading

import pytest

from keras_transformer.config import DataConfig
from keras_transformer.data import corpus, multi30k, text


def fixture_config(directory, source="en", target="de"):
    return DataConfig(data_dir=str(directory), source_language=source,
                      target_language=target)


@pytest.mark.parametrize("source,target", [("en", "de"), ("de", "en"), ("en", "fr"),
                                           ("fr", "en")])
def test_reads_each_direction_from_data_dir(fixture_corpus_dir, source, target):
    parallel_text = corpus.load_split(fixture_config(fixture_corpus_dir, source, target),
                                      "train", verbose=False)
    assert parallel_text.source_file.endswith(f"train.{source}.gz")
    assert parallel_text.target_file.endswith(f"train.{target}.gz")
    assert len(parallel_text) == len(parallel_text.target_lines) == 168
    assert parallel_text.stats == text.FilterStats(read=168, kept=168)
    expected = text.read_lines(fixture_corpus_dir / f"train.{source}.gz")
    assert list(parallel_text.source_lines) == expected


def test_split_names_map_to_multi30k_files(fixture_corpus_dir):
    config = fixture_config(fixture_corpus_dir)
    assert [os.path.basename(path) for split in ("validation", "test")
            for path in corpus.corpus_files(config, split)] == [
        "val.en.gz", "val.de.gz", "test_2016_flickr.en.gz", "test_2016_flickr.de.gz"]
    with pytest.raises(ValueError, match="Unknown split 'dev'"):
        corpus.corpus_files(config, "dev")


def test_every_multi30k_checksum_is_that_of_the_file(multi30k_dir):
    # Every split of every language: the table the downloads are checked against.
    assert sorted(multi30k.SHA256) == sorted(
        f"{split}.{language}.gz" for split in multi30k.SPLITS for language in multi30k.LANGUAGES)
    for name, expected in multi30k.SHA256.items():
        assert hashlib.sha256((multi30k_dir / name).read_bytes()).hexdigest() == expected, name


def test_every_tokenized_multi30k_checksum_is_that_of_the_file(multi30k_dir):
    assert sorted(multi30k.TOKENIZED_SHA256) == sorted(
        multi30k.tokenized_file_name(split, language)
        for split in multi30k.TOKENIZED_SPLITS for language in multi30k.LANGUAGES)
    tok = multi30k_dir / multi30k.TOKENIZED_FOLDER
    if not tok.is_dir():
        pytest.skip(f"{tok} is missing: Multi30K's tokenized files are not in this copy")
    for name, expected in multi30k.TOKENIZED_SHA256.items():
        assert hashlib.sha256((tok / name).read_bytes()).hexdigest() == expected, name
    reference = multi30k_dir / "test_2017_mscoco.fr.gz"
    assert multi30k.tokenized_reference(reference) == str(
        tok / "test_2017_mscoco.lc.norm.tok.fr")
    assert multi30k.tokenized_reference(multi30k_dir / "train.fr.gz") is None


def test_multi30k_from_data_dir_has_its_published_sizes(multi30k_dir):
    sizes = {split: len(corpus.load_split(fixture_config(multi30k_dir, "en", "fr"), split,
                                          verbose=False))
             for split in ("train", "validation", *multi30k.TEST_SPLITS)}
    assert sizes == {"train": 29000, "validation": 1014, "test_2016_flickr": 1000,
                     "test_2017_flickr": 1000, "test_2017_mscoco": 461}


def test_unsupported_direction_is_rejected(fixture_corpus_dir):
    for source, target in [("en", "en"), ("en", "cs")]:
        with pytest.raises(ValueError, match=f"no {source}-{target} direction"):
            corpus.load_split(fixture_config(fixture_corpus_dir, source, target), "train")


def test_other_corpus_reads_named_files(tmp_path):
    write(tmp_path / "a.src", "Hallo Welt.\nGuten Morgen!\n")
    write(tmp_path / "a.tgt", "Hello world.\nGood morning!\n")
    config = DataConfig(corpus="custom",
                        train_files=(str(tmp_path / "a.src"), str(tmp_path / "a.tgt")))
    parallel_text = corpus.load_split(config, "train", verbose=False)
    assert parallel_text.source_lines == ("Hallo Welt.", "Guten Morgen!")
    assert parallel_text.target_lines == ("Hello world.", "Good morning!")
    with pytest.raises(ValueError, match="DataConfig.validation_files"):
        corpus.load_split(config, "validation")


def test_missing_file_names_it_and_the_fix(tmp_path):
    with pytest.raises(text.CorpusFileNotFoundError) as error:
        corpus.load_split(fixture_config(tmp_path), "train")
    assert isinstance(error.value, FileNotFoundError)
    assert str(tmp_path / "train.en.gz") in str(error.value)
    assert "DataConfig.data_dir" in str(error.value)


def test_line_count_mismatch_names_both_files_and_counts(tmp_path):
    write(tmp_path / "train.en.gz", "One.\nTwo.\nThree.\n", compress=True)
    write(tmp_path / "train.de.gz", "Eins.\nZwei.\n", compress=True)
    with pytest.raises(text.LineCountMismatchError) as error:
        corpus.load_split(fixture_config(tmp_path), "train")
    message = str(error.value)
    assert f"{tmp_path / 'train.en.gz'} has 3 lines" in message
    assert f"{tmp_path / 'train.de.gz'} has 2" in message


@pytest.mark.parametrize("compress", [False, True])
def test_invalid_utf8_names_file_and_line(tmp_path, compress):
    path = tmp_path / "bad.de"
    data = "Ein Mann.\nZwei Frauen.\n".encode() + "Drei Männer.\n".encode("latin-1")
    (tmp_path / "bad.de").write_bytes(gzip.compress(data) if compress else data)
    with pytest.raises(text.CorpusEncodingError,
                       match=rf"{path}: line 3: bytes .* not valid UTF-8"):
        text.read_lines(path)


@pytest.mark.parametrize("damage", ["truncated", "bad_deflate_stream"])
def test_damaged_gzip_names_the_file(tmp_path, damage):
    path = tmp_path / "train.en.gz"
    data = bytearray(gzip.compress(b"A cat.\n" * 100))
    if damage == "truncated":
        data = data[:30]
    else:
        data[10] ^= 0xFF  # the first byte after the header: zlib.error, not OSError
    path.write_bytes(bytes(data))
    with pytest.raises(text.CorpusError, match=rf"{path}: corrupt gzip data"):
        text.read_lines(path)


def test_empty_and_overlong_pairs_are_filtered_and_counted(tmp_path, caplog):
    long_line = "word " * 300
    write(tmp_path / "train.en.gz", f"A cat.\n\nA dog.\n{long_line}\nA bird.\n", compress=True)
    write(tmp_path / "train.de.gz", "Eine Katze.\nLeer.\n \nLang.\nEin Vogel.\n", compress=True)
    caplog.set_level("INFO", "keras_transformer")
    parallel_text = corpus.load_split(fixture_config(tmp_path), "train")
    assert parallel_text.source_lines == ("A cat.", "A bird.")
    assert parallel_text.target_lines == ("Eine Katze.", "Ein Vogel.")
    assert parallel_text.stats == text.FilterStats(read=5, kept=2, empty=2, too_long=1)
    assert caplog.messages == [
        "multi30k train en-de: kept 2 of 5 pairs (2 empty, 1 too long)."]


def test_evaluation_splits_keep_every_line_by_default(tmp_path):
    write(tmp_path / "test_2016_flickr.en.gz", "A cat.\n\n", compress=True)
    write(tmp_path / "test_2016_flickr.de.gz", "Eine Katze.\nLeer.\n", compress=True)
    parallel_text = corpus.load_split(fixture_config(tmp_path), "test", verbose=False)
    assert parallel_text.source_lines == ("A cat.", "")


def test_lines_split_only_at_newlines(tmp_path):
    write(tmp_path / "text", "\ufeffA\u2028B\x85C\r\nD\n")
    assert text.read_lines(tmp_path / "text") == ["A\u2028B\x85C", "D"]


def write(path, text, compress=False):
    data = text.encode("utf-8")
    path.write_bytes(gzip.compress(data) if compress else data)


# Download: a real HTTP server on 127.0.0.1 serving copies of the files.


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    requests = []

    def log_message(self, *args):
        pass

    def do_GET(self):
        QuietHandler.requests.append(self.path)
        super().do_GET()


@pytest.fixture
def file_server(tmp_path):
    """Serves `tmp_path / "served"` over HTTP; yields (directory, base_url)."""
    served = tmp_path / "served"
    served.mkdir()
    handler = functools.partial(QuietHandler, directory=str(served))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    QuietHandler.requests = []
    yield served, f"http://127.0.0.1:{server.server_address[1]}/data"
    server.shutdown()
    server.server_close()
    thread.join()


def test_download_with_matching_checksum_is_cached_and_read(
        file_server, fixture_corpus_dir, tmp_path, monkeypatch):
    served, base_url = file_server
    (served / "data").mkdir()
    for name in ("val.en.gz", "val.fr.gz"):
        shutil.copy(fixture_corpus_dir / name, served / "data" / name)
        monkeypatch.setitem(multi30k.SHA256, name,
                            hashlib.sha256((served / "data" / name).read_bytes()).hexdigest())
    monkeypatch.setenv(multi30k.URL_ENVIRONMENT_VARIABLE, base_url)
    config = DataConfig(source_language="fr", target_language="en")
    cache = tmp_path / "keras_home"
    parallel_text = corpus.load_split(config, "validation", cache_dir=str(cache),
                                      verbose=False)
    cached = cache / "datasets" / "multi30k"
    assert parallel_text.source_file == str(cached / "val.fr.gz")
    assert parallel_text.source_lines == tuple(text.read_lines(fixture_corpus_dir /
                                                                 "val.fr.gz"))
    assert sorted(os.listdir(cached)) == ["val.en.gz", "val.fr.gz"]
    assert sorted(QuietHandler.requests) == ["/data/val.en.gz", "/data/val.fr.gz"]
    corpus.load_split(config, "validation", cache_dir=str(cache), verbose=False)
    assert len(QuietHandler.requests) == 2  # the second load reads the cache


def test_a_downloaded_test_split_brings_its_tokenized_reference(
        file_server, fixture_corpus_dir, tmp_path, monkeypatch):
    served, base_url = file_server
    (served / "data" / "tok").mkdir(parents=True)
    names = ["test_2017_flickr.en.gz", "test_2017_flickr.de.gz"]
    for name in names:
        shutil.copy(fixture_corpus_dir / name, served / "data" / name)
    tokenized = "tok/test_2017_flickr.lc.norm.tok.de"
    (served / "data" / tokenized).write_text("ein hund .\n", encoding="utf-8")
    for table, path in [(multi30k.SHA256, name) for name in names] + [
            (multi30k.TOKENIZED_SHA256, tokenized)]:
        monkeypatch.setitem(table, os.path.basename(path), hashlib.sha256(
            (served / "data" / path).read_bytes()).hexdigest())
    cache = tmp_path / "keras_home"
    _, reference = corpus.corpus_files(DataConfig(), "test_2017_flickr",
                                       cache_dir=str(cache), base_url=base_url)
    cached = cache / "datasets" / "multi30k"
    assert multi30k.tokenized_reference(reference) == str(cached / tokenized)
    # The files the split is read from come first: their failure is the one to report.
    assert QuietHandler.requests == [f"/data/{name}" for name in names] + [
        f"/data/{tokenized}"]
    # Validation and training are read to train: nothing more is fetched for them.
    assert multi30k.tokenized_reference(cached / "val.de.gz") is None


def test_a_mirror_without_the_tokenized_reference_says_where_it_belongs(
        file_server, fixture_corpus_dir, tmp_path, monkeypatch):
    served, base_url = file_server
    (served / "data").mkdir()
    for name in ["test_2017_flickr.en.gz", "test_2017_flickr.de.gz"]:
        shutil.copy(fixture_corpus_dir / name, served / "data" / name)
        monkeypatch.setitem(multi30k.SHA256, name, hashlib.sha256(
            (served / "data" / name).read_bytes()).hexdigest())
    cache = tmp_path / "keras_home"
    with pytest.raises(multi30k.DownloadError) as error:
        corpus.corpus_files(DataConfig(), "test_2017_flickr", cache_dir=str(cache),
                            base_url=base_url)
    message = str(error.value)
    assert f"{base_url}/tok/test_2017_flickr.lc.norm.tok.de" in message
    assert "tok/<split>.lc.norm.tok.<language>" in message
    assert os.listdir(cache / "datasets" / "multi30k" / "tok") == []


def test_download_of_real_multi30k_file_passes_recorded_checksum(
        file_server, multi30k_dir, tmp_path):
    served, base_url = file_server
    shutil.copytree(multi30k_dir, served / "data")
    path = multi30k.download("val", "de", cache_dir=str(tmp_path / "cache"),
                                    base_url=base_url)
    assert len(text.read_lines(path)) == 1014


def test_download_with_wrong_checksum_fails_and_leaves_no_file(
        file_server, fixture_corpus_dir, tmp_path):
    served, base_url = file_server
    (served / "data").mkdir()
    shutil.copy(fixture_corpus_dir / "val.de.gz", served / "data" / "val.de.gz")
    cache = tmp_path / "keras_home"
    with pytest.raises(multi30k.ChecksumMismatchError) as error:
        multi30k.download("val", "de", cache_dir=str(cache), base_url=base_url)
    message = str(error.value)
    assert f"{base_url}/val.de.gz" in message
    assert multi30k.SHA256["val.de.gz"] in message
    assert os.listdir(cache / "datasets" / "multi30k") == []


def test_data_dir_reads_uncompressed_files_too(tmp_path, fixture_corpus_dir):
    for language in ("en", "de"):
        with gzip.open(fixture_corpus_dir / f"train.{language}.gz", "rb") as compressed:
            (tmp_path / f"train.{language}").write_bytes(compressed.read())
    parallel_text = corpus.load_split(fixture_config(tmp_path), "train", verbose=False)
    assert parallel_text.source_file == str(tmp_path / "train.en")
    assert len(parallel_text) == 168
