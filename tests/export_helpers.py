"""A tiny exported translator shared by the serving and export tests, built once.

A SentencePiece vocabulary trained on the fixture corpus and a randomly initialised
one-layer "tiny" Transformer: its translations are nonsense, but every artifact must produce the
same nonsense, which is what the tests check.
"""

import dataclasses
import fcntl
import functools
import hashlib
import importlib.metadata
import os
import pathlib
import shutil
import tempfile
import time
import types

import keras

from keras_transformer import config as config_lib
from keras_transformer import files, runs
from keras_transformer.data.text import read_lines
from keras_transformer.data.tokenizer import END_ID, train_tokenizer
from keras_transformer.model import Transformer
from keras_transformer.serving import artifacts, export, export_folder
from keras_transformer.serving.translator import Translator
from tests.conftest import REPOSITORY, fixture_corpus

CORPUS = fixture_corpus()
VOCABULARY_SIZE = 200

# Inputs that must each give exactly one string per sentence, without error or hang.
BAD_INPUTS = {
    "empty": [""],
    "whitespace_only": ["   \t  ", "\u3000\u00a0"],
    "ten_thousand_characters": [("A dog runs across the green field. " * 300)[:10_000],
                                "x" * 10_000],
    "invalid_utf8": [b"\xff\xfe\xc3(", b"caf\xe9 au lait", b"\xed\xa0\x80"],
    "control_characters": ["\x00\x07 bell \x1b[31m red\x7f", "tab\tnew\nline\r\x0c"],
    "emoji_and_mixed_scripts": ["😀 Ein Mann 日本語 мир عربى 👩‍👩‍👧", "🚲" * 50],
    "batch_of_0": [],
}

# Sentences without a piece, which must translate to nothing, beside ones with pieces,
# which never may.
EMPTY_AND_NOT = ["", "A dog runs.", "   ", "Two men play football in a park."]


def check_only_empty_sentences_translate_to_nothing(outputs):
    """Asserts the contract on a runner's outputs for `EMPTY_AND_NOT`."""
    ends_first = [bool(row[0] == END_ID) for row in outputs["token_ids"]]
    assert ends_first == [True, False, True, False]
    assert [outputs["translations"][i] for i in (0, 2)] == [b"", b""]


def batch_of(count):
    """Returns `count` fixture validation sentences, repeating them as needed."""
    sentences = validation_sentences()
    return [sentences[i % len(sentences)] for i in range(count)]


@functools.lru_cache(maxsize=None)
def validation_sentences():
    return tuple(read_lines(CORPUS / "val.en.gz"))


@functools.lru_cache(maxsize=None)
def tiny_tokenizer():
    """The SentencePiece vocabulary of the fixture corpus, trained once."""
    lines = read_lines(CORPUS / "train.en.gz") + read_lines(CORPUS / "train.de.gz")
    return train_tokenizer(lines, VOCABULARY_SIZE, verbose=False)


# Where every test process and every pytest run of this user finds the tiny export
# (`tiny_export`): building it (SentencePiece, tracing seven signatures, two TFLite
# conversions) takes a minute, which each test process of each CI step paid. One folder
# per user: another user's files could be changed under us.
SHARED_EXPORTS = (pathlib.Path(tempfile.gettempdir())
                  / f"keras_transformer_tiny_export-{os.getuid()}")
# What the export is built with, besides this package's files: a change to any of these
# builds it again.
BUILT_WITH = ("tensorflow", "tensorflow-text", "keras", "ai-edge-litert", "sentencepiece",
              "protobuf", "numpy", "ml-dtypes", "h5py")
UNUSED_FOR_DAYS = 2  # shared exports of other code left unused this long are removed


def _export_key():
    """A digest of what the tiny export depends on: the package's and this file's code,
    the fixture corpus, the versions of `BUILT_WITH` (and of `export.library_versions`,
    which reads the modules), Keras's backend and TensorFlow's kernel choice."""
    digest = hashlib.sha256()
    package = REPOSITORY / "keras_transformer"
    paths = sorted(path for path in package.rglob("*")
                   if path.is_file() and "__pycache__" not in path.parts)
    paths += [pathlib.Path(__file__), *sorted(CORPUS.glob("*.gz"))]
    for path in paths:
        name = path.relative_to(REPOSITORY) if path.is_relative_to(REPOSITORY) else path
        digest.update(f"{name}\0".encode() + path.read_bytes() + b"\0")
    versions = dict(export.library_versions())
    for name in BUILT_WITH:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "absent"
    versions.update((variable, os.environ.get(variable, "unset"))
                    for variable in ("KERAS_BACKEND", "TF_ENABLE_ONEDNN_OPTS"))
    digest.update(repr(sorted(versions.items())).encode())
    return digest.hexdigest()[:16]


def _build_tiny_export(directory):
    """Writes the tiny translator's export (`export/`) and run directory (`run/`, what
    `runs.load_run` restores it from) into `directory`."""
    tokenizer = tiny_tokenizer()
    keras.utils.set_random_seed(0)
    # One layer per stack: every code path of two, for half the tracing and conversion.
    model = Transformer.from_preset("tiny", vocabulary_size=tokenizer.vocabulary_size,
                                    num_layers=1)
    translator = Translator(model, tokenizer)
    export.export_translator(translator, str(directory / "export"), quantize=True)
    run_dir_of(translator, directory / "run")


