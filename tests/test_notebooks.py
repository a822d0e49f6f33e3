"""The notebooks run from top to bottom (executed with nbclient) on a small configuration.

Each notebook has one cell tagged `parameters`; like papermill, the tests insert a cell
after it that sets small values (the fixture corpus, a few training steps, a temporary
working directory), then run every cell in a fresh kernel. A cell that raises fails the
test with the cell's traceback.

Running the notebooks is slow (`pytest -m slow tests/test_notebooks.py`: the quickstart
trains, exports SavedModel and TFLite and scores in about 110 s, the walkthrough takes
about 90 s, on 2 cores); CI runs the slow tests after the default ones, so a broken
notebook fails CI. The default suite checks every notebook statically: what it uses from
the package exists, and it is committed without outputs.
"""

import ast
import importlib
import pathlib

import nbformat
import pytest
from IPython.core.inputtransformer2 import TransformerManager
from nbclient import NotebookClient

NOTEBOOKS = pathlib.Path(__file__).resolve().parent.parent / "notebooks"
NOTEBOOK_FILES = sorted(NOTEBOOKS.glob("*.ipynb"))


# nbclient's limit per cell; each notebook's test allows its cells NOTEBOOK_TIMEOUT_S in all.
CELL_TIMEOUT_S = 600
NOTEBOOK_TIMEOUT_S = 900


def execute(name, parameters, working_dir, timeout=CELL_TIMEOUT_S):
    """Runs notebook `name` with `parameters` injected; returns the executed notebook."""
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    tagged = [index for index, cell in enumerate(notebook.cells)
              if "parameters" in cell.metadata.get("tags", [])]
    assert len(tagged) == 1, f"{name} needs exactly one cell tagged 'parameters'"
    injected = nbformat.v4.new_code_cell(
        "\n".join(f"{key} = {value!r}" for key, value in parameters.items()))
    injected.metadata["tags"] = ["injected-parameters"]
    notebook.cells.insert(tagged[0] + 1, injected)
    client = NotebookClient(notebook, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(working_dir)}})
    client.execute()
    return notebook


def text_output(notebook):
    """Returns everything the notebook's cells printed or returned as text."""
    pieces = []
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            if output.get("output_type") == "stream":
                pieces.append(output["text"])
            elif "data" in output and "text/plain" in output["data"]:
                pieces.append(output["data"]["text/plain"])
    return "\n".join(pieces)


def image_count(notebook):
    return sum("image/png" in output.get("data", {})
               for cell in notebook.cells for output in cell.get("outputs", []))


def package_references(notebook):
    """Returns `{(imported name, attribute)}` for `alias.attribute` on package imports.

    Imports are the notebook's `from keras_transformer[...] import name [as alias]`;
    the imported name is the dotted path of what was imported.
    """
    code = "\n".join(TransformerManager().transform_cell(cell.source)
                     for cell in notebook.cells if cell.cell_type == "code")
    tree = ast.parse(code)
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                "keras_transformer"):
            for name in node.names:
                aliases[name.asname or name.name] = f"{node.module}.{name.name}"
    references = {(imported, None) for imported in aliases.values()}
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in aliases):
            references.add((aliases[node.value.id], node.attr))
    return references


def resolve(dotted):
    """Imports `package.module` or `package.module.object` and returns it."""
    try:
        return importlib.import_module(dotted)
    except ModuleNotFoundError:
        module, _, name = dotted.rpartition(".")
        return getattr(importlib.import_module(module), name)


@pytest.mark.parametrize("path", NOTEBOOK_FILES, ids=lambda path: path.name)
def test_everything_a_notebook_uses_from_the_package_exists(path):
    references = package_references(nbformat.read(path, as_version=4))
    assert references, f"{path.name} uses nothing from keras_transformer"
    missing = sorted(f"{imported}.{attribute}" if attribute else imported
                     for imported, attribute in references
                     if not _exists(imported, attribute))
    assert not missing, f"{path.name} uses names the package lacks: {missing}"


def _exists(imported, attribute):
    try:
        target = resolve(imported)
    except (ImportError, AttributeError):
        return False
    return attribute is None or hasattr(target, attribute)


@pytest.mark.parametrize("path", NOTEBOOK_FILES, ids=lambda path: path.name)
def test_notebooks_are_committed_without_outputs(path):
    notebook = nbformat.read(path, as_version=4)
    nbformat.validate(notebook)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, (
                f"{path.name} has outputs: clear them before committing")


# The whole notebook: 91 s measured on 2 busy cores; a hung cell fails at CELL_TIMEOUT_S.
@pytest.mark.timeout(NOTEBOOK_TIMEOUT_S)
@pytest.mark.slow
def test_walkthrough_runs_and_reproduces_the_hand_computed_attention(
        tmp_path, fixture_corpus_dir):
    notebook = execute("walkthrough.ipynb", {
        "DATA_DIR": str(fixture_corpus_dir), "TRAIN_STEPS": 3, "WORK_DIR": str(tmp_path),
    }, tmp_path)
    printed = text_output(notebook)
    assert "softmax of input 1: [0.063 0.468 0.468]" in printed
    assert "output of input 1: [1.937 6.683 1.595]" in printed
    assert "cos(PE(2), PE(10))" in printed
    assert (tmp_path / "walkthrough-tiny-3-steps" / "model.weights.h5").exists()
    # Figures: encoding, similarity, masks, one head, schedule, smoothing (2), and the
    # trained tiny model's cross-attention (2 layers) and self-attention.
    assert image_count(notebook) == 10


# The whole notebook: 108 s measured on 2 busy cores; a hung cell fails at CELL_TIMEOUT_S.
@pytest.mark.timeout(NOTEBOOK_TIMEOUT_S)
@pytest.mark.slow
def test_quickstart_trains_exports_translates_and_scores(tmp_path, fixture_corpus_dir):
    run_dir = tmp_path / "run"
    notebook = execute("quickstart.ipynb", {
        "DATA_DIR": str(fixture_corpus_dir), "PRESET": "tiny", "EPOCHS": 1,
        "TRAIN_STEPS": 3, "RUN_DIR": str(run_dir), "BLEU_SENTENCES": 4,
        "TEST_SENTENCES": 8, "SHOW_TENSORBOARD": False,
    }, tmp_path)
    printed = text_output(notebook)
    assert (run_dir / "export" / "saved_model" / "saved_model.pb").exists()
    assert (run_dir / "export" / "translator.tflite").exists()
    assert printed.count("  TFLite: ") == 3  # three sentences, each through every path
    for split in ("test_2016_flickr", "test_2017_flickr", "test_2017_mscoco"):
        assert f"{split}: 8 sentences, BLEU " in printed  # every test split, scored
    assert "nrefs:1|case:mixed|eff:no|tok:13a" in printed
    assert list((run_dir / "logs" / "validation").glob("events.out.tfevents.*"))
