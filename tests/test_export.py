"""TFLite translator, self-check, translate command and the export command end to end."""

import errno
import io
import os
import platform
import re
import subprocess
import sys

import pytest
from tensorflow.core.protobuf import saved_model_pb2

from keras_transformer import cli, files, translate
from keras_transformer.serving import op_checks as export_checks
from keras_transformer.serving import runners, self_check
from tests.conftest import REPOSITORY
from tests.export_helpers import (
    BAD_INPUTS,
    EMPTY_AND_NOT,
    batch_of,
    check_only_empty_sentences_translate_to_nothing,
    run_dir_of,
    tiny_export,
    validation_sentences,
)

CASES = {**BAD_INPUTS, "batch_of_512": None}
ENVIRONMENT = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}


@pytest.fixture(scope="module")
def exported():
    return tiny_export()


@pytest.fixture(scope="module")
def tflite_runner(exported):
    return runners.TFLiteRunner(exported.tflite)


@pytest.mark.parametrize("case", list(CASES))
def test_tflite_answers_one_string_per_input(tflite_runner, case):
    sentences = batch_of(512) if case == "batch_of_512" else CASES[case]
    outputs = tflite_runner(sentences)
    assert outputs["translations"].shape == (len(sentences),)
    assert all(isinstance(text, bytes) for text in outputs["translations"])
    assert outputs["token_ids"].shape[0] == len(sentences)


def test_tflite_beam_signature_answers_every_bad_input(exported):
    beam = runners.TFLiteRunner(exported.tflite, files.BEAM_SIGNATURE)
    for sentences in BAD_INPUTS.values():
        assert beam(sentences)["translations"].shape == (len(sentences),)


@pytest.mark.parametrize("signature", [files.GREEDY_SIGNATURE, files.BEAM_SIGNATURE])
def test_tflite_translates_only_empty_sentences_to_nothing(exported, signature):
    runner = runners.TFLiteRunner(exported.tflite, signature)
    check_only_empty_sentences_translate_to_nothing(runner(EMPTY_AND_NOT))


def test_tflite_has_only_builtins_and_tf_text_custom_ops(exported):
    with open(exported.tflite, "rb") as file:
        ops = export_checks.tflite_ops(file.read())
    assert "WHILE" in ops
    assert export_checks.check_tflite_ops(ops) == [
        "RaggedTensorToTensor", "TFText>FastSentencepieceDetokenize",
        "TFText>FastSentencepieceTokenize"]


def test_tflite_writes_its_caches_in_place_and_the_saved_model_by_scatter(exported):
    # TFLite lowers a scatter to SCATTER_ND plus arithmetic over the whole cache at every
    # step; its DYNAMIC_UPDATE_SLICE writes one position in place. TensorFlow without
    # XLA runs a slice update op by op through XLA, so the SavedModel keeps the scatter.
    with open(exported.tflite, "rb") as file:
        ops = export_checks.tflite_ops(file.read())
    # Self-attention keys and values of each decoder layer, in each of two signatures.
    layers = exported.translator.model.num_layers
    assert ops.get("DYNAMIC_UPDATE_SLICE", 0) >= 2 * 2 * layers
    assert "SCATTER_ND" not in ops
    saved_model_ops = export_checks.saved_model_ops(exported.saved_model)
    assert "TensorScatterUpdate" in saved_model_ops
    assert "XlaDynamicUpdateSlice" not in saved_model_ops


def test_saved_model_holds_each_translation_function_once(exported):
    # `tf.saved_model.load` imports every function of the library into Python graphs:
    # a second copy of the translators doubled the time it takes to load.
    saved_model = saved_model_pb2.SavedModel()
    with open(os.path.join(exported.saved_model, "saved_model.pb"), "rb") as file:
        saved_model.ParseFromString(file.read())
    (meta_graph,) = saved_model.meta_graphs
    functions = {"translate", "translate_beam", "translate_n_best", "translate_prefix",
                 "score", "sample", "align"}
    traced = [re.sub(r"_\d+$", "", function.signature.name)[len("__inference_"):]
              for function in meta_graph.graph_def.library.function]
    assert sorted(name for name in traced if name in functions) == sorted(functions)


