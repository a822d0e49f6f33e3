"""keras_transformer: the Transformer of "Attention Is All You Need" for Keras 3.

    import keras_transformer as kt

    config = kt.preset_config("tiny")                 # or "multi30k", "paper_base", ...
    kt.train(config, "runs/tiny")                     # model.fit, resumable
    translate = kt.load_translator("runs/tiny")       # a kt.LoadedTranslator: run dir or
                                                      # any exported artifact
    translate(["A man rides a bike."])                # -> ["Ein Mann fährt Fahrrad."]

The package follows the data flow: `data` (text → ids → batches), `layers` and `model`,
`training` (`model.fit`), `decoding`, `serving` (the exported translator), `loading`
(any run or artifact as a translator), `evaluation` and `translate`. Names below are
imported on first use, so `import keras_transformer` loads neither Keras nor TensorFlow.
"""

import importlib
import logging

__version__ = "0.2.0"

# Library modules log; the command line shows their messages (`keras_transformer.cli`).
logging.getLogger(__name__).addHandler(logging.NullHandler())

# Public name -> the module that defines it.
_EXPORTS = {
    "Config": "keras_transformer.config",
    "DataConfig": "keras_transformer.config",
    "ModelConfig": "keras_transformer.config",
    "TrainConfig": "keras_transformer.config",
    "PRESETS": "keras_transformer.config",
    "preset_config": "keras_transformer.config",
    "Tokenizer": "keras_transformer.data.tokenizer",
    "train_tokenizer": "keras_transformer.data.tokenizer",
    "Transformer": "keras_transformer.model",
    "train": "keras_transformer.training.fit",
    "greedy_decode": "keras_transformer.decoding",
    "beam_search": "keras_transformer.decoding",
    "Ensemble": "keras_transformer.decoding",
    "Translator": "keras_transformer.serving.translator",
    "export_run": "keras_transformer.serving.export",
    "load_translator": "keras_transformer.loading",
    "LoadedTranslator": "keras_transformer.loading",
    "evaluate": "keras_transformer.evaluation",
    # The beam extra's: Apache Beam's RunInference.
    "TranslateLines": "keras_transformer.translate_corpus",
    "TranslatorHandler": "keras_transformer.translate_corpus",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__():
    return sorted([*globals(), *_EXPORTS])
