"""Translate a corpus on Apache Beam: `keras-transformer translate-corpus`, and
`TranslateLines` for pipelines of one's own. Needs the `beam` extra.

    keras-transformer translate-corpus RUN_DIR --input 'corpus/*.en' --output corpus.de
    keras-transformer translate-corpus model.tflite --input mono.de --output pairs.tsv \\
        --pairs tsv --direct_num_workers 2

Any artifact `load_translator` opens is translated by Beam's RunInference with
`TranslatorHandler`, on Beam's in-process runner by default (FnApiRunner: it never
reaches for the network) or on any runner Beam's options name (Dataflow, Flink, Spark).

Order and completeness by construction (Beam itself keeps no order):
- The driver numbers the lines: it reads the inputs once, in sorted name order, counting
  each file's lines and noting every `STRIDE`-th line's byte offset; the first line that
  is not UTF-8 gets `translate`'s warning, and a truncated or damaged compressed file
  stops the run there, named, before anything is translated (what it wrote removed).
- Numbering writes each compressed input's text into `OUTPUT.parts/input-N`, which its
  chunks seek into: chunks that each decompressed the file from its start would do work
  that grows with the square of its size. Each run writes the texts anew and removes
  them when it ends, whether it failed or not.
- The numbered lines are cut into `translate`'s windows (batch size × `WINDOW_BATCHES`
  lines of the joined files), one chunk each; the handler batches a chunk by length
  exactly as `translate` batches that window, so the output is `translate`'s, byte for
  byte.
- Each chunk's text is written to `OUTPUT.parts/chunk-N` through a temporary name: a
  retried bundle rewrites the same file, never a second copy. The last step joins the
  chunks in order into OUTPUT (through a temporary name too) and removes the parts.
- Run again with the same arguments after a failure or a kill, it keeps the chunks
  already written (`OUTPUT.parts/plan.json` says what they are of) and does the rest.
"""

import bz2
import contextlib
import dataclasses
import functools
import gzip
import io
import json
import logging
import lzma
import os
import shutil
import threading
import uuid
import zlib

from keras_transformer import files, formats, loading, translate
from keras_transformer.data.text import GZIP_MAGIC, CorpusError


class _ApitoolsNoise(logging.Filter):
    """Beam warns at import that Google Cloud's client libraries are missing, which
    only its Google Cloud connectors need."""

    def filter(self, record):
        return "apitools not found" not in record.getMessage()


_noise = _ApitoolsNoise()
logging.getLogger().addFilter(_noise)
try:
    import apache_beam as beam
    import zstandard  # Beam's dependency, for its zstd files
    from apache_beam.io.filesystem import CompressionTypes
    from apache_beam.io.filesystems import FileSystems
    from apache_beam.metrics import Metrics
    from apache_beam.ml.inference import base as inference
    from apache_beam.options import pipeline_options
except ImportError as error:
    raise ImportError("Translating a corpus runs on Apache Beam: pip install "
                      "'keras-transformer-mt[beam]'.") from error
finally:
    logging.getLogger().removeFilter(_noise)

logger = logging.getLogger(__name__)

# Every STRIDE-th line's byte offset is noted: a chunk seeks to the nearest one before
# its first line and skips fewer than STRIDE lines.
STRIDE = 1024
PARTS_SUFFIX = ".parts"
# Numbering shows a progress bar only for inputs it takes seconds to read.
NUMBERING_BAR_BYTES = 256 << 20
PLAN_FILE = "plan.json"
# Beam's runners that run in this process or its children.
LOCAL_RUNNERS = {"FnApiRunner", "DirectRunner", "BundleBasedDirectRunner",
                 "SwitchingDirectRunner", "PrismRunner"}
COUNTERS = "keras_transformer"
# Beam's runner and options unless given: in-process, and workers that log warnings only.
DEFAULT_PIPELINE_ARGS = {"--runner": "FnApiRunner",
                         "--default_sdk_harness_log_level": "WARNING"}


@dataclasses.dataclass(frozen=True)
class InputFile:
    """An input file, numbered: its `lines` and the byte `offsets` of lines 0,
    `STRIDE`, 2 × `STRIDE`, ... (of its decompressed bytes)."""

    path: str
    size: int
    lines: int
    offsets: tuple
    not_utf8: int


@dataclasses.dataclass(frozen=True)
class Chunk:
    """A window of lines: `number` (from 0), the number of its `first_line` in the joined
    input, and `pieces`, one `(path, offset, skip, count)` per file it takes lines from:
    seek to `offset`, skip `skip` lines, read `count`."""

    number: int
    first_line: int
    pieces: tuple

    @property
    def lines(self):
        return sum(piece[3] for piece in self.pieces)


def match_inputs(patterns):
    """Returns the paths the glob `patterns` match (any file system Beam knows), sorted
    by name, each once.

    Raises:
        FileNotFoundError: a pattern matches no file, naming it.
    """
    paths = set()
    for pattern in patterns:
        found = [metadata.path for metadata in
                 FileSystems.match([pattern])[0].metadata_list]
        if not found:
            raise FileNotFoundError(f"--input {pattern}: no file matches it.")
        paths.update(found)
    return sorted(paths)