# Allocates, fills and frees a 64 MiB block six times; prints the page faults of the
# last five. Such a block is mapped afresh at each request by glibc's default.
_REALLOCATING = """
import ctypes, resource, sys
from keras_transformer.serving import litert
if sys.argv[1] == "reuse":
    litert.reuse_freed_memory()
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
size = 64 << 20
def fill_and_free():
    block = libc.malloc(size)
    ctypes.memset(block, 1, size)
    libc.free(ctypes.c_void_p(block))
fill_and_free()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    fill_and_free()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_tflite_runs_reuse_the_memory_freed_between_loop_steps():
    # LiteRT's WHILE frees and reallocates its dynamic tensors at every step: each
    # fresh mapping costs a page fault per 4 KiB page.
    def page_faults(mode):
        result = subprocess.run([sys.executable, "-c", _REALLOCATING, mode],
                                capture_output=True, text=True, check=True, cwd=REPOSITORY)
        return int(result.stdout)

    assert page_faults("default") > 5 * 16384 // 2  # the test can tell the two apart
    assert page_faults("reuse") < 1000


def _weight_bytes(path):
    """The bytes of a TFLite file's float32 and int8 constants (each buffer once)."""
    from ai_edge_litert import schema_py_generated as schema

    with open(path, "rb") as file:
        model = schema.Model.GetRootAs(file.read(), 0)
    weights = set()
    for g in range(model.SubgraphsLength()):
        subgraph = model.Subgraphs(g)
        for t in range(subgraph.TensorsLength()):
            tensor = subgraph.Tensors(t)
            if tensor.Type() in (schema.TensorType.FLOAT32, schema.TensorType.INT8):
                weights.add(tensor.Buffer())
    return sum(model.Buffers(b).DataLength() for b in weights)


def test_quantized_tflite_holds_int8_weights_and_answers(exported):
    # The weights, not the file: a one-layer model's 7 signatures of graph outweigh
    # its weights, and quantizing adds a DEQUANTIZE op per weight that stays float.
    assert _weight_bytes(exported.tflite_quantized) < 0.5 * _weight_bytes(exported.tflite)
    outputs = runners.TFLiteRunner(exported.tflite_quantized)(BAD_INPUTS["invalid_utf8"])
    assert len(outputs["translations"]) == len(BAD_INPUTS["invalid_utf8"])


def test_self_check_passes_on_the_tiny_export(exported):
    sentences = list(validation_sentences())
    checks, reference = self_check.artifact_checks(exported.directory, sentences, alone=3)
    checks += self_check.model_checks(exported.translator, sentences, reference,
                                      export_dir=exported.directory, alone=3)
    table = self_check.format_table(checks)
    assert all(check.passed is not False for check in checks), table
    names = {check.name for check in checks}
    assert {"TFLite = SavedModel", "SavedModel session loader = tf.saved_model.load",
            "cached greedy = uncached greedy", "in-memory model = SavedModel",
            "beam search: TFLite = in-memory"} <= names
    assert [check.passed for check in checks if "quantized" in check.name] == [None]


def test_self_check_of_an_export_without_beam_search_checks_what_it_holds(exported,
                                                                          tmp_path):
    # `export --signatures serving_default,n_best,prefix,score`: no beam search to
    # compare the others with, nor to take prefixes from.
    from keras_transformer.serving import export
    from keras_transformer.serving.translator import Translator

    translator = Translator(exported.translator.model, exported.translator.tokenizer,
                            signatures=[files.GREEDY_SIGNATURE, files.N_BEST_SIGNATURE,
                                        files.PREFIX_SIGNATURE, files.SCORE_SIGNATURE])
    directory = str(tmp_path / "greedy")
    export.export_translator(translator, directory, tflite=False)
    sentences = list(validation_sentences())[:8]
    checks, reference = self_check.artifact_checks(directory, sentences, alone=2)
    checks += self_check.model_checks(translator, sentences, reference,
                                      export_dir=directory, alone=2)
    checks += self_check.rich_decoding_checks(directory, sentences[:4], translator)
    assert all(check.passed for check in checks), self_check.format_table(checks)
    names = [check.name for check in checks]
    assert "in-memory model = SavedModel" in names
    assert "prefix: translations start with it (SavedModel)" in names
    assert "n_best: in-memory = SavedModel" in names
    assert not [name for name in names if "beam" in name], names


