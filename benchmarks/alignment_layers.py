"""Which decoder layer's cross-attention aligns words: accuracy per layer on a copy task.

The `align` signature reads one decoder layer's cross-attention, averaged over its
heads (`decoding.alignment`). Measuring that needs text whose word alignment is known:
this script trains a small model with `kt.train` on a copy task with reordering (the
target is the source with each pair of adjacent words swapped, so target word j comes
from source word j ± 1), translates held-out sentences with `Translator.align` and
counts, for each layer, the target words all of whose pieces align to their source
word. `tests/test_alignment_trained.py` holds the default layer to it.

    python -m benchmarks.alignment_layers --layers 3
    python -m benchmarks.alignment_layers --layers 6 --epochs 120 --json results.json
"""

import argparse
import os
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from benchmarks import common  # noqa: E402
from keras_transformer import config as config_lib  # noqa: E402
from keras_transformer import runs  # noqa: E402
from keras_transformer.decoding import alignment  # noqa: E402
from keras_transformer.serving.translator import Translator  # noqa: E402
from keras_transformer.training import fit  # noqa: E402


def parse_arguments(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=3, help="decoder (and encoder) layers")
    parser.add_argument("--epochs", type=int, default=80)
    parser.add_argument("--minutes", type=float, default=None,
                        help="stop training after this long (default: no limit)")
    parser.add_argument("--train-sentences", type=int, default=4000)
    parser.add_argument("--test-sentences", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None, metavar="PATH", help="write results here")
    return parser.parse_args(argv)


def make_pairs(count, generator, words):
    """Returns `count` `(source words, order)` over `words`: the target is
    `[source[i] for i in order]`, each adjacent pair of words swapped."""
    pairs = []
    for _ in range(count):
        source = [str(word) for word in generator.choice(words, size=generator.integers(3, 9))]
        order = list(range(len(source)))
        for i in range(0, len(source) - 1, 2):
            order[i], order[i + 1] = order[i + 1], order[i]
        pairs.append((source, order))
    return pairs


def write_corpus(directory, splits):
    """Writes `{split: pairs}` as `split.src`/`split.tgt`; returns `{split: (src, tgt)}`."""
    paths = {}
    for split, pairs in splits.items():
        paths[split] = (os.path.join(directory, f"{split}.src"),
                        os.path.join(directory, f"{split}.tgt"))
        with open(paths[split][0], "w", encoding="utf-8") as source_file, \
                open(paths[split][1], "w", encoding="utf-8") as target_file:
            for source, order in pairs:
                source_file.write(" ".join(source) + "\n")
                target_file.write(" ".join(source[i] for i in order) + "\n")
    return paths


def copy_task_config(paths, layers, epochs, minutes=None, seed=0):
    return config_lib.Config(
        model=config_lib.ModelConfig(vocabulary_size=96, num_layers=layers, hidden_dim=64,
                                     intermediate_dim=128, num_heads=4, dropout=0.0,
                                     max_length=32),
        data=config_lib.DataConfig(corpus="copy", train_files=paths["train"],
                                   validation_files=paths["validation"],
                                   test_files=paths["test"], batch_tokens=1024, seed=seed),
        train=config_lib.TrainConfig(warmup_steps=400, epochs=epochs, learning_rate_scale=0.5,
                                     time_budget_minutes=minutes, seed=seed))


def train_copy_model(directory, layers, epochs=80, minutes=None, train_sentences=4000,
                     test_sentences=300, seed=0, verbose=0):
    """Trains on the copy task in `directory` (`verbose` as `kt.train`'s); returns
    `(model, tokenizer, test pairs)`."""
    generator = np.random.default_rng(seed)
    words = generator.choice([consonant + vowel + last for consonant in "bdfgklmnprstvz"
                              for vowel in "aeiou" for last in "kmst"], size=40,
                             replace=False)  # one lexicon for every split
    splits = {"train": make_pairs(train_sentences, generator, words),
              "validation": make_pairs(200, generator, words),
              "test": make_pairs(test_sentences, generator, words)}
    paths = write_corpus(directory, splits)
    run_dir = os.path.join(directory, "run")
    fit.train(copy_task_config(paths, layers, epochs, minutes, seed), run_dir,
              verbose=verbose)
    _, tokenizer, model = runs.load_run(run_dir)
    return model, tokenizer, splits["test"]


def layer_accuracy(model, tokenizer, pairs, layer):
    """Returns `(exact, aligned)`: the share of translations equal to the reference,
    and of reference words whose pieces all align to their source word (a word the
    translation lacks counts as wrong)."""
    translator = Translator(model, tokenizer, alignment_layer=layer)
    outputs = translator.align(tf.constant([" ".join(source) for source, _ in pairs]))
    translations = [t.decode() for t in outputs["translations"].numpy()]
    target_words = outputs["target_words"].numpy()
    alignments = outputs["alignments"].numpy()
    exact = good = total = 0
    for b, (source, order) in enumerate(pairs):
        exact += translations[b] == " ".join(source[i] for i in order)
        linked = {}
        for word, source_word in zip(target_words[b], alignments[b]):
            if word >= 0:
                linked.setdefault(int(word), set()).add(int(source_word))
        good += sum(linked.get(j) == {i} for j, i in enumerate(order))
        total += len(order)
    return exact / len(pairs), good / total


def main(argv=None):
    arguments = parse_arguments(argv)
    result = common.header(arguments)
    with tempfile.TemporaryDirectory() as scratch:
        model, tokenizer, pairs = train_copy_model(
            scratch, arguments.layers, arguments.epochs, arguments.minutes,
            arguments.train_sentences, arguments.test_sentences, arguments.seed,
            verbose=2)  # a line per epoch
    rows = []
    for layer in range(model.num_layers):
        exact, aligned = layer_accuracy(model, tokenizer, pairs, layer)
        rows.append({"layer": layer, "aligned": aligned, "exact": exact,
                     "default": "yes" if layer == alignment.default_layer(
                         model.num_layers) else ""})
    result.update(rows=rows, test_sentences=len(pairs))
    common.print_table(rows, [("layer", "layer"), ("aligned", "words aligned"),
                              ("exact", "exact translations"), ("default", "default")])
    common.write_json(arguments.json, result)


if __name__ == "__main__":
    sys.exit(main())
