"""Find the exported translator that a path names: an artifact, or a run's export.

Commands that run an exported translator (`evaluation`, `translate`) take a SavedModel
directory, a `.tflite` file, or, for convenience, a run directory, which stands for the
SavedModel that `python -m export RUN_DIR` writes into it. Running the artifact is
`keras_transformer.runtimes`'s business; this module imports no model code unless it has
to export.
"""

import os

CONFIG_FILE = "config.json"  # what marks a run directory (see `keras_transformer.runs`)


def run_saved_model(run_dir):
    """Returns where `python -m export RUN_DIR` writes the run's SavedModel."""
    # Imported here: translating needs no model code, and exporting imports it.
    from keras_transformer import exporting

    return os.path.join(run_dir, exporting.EXPORT_DIR, exporting.SAVED_MODEL)


def resolve_artifact(path, *, export_if_missing=False, verbose=True):
    """Returns the artifact that `path` names: a run directory means its SavedModel.

    Args:
        path: str. A SavedModel directory, a `.tflite` file, or a run directory (one with
            a `config.json`), whose `export/saved_model` is used.
        export_if_missing: bool. Export a run directory that has no SavedModel yet (as
            `python -m export RUN_DIR` does, with its newest weights) instead of failing.
        verbose: bool. Say so when exporting.

    Raises:
        FileNotFoundError: when there is no artifact at `path`; for a run directory,
            with the command that exports it.
    """
    path = os.fspath(path)
    if os.path.isfile(path) and path.endswith(".tflite"):
        return path
    if os.path.isfile(os.path.join(path, "saved_model.pb")):
        return path
    if not os.path.isfile(os.path.join(path, CONFIG_FILE)):
        raise FileNotFoundError(
            f"{path!r} is neither a SavedModel directory (with saved_model.pb), a .tflite "
            "file nor a run directory (with config.json).")
    saved_model = run_saved_model(path)
    if os.path.isfile(os.path.join(saved_model, "saved_model.pb")):
        return saved_model
    if not export_if_missing:
        raise FileNotFoundError(
            f"Run directory {path!r} has no exported SavedModel at {saved_model!r}: "
            f"export it first with `python -m export {path}`.")
    if verbose:
        print(f"{path} has no export yet: exporting it (python -m export {path}).",
              flush=True)
    from keras_transformer import exporting

    exporting.export_run(path)
    return saved_model
