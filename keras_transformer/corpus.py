"""Parallel text: find, download, read and validate line-aligned corpus files.

The first stage of the data flow: text files → `ParallelText` (source and target lines).

Public API:
    - `load_split(data_config, split, ...) -> ParallelText`: the lines of one split
      (`"train"`, `"validation"` or `"test"`) in the direction the config names.
    - `corpus_files(data_config, split, ...) -> (source_path, target_path)`: where a split's
      files are, downloading Multi30K on first use.
    - `read_parallel(source_path, target_path, ...) -> ParallelText`: read and validate any
      pair of line-aligned files, plain or gzip-compressed.
    - `download_multi30k(split_name, language, ...) -> path`: one Multi30K Task 1 file,
      fetched with `keras.utils.get_file`, verified by SHA-256 and cached under
      `$KERAS_HOME/datasets/multi30k` like other Keras datasets.

The default corpus is Multi30K Task 1 (Elliott et al., 2016): en, de and fr captions,
line-aligned across languages, so any two of them make a direction. `DataConfig.data_dir`
reads a local directory holding Multi30K's file names instead of downloading.
`corpus="wmt14"` reads WMT14 from TensorFlow Datasets (see `wmt14`). Another
corpus names its files in `DataConfig.train_files` / `validation_files` / `test_files`.
The download location can be overridden with `base_url=` or the environment variable
`KERAS_TRANSFORMER_MULTI30K_URL` (a mirror, or a local server in tests).

Bad data fails early with errors that name the file, the line and the fix:
`CorpusFileNotFoundError` (a `FileNotFoundError`), and the `CorpusError` (`ValueError`)
subclasses `LineCountMismatchError`, `CorpusEncodingError` and `ChecksumMismatchError`.
"""

import dataclasses
import gzip
import hashlib
import os
import tempfile

import keras

MULTI30K_URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/"
BASE_URL_ENVIRONMENT_VARIABLE = "KERAS_TRANSFORMER_MULTI30K_URL"
MULTI30K_CACHE_SUBDIR = os.path.join("datasets", "multi30k")
MULTI30K_LANGUAGES = ("en", "de", "fr")
# Our split names → Multi30K's file name stems.
MULTI30K_SPLITS = {"train": "train", "validation": "val", "test": "test_2016_flickr"}
# SHA-256 of the upstream files, so a changed or truncated download is caught.
MULTI30K_SHA256 = {
    "train.en.gz": "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f",
    "train.de.gz": "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6",
    "train.fr.gz": "622e75069e9f4c577425c4f277116ce66e63a2401c0a2312d90073cb12379a3c",
    "val.en.gz": "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28",
    "val.de.gz": "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a",
    "val.fr.gz": "ca3106f1a72390591d25f6c45cb4cd39dec4cd3f123e099748a3ce5256c160e9",
    "test_2016_flickr.en.gz": "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9",
    "test_2016_flickr.de.gz": "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8",
    "test_2016_flickr.fr.gz": "6d326e188d259fb1d04ac19eae3af956559b3a0b93d7635e56c90987c40c8b90",
}
# A caption is a sentence; a "line" of thousands of characters is almost always two files
# glued together or a missing newline, and would blow up the batch's padded length.
MAX_CHARACTERS = 1000


class CorpusError(ValueError):
    """The config names no usable corpus files, or their content cannot be used."""


class LineCountMismatchError(CorpusError):
    """Source and target files have different numbers of lines."""


class CorpusEncodingError(CorpusError):
    """A corpus file is not valid UTF-8."""


class ChecksumMismatchError(CorpusError):
    """A downloaded file does not have the expected SHA-256."""


class CorpusFileNotFoundError(FileNotFoundError):
    """A corpus file named by the configuration does not exist."""


@dataclasses.dataclass(frozen=True)
class FilterStats:
    """How many pairs were read, and why some were dropped."""

    read: int
    kept: int
    empty: int = 0
    too_long: int = 0

    def summary(self, name):
        return (f"{name}: kept {self.kept} of {self.read} pairs "
                f"({self.empty} empty, {self.too_long} too long).")


@dataclasses.dataclass(frozen=True)
class ParallelText:
    """Line-aligned source and target sentences of one split.

    Attributes:
        source_lines: tuple of str, one sentence each, without the newline.
        target_lines: tuple of str, aligned with `source_lines`.
        source_file: str. Path the source lines were read from.
        target_file: str. Path the target lines were read from.
        stats: `FilterStats` of the pairs dropped while reading.
    """

    source_lines: tuple
    target_lines: tuple
    source_file: str
    target_file: str
    stats: FilterStats

    def __len__(self):
        return len(self.source_lines)