def number_lines(path, progress=None, text_to=None):
    """Returns the `InputFile` of `path`; warns, as `translate` does, at its first line
    that is not UTF-8. `progress(bytes)` is told the bytes read; the decompressed text
    is written to the path `text_to` as it is read, where given.

    Raises:
        CorpusError: a compressed input is truncated or damaged (naming it).
        OSError: reading the file failed (the file system's error), or writing its text
            (naming both).
    """
    compression = _compression_of(*_identity(path))
    try:
        return _number_lines(path, progress, text_to)
    except _TextError as error:
        cause = error.__cause__
        raise OSError(cause.errno, f"{text_to}: writing the text of {path} failed "
                      f"({cause.strerror or cause}); translate-corpus needs room beside "
                      "--output for the text of each compressed input") from None
    except _FileSystemError as error:  # reading failed: not the file's data
        raise error.__cause__ from None
    except (OSError, EOFError, zlib.error, lzma.LZMAError, zstandard.ZstdError) as error:
        if compression == CompressionTypes.UNCOMPRESSED:
            raise
        raise CorpusError(f"{path}: its {compression} data cannot be read ({error}): the "
                          "file is truncated or damaged. Download or copy it again.") from None


def _number_lines(path, progress, text_to):
    offsets, offset, count, not_utf8 = [], 0, 0, 0
    with contextlib.ExitStack() as stack:
        file, raw = stack.enter_context(_open_input(path))
        text = stack.enter_context(_create(text_to)) if text_to else None
        for line in iter(file.readline, b""):
            if text:
                text.write(line)
            if count % STRIDE == 0:
                offsets.append(offset)
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as error:
                if not not_utf8:  # translate's warning
                    logger.warning(
                        "%s: line %d is not UTF-8 (bytes %r): its accented characters "
                        "will be garbled. Re-encode the file as UTF-8 (e.g. `iconv -f "
                        "latin1 -t utf-8`).", path, count + 1,
                        line[error.start:error.end])
                not_utf8 += 1
            offset += len(line)
            count += 1
            if progress and count % 65536 == 0:
                progress(raw.tell())  # of the file's own bytes, as its size counts them
    size = FileSystems.match([path])[0].metadata_list[0].size_in_bytes
    if progress:
        progress(size)
    return InputFile(path, size, count, tuple(offsets), not_utf8)


class _WholeStreams(io.RawIOBase):
    """The decompressed bytes of the binary file `raw`, each of its concatenated streams
    read with a `new_decompressor()` (zlib's or zstandard's objects: `decompress`,
    `eof`, `unused_data`); a file that ends inside a stream raises `EOFError`, as
    Python's gzip reader does. Seeks go forward only, by reading."""

    def __init__(self, raw, new_decompressor):
        super().__init__()
        self._raw, self._new_decompressor = raw, new_decompressor
        self._decompressor, self._inside = new_decompressor(), False
        self._output, self._taken, self._position = b"", 0, 0

    def readable(self):
        return True

    def seekable(self):
        return True

    def tell(self):
        return self._position

    def seek(self, offset, whence=io.SEEK_SET):
        if whence not in (io.SEEK_SET, io.SEEK_CUR):
            raise io.UnsupportedOperation("a compressed input seeks from its start or here")
        target = offset + (self._position if whence == io.SEEK_CUR else 0)
        if target < self._position:
            raise io.UnsupportedOperation("a compressed input seeks forward only")
        scratch = bytearray(1 << 16)
        while self._position < target:
            with memoryview(scratch)[:min(len(scratch), target - self._position)] as view:
                if not self.readinto(view):
                    break
        return self._position

    def readinto(self, buffer):
        while self._taken == len(self._output):
            data = b""
            if self._decompressor.eof:  # the next stream, if any, starts here
                data = self._decompressor.unused_data
                self._decompressor, self._inside = self._new_decompressor(), False
            data = data or self._raw.read(1 << 16)
            if not data:
                if self._inside:
                    raise EOFError("the file ended inside a compressed stream")
                return 0
            self._output, self._taken = self._decompressor.decompress(data), 0
            self._inside = not self._decompressor.eof
        count = min(len(buffer), len(self._output) - self._taken)
        buffer[:count] = self._output[self._taken:self._taken + count]
        self._taken += count
        self._position += count
        return count


def _zstd_decompressor():
    # Beam's window limit (2 GiB): zstandard's default refuses files written with a
    # long window.
    return zstandard.ZstdDecompressor(max_window_size=2 ** 31).decompressobj()


