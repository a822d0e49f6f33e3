"""Multi30K Task 1: its file names, and its files downloaded once and checked by SHA-256.

Multi30K Task 1 (Elliott et al., 2016; the WMT 2017 multimodal task) holds en, de and
fr image captions, line-aligned across languages, so any two make a direction. Files
are named `<split>.<language>.gz`: `train` (29,000 lines), `val` (1,014) and the three
test splits the field reports side by side, `test_2016_flickr` (1,000),
`test_2017_flickr` (1,000) and `test_2017_mscoco` (461, out of Flickr's domain).
The literature scores on Multi30K's own lowercased, tokenized text of those splits
(`tok/<split>.lc.norm.tok.<language>`), downloaded and checked the same way.

`download(split, language)` fetches one file with `keras.utils.get_file` (its messages
and progress bar on stderr), verifies it by SHA-256 and caches it under
`$KERAS_HOME/datasets/multi30k` like other Keras datasets; `local_file(data_dir, split,
language)` finds it in a local copy instead. The download location can be overridden
with `base_url=` or the environment variable `KERAS_TRANSFORMER_MULTI30K_URL` (a mirror,
or a local server in tests).

Errors name the URL or file and the fix: `DownloadError` (no connection, a missing
file) and `ChecksumMismatchError` (other bytes than the original's); neither leaves a
file in the cache.
"""

import contextlib
import hashlib
import os
import sys
import tempfile

import keras

from keras_transformer.data.text import CorpusError

URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/"
URL_ENVIRONMENT_VARIABLE = "KERAS_TRANSFORMER_MULTI30K_URL"
CACHE_SUBDIR = os.path.join("datasets", "multi30k")
LANGUAGES = ("en", "de", "fr")
TEST_SPLITS = ("test_2016_flickr", "test_2017_flickr", "test_2017_mscoco")
SPLITS = ("train", "val", *TEST_SPLITS)
# SHA-256 of the upstream files, so that a changed or truncated download is caught.
SHA256 = {
    "train.en.gz": "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f",
    "train.de.gz": "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6",
    "train.fr.gz": "622e75069e9f4c577425c4f277116ce66e63a2401c0a2312d90073cb12379a3c",
    "val.en.gz": "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28",
    "val.de.gz": "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a",
    "val.fr.gz": "ca3106f1a72390591d25f6c45cb4cd39dec4cd3f123e099748a3ce5256c160e9",
    "test_2016_flickr.en.gz": "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9",
    "test_2016_flickr.de.gz": "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8",
    "test_2016_flickr.fr.gz": "6d326e188d259fb1d04ac19eae3af956559b3a0b93d7635e56c90987c40c8b90",
    "test_2017_flickr.en.gz": "76a444ee25172e72695cddb13ae4a3bda59430617be88e0bb46b60504f054074",
    "test_2017_flickr.de.gz": "a2c89666db00c495cd8513b9d708d5a3acc205d7de312ef2bf5fb7ebc1540aee",
    "test_2017_flickr.fr.gz": "3ba671ceb2299f3304ffafefea7a833d08632fbaf0ba18546f8a2ec2391af496",
    "test_2017_mscoco.en.gz": "aab300bfb4427697987e02cd0aacd44bfe8aa50456231b6474c08038bbed2b58",
    "test_2017_mscoco.de.gz": "799e4854c25d601cb6cb6be29eabe5667734c61ace2f495e03e429031a0bc338",
    "test_2017_mscoco.fr.gz": "754f3072ba9f124569ba5258b32730fc1d214bbf8e0c6dfb2b74401676220db0",
}


