"""The examples in the package's docstrings run and print what they show (doctest).

Examples that need a trained run (`load_translator("runs/…")`) are written as plain code
in their docstrings, without `>>>`, and are run by the README's and the notebooks' tests
instead.
"""

import doctest
import importlib

import numpy as np
import pytest

from tests.test_package_layout import module_names

# Modules whose docstrings hold `>>>` examples; a new one fails the count test below
# until it is listed here.
EXAMPLES = ["keras_transformer.data.tokenizer", "keras_transformer.layers.attention",
            "keras_transformer.layers.decoder", "keras_transformer.layers.decoder_layer",
            "keras_transformer.layers.encoder", "keras_transformer.layers.encoder_layer",
            "keras_transformer.layers.feed_forward", "keras_transformer.layers.token_embedding",
            "keras_transformer.model", "keras_transformer.training.losses",
            "keras_transformer.training.optimization"]


def examples_of(name):
    """The doctests of module `name` that hold at least one example."""
    finder = doctest.DocTestFinder(exclude_empty=True)
    return [test for test in finder.find(importlib.import_module(name))
            if test.examples]


def test_every_module_with_examples_is_tested():
    # Read as text: importing every module for its docstrings would load all of them.
    from tests.test_package_layout import module_path
    with_examples = sorted(name for name in module_names()
                           if ">>> " in module_path(name).read_text(encoding="utf-8"))
    assert with_examples == sorted(EXAMPLES)


@pytest.mark.parametrize("name", EXAMPLES)
def test_the_docstring_examples_run(name):
    tests = examples_of(name)
    assert tests, f"{name} has no examples left: remove it from EXAMPLES"
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for test in tests:
        test.globs = {**test.globs, "np": np}  # the examples' one import
        runner.run(test)
    assert runner.summarize(verbose=False).failed == 0