def test_self_check_makes_the_translator_the_export_recorded(tmp_path):
    # check_run compares the export with an in-memory translator made from the options
    # in its report: one option lost there (e.g. `--sampling-topk`) fails a sound export.
    import json

    from keras_transformer.model import Transformer
    from keras_transformer.serving.translator import OPTIONS, Translator, default_settings
    from tests.export_helpers import tiny_tokenizer

    tokenizer = tiny_tokenizer()
    model = Transformer.from_preset("tiny", vocabulary_size=tokenizer.vocabulary_size)
    exported = Translator(model, tokenizer, max_output_length=20, extra_length=7,
                          beam_size=3, length_penalty=0.9, n_best=2, sampling_top_k=5,
                          sampling_temperature=0.5, alignment_layer=1)
    defaults = Translator(model, tokenizer).settings()
    assert all(exported.settings()[name] != defaults[name]
               for name in OPTIONS)
    (tmp_path / files.REPORT_JSON).write_text(
        json.dumps({"translator": exported.settings()}), encoding="utf-8")
    remade = Translator(model, tokenizer, **self_check.translator_options(str(tmp_path)))
    assert remade.settings() == exported.settings()
    for beam_size, alpha in [(4, 0.6), (2, 1.0)]:
        assert default_settings(model.max_length, model.num_layers, beam_size=beam_size,
                                length_penalty=alpha) == Translator(
            model, tokenizer, beam_size=beam_size, length_penalty=alpha).settings()


def test_the_self_check_uses_the_translator_it_is_given_else_the_exported_one(
        exported, tmp_path, monkeypatch):
    # `export_and_check` hands over the translator it exported, whose functions
    # are traced already; without one, the check makes the translator the report names.
    import shutil

    import numpy as np

    export_dir = str(shutil.copytree(exported.directory, tmp_path / "export"))
    run_dir = os.path.join(os.path.dirname(exported.directory), "run")
    sentences = tmp_path / "sentences.txt"
    sentences.write_text("\n".join(validation_sentences()[:2]) + "\n", encoding="utf-8")
    compared = []
    monkeypatch.setattr(self_check, "load_saved_model", lambda directory: None)
    monkeypatch.setattr(self_check, "artifact_checks", lambda *args, **kwargs: ([], None))
    monkeypatch.setattr(self_check, "model_checks",
                        lambda translator, *args, **kwargs: compared.append(translator) or [])
    monkeypatch.setattr(self_check, "rich_decoding_checks",
                        lambda directory, sources, translator, **kwargs:
                        compared.append(translator) or [])
    self_check.check_run(run_dir, export_dir=export_dir, sentences_file=str(sentences),
                         translator=exported.translator)
    assert compared == [exported.translator] * 2
    compared.clear()
    self_check.check_run(run_dir, export_dir=export_dir, sentences_file=str(sentences))
    made = compared[0]
    assert compared == [made, made] and made is not exported.translator
    assert made.settings() == {name: value for name, value in
                               exported.report["translator"].items()
                               if name != "vocabulary_size"}
    for mine, theirs in zip(made.model.weights, exported.translator.model.weights):
        np.testing.assert_array_equal(mine.numpy(), theirs.numpy())


def test_the_report_check_fails_on_other_weights_options_or_a_changed_file(tmp_path):
    # What the self-check with the exporting translator compares in place of loading
    # the run again: the report must name the weights and options that were exported.
    from keras_transformer import runs
    from keras_transformer.model import Transformer
    from keras_transformer.serving.translator import Translator
    from tests.export_helpers import tiny_tokenizer

    tokenizer = tiny_tokenizer()

    def translator(seed, **options):
        import keras
        keras.utils.set_random_seed(seed)
        model = Transformer.from_preset("tiny", vocabulary_size=tokenizer.vocabulary_size,
                                        num_layers=1)
        return Translator(model, tokenizer, **options)

    exported = translator(0)
    weights = tmp_path / files.FINAL_WEIGHTS
    exported.model.save_weights(str(weights))
    recorded = {"weights": str(weights), "weights_sha256": runs.weights_sha256(str(weights))}
    named = translator(0)
    assert self_check.report_check(recorded, named, exported).passed
    assert self_check.report_check({}, exported, exported).passed
    other = self_check.report_check(recorded, translator(1), exported)
    assert not other.passed and other.detail == "weights differ"
    options = self_check.report_check(recorded, translator(0, length_penalty=0.9), exported)
    assert not options.passed and options.detail == "options differ: length_penalty"
    translator(1).model.save_weights(str(weights))  # e.g. averaged again since the export
    changed = self_check.report_check(recorded, named, exported)
    assert not changed.passed and changed.detail == f"{weights} changed since the export"