def load_split(data_config, split, *, filter_pairs=None, max_characters=MAX_CHARACTERS,
               cache_dir=None, base_url=None, verbose=True):
    """Reads one split of the corpus that `data_config` names.

    Args:
        data_config: `keras_transformer.config.DataConfig`.
        split: `"train"`, `"validation"` or `"test"`.
        filter_pairs: bool. Drop empty and over-long pairs. Defaults to `True` for
            `"train"` only, so that validation and test keep every reference line.
        max_characters: int. Pairs with a side longer than this many characters count as
            over-long.
        cache_dir: str. Download cache root; defaults to `$KERAS_HOME` (`~/.keras`).
        base_url: str. Where Multi30K's files are downloaded from; defaults to
            `$KERAS_TRANSFORMER_MULTI30K_URL`, else the multi30k/dataset GitHub repository.
        verbose: bool. Print one line with the filter counts.

    Returns:
        A `ParallelText`.
    """
    if data_config.corpus == "wmt14":  # from TensorFlow Datasets, not from files
        from keras_transformer import wmt14
        return wmt14.load_split(data_config, split, filter_pairs=filter_pairs,
                                max_characters=max_characters, verbose=verbose)
    source_path, target_path = corpus_files(
        data_config, split, cache_dir=cache_dir, base_url=base_url)
    if filter_pairs is None:
        filter_pairs = split == "train"
    parallel_text = read_parallel(source_path, target_path, filter_pairs=filter_pairs,
                                  max_characters=max_characters)
    if verbose:
        print(parallel_text.stats.summary(
            f"{data_config.corpus} {split} "
            f"{data_config.source_language}-{data_config.target_language}"), flush=True)
    return parallel_text


def corpus_files(data_config, split, *, cache_dir=None, base_url=None):
    """Returns the `(source_path, target_path)` of a split, downloading if needed.

    Args:
        data_config: `keras_transformer.config.DataConfig`.
        split: `"train"`, `"validation"` or `"test"`.
        cache_dir: str. Download cache root (see `download_multi30k`).
        base_url: str. Download location (see `download_multi30k`).

    Returns:
        A tuple of two paths.
    """
    if split not in MULTI30K_SPLITS:
        raise ValueError(f"Unknown split {split!r}; use one of {sorted(MULTI30K_SPLITS)}.")
    if data_config.corpus != "multi30k":
        files = getattr(data_config, f"{split}_files")
        if files is None or len(files) != 2:
            raise CorpusError(
                f"Corpus {data_config.corpus!r} has no {split} files: set "
                f"DataConfig.{split}_files to a (source_path, target_path) pair.")
        return tuple(files)
    languages = (data_config.source_language, data_config.target_language)
    if len(set(languages)) != 2 or not set(languages) <= set(MULTI30K_LANGUAGES):
        raise CorpusError(
            f"Multi30K has no {languages[0]}-{languages[1]} direction: source_language and "
            f"target_language must be two different languages of {MULTI30K_LANGUAGES}.")
    split_name = MULTI30K_SPLITS[split]
    if data_config.data_dir is not None:
        return tuple(_local_file(data_config.data_dir, f"{split_name}.{language}")
                     for language in languages)
    return tuple(download_multi30k(split_name, language, cache_dir=cache_dir,
                                   base_url=base_url) for language in languages)


def _local_file(data_dir, stem):
    """Returns `data_dir/stem.gz`, or the uncompressed `data_dir/stem` when only it exists.

    A missing file keeps the `.gz` name, which the error then reports.
    """
    compressed = os.path.join(data_dir, f"{stem}.gz")
    plain = os.path.join(data_dir, stem)
    return plain if not os.path.exists(compressed) and os.path.exists(plain) else compressed


