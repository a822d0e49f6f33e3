"""WMT14 from TensorFlow Datasets: the corpus of the paper's base recipe (§5.1).

`DataConfig(corpus="wmt14")` reads `wmt14_translate/<xx>-en` with TensorFlow Datasets
(`pip install "keras-transformer[wmt]"`) instead of text files; `corpus.load_split`
dispatches here, so training, the BLEU callback and `evaluate` need nothing else
(`write_split` writes a split as two text files).
English-German is the paper's task: about 4.5 million training pairs (Europarl,
Common Crawl, News Commentary), `newstest2013` as validation and `newstest2014` as test.

The paper's base recipe, with the same command:

    keras-transformer train --preset paper_base corpus=wmt14 --epochs 100 --steps 1000 \\
        checkpoint_every_steps=1500 keep_checkpoints=5
    keras-transformer average runs/paper_base-en-de --last 5
    keras-transformer export runs/paper_base-en-de
    keras-transformer evaluate runs/paper_base-en-de --split test --beam

(100 epochs of 1,000 steps = 100k updates of ≈25k + 25k tokens; a checkpoint every
1,500 updates, the paper's "10-minute intervals" at its 0.4 s per step; average the
last 5; score newstest2014, the `test` split, with the exported beam search: beam 4
and α 0.6 are its defaults.)

Data: on first use TFDS downloads the WMT14 sources (a few GB) and prepares them under
`DataConfig.data_dir` (default `~/tensorflow_datasets`); later runs read the prepared
files offline. Memory: the pairs are streamed out of TFDS one at a time, filtered, and
kept once, as the tuples of str that `ParallelText` holds and `data.make_dataset`
tokenizes (it needs the whole split at once); see BENCHMARKS.md for what that costs
for the 4.5 M training pairs.

Public API:
    - `load_split(data_config, split, ...) -> text.ParallelText`.
    - `write_split(data_config, split, directory) -> (source_path, target_path)`: a split
      as two line-aligned text files.
    - `tfds_name(source_language, target_language) -> str`, e.g. `"wmt14_translate/de-en"`.
"""

import os

from keras_transformer.data import text as text_lib

CORPUS = "wmt14"
TFDS_DATASET = "wmt14_translate"
# TFDS pairs each of these languages with English, in configs named "<xx>-en".
PAIRED_WITH_ENGLISH = ("cs", "de", "fr", "hi", "ru")
# Our split names are TFDS's: validation is newstest2013, test is newstest2014 (de-en).
SPLITS = ("train", "validation", "test")


def tfds_name(source_language, target_language):
    """Returns the TFDS dataset name of a direction, e.g. `"wmt14_translate/de-en"`."""
    languages = {source_language, target_language}
    others = languages - {"en"}
    if "en" not in languages or len(others) != 1 or not others <= set(PAIRED_WITH_ENGLISH):
        raise ValueError(
            f"WMT14 has no {source_language}-{target_language} direction: one language "
            f"must be 'en' and the other one of {PAIRED_WITH_ENGLISH}.")
    return f"{TFDS_DATASET}/{others.pop()}-en"


def load_split(data_config, split, *, filter_pairs=None,
               max_characters=text_lib.MAX_CHARACTERS):
    """Reads one WMT14 split from TensorFlow Datasets (downloading it on first use).

    Args:
        data_config: `DataConfig` with `corpus="wmt14"`; `source_language` and
            `target_language` choose the direction, `data_dir` the TFDS data directory.
        split: `"train"`, `"validation"` or `"test"`.
        filter_pairs: bool. Drop empty and over-long pairs, as `text.read_parallel`
            does. Defaults to `True` for `"train"` only.
        max_characters: int. Pairs with a longer side count as over-long.

    Returns:
        A `text.ParallelText` whose file names are `tfds:<name>:<split>:<language>`.
    """
    if split not in SPLITS:
        raise ValueError(f"Unknown split {split!r}; use one of {list(SPLITS)}.")
    name = tfds_name(data_config.source_language, data_config.target_language)
    if filter_pairs is None:
        filter_pairs = split == "train"
    examples = _examples(name, split, data_config.data_dir)
    return _collect(examples, data_config.source_language, data_config.target_language,
                    filter_pairs, max_characters, origin=f"tfds:{name}:{split}")


def _examples(name, split, data_dir):
    """Yields TFDS examples (dicts of language → bytes) one at a time."""
    try:  # an optional dependency, imported when the corpus is asked for
        import tensorflow_datasets as tfds
    except ImportError:
        raise ImportError("corpus='wmt14' reads TensorFlow Datasets: "
                          'pip install "keras-transformer[wmt]"') from None
    dataset = tfds.load(name, split=split, data_dir=data_dir, shuffle_files=False)
    return tfds.as_numpy(dataset)


def _collect(examples, source_language, target_language, filter_pairs, max_characters,
             origin):
    """Decodes and filters the examples in one pass; returns a `ParallelText`."""
    sources, targets = [], []
    read = empty = too_long = 0
    for example in examples:
        read += 1
        source = example[source_language].decode("utf-8")
        target = example[target_language].decode("utf-8")
        if filter_pairs and (not source.strip() or not target.strip()):
            empty += 1
        elif filter_pairs and max(len(source), len(target)) > max_characters:
            too_long += 1
        else:
            sources.append(source)
            targets.append(target)
    stats = text_lib.FilterStats(read=read, kept=len(sources), empty=empty, too_long=too_long)
    return text_lib.ParallelText(
        source_lines=tuple(sources), target_lines=tuple(targets),
        source_file=f"{origin}:{source_language}", target_file=f"{origin}:{target_language}",
        stats=stats)


def write_split(data_config, split, directory):
    """Writes a split, unfiltered, as `<split>.<language>` files; returns their paths."""
    text = load_split(data_config, split, filter_pairs=False)
    os.makedirs(directory, exist_ok=True)
    paths = []
    for language, lines in ((data_config.source_language, text.source_lines),
                            (data_config.target_language, text.target_lines)):
        path = os.path.join(directory, f"{split}.{language}")
        with open(path, "w", encoding="utf-8", newline="\n") as file:
            file.writelines(line + "\n" for line in lines)
        paths.append(path)
    return tuple(paths)