def _is_whole(directory):
    """Whether `directory` holds a whole build: a cleaner of the temporary directory may
    have removed some of its files since."""
    export_dir = directory / "export"
    needed = [export_dir / name for name in (files.REPORT_JSON, files.TFLITE,
                                             files.TFLITE_QUANTIZED)]
    needed += [export_dir / files.SAVED_MODEL / "saved_model.pb"]
    needed += [directory / "run" / name for name in (files.CONFIG, files.TOKENIZER,
                                                     files.FINAL_WEIGHTS)]
    if not all(path.exists() for path in needed):
        return False
    try:
        export_folder.check_consistent(str(export_dir))
    except export_folder.ExportMismatchError:
        return False
    return True


def _remove(path):
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _remove_unused_exports(keep):
    """Removes the builds (and locks) of other keys than `keep` that no test process
    used for `UNUSED_FOR_DAYS`, each under its key's lock (skipped while held)."""
    for path in SHARED_EXPORTS.iterdir():
        key = path.name.split(".")[0]
        if key == keep or path.suffix == ".lock":
            continue
        with open(SHARED_EXPORTS / f"{key}.lock", "w") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # a process is building or opening it
            try:
                unused = time.time() - path.lstat().st_mtime > UNUSED_FOR_DAYS * 86400
            except FileNotFoundError:
                continue
            if unused:
                _remove(path)
                (SHARED_EXPORTS / f"{key}.lock").unlink(missing_ok=True)


def _shared_folder():
    """`SHARED_EXPORTS`, made if missing, and refused unless this user's own."""
    SHARED_EXPORTS.mkdir(mode=0o700, exist_ok=True)
    status = SHARED_EXPORTS.lstat()
    if SHARED_EXPORTS.is_symlink() or status.st_uid != os.getuid():
        raise RuntimeError(f"{SHARED_EXPORTS} is not a folder of this user's: the tests "
                           "load the exports in it. Remove it, then run them again.")
    return SHARED_EXPORTS


@functools.lru_cache(maxsize=None)
def tiny_export():
    """The tiny translator and its export, built once per user, machine and code.

    The first test process to ask builds it into `SHARED_EXPORTS` (under an `flock`,
    into a folder of its own moved into place once complete); the others, in this run
    and later ones, load the same files (a build found incomplete is made again).
    Read-only: a test that changes an export copies it first.

    Returns:
        A namespace with `translator` (the exported model, in memory), `directory`
        (str), `report`, `saved_model`, `tflite` and `tflite_quantized` paths.
    """
    shared = _shared_folder()
    key = _export_key()
    directory = shared / key
    with open(shared / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        for stale in [*shared.glob(f"{key}.*.partial"), *shared.glob(f"{key}.*.damaged")]:
            _remove(stale)  # of a build that was interrupted: none runs without the lock
        if directory.exists() and not _is_whole(directory):
            damaged = shared / f"{key}.{os.getpid()}.damaged"
            os.rename(directory, damaged)
            _remove(damaged)
        if not directory.exists():
            building = shared / f"{key}.{os.getpid()}.partial"
            building.mkdir()
            try:
                _build_tiny_export(building)
            except BaseException:
                _remove(building)
                raise
            try:
                os.rename(building, directory)
            except OSError:
                # Built beside another process that took the lock file of this key
                # while `_remove_unused_exports` removed it: theirs is as good.
                _remove(building)
                if not directory.exists():
                    raise
            _remove_unused_exports(keep=key)
        os.utime(directory)  # in use: see `_remove_unused_exports`
    _, tokenizer, model = runs.load_run(str(directory / "run"))
    export_dir = directory / "export"
    return types.SimpleNamespace(
        translator=Translator(model, tokenizer), directory=str(export_dir),
        report=artifacts.export_report(str(export_dir / files.SAVED_MODEL)),
        saved_model=str(export_dir / files.SAVED_MODEL),
        tflite=str(export_dir / files.TFLITE),
        tflite_quantized=str(export_dir / files.TFLITE_QUANTIZED))


def run_dir_of(translator, run_dir):
    """Writes a run directory (`tiny` config on the fixture corpus, tokenizer, final
    weights) of `translator`'s model into `run_dir`; returns it as a str."""
    config = config_lib.preset_config("tiny")
    config = dataclasses.replace(config, model=dataclasses.replace(
        config.model, vocabulary_size=translator.tokenizer.vocabulary_size,
        num_layers=translator.model.num_layers),
        data=dataclasses.replace(config.data, corpus="fixture",
                                 data_dir=str(REPOSITORY / "tests" / "fixtures" / "corpus")))
    os.makedirs(run_dir)
    config.save(os.path.join(run_dir, files.CONFIG))
    translator.tokenizer.save(os.path.join(run_dir, files.TOKENIZER))
    translator.model.save_weights(os.path.join(run_dir, files.FINAL_WEIGHTS))
    return str(run_dir)


@functools.lru_cache(maxsize=None)
def artifact_runner(directory, artifact, signature):
    """The runner of `signature` in `artifact` ("saved_model", "session" for the
    session-based loader, "tflite", "tflite_quantized") of an export `directory`,
    loaded once (loading costs seconds)."""
    from keras_transformer.serving import runners

    paths = {"saved_model": files.SAVED_MODEL, "session": files.SAVED_MODEL,
             "tflite": files.TFLITE, "tflite_quantized": files.TFLITE_QUANTIZED}
    path = f"{directory}/{paths[artifact]}"
    if artifact == "session":
        return runners.SessionRunner(path, signature)
    return runners.open_runner(path, signature=signature)