# The literature's references: Multi30K's own `tok/<split>.lc.norm.tok.<language>`,
# lowercased, punctuation-normalised and tokenized by Moses' scripts
# (scripts/task1-tokenize.sh upstream). Papers score BLEU on these tokens; the project
# scores on them too (`evaluation.score_tokenized`), beside cased sacreBLEU. Only the
# splits that are scored are listed.
TOKENIZED_URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/tok/"
TOKENIZED_FOLDER = "tok"
TOKENIZED_SPLITS = ("val", *TEST_SPLITS)
TOKENIZED_SHA256 = {
    "val.lc.norm.tok.en": "46573ce391ae227f1c72f873392436a20ef18e0a6d518098cfbd70b77c8572ec",
    "val.lc.norm.tok.de": "97232bd273eceb7207f689527386a97e4be2616b18ada47576bdaf96c8ae1f00",
    "val.lc.norm.tok.fr": "b303e301aa21fe7822a846b2b3fb2d5a1121ec807cd5b1d006fb7b2b5507168a",
    "test_2016_flickr.lc.norm.tok.en":
        "5b7f32627cf99eced828311b955dae9800bb52bc8b91cf8b6526829e605b29d2",
    "test_2016_flickr.lc.norm.tok.de":
        "c6a33d39d48f9f510de147651316cd9d918e09ad0219df734a2f16b6baccacc4",
    "test_2016_flickr.lc.norm.tok.fr":
        "1463bd5960f9bfe098ec3cd752d3df0c49c84dc646fb518964a29232658cd836",
    "test_2017_flickr.lc.norm.tok.en":
        "c9d1dfd7a26add989382e534af235af9f0f658b2a30e7eb0efdaf142496ee54f",
    "test_2017_flickr.lc.norm.tok.de":
        "02067e4a9402786a4fcb8c1b6f4307e4a5073ced64800abead5273b54f5f31f6",
    "test_2017_flickr.lc.norm.tok.fr":
        "c0583117a47b31e8a6c6a97cfe8de153e462074668f4e994764fcc80b21d33b4",
    "test_2017_mscoco.lc.norm.tok.en":
        "fe69ae004d71c42ead0301e70c57de5b1b6b5fb7f52210d42b22801e98e656f3",
    "test_2017_mscoco.lc.norm.tok.de":
        "e2825990b8a4e5289d2cdba801d57c187810bab9b4f5d87a30c35800a0d871b6",
    "test_2017_mscoco.lc.norm.tok.fr":
        "0b6a4620f02b6b9acf7811fda23f90fed9c6baa0b96aa224db50a273078c84d1",
}


class DownloadError(CorpusError):
    """A Multi30K file could not be downloaded; the message names the URL and the fix."""


class ChecksumMismatchError(CorpusError):
    """A downloaded file does not have the expected SHA-256."""


def file_name(split, language):
    """Returns Multi30K's name of one file, e.g. `"val.de.gz"`."""
    if split not in SPLITS or language not in LANGUAGES:
        raise CorpusError(f"Multi30K has no {split}.{language}: splits are {SPLITS}, "
                          f"languages {LANGUAGES}.")
    return f"{split}.{language}.gz"


def local_file(data_dir, split, language):
    """Returns `data_dir/<split>.<language>.gz`, or the uncompressed file when only it exists.

    A missing file keeps the `.gz` name, which the error of the reader then reports.
    """
    compressed = os.path.join(data_dir, file_name(split, language))
    plain = compressed.removesuffix(".gz")
    return plain if not os.path.exists(compressed) and os.path.exists(plain) else compressed


def tokenized_file_name(split, language):
    """Returns the name of a split's tokenized text, e.g. `"val.lc.norm.tok.de"`."""
    if split not in TOKENIZED_SPLITS or language not in LANGUAGES:
        raise CorpusError(f"Multi30K's tok/ folder has no {split}.{language} here: splits "
                          f"are {TOKENIZED_SPLITS}, languages {LANGUAGES}.")
    return f"{split}.lc.norm.tok.{language}"


def tokenized_reference(reference_path):
    """Returns the tokenized text beside a Multi30K reference file, or `None`.

    `DIR/test_2016_flickr.de.gz` (or the uncompressed file) has it in
    `DIR/tok/test_2016_flickr.lc.norm.tok.de`: in a `--data-dir` copy, and in the
    download cache once `download(..., tokenized=True)` fetched it. Any other file name,
    or a missing file, gives `None`.
    """
    folder, name = os.path.split(os.fspath(reference_path))
    parts = name.removesuffix(".gz").split(".")
    if len(parts) != 2 or parts[0] not in TOKENIZED_SPLITS or parts[1] not in LANGUAGES:
        return None
    path = os.path.join(folder, TOKENIZED_FOLDER, tokenized_file_name(*parts))
    return path if os.path.isfile(path) else None


