"""Shared fixtures: data locations and a quiet TensorFlow."""

import os
import pathlib
import shutil
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import hypothesis  # noqa: E402
import pytest  # noqa: E402

# Every run draws the same examples, derived from each test alone, so that a failure in
# CI reproduces on any machine; a failure also prints the blob that replays it
# (`@hypothesis.reproduce_failure`). HYPOTHESIS_PROFILE=explore draws new examples.
hypothesis.settings.register_profile("reproducible", derandomize=True, database=None,
                                     print_blob=True)
hypothesis.settings.register_profile("explore", print_blob=True)
hypothesis.settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "reproducible"))

# The slow and JAX test files that take longest, longest first (CI's durations on 2
# cores). pytest-xdist hands out files with most tests first, which left these files of
# few long tests last, one process running one while the other idled: CI's `-m "slow
# or jax"` run keeps this order instead (`--no-loadscope-reorder`): 838 s against 879 s.
# The default run keeps xdist's order: ordered so, its long exports overlapped and it
# took 982 s against 897 s (2-core AMD EPYC, family 25).
LONGEST_FILES = (
    "test_jax_backend.py", "test_benchmarks.py", "test_jax_fault_tolerance.py",
    "test_export.py", "test_notebooks.py", "test_alignment_trained.py",
    "test_export_folder.py", "test_fault_tolerance.py", "test_ensemble.py",
)


# The time limit of a slow test that sets none: pyproject.toml's 300 s counts its
# fixtures' exports and training too, which take 2.5 times as long on a CPU without
# AVX-512 as on the one its durations were measured on.
SLOW_TEST_TIMEOUT_S = 900


def pytest_collection_modifyitems(config, items):
    """Gives slow tests `SLOW_TEST_TIMEOUT_S` where they set no limit; without xdist's
    reordering, runs the `LONGEST_FILES` first, in that order."""
    for item in items:
        if item.get_closest_marker("slow") and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(SLOW_TEST_TIMEOUT_S))
    if config.getoption("loadscopereorder", True):
        return
    rank = {name: position for position, name in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable


REPOSITORY = pathlib.Path(__file__).resolve().parent.parent
FIXTURES = pathlib.Path(__file__).resolve().parent / "fixtures"
MULTI30K_FILES = tuple(f"{split}.{language}.gz" for split in (
    "train", "val", "test_2016_flickr", "test_2017_flickr", "test_2017_mscoco")
    for language in ("en", "de", "fr"))


def find_multi30k():
    """Returns the local Multi30K directory, or None when this machine has none."""
    candidates = [os.environ.get("KERAS_TRANSFORMER_DATA_DIR"),
                  REPOSITORY.parent / "shared" / "data" / "multi30k"]
    for candidate in candidates:
        if candidate and all((pathlib.Path(candidate) / name).exists()
                             for name in MULTI30K_FILES):
            return pathlib.Path(candidate)
    return None


@pytest.fixture(scope="session")
def multi30k_dir():
    """The Multi30K directory; skips the test when it is absent."""
    directory = find_multi30k()
    if directory is None:
        pytest.skip("Multi30K is not on this machine: set KERAS_TRANSFORMER_DATA_DIR "
                    "to a directory holding its 15 files (train, val, test_2016_flickr, "
                    "test_2017_flickr, test_2017_mscoco; .en/.de/.fr.gz)")
    return directory


def fixture_corpus():
    """Returns a directory holding the tests' own small en/de/fr corpus under Multi30K's
    file names (`train.en.gz`, `val.de.gz`, ...), made once per machine.

    The repository keeps it as `own-*.gz`, so that no file in it carries the names of
    the real corpus, which is downloaded or read from a data directory, never committed.
    """
    directory = pathlib.Path(tempfile.gettempdir()) / "keras_transformer_fixture_corpus"
    directory.mkdir(exist_ok=True)
    for source in sorted((FIXTURES / "corpus").glob("own-*.gz")):
        target = directory / source.name.removeprefix("own-")
        if not target.exists() or target.read_bytes() != source.read_bytes():
            partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
            shutil.copyfile(source, partial)
            os.replace(partial, target)
    return directory


@pytest.fixture(scope="session")
def fixture_corpus_dir():
    """The tests' own small corpus under Multi30K's file names (see `fixture_corpus`)."""
    return fixture_corpus()