def test_export_and_check_checks_with_the_translator_it_exported(exported, tmp_path,
                                                                 monkeypatch):
    from keras_transformer.serving import export

    run_dir = run_dir_of(exported.translator, tmp_path / "run")
    written, checked = [], []
    monkeypatch.setattr(export, "export_translator",
                        lambda translator, *args, **kwargs: written.append(translator) or {})
    monkeypatch.setattr(self_check, "check_run",
                        lambda *args, **kwargs: checked.append(kwargs) or ["checks"])
    output_dir, report, checks = self_check.export_and_check(
        run_dir, output_dir=str(tmp_path / "out"), beam_size=2)
    assert (output_dir, report, checks) == (str(tmp_path / "out"), {}, ["checks"])
    assert written[0].beam_size == 2  # the export's options reach the export
    assert checked == [{"export_dir": output_dir, "translator": written[0]}]


def test_compare_reports_the_first_difference():
    check = self_check.compare("x", [(5, 3), (6, 3)], [(5, 3), (7, 3)])
    assert not check.passed and "1/2" in check.detail and "sentence 1" in check.detail
    assert self_check.token_sequences([[5, 3, 0, 0], [4, 4, 4, 4]]) == [(5, 3), (4, 4, 4, 4)]


def test_translate_sentences_keeps_input_order_and_one_line_each():
    def runner(batch):
        texts = [f"<{s}>\nsecond line" if s else "" for s in batch]
        return {"translations": [text.encode() for text in texts]}

    sentences = ["ccc", "", "a", "bb"]
    done = []
    result = translate.translate_sentences(runner, sentences, batch_size=3,
                                           progress=done.append)
    assert result == ["<ccc> second line", "", "<a> second line", "<bb> second line"]
    assert done == [3, 4]


@pytest.mark.parametrize("failure", [RuntimeError("decoder failed"), KeyboardInterrupt()])
def test_translate_command_keeps_the_chunks_it_finished_beside_the_earlier_output(
        tmp_path, monkeypatch, capsys, failure):
    calls = []

    def runner(batch):
        calls.append(batch)
        if len(calls) == 4:  # the second batch of the second chunk
            raise failure
        return {"translations": [b"<" + sentence + b">" for sentence in batch]}

    monkeypatch.setattr(translate, "WINDOW_BATCHES", 2)
    monkeypatch.setattr(runners, "open_runner", lambda artifact, **options: runner)
    artifact = tmp_path / "saved_model"
    artifact.mkdir()
    (artifact / "saved_model.pb").touch()
    source = tmp_path / "source.txt"
    source.write_bytes(b"".join(b"s%d\n" % i for i in range(11)))
    target = tmp_path / "target.txt"
    target.write_bytes(b"an earlier run's complete output\n")
    arguments = ["translate", str(artifact), "--input", str(source), "--output",
                 str(target), "--batch-size", "3", "--no-progress"]
    status = cli.main(arguments)
    partial = tmp_path / "target.txt.partial"
    assert partial.read_bytes() == b"".join(b"<s%d>\n" % i for i in range(6))
    assert target.read_bytes() == b"an earlier run's complete output\n"
    error = capsys.readouterr().err
    assert f"{partial}: stopped after 6 lines" in error
    assert f"{target} is unchanged" in error
    if isinstance(failure, KeyboardInterrupt):
        assert status == 130
    else:
        assert status == 1 and "error: decoder failed" in error


