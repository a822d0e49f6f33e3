"""translate-corpus on Apache Beam: order across files and chunks, empty input and lines,
rewritten chunks, counters, pairs, resumption after a failure or a kill; the tiny
exported translator through the command with two worker processes (the beam extra)."""

import bz2
import gzip
import io
import json
import logging
import lzma
import os
import pathlib
import re
import signal
import subprocess
import sys
import time
import zlib

import pytest

pytest.importorskip("apache_beam", reason="translate-corpus needs the beam extra: "
                                          "pip install -e '.[beam]'")

import apache_beam as beam  # noqa: E402
from apache_beam.testing.test_pipeline import TestPipeline  # noqa: E402
from apache_beam.testing.util import assert_that, equal_to  # noqa: E402

from keras_transformer import translate, translate_corpus  # noqa: E402

pytestmark = pytest.mark.beam

BATCH_SIZE = 2  # chunks of 2 × 64 = 128 lines
WINDOW = BATCH_SIZE * translate.WINDOW_BATCHES


def batch_dependent_runner(sentences):
    """A translator whose output shows the batch it ran in: equal outputs mean equal
    batches (what makes translate-corpus byte-identical to translate)."""
    return {"translations": [sentence[::-1] + b"|%d" % len(sentences)
                             for sentence in sentences],
            "scores": [-float(len(sentence)) for sentence in sentences]}


class FakeHandler(translate_corpus.TranslatorHandler):
    """`TranslatorHandler` over `batch_dependent_runner`; fails once at the chunk that
    holds line `fail_at` while `flag` (a file) exists, removing it."""

    def __init__(self, fail_at=None, flag=None):
        super().__init__("fake", batch_size=BATCH_SIZE)
        self.fail_at, self.flag = fail_at, flag

    def load_model(self):
        return translate_corpus._Model(batch_dependent_runner, dict(
            batch_size=BATCH_SIZE, batch_tokens=None, count_tokens=None))

    def run_inference(self, batch, model, inference_args=None):
        def failing(sentences):
            if self.flag and os.path.exists(self.flag) and any(
                    b"line %d " % self.fail_at in sentence for sentence in sentences):
                os.remove(self.flag)
                raise RuntimeError("planted failure")
            return batch_dependent_runner(sentences)
        return super().run_inference(batch, translate_corpus._Model(
            failing, model.batching), inference_args)


def write_inputs(directory, sizes, *, trailing_newline=True):
    """Files `part-0.txt`... of `sizes` lines (every 7th empty, some with tabs and
    backslashes); returns their joined bytes as translate reads them."""
    joined, number = [], 0
    for index, size in enumerate(sizes):
        lines = []
        for _ in range(size):
            lines.append(b"" if number % 7 == 3 else
                         b"line %d \t back\\slash %s" % (number, b"x" * (number % 13)))
            number += 1
        data = b"\n".join(lines) + (b"\n" if lines and trailing_newline else b"")
        (directory / f"part-{index}.txt").write_bytes(data)
        joined.extend(lines)
    return joined


def expected_output(lines, format_output=None):
    output = io.BytesIO()
    translate.translate_file(batch_dependent_runner, iter(lines), output,
                             batch_size=BATCH_SIZE, format_output=format_output)
    return output.getvalue()


def run(directory, output, handler=None, **options):
    return translate_corpus.translate_corpus(
        "fake", [str(directory / "part-*.txt")], str(output),
        handler=handler or FakeHandler(), batch_size=BATCH_SIZE, **options)


@pytest.mark.parametrize("beam_args", [
    [], ["--direct_num_workers", "2", "--direct_running_mode", "multi_threading"]])