# Readers that raise at a truncated or damaged stream, as `translate` does
# (`text.open_lines`), over the file's bytes from Beam: Beam's own reader ends a
# truncated stream early without a word (half a gzip file of 20,000 lines read as its
# first 9,918; the same with zstd and deflate). Python's own where it has them.
_WHOLE_STREAM_READERS = {
    CompressionTypes.GZIP: lambda raw: gzip.GzipFile(fileobj=raw, mode="rb"),
    CompressionTypes.BZIP2: bz2.BZ2File, CompressionTypes.LZMA: lzma.LZMAFile,
    CompressionTypes.DEFLATE: lambda raw: io.BufferedReader(
        _WholeStreams(raw, zlib.decompressobj)),
    CompressionTypes.ZSTD: lambda raw: io.BufferedReader(
        _WholeStreams(raw, _zstd_decompressor))}


class _FileSystemError(Exception):
    """An `OSError` of reading a file's own bytes or writing its text (its `__cause__`),
    carried past the decompressing readers, whose own `OSError`s say the data is
    damaged."""


class _TextError(_FileSystemError):
    """A `_FileSystemError` of writing an input's text."""


class _FileSystemFile:
    """The file object `raw`, its `OSError`s raised as `error`s (`_FileSystemError`)."""

    def __init__(self, raw, error=_FileSystemError):
        self._raw = raw
        self._error = error

    def read(self, size=-1):
        return self._call(self._raw.read, size)

    def write(self, data):
        return self._call(self._raw.write, data)

    def close(self):
        return self._call(self._raw.close)

    def seek(self, *arguments):
        return self._call(self._raw.seek, *arguments)

    def tell(self):
        return self._call(self._raw.tell)

    def seekable(self):
        return self._call(self._raw.seekable)

    def _call(self, method, *arguments):
        try:
            return method(*arguments)
        except OSError as error:
            raise self._error() from error


@contextlib.contextmanager
def open_input(path):
    """Opens the input file `path` (any file system Beam knows), decompressed, as a
    context manager: gzip is known by its first two bytes, as `translate` knows it
    (`text.open_lines`), not by its name as Beam's default would, so that one file reads
    alike in both commands; other compressions (.bz2, .xz, .zst, .deflate) by their
    names, as Beam knows them. A truncated stream raises, as does a damaged one where
    its format tells (`EOFError`, `OSError`, `zlib.error`, `lzma.LZMAError`,
    zstandard's `ZstdError`; zstd keeps no checksum unless written with one)."""
    try:
        with _open_input(path) as (file, _):
            yield file
    except _FileSystemError as error:
        raise error.__cause__ from None


@contextlib.contextmanager
def _open_input(path):
    """`open_input`, giving `(decompressed file, the file's own bytes)`: the second's
    `tell()` counts the bytes read as the file's size does. A compressed file's own
    `OSError`s, opening or reading it, are raised as `_FileSystemError`s."""
    compression = _compression_of(*_identity(path))
    if compression == CompressionTypes.UNCOMPRESSED:
        with FileSystems.open(path, compression_type=compression) as raw:
            yield raw, raw
        return
    try:
        opened = FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED)
    except OSError as error:
        raise _FileSystemError() from error
    with opened as raw, _WHOLE_STREAM_READERS[compression](_FileSystemFile(raw)) as file:
        yield file, raw


@contextlib.contextmanager
def _create(path):
    """`FileSystems.create(path)` of a plain file, its `OSError`s (creating, writing or
    closing it; not those of the `with` block's own work) raised as `_TextError`s."""
    try:
        opened = FileSystems.create(path, compression_type=CompressionTypes.UNCOMPRESSED)
    except OSError as error:
        raise _TextError() from error
    file = _FileSystemFile(opened, _TextError)
    try:
        yield file
    except BaseException:
        with contextlib.suppress(Exception):  # the error that stopped the writing counts
            opened.close()
        raise
    file.close()


def _identity(path):
    """`(path, size, time)`: what `_compression_of` caches its answer by."""
    metadata = FileSystems.match([path])[0].metadata_list[0]
    return path, metadata.size_in_bytes, metadata.last_updated_in_seconds


# Once per file (as it is now) and process: each chunk opens its files, and reading the
# first bytes of a remote file fetches a whole buffer.
@functools.lru_cache(maxsize=None)
def _compression_of(path, size, modified):
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as file:
        if file.read(2) == GZIP_MAGIC:
            return CompressionTypes.GZIP
    named = CompressionTypes.detect_compression_type(path)
    return CompressionTypes.UNCOMPRESSED if named == CompressionTypes.GZIP else named