def test_a_second_run_writing_the_same_output_is_refused(tmp_path, monkeypatch, capsys):
    import fcntl

    monkeypatch.setattr(runners, "open_runner", lambda artifact, **options: (
        lambda batch: {"translations": [b"<" + sentence + b">" for sentence in batch]}))
    artifact = tmp_path / "saved_model"
    artifact.mkdir()
    (artifact / "saved_model.pb").touch()
    source, target = tmp_path / "source.txt", tmp_path / "target.txt"
    source.write_bytes(b"a\nb\n")
    partial = tmp_path / "target.txt.partial"
    partial.write_bytes(b"the first run's lines\n")
    arguments = ["translate", str(artifact), "--input", str(source), "--output",
                 str(target), "--no-progress"]
    with open(partial, "ab") as first_run:  # the first run, still writing
        fcntl.flock(first_run, fcntl.LOCK_EX)
        assert cli.main(arguments) == 2
        assert f"--output {target} is being written by another run" in (
            capsys.readouterr().err)
        assert partial.read_bytes() == b"the first run's lines\n" and not target.exists()
    assert cli.main(arguments) == 0  # once it ended, or was killed
    assert target.read_bytes() == b"<a>\n<b>\n" and not partial.exists()


def test_a_run_that_locks_a_partial_file_renamed_meanwhile_opens_a_new_one(tmp_path,
                                                                          monkeypatch):
    # The run before it renamed FILE.partial to FILE between this run's open and lock:
    # what it locked is FILE now, which it must leave whole.
    import fcntl

    from keras_transformer.cli import translating
    partial, final = tmp_path / "out.txt.partial", tmp_path / "out.txt"
    partial.write_bytes(b"the first run's complete output\n")
    real_flock, renamed = fcntl.flock, []

    def flock(descriptor, operation):
        if not renamed:
            os.replace(partial, final)
            renamed.append(True)
        real_flock(descriptor, operation)

    monkeypatch.setattr(fcntl, "flock", flock)
    with translating._open_partial(str(partial), str(final)) as stream:
        stream.write(b"the second run's\n")
    assert final.read_bytes() == b"the first run's complete output\n"
    assert partial.read_bytes() == b"the second run's\n"


def test_translate_command_writes_through_links_and_into_devices(tmp_path, monkeypatch):
    # A link's file gets the translations (the link stays), and a device is written,
    # never replaced by a file: here /dev/null through a link, as `-o /dev/null` does.
    monkeypatch.setattr(runners, "open_runner", lambda artifact, **options: (
        lambda batch: {"translations": [b"<" + sentence + b">" for sentence in batch]}))
    artifact = tmp_path / "saved_model"
    artifact.mkdir()
    (artifact / "saved_model.pb").touch()
    source = tmp_path / "source.txt"
    source.write_bytes(b"a\nb\n")
    target, to_target, to_null = tmp_path / "target.txt", tmp_path / "a", tmp_path / "b"
    target.write_bytes(b"earlier\n")
    to_target.symlink_to(target)
    to_null.symlink_to(os.devnull)
    for output in (to_target, to_null):
        assert cli.main(["translate", str(artifact), "--input", str(source), "--output",
                         str(output), "--no-progress"]) == 0
        assert output.is_symlink()
    assert target.read_bytes() == b"<a>\n<b>\n"
    assert sorted(os.listdir(tmp_path)) == ["a", "b", "saved_model", "source.txt",
                                            "target.txt"]
    # The earlier file's permissions are kept; a file a rename cannot replace (one
    # mounted on its own: EXDEV, EBUSY) gets the translations copied in.
    target.chmod(0o640)
    real_replace = os.replace

    def replace(source, destination):
        if os.fspath(destination) == str(target):
            raise OSError(errno.EBUSY, "Device or resource busy")
        real_replace(source, destination)

    monkeypatch.setattr(os, "replace", replace)
    source.write_bytes(b"c\n")
    assert cli.main(["translate", str(artifact), "--input", str(source), "--output",
                     str(target), "--no-progress"]) == 0
    assert target.read_bytes() == b"<c>\n" and target.stat().st_mode & 0o777 == 0o640
    assert not (tmp_path / "target.txt.partial").exists()


