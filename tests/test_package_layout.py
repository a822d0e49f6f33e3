"""The package's layout: no import circles, every module importable, a TF-free top level."""

import ast
import subprocess
import sys
import warnings

import pytest
from setuptools.config import pyprojecttoml

from tests.conftest import REPOSITORY

PACKAGE = REPOSITORY / "keras_transformer"


def module_names():
    """Every module of the package, as dotted names (packages by their `__init__`)."""
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(REPOSITORY).with_suffix("").parts
        if parts[-1] == "__main__":
            continue
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def module_path(name):
    path = REPOSITORY.joinpath(*name.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def imported_modules(name, known, *, top_level_only=True):
    """The package's modules that module `name` imports (at its top level by default)."""
    tree = ast.parse(module_path(name).read_text(encoding="utf-8"))
    nodes = tree.body if top_level_only else ast.walk(tree)
    found = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            # `from package import module` imports the module.
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {module for module in found if module in known and module != name}


def import_graph(**options):
    known = set(module_names())
    return {name: imported_modules(name, known, **options) for name in known}


def find_cycle(graph):
    """Returns one cycle of `graph` as a list of nodes, or `None`."""
    state = {}

    def visit(node, path):
        state[node] = "open"
        for successor in sorted(graph[node]):
            if state.get(successor) == "open":
                return path[path.index(successor):] + [successor]
            if successor not in state:
                cycle = visit(successor, path + [successor])
                if cycle:
                    return cycle
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node, [node])
            if cycle:
                return cycle
    return None


def test_the_package_has_no_import_circle():
    # Function-level imports count too: a circle deferred to call time is still one.
    assert find_cycle(import_graph(top_level_only=False)) is None


def test_the_cycle_finder_finds_a_planted_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_every_module_imports_in_dependency_order_in_a_fresh_interpreter():
    graph = import_graph()
    order, seen = [], set()

    def visit(name):
        if name not in seen:
            seen.add(name)
            for dependency in sorted(graph[name]):
                visit(dependency)
            order.append(name)

    for name in sorted(graph):
        visit(name)
    code = ("import importlib, sys\n"
            f"for name in {order!r}:\n"
            "    importlib.import_module(name)\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPOSITORY,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]


def test_every_folder_of_the_package_is_a_regular_package_that_the_wheel_holds():
    folders = {path.parent for path in PACKAGE.rglob("*.py")}
    assert sorted(str(folder) for folder in folders
                  if not (folder / "__init__.py").is_file()) == []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # setuptools calls [tool.setuptools] beta
        settings = pyprojecttoml.read_configuration(REPOSITORY / "pyproject.toml")
    found = set(settings["tool"]["setuptools"]["packages"])  # what the wheel holds
    names = {".".join(folder.relative_to(REPOSITORY).parts) for folder in folders}
    assert sorted(names - found) == []


@pytest.mark.parametrize("module", ["keras_transformer", "keras_transformer.files",
                                    "keras_transformer.config", "keras_transformer.cli"])
def test_light_modules_import_neither_keras_nor_tensorflow(module):
    code = (f"import sys, {module}\n"
            "print(sorted(m for m in ('keras', 'tensorflow') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPOSITORY,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
