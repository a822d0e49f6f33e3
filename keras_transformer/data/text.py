"""Parallel text files: read and validate line-aligned sentences, plain or gzip.

The first stage of the data flow: text files → `ParallelText` (source and target
lines). Bad data fails early with errors that name the file, the line and the fix:
`CorpusFileNotFoundError` (a `FileNotFoundError`), and the `CorpusError` (`ValueError`)
subclasses `LineCountMismatchError` and `CorpusEncodingError`.

Public API:
    - `read_parallel(source_path, target_path, ...) -> ParallelText`: any pair of
      line-aligned files, plain or gzip-compressed.
    - `read_lines(path) -> list of str`: one UTF-8 file's lines.
    - `open_lines(path)`: one file's lines as bytes, one by one (for large files).
"""

import dataclasses
import gzip
import os
import zlib

# A caption is a sentence; a "line" of thousands of characters is almost always two files
# glued together or a missing newline, and would blow up the batch's padded length.
MAX_CHARACTERS = 1000

# A gzip file's first two bytes: compression is known by these, whatever the file's name.
GZIP_MAGIC = b"\x1f\x8b"


class CorpusError(ValueError):
    """The config names no usable corpus files, or their content cannot be used."""


class LineCountMismatchError(CorpusError):
    """Source and target files have different numbers of lines."""


class CorpusEncodingError(CorpusError):
    """A corpus file is not valid UTF-8."""


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


def open_lines(path):
    """Opens the file `path` to read its lines as bytes, decompressed where it is gzip
    (known by its first two bytes, as `read_lines` knows it): for reading a large file
    line by line. Damaged gzip data raises `CorpusError` naming the file, at the line
    where it is found."""
    with open(path, "rb") as file:
        compressed = file.read(2) == GZIP_MAGIC
    return _GzipLines(path) if compressed else open(path, "rb")


class _GzipLines:
    """A gzip file's lines, as a binary file's (iterated, closed, a context manager),
    with damaged data reported as `CorpusError` rather than zlib's or gzip's error."""

    def __init__(self, path):
        self.path = os.fspath(path)
        self._file = gzip.open(path, "rb")

    def __iter__(self):
        try:
            yield from self._file
        except (OSError, EOFError, zlib.error) as error:
            raise CorpusError(f"{self.path}: corrupt gzip data ({error}). Download or "
                              "copy the file again.") from None

    def close(self):
        self._file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()


def read_lines(path):
    """Returns the lines of a UTF-8 text file (plain or gzip), without line endings.

    Lines are split at `\\n` only: `str.splitlines` would also split at characters such
    as U+2028 or U+0085 that may occur inside a sentence, and misalign the two sides.
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise CorpusFileNotFoundError(
            f"{path}: no such corpus file. Check --data-dir (DataConfig.data_dir) or the "
            "--train-files/--valid-files pairs, or leave data_dir unset to download "
            "Multi30K.")
    with open(path, "rb") as file:
        data = file.read()
    if data[:2] == GZIP_MAGIC:
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as error:  # zlib: a damaged stream
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