@pytest.mark.parametrize("artifact", ["saved_model", "tflite"])
def test_translate_command_writes_one_line_per_input_line(exported, tmp_path, artifact):
    import gzip

    lines = [b"A dog runs.", b"", b"   ", b"\xff\xfe bad", b"\x00\x07",
             "😀 日本語 мир".encode(), b"x" * 10_000]
    source = tmp_path / "source.txt"
    source.write_bytes(b"\r\n".join(lines) + b"\n")
    target = tmp_path / "target.txt"
    status = cli.main(["translate", getattr(exported, artifact), "--input", str(source),
                       "--output", str(target), "--batch-size", "3"])
    assert status == 0
    assert len(target.read_text(encoding="utf-8").split("\n")) == len(lines) + 1
    assert not (tmp_path / "target.txt.partial").exists()  # renamed once complete
    # A gzip file (as Multi30K's) translates as its text does, not as its bytes.
    compressed = tmp_path / "source.txt.gz"
    compressed.write_bytes(gzip.compress(source.read_bytes()))
    status = cli.main(["translate", getattr(exported, artifact), "--input", str(compressed),
                       "--output", str(tmp_path / "from_gzip.txt"), "--batch-size", "3"])
    assert status == 0
    assert (tmp_path / "from_gzip.txt").read_bytes() == target.read_bytes()


def test_translate_command_reads_stdin_and_writes_stdout(exported, monkeypatch,
                                                        capsysbinary):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"A dog.\n\nTwo men.\n")))
    assert cli.main(["translate", exported.saved_model]) == 0
    assert len(capsysbinary.readouterr().out.decode("utf-8").split("\n")) == 4


