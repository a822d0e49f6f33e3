"""The corpus a `DataConfig` names: which files each split is, read as `ParallelText`.

Three kinds of corpus, chosen by `DataConfig.corpus`:

- `"multi30k"` (the default): Multi30K Task 1 (`multi30k`), downloaded on first use or
  read from `data_dir`, in any direction between en, de and fr;
- `"wmt14"`: WMT14 from TensorFlow Datasets (`wmt14`), the paper's corpus;
- any other name (`"files"`, say): your own line-aligned files, named by
  `train_files`, `validation_files` and `test_files` (`(source_path, target_path)`
  pairs, plain or gzip, any language codes).

Splits are `"train"`, `"validation"` and `"test"`; Multi30K also names each of its test
splits (`test_splits` lists what a corpus has; `"test"` is its first).

Public API:
    - `load_split(data_config, split, ...) -> ParallelText`: the lines of one split in
      the direction the config names.
    - `corpus_files(data_config, split, ...) -> (source_path, target_path)`.
    - `test_splits(data_config) -> tuple of str`.
"""

import logging

from keras_transformer.data import multi30k, wmt14
from keras_transformer.data.text import MAX_CHARACTERS, CorpusError, read_parallel

logger = logging.getLogger(__name__)

SPLITS = ("train", "validation", "test")
# Our split names → Multi30K's file name stems.
MULTI30K_SPLITS = {"train": "train", "validation": "val", "test": "test_2016_flickr",
                   **{name: name for name in multi30k.TEST_SPLITS}}


def test_splits(data_config):
    """Returns the names of the corpus's test splits, the one `"test"` means first."""
    if data_config.corpus == "multi30k":
        return multi30k.TEST_SPLITS
    if data_config.corpus == wmt14.CORPUS or data_config.test_files:
        return ("test",)
    return ()


def load_split(data_config, split, *, filter_pairs=None, max_characters=MAX_CHARACTERS,
               cache_dir=None, base_url=None, verbose=True):
    """Reads one split of the corpus that `data_config` names.

    Args:
        data_config: `keras_transformer.config.DataConfig`.
        split: `"train"`, `"validation"`, `"test"` or, for Multi30K, a test split's name.
        filter_pairs: bool. Drop empty and over-long pairs. Defaults to `True` for
            `"train"` only, so that validation and test keep every reference line.
        max_characters: int. Pairs with a side longer than this many characters count as
            over-long.
        cache_dir: str. Download cache root; defaults to `$KERAS_HOME` (`~/.keras`).
        base_url: str. Where Multi30K's files are downloaded from (see
            `multi30k.download`).
        verbose: bool. Log one line with the filter counts.

    Returns:
        A `ParallelText`.
    """
    if filter_pairs is None:
        filter_pairs = split == "train"
    if data_config.corpus == wmt14.CORPUS:  # from TensorFlow Datasets, not from files
        parallel_text = wmt14.load_split(data_config, split, filter_pairs=filter_pairs,
                                         max_characters=max_characters)
    else:
        source_path, target_path = corpus_files(
            data_config, split, cache_dir=cache_dir, base_url=base_url)
        parallel_text = read_parallel(source_path, target_path, filter_pairs=filter_pairs,
                                      max_characters=max_characters)
    if verbose:
        logger.info(parallel_text.stats.summary(
            f"{data_config.corpus} {split} "
            f"{data_config.source_language}-{data_config.target_language}"))
    return parallel_text


def corpus_files(data_config, split, *, cache_dir=None, base_url=None):
    """Returns the `(source_path, target_path)` of a split, downloading if needed.

    Args:
        data_config: `keras_transformer.config.DataConfig` of a corpus of files.
        split: as for `load_split`.
        cache_dir: str. Download cache root (see `multi30k.download`).
        base_url: str. Download location (see `multi30k.download`).

    Returns:
        A tuple of two paths.
    """
    if data_config.corpus != "multi30k":
        if split not in SPLITS:
            raise CorpusError(f"Unknown split {split!r}; use one of {list(SPLITS)}.")
        files = getattr(data_config, f"{split}_files")
        if files is None or len(files) != 2:
            option = {"train": "--train-files", "validation": "--valid-files",
                      "test": "--test-files"}[split]
            raise CorpusError(
                f"Corpus {data_config.corpus!r} has no {split} files: pass {option} "
                f"SOURCE TARGET (DataConfig.{split}_files).")
        return tuple(files)
    if split not in MULTI30K_SPLITS:
        raise CorpusError(f"Unknown split {split!r}; use one of {list(MULTI30K_SPLITS)}.")
    languages = (data_config.source_language, data_config.target_language)
    if len(set(languages)) != 2 or not set(languages) <= set(multi30k.LANGUAGES):
        raise CorpusError(
            f"Multi30K has no {languages[0]}-{languages[1]} direction: source_language and "
            f"target_language must be two different languages of {multi30k.LANGUAGES}. "
            "For other languages, train on your own files (--train-files, --valid-files).")
    stem = MULTI30K_SPLITS[split]
    if data_config.data_dir is not None:
        return tuple(multi30k.local_file(data_config.data_dir, stem, language)
                     for language in languages)
    paths = tuple(multi30k.download(stem, language, cache_dir=cache_dir, base_url=base_url)
                  for language in languages)
    if stem in multi30k.TEST_SPLITS:
        # A test split is read to be scored: its tokenized reference comes along, for
        # the literature's BLEU (found beside the reference: `multi30k.tokenized_reference`).
        multi30k.download(stem, data_config.target_language, tokenized=True,
                          cache_dir=cache_dir, base_url=base_url)
    return paths
