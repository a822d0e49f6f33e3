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
    # A module's own packages are not counted: Python loads them before the module
    # whatever it imports, so `from keras_transformer.cli import options` inside
    # `cli.training` adds no edge to `cli`, whose `__init__` imports its verbs.
    ancestors = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
    return {module for module in found
            if module in known and module != name and module not in ancestors}


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


def folder_graph(graph):
    """`graph` between the package's folders and top-level modules: an edge from each
    folder to every other one that one of its modules imports. The package's
    `__init__` is left out (it imports nothing of its own; `kt.X` loads X on use)."""
    def node(name):
        return ".".join(name.split(".")[:2])

    folders = {}
    for name, imported in graph.items():
        if name != PACKAGE.name:
            folders.setdefault(node(name), set()).update(
                node(other) for other in imported
                if other != PACKAGE.name and node(other) != node(name))
    return folders


def test_no_folder_imports_a_folder_that_imports_it_back():
    # `serving -> training -> serving` is a circle even with no module in it twice.
    assert find_cycle(folder_graph(import_graph(top_level_only=False))) is None


def test_the_folder_graph_finds_a_circle_through_two_modules_of_one_folder():
    graph = {"keras_transformer.a.x": {"keras_transformer.b.y"},
             "keras_transformer.b.y": set(), "keras_transformer.b.z": {
                 "keras_transformer.a.w"}, "keras_transformer.a.w": set()}
    assert find_cycle(graph) is None
    assert find_cycle(folder_graph(graph)) == [
        "keras_transformer.a", "keras_transformer.b", "keras_transformer.a"]


def test_tools_are_leaves_that_only_the_command_line_imports():
    users = sorted(name for name, imported in import_graph(top_level_only=False).items()
                   if any(other.startswith(f"{PACKAGE.name}.tools") for other in imported)
                   and not name.startswith(f"{PACKAGE.name}.tools"))
    assert users and all(name.startswith(f"{PACKAGE.name}.cli.") for name in users)


# What reads a run directory: its config (`Config.load`), its checkpoints (their file
# pattern), its choice on validation. `runs` alone does; the command line also loads the
# config file that `--config FILE` names, which need not lie in a run directory.
RUN_DIRECTORY_READS = {"load": "Config.load", "CHECKPOINT_PATTERN": "files.CHECKPOINT_PATTERN",
                       "CHOICE": "files.CHOICE"}
READERS = {"runs": set(RUN_DIRECTORY_READS), "cli.options": {"load"},
           "files": set(RUN_DIRECTORY_READS)}


def run_directory_reads(source):
    """The names of `RUN_DIRECTORY_READS` that Python `source` uses."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in RUN_DIRECTORY_READS:
            if node.attr != "load" or (isinstance(node.value, ast.Attribute | ast.Name)
                                       and getattr(node.value, "attr", getattr(
                                           node.value, "id", None)) == "Config"):
                found.add(node.attr)
        elif isinstance(node, ast.ImportFrom) and node.module == f"{PACKAGE.name}.files":
            found.update(alias.name for alias in node.names
                         if alias.name in RUN_DIRECTORY_READS)
    return found


def test_run_directories_are_read_through_runs_alone():
    bypasses = {}
    for name in module_names():
        short = name.removeprefix(f"{PACKAGE.name}.")
        reads = run_directory_reads(module_path(name).read_text(encoding="utf-8"))
        if reads - READERS.get(short, set()):
            bypasses[name] = sorted(reads - READERS.get(short, set()))
    assert bypasses == {}


@pytest.mark.parametrize("source", [
    "config = config_lib.Config.load(os.path.join(run_dir, files.CONFIG))",
    "from keras_transformer.files import CHECKPOINT_PATTERN",
    "match = files.CHECKPOINT_PATTERN.match(name)",
    "path = os.path.join(run_dir, files.CHOICE)"])
def test_the_bypass_finder_finds_a_planted_read(source):
    assert run_directory_reads(source)
    assert not run_directory_reads("config = runs.load_config(run_dir); json.load(file)")


def test_the_cycle_finder_finds_a_planted_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


# Modules that need an extra: (the package it installs, the extra's name).
OPTIONAL_MODULES = {"keras_transformer.translate_corpus": ("apache_beam", "beam")}


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
    # A module of an extra that is not installed must say which extra it needs.
    code = ("import importlib, importlib.util, sys\n"
            f"for name in {order!r}:\n"
            "    try:\n"
            "        importlib.import_module(name)\n"
            "    except ImportError as error:\n"
            f"        extra = {OPTIONAL_MODULES!r}.get(name)\n"
            "        if not extra or importlib.util.find_spec(extra[0]) is not None:\n"
            "            raise\n"
            "        assert f'[{extra[1]}]' in str(error), error\n")
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
                                    "keras_transformer.runs",
                                    "keras_transformer.config", "keras_transformer.cli"])
def test_light_modules_import_neither_keras_nor_tensorflow(module):
    code = (f"import sys, {module}\n"
            "print(sorted(m for m in ('keras', 'tensorflow') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPOSITORY,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