def download(split, language, *, tokenized=False, cache_dir=None, base_url=None):
    """Downloads one Multi30K Task 1 file (once) and returns its cached path.

    Args:
        split: Multi30K's split name: one of `SPLITS`, e.g. `"val"`.
        language: `"en"`, `"de"` or `"fr"`.
        tokenized: bool. The literature's tokenized text of the split
            (`tokenized_file_name`, from `TOKENIZED_URL`, or `<base_url>/tok/` on a
            mirror, the layout of a `--data-dir`) instead of the raw file; it lands in
            the cache's `tok/` folder, where `tokenized_reference` finds it.
        cache_dir: str. Cache root; the file lands in `<cache_dir>/datasets/multi30k/`.
            Defaults to `$KERAS_HOME` (`~/.keras`).
        base_url: str. URL prefix of the files. Defaults to
            `$KERAS_TRANSFORMER_MULTI30K_URL`, else `URL`.

    Returns:
        The local path of the verified file.

    Raises:
        DownloadError: the file could not be fetched (no connection, wrong URL).
        ChecksumMismatchError: the downloaded bytes are not the expected ones.
        Neither leaves a file in the cache.
    """
    base_url = base_url or os.environ.get(URL_ENVIRONMENT_VARIABLE)
    if tokenized:
        name = tokenized_file_name(split, language)
        folder_url = (base_url.rstrip("/") + "/" + TOKENIZED_FOLDER if base_url
                      else TOKENIZED_URL)
        expected, cache_subdir = TOKENIZED_SHA256[name], os.path.join(
            CACHE_SUBDIR, TOKENIZED_FOLDER)
    else:
        name = file_name(split, language)
        folder_url, expected, cache_subdir = base_url or URL, SHA256[name], CACHE_SUBDIR
    origin = folder_url.rstrip("/") + "/" + name
    cache_root = _cache_root(cache_dir)
    path = os.path.join(cache_root, cache_subdir, name)
    try:
        # Keras prints "Downloading data from …" and its progress bar to stdout, which
        # commands keep for their results.
        with contextlib.redirect_stdout(sys.stderr):
            return keras.utils.get_file(
                fname=name, origin=origin, file_hash=expected, hash_algorithm="sha256",
                cache_subdir=cache_subdir, cache_dir=cache_root)
    except ValueError:
        # Keras leaves a file that fails its hash check in the cache: remove it, so that
        # the next run downloads again instead of reading corrupt data.
        actual = _sha256(path) if os.path.exists(path) else "nothing"
        _remove(path)
        raise ChecksumMismatchError(
            f"{origin}: downloaded file has SHA-256 {actual}, expected {expected}; the "
            f"file was removed from {os.path.dirname(path)}. Check that the URL (or "
            f"${URL_ENVIRONMENT_VARIABLE}) points at the original Multi30K files, or "
            "pass --data-dir DIR with a local copy.") from None
    except Exception as error:  # Keras raises a bare Exception for a failed fetch
        _remove(path)
        cause = str(error).split(" -- ")[-1] or type(error).__name__
        layout = ("tok/<split>.lc.norm.tok.<language>" if tokenized
                  else "<split>.<language>.gz")
        raise DownloadError(
            f"cannot download {origin} ({cause}). Without internet, pass --data-dir DIR "
            f"with Multi30K's files ({name} and the others: {layout}), or "
            f"set ${URL_ENVIRONMENT_VARIABLE} to a mirror.") from None


def _remove(path):
    if os.path.exists(path):
        os.remove(path)


def _cache_root(cache_dir):
    # Resolved here, not left to Keras, so that we know where a bad download lies; the
    # same rule as Keras: $KERAS_HOME, else ~/.keras, else /tmp/.keras if not writable.
    root = os.path.expanduser(cache_dir or os.environ.get("KERAS_HOME")
                              or os.path.join("~", ".keras"))
    try:
        os.makedirs(root, exist_ok=True)
    except OSError:
        pass  # not writable: the check below falls back on the temporary directory
    if not os.access(root, os.W_OK):
        root = os.path.join(tempfile.gettempdir(), ".keras")
    return root


def _sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for chunk in iter(lambda: file.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