def download_multi30k(split_name, language, *, cache_dir=None, base_url=None):
    """Downloads one Multi30K Task 1 file (once) and returns its cached path.

    Args:
        split_name: Multi30K's stem: `"train"`, `"val"` or `"test_2016_flickr"`.
        language: `"en"`, `"de"` or `"fr"`.
        cache_dir: str. Cache root; the file lands in `<cache_dir>/datasets/multi30k/`.
            Defaults to `$KERAS_HOME` (`~/.keras`).
        base_url: str. URL prefix of the files. Defaults to
            `$KERAS_TRANSFORMER_MULTI30K_URL`, else `MULTI30K_URL`.

    Returns:
        The local path of the verified file.

    Raises:
        ChecksumMismatchError: the downloaded bytes are not the expected ones; the bad
            file is removed from the cache.
    """
    file_name = f"{split_name}.{language}.gz"
    base_url = base_url or os.environ.get(BASE_URL_ENVIRONMENT_VARIABLE) or MULTI30K_URL
    origin = base_url.rstrip("/") + "/" + file_name
    expected = MULTI30K_SHA256[file_name]
    cache_root = _cache_root(cache_dir)
    try:
        return keras.utils.get_file(
            fname=file_name, origin=origin, file_hash=expected, hash_algorithm="sha256",
            cache_subdir=MULTI30K_CACHE_SUBDIR, cache_dir=cache_root)
    except ValueError:
        # Keras leaves a file that fails its hash check in the cache: remove it, so that
        # the next run downloads again instead of reading corrupt data.
        path = os.path.join(cache_root, MULTI30K_CACHE_SUBDIR, file_name)
        actual = _sha256(path) if os.path.exists(path) else "nothing"
        if os.path.exists(path):
            os.remove(path)
        raise ChecksumMismatchError(
            f"{origin}: downloaded file has SHA-256 {actual}, expected {expected}; the "
            f"file was removed from {os.path.dirname(path)}. Check the URL (or "
            f"${BASE_URL_ENVIRONMENT_VARIABLE}) points at the original Multi30K files, "
            "or set DataConfig.data_dir to a local copy.") from None


def read_parallel(source_path, target_path, *, filter_pairs=True,
                  max_characters=MAX_CHARACTERS):
    """Reads two line-aligned files into a `ParallelText`.

    Args:
        source_path: str. Source-language file, UTF-8, plain or gzip (`.gz`).
        target_path: str. Target-language file with the same number of lines.
        filter_pairs: bool. Drop pairs with an empty side or a side longer than
            `max_characters`, counting each reason in `ParallelText.stats`.
        max_characters: int. Longest side kept, in characters.

    Returns:
        A `ParallelText`.
    """
    source_lines = read_lines(source_path)
    target_lines = read_lines(target_path)
    if len(source_lines) != len(target_lines):
        raise LineCountMismatchError(
            f"{source_path} has {len(source_lines)} lines but {target_path} has "
            f"{len(target_lines)}: parallel files must be line-aligned (one sentence per "
            "line, translation on the same line number). Fix the shorter file or pair the "
            "right files.")
    pairs = list(zip(source_lines, target_lines))
    empty = too_long = 0
    if filter_pairs:
        kept = []
        for source, target in pairs:
            if not source.strip() or not target.strip():
                empty += 1
            elif max(len(source), len(target)) > max_characters:
                too_long += 1
            else:
                kept.append((source, target))
        pairs = kept
    stats = FilterStats(read=len(source_lines), kept=len(pairs), empty=empty,
                        too_long=too_long)
    return ParallelText(
        source_lines=tuple(source for source, _ in pairs),
        target_lines=tuple(target for _, target in pairs),
        source_file=str(source_path), target_file=str(target_path), stats=stats)


def read_lines(path):
    """Returns the lines of a UTF-8 text file (plain or gzip), without line endings.

    Lines are split at `\\n` only: `str.splitlines` would also split at characters such
    as U+2028 or U+0085 that may occur inside a sentence, and misalign the two sides.
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise CorpusFileNotFoundError(
            f"{path}: no such corpus file. Check DataConfig.data_dir (or the *_files "
            "pairs), or leave data_dir unset to download Multi30K.")
    with open(path, "rb") as file:
        data = file.read()
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as error:
            raise CorpusError(f"{path}: corrupt gzip data ({error}). Download or "
                              "copy the file again.") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        raise CorpusEncodingError(
            f"{path}: line {line}: bytes {data[error.start:error.end]!r} are not valid "
            "UTF-8. Re-encode the file as UTF-8 (e.g. `iconv -f latin1 -t utf-8`).") from None
    if text.startswith("\ufeff"):
        text = text[1:]
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line.removesuffix("\r") for line in lines]


def _cache_root(cache_dir):
    # Resolved here, not left to Keras, so that we know where a bad download lies; the
    # same rule as Keras: $KERAS_HOME, else ~/.keras, else /tmp/.keras if not writable.
    root = os.path.expanduser(cache_dir or os.environ.get("KERAS_HOME")
                              or os.path.join("~", ".keras"))
    try:
        os.makedirs(root, exist_ok=True)
    except OSError:
        pass
    if not os.access(root, os.W_OK):
        root = os.path.join(tempfile.gettempdir(), ".keras")
    return root


def _sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for chunk in iter(lambda: file.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
