"""A tiny exported translator shared by the serving and export tests, built once.

A SentencePiece vocabulary trained on the fixture corpus and a randomly initialised
one-layer "tiny" Transformer: its translations are nonsense, but every artifact must produce the
same nonsense, which is what the tests check.
"""

import dataclasses
import functools
import os
import types

import keras

from keras_transformer import config as config_lib
from keras_transformer import files
from keras_transformer.data.text import read_lines
from keras_transformer.data.tokenizer import END_ID, train_tokenizer
from keras_transformer.model import Transformer
from keras_transformer.serving import export
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


@functools.lru_cache(maxsize=None)
def tiny_export(directory):
    """Exports the tiny translator into `directory` once per test session.

    Returns:
        A namespace with `translator`, `directory` (str), `report`, `saved_model`,
        `tflite` and `tflite_quantized` paths.
    """
    tokenizer = tiny_tokenizer()
    keras.utils.set_random_seed(0)
    # One layer per stack: every code path of two, for half the tracing and conversion.
    model = Transformer.from_preset("tiny", vocabulary_size=tokenizer.vocabulary_size,
                                    num_layers=1)
    translator = Translator(model, tokenizer)
    report = export.export_translator(translator, str(directory), quantize=True)
    return types.SimpleNamespace(
        translator=translator, directory=str(directory), report=report,
        saved_model=str(directory / files.SAVED_MODEL),
        tflite=str(directory / files.TFLITE),
        tflite_quantized=str(directory / files.TFLITE_QUANTIZED))


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