def test_lines_keep_their_order_across_files_and_chunks(tmp_path, beam_args):
    # 10 files: empty ones, one of a line, ones across chunk boundaries; no trailing
    # newline on each file's last line.
    sizes = [0, 1, 300, 129, 0, 200, 5, 127, 128, 60]
    lines = write_inputs(tmp_path, sizes, trailing_newline=False)
    result = run(tmp_path, tmp_path / "out.txt", beam_args=beam_args)
    assert (tmp_path / "out.txt").read_bytes() == expected_output(lines)
    assert result.lines == sum(sizes) and result.chunks == -(-sum(sizes) // WINDOW)
    assert result.counters == {"lines_read": sum(sizes), "lines_translated": sum(sizes),
                               "lines_written": sum(sizes)}
    assert not (tmp_path / "out.txt.parts").exists()


def test_the_output_holds_one_line_per_input_line_empty_lines_included(tmp_path):
    lines = write_inputs(tmp_path, [50])
    run(tmp_path, tmp_path / "out.txt")
    written = (tmp_path / "out.txt").read_bytes().split(b"\n")[:-1]
    assert len(written) == 50 and lines.count(b"") == 7
    assert [line.startswith(b"|") for line in written] == [not line for line in lines]


def test_empty_input_writes_an_empty_file(tmp_path):
    (tmp_path / "part-0.txt").write_bytes(b"")
    result = run(tmp_path, tmp_path / "out.txt")
    assert (tmp_path / "out.txt").read_bytes() == b"" and result.lines == 0


def test_a_pattern_that_matches_nothing_names_itself(tmp_path):
    with pytest.raises(FileNotFoundError, match="nothing-here"):
        translate_corpus.translate_corpus("fake", [str(tmp_path / "nothing-here*")],
                                          str(tmp_path / "out"), handler=FakeHandler())


def test_an_input_named_otherwise_as_the_output_is_refused_and_kept(tmp_path):
    write_inputs(tmp_path, [5])
    before = (tmp_path / "part-0.txt").read_bytes()
    (tmp_path / "link.txt").symlink_to(tmp_path / "part-0.txt")
    for output in (f"{tmp_path}/./part-0.txt", tmp_path / "link.txt"):
        with pytest.raises(ValueError, match="overwrite the input"):
            run(tmp_path, output)
    assert (tmp_path / "part-0.txt").read_bytes() == before
    model = tmp_path / "model.tflite"  # nor is the artifact
    model.write_bytes(b"model")
    with pytest.raises(ValueError, match="overwrite the artifact"):
        translate_corpus.translate_corpus(str(model), [str(tmp_path / "part-*.txt")],
                                          str(model), handler=FakeHandler())
    assert model.read_bytes() == b"model"


def test_a_rewritten_chunk_leaves_one_copy(tmp_path):
    # A retried bundle writes its chunk again: the file is replaced, not doubled.
    lines = write_inputs(tmp_path, [300])
    parts = tmp_path / "out.txt.parts"
    parts.mkdir()
    writer = translate_corpus._ChunkWriter(str(parts), pairs=None, n_best=None,
                                           scores=False)
    example = [lines[0], lines[1]]
    rows = [{"translations": b"a", "scores": 0.0}, {"translations": b"b", "scores": 0.0}]
    for _ in range(2):
        writer.write(((0, 0), beam.ml.inference.base.PredictionResult(example, rows)))
    assert sorted(os.listdir(parts)) == ["chunk-00000000"]
    assert (parts / "chunk-00000000").read_bytes() == b"a\nb\n"


def test_a_failed_run_keeps_its_chunks_and_the_same_command_finishes(tmp_path):
    lines = write_inputs(tmp_path, [200, 300])
    flag = tmp_path / "fail-once"
    flag.write_text("")
    output = tmp_path / "out.txt"
    with pytest.raises(translate_corpus.CorpusTranslationError,
                       match=r"planted failure.*run the same command again"):
        run(tmp_path, output, handler=FakeHandler(fail_at=300, flag=str(flag)))
    assert not output.exists()  # never a partial file under the output's name
    kept = sorted(os.listdir(tmp_path / "out.txt.parts"))
    assert "plan.json" in kept and "chunk-00000002" not in kept
    result = run(tmp_path, output)
    assert output.read_bytes() == expected_output(lines)
    assert result.lines_kept == WINDOW * (len(kept) - 1)
    assert result.counters["lines_read"] == 500 - result.lines_kept


def test_chunks_a_joined_run_left_without_its_plan_are_not_taken_as_done(tmp_path):
    # A joined run whose removal stopped after the plan (it goes first) left a chunk; a
    # later run into the same output fails before its own chunk 2, then runs again.
    lines = write_inputs(tmp_path, [200, 300])
    parts, output = tmp_path / "out.txt.parts", tmp_path / "out.txt"
    parts.mkdir()
    (parts / "chunk-00000002").write_bytes(b"an earlier run's line\n" * 128)
    flag = tmp_path / "fail-once"
    flag.write_text("")
    with pytest.raises(translate_corpus.CorpusTranslationError, match="planted failure"):
        run(tmp_path, output, handler=FakeHandler(fail_at=300, flag=str(flag)))
    assert "chunk-00000002" not in os.listdir(parts)
    run(tmp_path, output)
    assert output.read_bytes() == expected_output(lines)


def test_chunks_without_a_plan_that_cannot_be_removed_stop_the_run(tmp_path, monkeypatch):
    write_inputs(tmp_path, [200])
    parts = tmp_path / "out.txt.parts"
    parts.mkdir()
    (parts / "chunk-00000001").write_bytes(b"an earlier run's line\n")
    monkeypatch.setattr(translate_corpus.FileSystems, "delete", lambda paths: None)
    with pytest.raises(OSError, match=r"out\.txt\.parts holds chunks of an earlier run "
                                      r"that cannot be removed"):
        run(tmp_path, tmp_path / "out.txt")
    assert sorted(os.listdir(parts)) == ["chunk-00000001"]  # no plan was written


def test_a_run_with_other_arguments_refuses_the_parts_of_another(tmp_path):
    write_inputs(tmp_path, [300])
    flag = tmp_path / "fail-once"
    flag.write_text("")
    with pytest.raises(translate_corpus.CorpusTranslationError):
        run(tmp_path, tmp_path / "out.txt", handler=FakeHandler(fail_at=200, flag=str(flag)))
    with pytest.raises(ValueError, match=r"out.txt.parts holds chunks of a run with "
                                         r"other scores.*delete the folder"):
        run(tmp_path, tmp_path / "out.txt", scores=True)


def test_a_run_on_other_threads_finishes_the_parts_of_another(tmp_path):
    lines = write_inputs(tmp_path, [300])
    flag = tmp_path / "fail-once"
    flag.write_text("")
    with pytest.raises(translate_corpus.CorpusTranslationError):
        run(tmp_path, tmp_path / "out.txt", threads=2,
            handler=FakeHandler(fail_at=200, flag=str(flag)))
    result = run(tmp_path, tmp_path / "out.txt", threads=1)
    assert result.lines_kept > 0
    assert (tmp_path / "out.txt").read_bytes() == expected_output(lines)


def test_scores_and_n_best_are_written_as_translate_writes_them(tmp_path):
    from keras_transformer import formats
    lines = write_inputs(tmp_path, [150])
    run(tmp_path, tmp_path / "out.txt", scores=True)
    assert (tmp_path / "out.txt").read_bytes() == expected_output(
        lines, formats.scored_translation)


def test_pairs_hold_each_source_its_translation_and_score(tmp_path):
    lines = write_inputs(tmp_path, [140])
    (tmp_path / "part-1.txt").write_bytes(b"caf\xe9 latin-1\n")
    lines.append(b"caf\xe9 latin-1")
    run(tmp_path, tmp_path / "pairs.tsv", pairs="tsv")
    run(tmp_path, tmp_path / "pairs.jsonl", pairs="jsonl")
    tsv = (tmp_path / "pairs.tsv").read_bytes().split(b"\n")[:-1]
    jsonl = [json.loads(line) for line in
             (tmp_path / "pairs.jsonl").read_text(encoding="utf-8").splitlines()]
    assert len(tsv) == len(jsonl) == len(lines)
    for number, (source, row, record) in enumerate(zip(lines, tsv, jsonl)):
        fields = row.split(b"\t")
        assert len(fields) == 3  # the sources' tabs are escaped
        unescaped = fields[0].replace(b"\\t", b"\t").replace(b"\\\\", b"\\")
        assert unescaped == source
        assert float(fields[2]) == -len(source)
        assert record["line"] == number and record["score"] == -len(source)
        assert record["source"] == source.decode("utf-8", "replace")
        assert record["translation"].startswith(
            source[::-1].decode("utf-8", "replace"))


def test_gzipped_inputs_and_outputs(tmp_path):
    lines = write_inputs(tmp_path, [300])
    data = (tmp_path / "part-0.txt").read_bytes()
    (tmp_path / "part-0.txt").unlink()
    (tmp_path / "in.gz").write_bytes(gzip.compress(data))
    translate_corpus.translate_corpus(
        "fake", [str(tmp_path / "in.gz")], str(tmp_path / "out.gz"),
        handler=FakeHandler(), batch_size=BATCH_SIZE)
    assert gzip.decompress((tmp_path / "out.gz").read_bytes()) == expected_output(lines)


def zstd_compress(data):
    import zstandard  # the beam extra's

    return zstandard.ZstdCompressor().compress(data)


COMPRESSIONS = [("in.gz", gzip.compress), ("in.bz2", bz2.compress), ("in.xz", lzma.compress),
                ("in.deflate", zlib.compress), ("in.zst", zstd_compress)]


@pytest.mark.parametrize("name, compress", [
    ("in.txt", gzip.compress), ("in.gz", lambda data: data), *COMPRESSIONS[1:]])
def test_inputs_are_gzip_by_their_bytes_not_their_name(tmp_path, name, compress):
    # As `translate` reads them (`text.open_lines`): a gzip file without `.gz`, and a
    # plain one named `.gz`, read as what they hold; other compressions by their names.
    # Past 2 × STRIDE lines: chunks seek into the decompressed file.
    lines = write_inputs(tmp_path, [2 * translate_corpus.STRIDE + 500])
    data = (tmp_path / "part-0.txt").read_bytes()
    (tmp_path / "part-0.txt").unlink()
    named = tmp_path / name
    named.write_bytes(compress(data))
    translate_corpus.translate_corpus("fake", [str(named)], str(tmp_path / "out.txt"),
                                      handler=FakeHandler(), batch_size=BATCH_SIZE)
    assert (tmp_path / "out.txt").read_bytes() == expected_output(lines)


def compressed_inputs(directory, sizes, name, compress):
    """`write_inputs`, the last file compressed by `compress`, named with `name`'s
    extension (`part-N.gz`: still the last); returns the joined lines and the paths."""
    lines = write_inputs(directory, sizes)
    last = directory / f"part-{len(sizes) - 1}.txt"
    compressed = last.with_suffix(os.path.splitext(name)[1])
    compressed.write_bytes(compress(last.read_bytes()))
    last.unlink()
    return lines, [str(directory / f"part-{index}.txt") for index in range(len(sizes) - 1)
                   ] + [str(compressed)]


def counting_decompressions(monkeypatch, compression):
    """Counts the readers that decompress a `compression` input from its first byte (in
    this process: Beam's default runner runs its one worker here)."""
    readers = translate_corpus._WHOLE_STREAM_READERS
    opened, reader = [], readers[compression]

    def counted(raw):
        opened.append(raw)
        return reader(raw)

    monkeypatch.setitem(readers, compression, counted)
    return opened


@pytest.mark.parametrize("name, compress", COMPRESSIONS)
def test_a_compressed_input_is_decompressed_once_for_all_its_chunks(tmp_path, monkeypatch,
                                                                   name, compress):
    # Numbering writes its text, which its 21 chunks seek into: a chunk that decompressed
    # the file itself would read it up to its lines (work quadratic in the file). Its
    # first chunk holds the plain file's last lines too.
    lines, paths = compressed_inputs(tmp_path, [300, 2 * translate_corpus.STRIDE + 500],
                                     name, compress)
    decompressions = counting_decompressions(
        monkeypatch, translate_corpus._compression_of(*translate_corpus._identity(paths[1])))
    output, parts = tmp_path / "out.txt", tmp_path / "out.txt.parts"
    parts.mkdir()  # as a killed run left it: a text and a temporary one, both wrong
    (parts / "input-0001").write_bytes(b"stale\n" * 4000)
    (parts / "input-0001.tmp-killed").write_bytes(b"stale\n" * 10)
    flag = tmp_path / "fail-once"
    flag.write_text("")
    with pytest.raises(translate_corpus.CorpusTranslationError):
        translate_corpus.translate_corpus("fake", paths, str(output), batch_size=BATCH_SIZE,
                                          handler=FakeHandler(fail_at=1500, flag=str(flag)))
    assert len(decompressions) == 1
    assert [name for name in os.listdir(parts) if name.startswith("input-")] == []
    # The run again writes the text anew; its output holds the chunks kept too.
    result = translate_corpus.translate_corpus("fake", paths, str(output),
                                               handler=FakeHandler(), batch_size=BATCH_SIZE)
    assert len(decompressions) == 2 and 0 < result.lines_kept < len(lines)
    assert output.read_bytes() == expected_output(lines)
    assert not parts.exists()


def test_a_run_refused_by_another_runs_parts_keeps_its_plan_and_chunks(tmp_path):
    lines, paths = compressed_inputs(tmp_path, [3000], "in.gz", gzip.compress)
    flag = tmp_path / "fail-once"
    flag.write_text("")
    output, parts = tmp_path / "out.txt", tmp_path / "out.txt.parts"
    with pytest.raises(translate_corpus.CorpusTranslationError):
        translate_corpus.translate_corpus("fake", paths, str(output), batch_size=BATCH_SIZE,
                                          handler=FakeHandler(fail_at=1500, flag=str(flag)))
    held = {name: (parts / name).read_bytes() for name in os.listdir(parts)}
    assert "plan.json" in held and "chunk-00000000" in held
    (tmp_path / "part-0.gz").write_bytes(gzip.compress(b"another line\n" * 3000))
    with pytest.raises(ValueError, match="holds chunks of a run with other inputs"):
        translate_corpus.translate_corpus("fake", paths, str(output),
                                          handler=FakeHandler(), batch_size=BATCH_SIZE)
    assert {name: (parts / name).read_bytes() for name in os.listdir(parts)} == held


class FailingText:
    """A file being written whose `failure` ("write": after 4 KB; "close") raises ENOSPC."""

    def __init__(self, file, failure):
        self.file, self.failure, self.written = file, failure, 0

    def write(self, data):
        self.written += len(data)
        if self.failure == "write" and self.written > 4096:
            raise OSError(28, "No space left on device")
        return self.file.write(data)

    def close(self):
        self.file.close()
        if self.failure == "close":
            raise OSError(28, "No space left on device")


@pytest.mark.parametrize("failure, damaged", [
    ("create", False), ("write", False), ("close", False), ("rename", False),
    ("close", True)])  # the others fail before the damage is read
def test_a_text_that_cannot_be_written_is_not_called_damaged_and_leaves_nothing(
        tmp_path, monkeypatch, failure, damaged):
    # The file system's error as it is; but damage found first is what a failing close
    # must not hide (it stopped the writing). A rename fails after the plan is written:
    # that goes too.
    _, paths = compressed_inputs(tmp_path, [3000], "in.gz", gzip.compress)
    if damaged:
        data = pathlib.Path(paths[0]).read_bytes()
        pathlib.Path(paths[0]).write_bytes(data[:len(data) // 2])
    real_create = translate_corpus.FileSystems.create

    def failing_create(path, *arguments, **options):
        if not os.path.basename(path).startswith("input-"):
            return real_create(path, *arguments, **options)
        if failure == "create":
            raise OSError(28, "No space left on device")
        return FailingText(real_create(path, *arguments, **options), failure)

    real_rename = translate_corpus.FileSystems.rename

    def failing_rename(sources, destinations):
        if failure == "rename" and os.path.basename(destinations[0]).startswith("input-"):
            raise OSError(28, "No space left on device")
        return real_rename(sources, destinations)

    monkeypatch.setattr(translate_corpus.FileSystems, "create", failing_create)
    monkeypatch.setattr(translate_corpus.FileSystems, "rename", failing_rename)
    expected = (translate_corpus.CorpusError if damaged and failure in ("close", "rename")
                else OSError)
    with pytest.raises(expected) as raised:
        translate_corpus.translate_corpus("fake", paths, str(tmp_path / "out.txt"),
                                          handler=FakeHandler(), batch_size=BATCH_SIZE)
    assert ("truncated or damaged" in str(raised.value)) == (expected is not OSError)
    if expected is OSError and failure != "rename":  # the text's error names it
        assert re.search(r"\[Errno 28\] .*out\.txt\.parts/input-0000\.tmp-\w+: writing the "
                         r"text of .*part-0\.gz failed \(No space left on device\); "
                         r"translate-corpus needs room beside --output", str(raised.value))
    assert sorted(os.listdir(tmp_path)) == ["part-0.gz"]


def test_a_rename_failing_at_the_second_text_leaves_neither(tmp_path, monkeypatch):
    write_inputs(tmp_path, [300, 300])
    for index in range(2):
        plain = tmp_path / f"part-{index}.txt"
        (tmp_path / f"part-{index}.gz").write_bytes(gzip.compress(plain.read_bytes()))
        plain.unlink()
    real_rename = translate_corpus.FileSystems.rename

    def failing_rename(sources, destinations):
        if os.path.basename(destinations[0]) == "input-0001":
            raise OSError(28, "No space left on device")
        return real_rename(sources, destinations)

    monkeypatch.setattr(translate_corpus.FileSystems, "rename", failing_rename)
    with pytest.raises(OSError, match="No space left on device"):
        translate_corpus.translate_corpus("fake", [str(tmp_path / "part-*.gz")],
                                          str(tmp_path / "out.txt"), handler=FakeHandler(),
                                          batch_size=BATCH_SIZE)
    assert sorted(os.listdir(tmp_path)) == ["part-0.gz", "part-1.gz"]


def test_a_failing_listing_of_the_parts_does_not_hide_the_damage(tmp_path, monkeypatch):
    _, paths = compressed_inputs(tmp_path, [3000], "in.gz", gzip.compress)
    data = pathlib.Path(paths[0]).read_bytes()
    pathlib.Path(paths[0]).write_bytes(data[:len(data) // 2])
    real_match = translate_corpus.FileSystems.match

    def failing_match(patterns, *arguments, **options):
        if patterns[0].endswith("out.txt.parts/*"):
            raise OSError(5, "Input/output error")
        return real_match(patterns, *arguments, **options)

    monkeypatch.setattr(translate_corpus.FileSystems, "match", failing_match)
    with pytest.raises(translate_corpus.CorpusError, match="truncated or damaged"):
        translate_corpus.translate_corpus("fake", paths, str(tmp_path / "out.txt"),
                                          handler=FakeHandler(), batch_size=BATCH_SIZE)


def test_a_finished_run_removes_the_files_of_parts_where_folders_are_not_files(
        tmp_path, monkeypatch):
    # As on object stores (gs://, s3://): deleting the folder's name deletes nothing.
    lines, paths = compressed_inputs(tmp_path, [300, 3000], "in.gz", gzip.compress)
    parts = tmp_path / "out.txt.parts"
    real_delete = translate_corpus.FileSystems.delete

    def object_store_delete(paths_to_delete):
        return real_delete([path for path in paths_to_delete if path != str(parts)])

    monkeypatch.setattr(translate_corpus.FileSystems, "delete", object_store_delete)
    translate_corpus.translate_corpus("fake", paths, str(tmp_path / "out.txt"),
                                      handler=FakeHandler(), batch_size=BATCH_SIZE)
    assert (tmp_path / "out.txt").read_bytes() == expected_output(lines)
    assert sorted(os.listdir(tmp_path)) == ["out.txt", "out.txt.parts", "part-0.txt",
                                            "part-1.gz"]
    assert os.listdir(parts) == []


def test_a_finished_run_whose_parts_cannot_be_removed_succeeds_and_says_so(
        tmp_path, monkeypatch, caplog):
    lines = write_inputs(tmp_path, [300])
    real_delete = translate_corpus.FileSystems.delete

    def failing_delete(paths):
        if any("chunk-" in path for path in paths):
            raise OSError(13, "Permission denied")
        return real_delete(paths)

    monkeypatch.setattr(translate_corpus.FileSystems, "delete", failing_delete)
    with caplog.at_level(logging.WARNING, logger=translate_corpus.__name__):
        run(tmp_path, tmp_path / "out.txt")
    assert (tmp_path / "out.txt").read_bytes() == expected_output(lines)
    assert re.search(r"out\.txt is complete; .*out\.txt\.parts could not be removed "
                     r"\(.*Permission denied\): delete it", caplog.text)


def test_a_join_run_again_after_it_finished_keeps_the_output(tmp_path, caplog,
                                                              monkeypatch):
    # Runners retry a bundle whose worker they lost: the join may run again after an
    # attempt that renamed the output into place and removed all or some of the parts.
    parts, output = tmp_path / "out.txt.parts", tmp_path / "out.txt"

    def write_parts(numbers, plan=True):
        parts.mkdir(exist_ok=True)
        if plan:  # the driver's, written before the pipeline starts
            (parts / translate_corpus.PLAN_FILE).write_text("{}")
        for number in numbers:
            (parts / f"chunk-{number:08d}").write_bytes(b"line %d\n" % number)

    output.write_bytes(b"an earlier run's output\n")
    write_parts(range(3))
    translate_corpus._join_chunks(None, str(parts), 3, str(output))
    assert output.read_bytes() == b"line 0\nline 1\nline 2\n" and not parts.exists()
    with caplog.at_level(logging.WARNING, logger=translate_corpus.__name__):
        translate_corpus._join_chunks(None, str(parts), 3, str(output))  # all removed
        write_parts([2], plan=False)  # stopped while removing: the plan goes first
        translate_corpus._join_chunks(None, str(parts), 3, str(output))
    assert output.read_bytes() == b"line 0\nline 1\nline 2\n" and not parts.exists()
    assert caplog.text == ""

    class WorkerLost(BaseException):
        pass

    real_delete = translate_corpus.FileSystems.delete

    def delete_one_then_stop(paths):  # the worker dies after one file
        real_delete(paths[:1])
        if len(paths) > 1:
            raise WorkerLost()

    write_parts(range(3))
    with monkeypatch.context() as patch:
        patch.setattr(translate_corpus.FileSystems, "delete", delete_one_then_stop)
        with pytest.raises(WorkerLost):
            translate_corpus._join_chunks(None, str(parts), 3, str(output))
    translate_corpus._join_chunks(None, str(parts), 3, str(output))  # the retry
    assert output.read_bytes() == b"line 0\nline 1\nline 2\n" and not parts.exists()
    # With the plan there, a missing chunk is an error, beside an output or not.
    for name in ("out.txt", "other.txt"):
        write_parts([1, 2])
        with pytest.raises(OSError):
            translate_corpus._join_chunks(None, str(parts), 3, str(tmp_path / name))
    assert output.read_bytes() == b"line 0\nline 1\nline 2\n"
    assert not (tmp_path / "other.txt").exists()
    assert sorted(os.listdir(tmp_path)) == ["out.txt", "out.txt.parts"]  # no .tmp-


@pytest.mark.parametrize("stop, runs_here, kept", [
    (ValueError("Unexpected pipeline runner"), True, False),
    (KeyboardInterrupt(), True, False),  # nothing else reads them
    (KeyboardInterrupt(), False, True)])  # a job elsewhere may go on reading them
def test_the_texts_go_when_the_pipeline_stops_unless_a_runner_elsewhere_reads_them(
        tmp_path, monkeypatch, stop, runs_here, kept):
    _, paths = compressed_inputs(tmp_path, [300, 3000], "in.gz", gzip.compress)

    def stopped(*arguments, **options):
        raise stop

    monkeypatch.setattr(translate_corpus, "_run", stopped)
    monkeypatch.setattr(translate_corpus, "_runs_here", lambda args: runs_here)
    with pytest.raises(type(stop)):
        translate_corpus.translate_corpus("fake", paths, str(tmp_path / "out.txt"),
                                          handler=FakeHandler(), batch_size=BATCH_SIZE)
    texts = [name for name in os.listdir(tmp_path / "out.txt.parts")
             if name.startswith("input-")]
    assert texts == (["input-0001"] if kept else [])


@pytest.mark.parametrize("args, here", [
    ([], True), (["--direct_num_workers", "2"], True), (["--runner", "DirectRunner"], True),
    (["--runner", "DataflowRunner"], False), (["--runner=FlinkRunner"], False)])
def test_runners_in_this_process_or_its_children_are_told_apart(args, here):
    assert translate_corpus._runs_here(args) is here


@pytest.mark.parametrize("name", ["out*.txt", "out?.txt", "out[1].txt"])
def test_an_output_named_with_a_patterns_characters_is_refused(tmp_path, name):
    write_inputs(tmp_path, [10])
    with pytest.raises(ValueError, match=r"a name without \*, \? or \["):
        run(tmp_path, tmp_path / name)
    assert sorted(os.listdir(tmp_path)) == ["part-0.txt"]


def test_numbering_shows_one_bar_for_the_bytes_of_every_input(tmp_path, monkeypatch):
    _, paths = compressed_inputs(tmp_path, [3000, 3000], "in.gz", gzip.compress)
    bars = []

    def progress_bar(total=None, unit="sentence"):
        bars.append((total, unit, []))
        return bars[-1][2].append

    monkeypatch.setattr(translate_corpus, "NUMBERING_BAR_BYTES", 0)
    monkeypatch.setattr(translate_corpus.translate, "progress_bar", progress_bar)
    (tmp_path / "parts").mkdir()
    translate_corpus._number_inputs(paths, True, str(tmp_path / "parts"), {})
    total = sum(os.path.getsize(path) for path in paths)
    assert [(bar_total, unit, told[-1]) for bar_total, unit, told in bars] == [
        (total, "byte", total)]


def test_the_compressed_input_benchmark_reads_the_same_lines_both_ways(capsys):
    from benchmarks import compressed_input

    compressed_input.main(["--lines", "5000", "--compression", "zst", "--batch-size", "8"])
    assert "10 chunks" in capsys.readouterr().out  # 5,000 lines in windows of 512


@pytest.mark.parametrize("name, compress", [("in.txt", lambda data: data), *COMPRESSIONS])
def test_numbering_counts_progress_in_the_files_own_bytes(tmp_path, name, compress):
    # As the bar's total counts them: the input sizes, compressed where they are.
    path = tmp_path / name
    path.write_bytes(compress(b"".join(b"sentence %d\n" % i for i in range(140_000))))
    told = []
    numbered = translate_corpus.number_lines(str(path), told.append)
    assert numbered.lines == 140_000
    assert len(told) == 3 and told == sorted(told) and told[-1] == path.stat().st_size


@pytest.mark.parametrize("name, compress", COMPRESSIONS)
@pytest.mark.parametrize("damage", ["truncated", "flipped"])
def test_a_truncated_or_damaged_compressed_input_is_an_error_naming_it(tmp_path, name,
                                                                      compress, damage):
    # As `translate` refuses it; Beam's own reader took half a gzip file for a whole one.
    write_inputs(tmp_path, [3000])
    data = compress((tmp_path / "part-0.txt").read_bytes())
    (tmp_path / "part-0.txt").unlink()
    if damage == "truncated":
        data = data[:len(data) // 2]
    else:
        middle = len(data) // 2
        data = data[:middle] + bytes(b ^ 0x5A for b in data[middle:middle + 64]) + data[
            middle + 64:]
    named = tmp_path / name
    named.write_bytes(data)
    with pytest.raises(translate_corpus.CorpusError,
                       match=rf"{named}: its \w+ data cannot be read .*truncated or damaged"):
        translate_corpus.translate_corpus("fake", [str(named)], str(tmp_path / "out.txt"),
                                          handler=FakeHandler(), batch_size=BATCH_SIZE)
    assert sorted(os.listdir(tmp_path)) == [name]  # no output, no parts, no text


def test_a_compressed_input_that_cannot_be_read_is_not_called_damaged(tmp_path,
                                                                      monkeypatch):
    # An error of the file system (here EIO on every read after the first bytes) is
    # raised as it is: "download it again" would send its reader the wrong way.
    named = tmp_path / "in.gz"
    named.write_bytes(gzip.compress(b"a line\n" * 10_000))
    real_open, opened = translate_corpus.FileSystems.open, []

    class Failing:
        def __init__(self, file):
            self.file = file

        def read(self, size=-1):
            raise OSError(5, "Input/output error")

        def __getattr__(self, name):
            return getattr(self.file, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc_info):
            self.file.close()

    def failing_open(path, *arguments, **options):
        opened.append(path)
        file = real_open(path, *arguments, **options)
        return file if len(opened) == 1 else Failing(file)  # the first: its magic bytes

    monkeypatch.setattr(translate_corpus.FileSystems, "open", failing_open)
    with pytest.raises(OSError, match="Input/output error"):
        translate_corpus.number_lines(str(named))


def test_translate_lines_keys_every_output():
    keyed = [(f"doc-{i}", f"sentence {i}".encode()) for i in range(300)]

    class Lines(translate_corpus.TranslateLines):
        def __init__(self):
            super().__init__("fake", batch_size=BATCH_SIZE)
            self.handler = FakeHandler()

    with TestPipeline(options=beam.options.pipeline_options.PipelineOptions(
            translate_corpus.pipeline_args([]))) as pipeline:
        outputs = (pipeline | beam.Create(keyed) | Lines()
                   | beam.MapTuple(lambda key, text: (key, text.split("|")[0])))
        assert_that(outputs, equal_to([(key, sentence[::-1].decode())
                                       for key, sentence in keyed]))


def test_beam_options_pass_through_and_default_to_the_in_process_runner():
    assert translate_corpus.pipeline_args([]) == [
        "--runner", "FnApiRunner", "--default_sdk_harness_log_level", "WARNING"]
    assert translate_corpus.pipeline_args(
        ["--runner=DataflowRunner", "--project", "p"], verbose=True) == [
        "--runner=DataflowRunner", "--project", "p"]
    assert "multi_processing" in translate_corpus.pipeline_args(
        ["--direct_num_workers", "2"])


# The tiny exported translator, through the command, in two worker processes.

def _command(*arguments):
    return [sys.executable, "-m", "keras_transformer", *map(str, arguments)]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    from tests.export_helpers import tiny_export, validation_sentences
    directory = tmp_path_factory.mktemp("corpus")
    exported = tiny_export()
    sentences = [sentence.encode() for sentence in validation_sentences()]
    lines = (sentences * (600 // len(sentences) + 1))[:600]
    lines[5], lines[77] = b"", b"caf\xe9 au lait" * 3
    half = len(lines) // 2
    (directory / "a.en").write_bytes(b"\n".join(lines[:half]) + b"\n")
    (directory / "b.en").write_bytes(b"\n".join(lines[half:]) + b"\n")
    (directory / "joined.txt").write_bytes(b"\n".join(lines) + b"\n")
    return directory, exported


@pytest.mark.timeout(900)
@pytest.mark.parametrize("artifact", ["saved_model", "tflite_quantized"])
def test_two_worker_processes_write_what_translate_writes(corpus, tmp_path, artifact):
    directory, exported = corpus
    path = getattr(exported, artifact)
    subprocess.run(_command("translate", path, "--input", directory / "joined.txt",
                            "--output", tmp_path / "expected", "--batch-size", BATCH_SIZE,
                            "--no-progress"), check=True, capture_output=True)
    done = subprocess.run(_command(
        "translate-corpus", path, "--input", directory / "*.en", "--output",
        tmp_path / "out", "--batch-size", BATCH_SIZE, "--direct_num_workers", 2,
        "--no-progress"), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "out").read_bytes() == (tmp_path / "expected").read_bytes()
    assert "600 lines (read 600, translated 600, written 600, failed 0)" in done.stderr


@pytest.mark.timeout(900)
def test_a_killed_run_run_again_gives_the_same_file(corpus, tmp_path):
    directory, exported = corpus
    arguments = _command("translate-corpus", exported.tflite, "--input",
                         directory / "joined.txt", "--output", tmp_path / "out",
                         "--batch-size", BATCH_SIZE, "--no-progress")
    process = subprocess.Popen(arguments, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, start_new_session=True)
    parts = tmp_path / "out.parts"
    deadline = time.monotonic() + 300
    while not (parts / "chunk-00000000").exists() or (parts / "chunk-00000004").exists():
        assert time.monotonic() < deadline and process.poll() is None
        time.sleep(0.05)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    assert not (tmp_path / "out").exists()
    done = subprocess.run(arguments, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "kept from the last run" in done.stderr
    subprocess.run(_command("translate", exported.tflite, "--input",
                            directory / "joined.txt", "--output", tmp_path / "expected",
                            "--batch-size", BATCH_SIZE, "--no-progress"), check=True)
    assert (tmp_path / "out").read_bytes() == (tmp_path / "expected").read_bytes()