def plan_chunks(inputs, window):
    """Returns the `Chunk`s of `window` lines (the last one shorter) that cover the
    `InputFile`s `inputs`, joined in their order."""
    chunks, pieces, first, taken = [], [], 0, 0
    for numbered in inputs:
        line = 0
        while line < numbered.lines:
            count = min(window - taken, numbered.lines - line)
            pieces.append((numbered.path, numbered.offsets[line // STRIDE],
                           line % STRIDE, count))
            line += count
            taken += count
            if taken == window:
                chunks.append(Chunk(len(chunks), first, tuple(pieces)))
                pieces, first, taken = [], first + window, 0
    if pieces:
        chunks.append(Chunk(len(chunks), first, tuple(pieces)))
    return chunks


def read_chunk(chunk, texts=None):
    """Returns the lines (bytes, without line ends) of `chunk`; an input path in `texts`
    (a dict) is read from the file of its decompressed text that it maps to."""
    lines = []
    for path, offset, skip, count in chunk.pieces:
        text = (texts or {}).get(path)
        opened = (FileSystems.open(text, compression_type=CompressionTypes.UNCOMPRESSED)
                  if text else open_input(path))
        with opened as file:
            file.seek(offset)
            for _ in range(skip):
                file.readline()
            lines.extend(file.readline() for _ in range(count))
    return list(translate.iter_sentences(lines))


class TranslatorHandler(inference.ModelHandler):
    """Beam's `ModelHandler` of any artifact `load_translator` opens: each example is a
    chunk (a list of sentences, str or bytes), batched by length as `translate` batches
    a window; its inference is one row of outputs per sentence (`translate.output_windows`).

    Beam's own TensorFlow handlers cannot serve here: they open models with Keras's
    `load_model`, which in Keras 3 refuses SavedModel folders, and know no `.tflite`
    or CTranslate2 artifact.

    Args:
        artifact: str. Run directory, SavedModel, `.tflite` file or CTranslate2 folder.
        n_best: int or `None`. The n-best signature's outputs instead of translations.
        seed: int or `None`. The sample signature's, every sentence drawn with `seed`.
        **load_options: of `load_translator` (beam, beam_size, batch_size, threads, ...).
    """

    def __init__(self, artifact, *, n_best=None, seed=None, **load_options):
        super().__init__()
        self.artifact = os.fspath(artifact)
        self.n_best = n_best
        self.seed = seed
        self.load_options = load_options
        self._failed = Metrics.counter(COUNTERS, "lines_failed")

    def load_model(self):
        # In each worker process; the runners register tf-text's ops as they load.
        translator = loading.load_translator(self.artifact, export_if_missing=False,
                                               n_best=self.n_best, **self.load_options)
        return _Model(translate.decoding_runner(translator, n_best=self.n_best,
                                                seed=self.seed), translator.batching)

    def run_inference(self, batch, model, inference_args=None):
        results = []
        for sentences in batch:
            try:
                rows = [row for window in translate.output_windows(
                            model.runner, sentences, **model.batching) for row in window]
            except Exception:
                self._failed.inc(len(sentences))
                raise
            results.append(inference.PredictionResult(sentences, rows))
        return results

    def batch_elements_kwargs(self):
        # An example is already a window of sentences.
        return {"min_batch_size": 1, "max_batch_size": 1}


class _Model:
    """A loaded runner and its batching options (Beam keeps a weak reference to it)."""

    def __init__(self, runner, batching):
        self.runner = runner
        self.batching = batching


class TranslateLines(beam.PTransform):
    """`(key, sentence)` in, `(key, output)` out, for pipelines of one's own.

    Sentences (str or bytes) are gathered per bundle into windows of `batch_size` ×
    `WINDOW_BATCHES` and batched by length inside them. The output is the translation
    (str); with `scores`, `(translation, log-probability)`; with `n_best`, the list of
    `formats.Hypothesis`, best first.

        with beam.Pipeline() as pipeline:
            (pipeline | beam.Create([(0, "A dog runs."), (1, "Two men.")])
                      | kt.TranslateLines("runs/multi30k", beam=True)
                      | beam.Map(print))

    Args:
        artifact, n_best, seed, **load_options: as `TranslatorHandler`'s.
        scores: bool. Give each translation's log-probability too.
    """

    def __init__(self, artifact, *, n_best=None, scores=False, seed=None,
                 **load_options):
        super().__init__()
        self.handler = TranslatorHandler(artifact, n_best=n_best, seed=seed,
                                         **load_options)
        self.window = load_options.get("batch_size", 32) * translate.WINDOW_BATCHES
        self.n_best = n_best
        self.scores = scores

    def expand(self, keyed_sentences):
        return (keyed_sentences
                | "Window" >> beam.BatchElements(min_batch_size=self.window,
                                                 max_batch_size=self.window)
                | "Keys" >> beam.Map(lambda pairs: (tuple(key for key, _ in pairs),
                                                    [sentence for _, sentence in pairs]))
                | "Translate" >> inference.RunInference(
                    inference.KeyedModelHandler(self.handler))
                | "Unwindow" >> beam.FlatMap(self._outputs))

    def _outputs(self, keyed_result):
        keys, result = keyed_result
        for key, row in zip(keys, result.inference):
            if self.n_best:
                yield key, formats.hypotheses(row)[:self.n_best]
            elif self.scores:
                yield key, (formats.one_line(row["translations"]), float(row["scores"]))
            else:
                yield key, formats.one_line(row["translations"])


@dataclasses.dataclass
class CorpusResult:
    """What `translate_corpus` did: lines of the joined input, and Beam's counters
    (`lines_read`, `lines_translated`, `lines_written`, `lines_failed`) of this run;
    `lines_kept` were written by an earlier run of the same plan."""

    output: str
    lines: int
    chunks: int
    lines_kept: int
    not_utf8: int
    counters: dict
    model_loads: int = 0
    load_seconds: float = 0.0

    def summary(self):
        counted = ", ".join(f"{name.removeprefix('lines_').replace('_', ' ')} "
                            f"{self.counters.get(name, 0):,}"
                            for name in ("lines_read", "lines_translated",
                                         "lines_written", "lines_failed"))
        kept = f", {self.lines_kept:,} kept from the last run" if self.lines_kept else ""
        utf8 = f"; {self.not_utf8:,} not UTF-8" if self.not_utf8 else ""
        loads = (f"; {self.model_loads} model load(s), {self.load_seconds:.1f} s each"
                 if self.model_loads else "")
        return f"{self.output}: {self.lines:,} lines ({counted}{kept}){utf8}{loads}."


def pipeline_args(args, verbose=False):
    """Returns Beam's options `args` (list of str) with `DEFAULT_PIPELINE_ARGS` where not
    given, and with several direct workers, processes (`multi_processing`) unless a
    running mode is given."""
    given = {arg.split("=", 1)[0] for arg in args if arg.startswith("--")}
    defaults = dict(DEFAULT_PIPELINE_ARGS)
    if verbose:
        defaults.pop("--default_sdk_harness_log_level")
    if workers_of(args) > 1:
        defaults["--direct_running_mode"] = "multi_processing"
    return [*args, *(item for name, value in defaults.items() if name not in given
                     for item in (name, value))]


def _runs_here(args):
    """Whether Beam's options `args` name one of the runners in this process or its
    children (the default: `DEFAULT_PIPELINE_ARGS`)."""
    options = pipeline_options.PipelineOptions(pipeline_args(list(args)))
    runner = options.view_as(pipeline_options.StandardOptions).runner
    return runner in LOCAL_RUNNERS


def workers_of(args):
    """The direct runner's workers that Beam's options `args` ask for (1 by default)."""
    options = pipeline_options.PipelineOptions(list(args))
    return options.view_as(pipeline_options.DirectOptions).direct_num_workers or 1


def translate_corpus(artifact, patterns, output, *, pairs=None, n_best=None, scores=False,
                     seed=None, beam_args=(), verbose=False, progress=False, handler=None,
                     **load_options):
    """Translates the lines of the files `patterns` match into `output` on Beam.

    Args:
        artifact: str. What `load_translator` opens (a run directory is exported first
            if it has no export).
        patterns: list of str. Globs of the input files (joined in sorted name order;
            plain or gzip, known by their first bytes, or compressed as their names
            say: `open_input`).
        output: str. The output file (any file system Beam knows; `.gz`: gzipped).
        pairs: `None` (line i of `output` is line i's output, as `translate` writes it),
            "tsv" or "jsonl" (`formats.pair_tsv`, `formats.pair_jsonl`).
        n_best, scores, seed: the outputs (`translate --n-best`, `--scores`, sampling
            with `--seed`).
        beam_args: list of str. Beam's pipeline options (`pipeline_args` adds defaults).
        verbose: bool. Beam's workers log at INFO, not only their warnings.
        progress: bool. Progress bars on stderr (numbering, then translating).
        handler: a `ModelHandler` of chunks to use instead of `TranslatorHandler`
            (tests).
        **load_options: of `load_translator`.

    Returns:
        The `CorpusResult`.

    Raises:
        ValueError: `output` holds the parts of a run with other arguments, or its name
            a pattern's characters.
        FileNotFoundError: a pattern matches nothing.
        CorpusError: a compressed input is truncated or damaged.
        OSError: an input cannot be read, or its text written (`number_lines`).
    """
    output = os.fspath(output)
    if set(output) & set("*?["):
        # Beam's file patterns cannot escape them: listing OUTPUT.parts would match
        # the parts of other outputs.
        raise ValueError(f"--output {output}: a name without *, ? or [ (Beam reads them "
                         "as patterns).")
    paths = match_inputs(patterns)
    if output in paths:
        raise ValueError(f"--output {output} is one of the inputs: write elsewhere.")
    # The same local file under another spelling (./a, a symbolic link) too.
    files.check_not_an_input("--output", output, {
        "artifact": artifact, **{f"input {path}": path for path in paths
                                 if os.path.exists(path)}})
    parts = output + PARTS_SUFFIX
    window = load_options.get("batch_size", 32) * translate.WINDOW_BATCHES
    inputs, chunks, done, texts = _start(artifact, paths, parts, progress, {
        "window": window, "pairs": pairs, "n_best": n_best, "scores": scores, "seed": seed,
        # Threads change the speed, not the output: a rerun may use other workers.
        "load_options": {name: value for name, value in load_options.items()
                         if name != "threads"}})
    todo = [chunk for chunk in chunks if chunk.number not in done]
    kept = sum(chunk.lines for chunk in chunks if chunk.number in done)
    try:
        options = pipeline_options.PipelineOptions(pipeline_args(list(beam_args), verbose))
        logger.info("Translating %d lines of %d files in %d chunks (%d to do) with %s.",
                    sum(numbered.lines for numbered in inputs), len(inputs), len(chunks),
                    len(todo), artifact)
        with _quiet_beam(verbose):
            pipeline = beam.Pipeline(options=options)
            written = (pipeline
                       | "Chunks" >> beam.Create(todo)
                       | "Spread" >> beam.Reshuffle()
                       | "Read" >> beam.Map(_read_keyed, texts)
                       | "Translate" >> inference.RunInference(inference.KeyedModelHandler(
                           handler or TranslatorHandler(artifact, n_best=n_best, seed=seed,
                                                        **load_options)))
                       | "Write" >> beam.Map(_ChunkWriter(parts, pairs=pairs, n_best=n_best,
                                                          scores=scores).write))
            _ = (written
                 | "Count" >> beam.combiners.Count.Globally()
                 | "Join" >> beam.Map(_join_chunks, parts, len(chunks), output))
            watcher = _ProgressWatcher(parts, chunks, kept) if progress else None
            result = _run(pipeline, output, parts, len(chunks), verbose=verbose,
                          watcher=watcher)
    except BaseException as error:
        # The next run writes them anew: no room taken until then. Not on an interrupt
        # of a runner elsewhere (Dataflow's job goes on): it may still read them.
        if isinstance(error, Exception) or _runs_here(beam_args):
            _delete_quietly(list(texts.values()))
        raise
    return _corpus_result(result, output, inputs, len(chunks), kept)


@contextlib.contextmanager
def _quiet_beam(verbose):
    """Beam's log while it builds and runs a pipeline: its notices and its workers'
    tracebacks hidden unless `verbose` (the error `_run` raises says what failed)."""
    beam_logger = logging.getLogger("apache_beam")
    level = beam_logger.level
    if not verbose:
        beam_logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        beam_logger.setLevel(level)


def _run(pipeline, output, parts, chunk_count, *, verbose, watcher):
    """Runs `pipeline` to its end and returns its result; a failure is a
    `CorpusTranslationError` that says how many chunks are kept (`verbose`: Beam's own
    error)."""
    try:
        result = pipeline.run()
        result.wait_until_finish()
    except Exception as error:
        if verbose:
            raise
        written = len(_written_chunks(parts))
        raise CorpusTranslationError(
            f"translating {output} stopped ({type(error).__name__}: "
            f"{_last_line(error)}); {written} of {chunk_count} chunks are kept in "
            f"{parts}: run the same command again to finish the rest.") from error
    finally:
        if watcher:
            watcher.stop()
    if watcher:
        watcher.finish()
    return result


def _corpus_result(result, output, inputs, chunk_count, kept):
    """The `CorpusResult` of a finished pipeline's `result`, from its counters."""
    metrics = result.metrics().query()
    counters = {counter.key.metric.name: counter.committed
                for counter in metrics["counters"]
                if counter.key.metric.namespace == COUNTERS}
    # RunInference's own measure of each worker's load_model.
    loads = [metric.committed for metric in metrics["distributions"]
             if metric.key.metric.name.endswith("load_model_latency_milli_secs")
             and metric.committed and metric.committed.count]
    count = sum(load.count for load in loads)
    return CorpusResult(output, sum(numbered.lines for numbered in inputs), chunk_count,
                        kept, sum(numbered.not_utf8 for numbered in inputs), counters,
                        count, sum(load.sum for load in loads) / 1000 / count if count else 0.0)


class CorpusTranslationError(RuntimeError):
    """The pipeline failed; the chunks it finished are kept for the next run."""


def _last_line(error):
    """The last line of `error`'s message: Beam wraps a worker's error in its traceback."""
    lines = [line for line in str(error).strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else repr(error)


def _written_chunks(parts):
    """The numbers of the chunk files in the `parts` folder."""
    try:
        found = FileSystems.match([FileSystems.join(parts, "chunk-*")])[0].metadata_list
    except Exception:  # no folder: nothing written, or joined and removed
        return set()
    return {number for number in map(_chunk_number, (m.path for m in found))
            if number is not None}


def _start(artifact, paths, parts, progress, plan_options):
    """Numbers the inputs `paths`, writing each compressed one's text into `parts`;
    exports `artifact` if it is a run directory without an export; then starts the
    parts folder with the plan or checks the plan there (`_start_parts`). Returns
    `(inputs, chunks, numbers of the chunks done, {compressed input: its text})`.

    What it wrote is removed if it fails: its texts, and the plan and parts folder
    where it made them. One run at a time may use a parts folder.
    """
    plan_path = FileSystems.join(parts, PLAN_FILE)
    # Local file systems: object stores have no folders, and exists() is False there.
    made_parts = not FileSystems.exists(parts)
    if made_parts:
        FileSystems.mkdirs(parts)
    # Compressed input -> its temporary text, then the text renamed into place.
    written_texts, texts, made_plan = {}, {}, False
    try:
        # Before the export: an input that cannot be read is named without one.
        inputs = _number_inputs(paths, progress, parts, written_texts)
        if files.is_run_dir(artifact):  # exported once here, not in every worker
            from keras_transformer.serving import artifacts
            artifacts.resolve_artifact(artifact, export_if_missing=True)
        chunks = plan_chunks(inputs, plan_options["window"])
        plan = {"artifact": (os.path.abspath(artifact) if os.path.exists(artifact)
                             else artifact),
                "inputs": [[numbered.path, numbered.size, numbered.lines]
                           for numbered in inputs], **plan_options}
        made_plan = not FileSystems.exists(plan_path)
        done = _start_parts(parts, plan)
        # A killed run's temporary texts: every run writes its own.
        stale = [metadata.path for metadata in FileSystems.match(
                     [FileSystems.join(parts, "input-*.tmp-*")])[0].metadata_list
                 if metadata.path not in written_texts.values()]
        _delete_quietly(stale)
        _keep_texts(parts, paths, written_texts, texts)
        return inputs, chunks, done, texts
    except BaseException:
        _delete_quietly([*written_texts.values(), *texts.values(),
                         *([plan_path] if made_plan else [])])
        with contextlib.suppress(Exception):  # the error that stopped the run counts
            if made_parts and not FileSystems.match(
                    [FileSystems.join(parts, "*")])[0].metadata_list:
                FileSystems.delete([parts])
        raise


def _number_inputs(paths, progress, parts, written_texts):
    """Numbers each input of `paths`; a compressed one's text is written into `parts`
    under a temporary name, which `written_texts` (a dict) is given before it is; the
    text of an earlier run (`input-N`) is removed first."""
    sizes = {metadata.path: metadata.size_in_bytes
             for matched in (FileSystems.match(paths) if paths else [])
             for metadata in matched.metadata_list}
    update = None
    if progress and sum(sizes.values()) > NUMBERING_BAR_BYTES:
        update = translate.progress_bar(sum(sizes.values()) or None, unit="byte")
    numbered, before = [], 0
    for index, path in enumerate(paths):
        if _compression_of(*_identity(path)) != CompressionTypes.UNCOMPRESSED:
            _delete_quietly([_text_path(parts, index)])  # one text at a time on the disk
            written_texts[path] = f"{_text_path(parts, index)}.tmp-{uuid.uuid4().hex}"
        result = number_lines(path, update and (lambda read, b=before: update(b + read)),
                              text_to=written_texts.get(path))
        before += result.size
        numbered.append(result)
    return numbered


def _keep_texts(parts, paths, written_texts, texts):
    """Renames each temporary file of `written_texts` (`{input path: temporary file}`)
    to `parts/input-N`, N the input's place in `paths`, replacing an earlier run's; moves
    each entry, as it goes, to `texts` (`{input path: the file of its text}`)."""
    for index, path in enumerate(paths):
        if path in written_texts:
            text = _text_path(parts, index)
            if FileSystems.exists(text):  # not every file system renames over a file
                FileSystems.delete([text])
            FileSystems.rename([written_texts[path]], [text])
            del written_texts[path]
            texts[path] = text


def _text_path(parts, index):
    """The file of the text of the input at `index` (sorted by name) in `parts`."""
    return FileSystems.join(parts, f"input-{index:04d}")


def _delete_quietly(paths):
    """Deletes what of `paths` exists (folders with what they hold), as far as it can."""
    for path in paths:
        with contextlib.suppress(Exception):
            FileSystems.delete([path])


def _start_parts(parts, plan):
    """Makes the parts folder (or checks the plan of one there); returns the numbers
    of the chunks written already."""
    plan_path = FileSystems.join(parts, PLAN_FILE)
    text = json.dumps(plan, indent=1, sort_keys=True)
    if FileSystems.exists(plan_path):
        with FileSystems.open(plan_path, compression_type=CompressionTypes.UNCOMPRESSED) \
                as file:
            held = json.loads(file.read())
        if held != json.loads(text):
            differing = sorted(name for name in set(held) | set(plan)
                               if held.get(name) != json.loads(text).get(name))
            raise ValueError(
                f"{parts} holds chunks of a run with other {', '.join(differing)}: run "
                "again with that run's arguments to finish it, or delete the folder to "
                "start over.")
        return _written_chunks(parts)
    if not FileSystems.exists(parts):
        FileSystems.mkdirs(parts)
    # Chunks without a plan are a joined run's that its removal left (it deletes the
    # plan first): none of them is this run's.
    _delete_quietly([_chunk_path(parts, number) for number in _written_chunks(parts)])
    if _written_chunks(parts):
        raise OSError(f"{parts} holds chunks of an earlier run that cannot be removed: "
                      "delete them, or write elsewhere.")
    _write_atomically(plan_path, text.encode("utf-8"))
    return set()


def _chunk_path(parts, number):
    return FileSystems.join(parts, f"chunk-{number:08d}")


def _chunk_number(path):
    name = path.rstrip("/").rsplit("/", 1)[-1]
    digits = name.removeprefix("chunk-")
    return int(digits) if name.startswith("chunk-") and digits.isdigit() else None


def _write_atomically(path, data):
    """Writes `data` to `path` through a temporary name beside it."""
    temporary = f"{path}.tmp-{uuid.uuid4().hex}"
    with FileSystems.create(temporary, compression_type=CompressionTypes.UNCOMPRESSED) \
            as file:
        file.write(data)
    FileSystems.rename([temporary], [path])


def _read_keyed(chunk, texts):
    sentences = read_chunk(chunk, texts)
    Metrics.counter(COUNTERS, "lines_read").inc(len(sentences))
    return (chunk.number, chunk.first_line), sentences


class _ChunkWriter:
    """Writes a translated chunk's text to its part file (picklable: a Beam step)."""

    def __init__(self, parts, *, pairs, n_best, scores):
        self.parts = parts
        self.pairs = pairs
        self.n_best = n_best
        self.scores = scores

    def write(self, keyed_result):
        (number, first_line), result = keyed_result
        rows = result.inference
        Metrics.counter(COUNTERS, "lines_translated").inc(len(rows))
        if self.pairs:
            pair = formats.pair_jsonl if self.pairs == "jsonl" else formats.pair_tsv
            text = "".join(pair(first_line + index, source, row)
                           for index, (source, row) in enumerate(zip(result.example, rows)))
        else:
            line = formats.output_format(n_best=self.n_best, scores=self.scores)
            text = "".join(line(first_line + index, row) for index, row in enumerate(rows))
        # surrogateescape: the bytes of a TSV's invalid UTF-8 sources, as read.
        _write_atomically(_chunk_path(self.parts, number),
                          text.encode("utf-8", "surrogateescape"))
        Metrics.counter(COUNTERS, "lines_written").inc(len(rows))
        return number


def _join_chunks(_, parts, count, output):
    """Joins the `count` chunk files of `parts` in order into `output`, through a
    temporary name; then removes `parts`: its files, then the folder (object stores
    have none, and Beam's deletion of one there matches no file).

    Runners retry a bundle whose worker failed or was lost, so this may run again after
    an attempt that renamed `output` into place and removed all or some of `parts`. The
    plan tells: the run's driver writes it before the pipeline starts, and only the
    removal deletes it, first. Without it, only the removal is left; an `output` there
    before this run (a rerun's) is no evidence, and neither is a listing that failed."""
    if (not FileSystems.exists(FileSystems.join(parts, PLAN_FILE))
            and FileSystems.exists(output)):
        _remove_parts(parts, output)
        return
    temporary = f"{output}.tmp-{uuid.uuid4().hex}"
    compression = CompressionTypes.detect_compression_type(output)
    try:
        with FileSystems.create(temporary, compression_type=compression) as joined:
            for number in range(count):
                with FileSystems.open(_chunk_path(parts, number),
                                      compression_type=CompressionTypes.UNCOMPRESSED) \
                        as part:
                    shutil.copyfileobj(part, joined, 1 << 20)
        FileSystems.rename([temporary], [output])
    except BaseException:
        _delete_quietly([temporary])
        raise
    _remove_parts(parts, output)


def _remove_parts(parts, output):
    """Removes the plan of `parts` (which says a join is to come: `_join_chunks`), its
    other files, then the folder, once `output` is whole: what is left of them only
    takes room, so a failure is a warning."""
    plan_path = FileSystems.join(parts, PLAN_FILE)
    try:
        if FileSystems.exists(plan_path):
            FileSystems.delete([plan_path])
        FileSystems.delete([metadata.path for metadata in FileSystems.match(
            [FileSystems.join(parts, "*")])[0].metadata_list])
    except Exception as error:  # noqa: BLE001  any file system's error
        logger.warning("%s is complete; %s could not be removed (%s): delete it.",
                       output, parts, error)
    _delete_quietly([parts])


class _ProgressWatcher:
    """A progress bar of the lines in chunk files, updated from a thread every second
    (the driver sees the workers' files, not their counters, while they run)."""

    def __init__(self, parts, chunks, kept):
        self._lines = {chunk.number: chunk.lines for chunk in chunks}
        self._parts = parts
        self._update = translate.progress_bar(sum(self._lines.values()) or None)
        self._shown = kept
        self._update(kept)
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self):
        while not self._stopped.wait(1.0):
            self._shown = max(self._shown, self._done())
            self._update(self._shown)

    def _done(self):
        return sum(self._lines.get(number, 0) for number in _written_chunks(self._parts))

    def stop(self):
        self._stopped.set()
        self._thread.join()

    def finish(self):
        total = sum(self._lines.values())
        if self._shown < total:  # the bar closed itself at the total
            self._update(total)