@pytest.mark.slow
def test_export_command_then_check_command_pass(exported, tmp_path):
    run_dir = tmp_path / "run"
    run_dir_of(exported.translator, run_dir)
    sentences = tmp_path / "sentences.txt"
    sentences.write_text("\n".join(validation_sentences()[:8]) + "\n", encoding="utf-8")
    result = subprocess.run(
        # Sampling options other than the defaults: the check must sample as exported.
        # Greedy and sampling alone: the other signatures add tracing, not contract.
        [sys.executable, "-m", "export", str(run_dir), "--no-quantize",
         "--signatures", f"{files.GREEDY_SIGNATURE},{files.SAMPLE_SIGNATURE}",
         "--sampling-topk", "3", "--temperature", "0.5"],
        capture_output=True, text=True, timeout=600, cwd=REPOSITORY, env=ENVIRONMENT)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert os.path.exists(run_dir / files.EXPORT_DIR / files.REPORT_MARKDOWN)
    result = subprocess.run(
        [sys.executable, "-m", "export.check", str(run_dir), "--sentences", str(sentences)],
        capture_output=True, text=True, timeout=600, cwd=REPOSITORY, env=ENVIRONMENT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert re.search(r"Exported SavedModel, \.tflite: self-check (\d+)/\1 passed",
                     result.stdout), result.stdout


def test_an_export_matches_only_the_weights_choice_and_artifacts_it_holds(tmp_path,
                                                                          monkeypatch):
    """What lets the recipe keep an export when run again: every difference is seen."""
    import json

    import h5py
    import numpy as np

    from keras_transformer import config as config_lib
    from keras_transformer import runs
    from keras_transformer.serving import export, export_folder
    from keras_transformer.serving import translator as translator_lib

    run_dir, config = tmp_path / "run", config_lib.Config()
    export_dir = run_dir / files.EXPORT_DIR
    export_dir.mkdir(parents=True)
    (run_dir / files.CONFIG).write_text(config.to_json(), encoding="utf-8")
    weights = run_dir / files.AVERAGED_WEIGHTS

    def write_weights(value):
        with h5py.File(weights, "w") as file:
            file["layer/kernel"] = np.full((2, 3), value, np.float32)

    write_weights(1.0)
    digest = runs.weights_sha256(str(weights))
    write_weights(1.0)  # the same values again: HDF5 writes other bytes
    assert runs.weights_sha256(str(weights)) == digest
    report = {"export_id": "e1", "versions": export.library_versions(),
              "run": {"weights": str(weights), "weights_sha256": digest,
                      "config": json.loads(config.to_json())},
              "translator": {**translator_lib.default_settings(
                  config.model.max_length, config.model.num_layers, beam_size=4,
                  length_penalty=1.0), "vocabulary_size": 37000},
              "saved_model": {"signatures": {name: "" for name in files.SIGNATURES}},
              "tflite": {}, "tflite_dynamic_range": {}}

    # A whole folder of one export, as far as `export_folder.check_consistent` (tested
    # in test_export_folder.py) can tell; its verdict is planted at the end.
    monkeypatch.setattr(export_folder, "check_consistent", lambda folder: None)

    def matches(written=report, **given):
        (export_dir / files.REPORT_JSON).write_text(json.dumps(written), encoding="utf-8")
        given = {"beam_size": 4, "length_penalty": 1.0, "quantize": True, **given}
        return export.matching_export(str(export_dir), str(run_dir), str(weights), **given)

    assert matches() == report
    assert matches(beam_size=5) is None and matches(length_penalty=0.6) is None
    assert matches(quantize=False) is None
    for option, value in [("max_output_length", 16), ("extra_length", 7), ("n_best", 2),
                          ("sampling_top_k", 3), ("sampling_temperature", 0.5),
                          ("alignment_layer", 0), ("max_source_length", 64)]:
        assert matches({**report, "translator": {**report["translator"],
                                                 option: value}}) is None, option
    assert matches({**report, "versions": {**report["versions"], "keras": "0"}}) is None
    assert matches({**report, "ctranslate2": {}}) is None
    assert matches({**report, "saved_model": {"signatures": {
        name: "" for name in files.TRANSLATING_SIGNATURES}}}) is None
    assert matches({key: value for key, value in report.items() if key != "run"}) is None
    write_weights(1.5)  # the same file, other weights
    assert matches() is None
    write_weights(1.0)
    assert matches() == report
    (run_dir / files.CONFIG).write_text(config_lib.Config(
        train=config_lib.TrainConfig(seed=1)).to_json(), encoding="utf-8")
    assert matches() is None
    (run_dir / files.CONFIG).write_text(config.to_json(), encoding="utf-8")

    def mismatch(folder):
        raise export_folder.ExportMismatchError("planted")

    monkeypatch.setattr(export_folder, "check_consistent", mismatch)
    assert matches() is None


def test_check_of_a_run_without_a_readable_export_says_what_to_do(tmp_path, capsys):
    from keras_transformer import config as config_lib

    run_dir = tmp_path / "run"
    # A mistyped run is named as such, not told to export itself.
    assert cli.main(["check", str(run_dir)]) == 2
    assert f"{run_dir} is not a run directory" in capsys.readouterr().err
    (run_dir / files.EXPORT_DIR).mkdir(parents=True)
    (run_dir / files.CONFIG).write_text(config_lib.preset_config("tiny").to_json(),
                                        encoding="utf-8")
    assert cli.main(["check", str(run_dir)]) == 2
    error = capsys.readouterr().err
    assert "holds no export (export_report.json is missing): export the run there" in error
    assert "check RUN_DIR --export-dir DIR" in error
    (run_dir / files.EXPORT_DIR / files.REPORT_JSON).write_text("[]", encoding="utf-8")
    assert cli.main(["check", str(run_dir)]) == 2
    assert "not a valid export report (not a JSON object)" in capsys.readouterr().err


def test_passed_checks_are_those_of_this_export_when_none_failed(tmp_path):
    import json

    (tmp_path / files.REPORT_JSON).write_text('{"export_id": "e1"}', encoding="utf-8")
    assert self_check.passed_checks(str(tmp_path)) is None  # not checked yet

    def written(export_id, *passed):
        (tmp_path / files.CHECK_REPORT).write_text(json.dumps({"export_id": export_id,
            "checks": [self_check.Check(f"c{i}", p, "")._asdict()
                       for i, p in enumerate(passed)]}), encoding="utf-8")
        return self_check.passed_checks(str(tmp_path))

    assert written("e1", True, None) == [self_check.Check("c0", True, ""),
                                         self_check.Check("c1", None, "")]
    assert written("e1", True, False) is None
    assert written("e0", True) is None  # the check of an earlier export
