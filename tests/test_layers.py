"""Source scans of the package's own rules on imports: no package reaches into another's private names,
only the command line draws terminal UI (``rich``), every floor imports only the floors below it, and no
module's imports lead back to it.

The scans are functions of sources — ``(path relative to the package root, text)`` pairs — so that they
run on the package's own files and on synthetic ones that break each rule."""

from __future__ import annotations

import ast
from pathlib import Path, PurePosixPath

import pytest

import headwise

SRC = Path(headwise.__file__).resolve().parent
Source = tuple[str, str]  # (path relative to the package root, "viz/heads.py"; its text)


def _package(path: str) -> str | None:
    """The subpackage a source file belongs to (``"viz"``), None for a module at the package root."""
    parts = PurePosixPath(path).parts
    return parts[0] if len(parts) > 1 else None


def _imports(path: str, text: str):
    """``(line, module, names)`` of every import of one source, relative imports resolved."""
    tree = ast.parse(text, filename=path)
    here = ["headwise", *PurePosixPath(path).with_suffix("").parts]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, []
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                base = here[: len(here) - node.level]
                module = ".".join(base + ([module] if module else []))
            yield node.lineno, module, [a.name for a in node.names]


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_leaks(sources: list[Source], subpackages: set[str]) -> list[str]:
    """``"path:line: module [names]"`` for every import of another package's private module, or of any
    module's private name (see :func:`test_no_private_name_crosses_a_boundary`)."""
    leaks = []
    for path, text in sources:
        own = _package(path)
        for line, module, names in _imports(path, text):
            parts = module.split(".")
            if parts[0] != "headwise" or len(parts) < 2:
                continue
            other_package = parts[1] in subpackages and parts[1] != own
            if (other_package and any(_private(p) for p in parts[2:])) or any(_private(n) for n in names):
                leaks.append(f"{path}:{line}: {module} {names}")
    return leaks


def rich_users(sources: list[Source]) -> list[str]:
    """``"path:line"`` of every import of ``rich`` outside ``cli/``."""
    return [
        f"{path}:{line}"
        for path, text in sources
        if _package(path) != "cli"
        for line, module, _ in _imports(path, text)
        if module == "rich" or module.startswith("rich.")
    ]


#: What each package never imports: the floors ``cli → commands → viz / lab / study → circuits → patching → analysis
#: / models / hf → core`` run one way — a command's flow (commands/) is the one place that combines the pictures, the
#: lab and the studies, which never import one another; the analysis is handed models and never opens one; hf imports
#: only the core. Beyond this table, only ``cli/`` itself and ``__main__.py`` import ``cli/``.
NEVER = {
    "commands": {"cli"},
    "viz": {"cli", "commands", "lab", "study"},
    "lab": {"cli", "commands", "viz", "study"},
    "study": {"cli", "commands", "viz", "lab"},
    "circuits": {"cli", "commands", "viz", "lab", "study"},
    "patching": {"cli", "commands", "viz", "lab", "study", "circuits"},
    "analysis": {"cli", "commands", "viz", "lab", "study", "models", "hf", "circuits"},
    "models": {"cli", "commands", "viz", "lab", "study", "analysis", "circuits"},
    "hf": {"cli", "commands", "viz", "lab", "study", "analysis", "models", "circuits"},
    "core": {"cli", "commands", "viz", "lab", "study", "analysis", "models", "hf", "reference", "circuits"},
}


def floor_breaches(sources: list[Source], subpackages: set[str]) -> list[str]:
    """``"path:line: module"`` for every import (at the top or inside a function) of a package that
    :data:`NEVER` keeps from the importing file's package."""
    breaches = []
    for path, text in sources:
        own = _package(path)
        never = NEVER.get(own, set()) | ({"cli"} if own != "cli" and path != "__main__.py" else set())
        for line, module, _ in _imports(path, text):
            parts = module.split(".")
            if parts[0] == "headwise" and len(parts) > 1 and parts[1] in subpackages and parts[1] in never:
                breaches.append(f"{path}:{line}: {module}")
    return breaches


#: What a command of ``cli/`` may import from ``cli/``: the shared app, output checks and progress bars — never another
#: command, nor a flow (flows live in the library, ``commands/``).
CLI_SHARED = {"headwise.cli._app", "headwise.cli._output", "headwise.cli._progress"}


def command_reaches(sources: list[Source]) -> list[str]:
    """``"path:line: module"`` for every import, by a command file of ``cli/``, of a ``cli/`` module other than
    :data:`CLI_SHARED` (``cli/__init__.py`` registers the commands; it is not one)."""
    return [
        f"{path}:{line}: {target}"
        for path, text in sources
        if _package(path) == "cli" and not path.endswith("__init__.py")
        for line, module, names in _imports(path, text)
        for target in ([f"{module}.{n}" for n in names] if module == "headwise.cli" else [module])
        if target.startswith("headwise.cli.") and target not in CLI_SHARED and target != _module(path)
    ]


def _module(path: str) -> str:
    """The dotted name of a source: ``"models/folder.py"`` → ``"headwise.models.folder"``, a package's
    ``__init__.py`` the package."""
    parts = list(PurePosixPath(path).with_suffix("").parts)
    return ".".join(["headwise", *(parts[:-1] if parts[-1] == "__init__" else parts)])


def import_graph(sources: list[Source]) -> dict[str, set[str]]:
    """``{module: the headwise modules it imports}``, imports inside functions included (a lazy import that
    closes a loop is still a loop of dependencies). A name a package's ``__init__`` re-exports counts as an
    import of the module that defines it (``from headwise.models import BertConfig`` depends on
    ``headwise.models.config``), so a package's facade makes no loop of its own."""
    texts = {_module(path): (path, text) for path, text in sources}
    facade = {
        module: {n: m for _, m, names in _imports(path, text) for n in names if m in texts}
        for module, (path, text) in texts.items()
        if path.endswith("__init__.py")
    }
    graph: dict[str, set[str]] = {}
    for module, (path, text) in texts.items():
        targets = set()
        for _, imported, names in _imports(path, text):
            for name in names or [None]:
                if name is not None and f"{imported}.{name}" in texts:  # a submodule: from headwise.x import mod
                    targets.add(f"{imported}.{name}")
                elif name is not None and name in facade.get(imported, {}):
                    targets.add(facade[imported][name])
                elif imported in texts:
                    targets.add(imported)
        graph[module] = targets - {module}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of ``graph`` with more than one module (Tarjan's algorithm, iterative):
    each is a set of modules whose imports lead back to themselves; empty when the imports form a DAG."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in graph:
                    continue
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))
    return cycles


def _package_sources() -> list[Source]:
    files = sorted(p for p in SRC.rglob("*.py") if "data" not in p.relative_to(SRC).parts)
    return [(p.relative_to(SRC).as_posix(), p.read_text(encoding="utf-8")) for p in files]


def _subpackages() -> set[str]:
    return {p.name for p in SRC.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}


# -- the package's own sources ----------------------------------------------------------------------------


def test_no_private_name_crosses_a_boundary():
    """A package's private modules (``viz/_files.py``) serve that package alone: ``from
    headwise.viz._files import X`` from cli/ is a leak, from viz/heads.py it is not. A module's private
    names (``ring._check_layout``) serve that module alone, not even its siblings. Modules at the package
    root (``headwise._io``, the one way files are written) are shared by every package."""
    assert private_leaks(_package_sources(), _subpackages()) == []


def test_only_the_command_line_imports_rich():
    assert rich_users(_package_sources()) == []


def test_every_floor_imports_only_below_it():
    assert floor_breaches(_package_sources(), _subpackages()) == []


def test_a_command_imports_only_the_shared_helpers_of_cli():
    assert command_reaches(_package_sources()) == []


def test_no_import_cycle():
    """No module's imports — at the top or inside a function — lead back to it."""
    assert import_cycles(import_graph(_package_sources())) == []


def test_the_scan_reads_the_package():
    """The scans see the package's real imports (a relative import resolved, a private module of the
    command line's own package), so an empty report is about these files."""
    sources = dict(_package_sources())
    found = {(module, tuple(names)) for _, module, names in _imports("cli/_output.py", sources["cli/_output.py"])}
    assert ("headwise.viz", ("FORMATS",)) in found
    assert ("headwise.cli._app", ("CLIError",)) in found


# -- synthetic sources: each rule broken once, and kept once ----------------------------------------------

PACKAGES = {"cli", "viz", "core", "analysis"}


@pytest.mark.parametrize(
    "path, text, leak",
    [
        ("cli/show.py", "from headwise.viz._files import write\n", "cli/show.py:1: headwise.viz._files ['write']"),
        ("cli/show.py", "\n\nfrom ..viz._files import write\n", "cli/show.py:3: headwise.viz._files ['write']"),
        ("analysis/roles.py", "import headwise.core._kernels\n", "analysis/roles.py:1: headwise.core._kernels []"),
        (
            "viz/heads.py",
            "def f():\n    from headwise.core.attention import _check\n",
            "viz/heads.py:2: headwise.core.attention ['_check']",
        ),
        ("viz/heads.py", "from .files import _name\n", "viz/heads.py:1: headwise.viz.files ['_name']"),
        ("_io.py", "from headwise.viz._files import write\n", "_io.py:1: headwise.viz._files ['write']"),
    ],
    ids=["private-module", "relative", "import-statement", "private-name", "sibling-name", "root-module"],
)
def test_a_private_import_is_reported(path, text, leak):
    clean = ("viz/other.py", "from headwise.core.attention import MultiHeadAttention\n")
    assert private_leaks([clean, (path, text)], PACKAGES) == [leak]


def test_rich_outside_the_command_line_is_reported():
    sources = [
        ("viz/heads.py", "import rich.progress\n"),
        ("analysis/corpus.py", "x = 1\nfrom rich import print\n"),
        ("_io.py", "import rich\n"),
        ("commands/heads.py", "def show():\n    from rich.console import Console\n"),
        ("cli/heads.py", "from rich.table import Table\nimport rich\n"),
    ]
    assert rich_users(sources) == ["viz/heads.py:1", "analysis/corpus.py:2", "_io.py:1", "commands/heads.py:2"]


def test_clean_sources_pass_both_scans():
    sources = [
        ("viz/heads.py", "from headwise.viz._files import write\nfrom ._files import FORMATS\n"),
        ("cli/heads.py", "from headwise._io import atomic_write\nfrom headwise.cli._app import app\nimport rich\n"),
        ("core/attention.py", "from __future__ import annotations\nfrom headwise.core import masks\n"),
        ("analysis/corpus.py", "import numpy as np\nfrom headwise.viz import FORMATS\n"),
    ]
    assert private_leaks(sources, PACKAGES) == []
    assert rich_users(sources) == []


def test_a_floor_importing_one_above_it_is_reported():
    sources = [
        ("study/decoder.py", "from headwise.viz.headview import write_headview\nfrom headwise.analysis import Probe\n"),
        ("analysis/corpus.py", "def f():\n    from headwise.models import open_model\n"),
        ("sizing/hf_config.py", "from headwise.cli._app import CLIError\n"),
        ("lab/prune.py", "from headwise.study import run_importance\nfrom headwise.models import open_model\n"),
        ("lab/induction.py", "from headwise.commands.lab import run\n"),
        ("commands/lab.py", "from headwise.study import run_importance\nfrom headwise.lab import prune\n"),
        ("commands/heads.py", "from headwise.cli.heads import show\nfrom headwise.viz.report import OUTPUTS\n"),
        ("cli/lab.py", "from headwise.commands.lab import run\nfrom headwise.cli._app import app\n"),
        ("__main__.py", "from headwise.cli import main\n"),
        ("viz/report.py", "from headwise.analysis import HeadReport\n"),
    ]
    packages = {"study", "viz", "analysis", "models", "cli", "lab", "sizing", "commands"}
    assert floor_breaches(sources, packages) == [
        "study/decoder.py:1: headwise.viz.headview",
        "analysis/corpus.py:2: headwise.models",
        "sizing/hf_config.py:1: headwise.cli._app",
        "lab/prune.py:1: headwise.study",
        "lab/induction.py:1: headwise.commands.lab",
        "commands/heads.py:1: headwise.cli.heads",
    ]


def test_an_import_cycle_is_reported():
    """The loop that ``models/folder.py`` and ``models/lab_checkpoint.py`` once made — one side importing inside a
    function — is found; a third module outside it is not part of it."""
    sources = [
        ("models/__init__.py", "from headwise.models.folder import inspect_folder\n"),
        ("models/folder.py", "from headwise.models.lab_checkpoint import is_lab_config\n"),
        ("models/lab_checkpoint.py", "def load():\n    from headwise.models.folder import read_safetensors\n"),
        ("models/sources.py", "from headwise.models import folder\nfrom headwise.models.lab_checkpoint import load\n"),
    ]
    graph = import_graph(sources)
    assert graph["headwise.models.sources"] == {"headwise.models.folder", "headwise.models.lab_checkpoint"}
    assert import_cycles(graph) == [["headwise.models.folder", "headwise.models.lab_checkpoint"]]


def test_a_package_facade_makes_no_cycle():
    """``from headwise.models import BertConfig`` inside ``models/folder.py`` depends on ``models/config.py``, where
    the name is defined, not on the package whose ``__init__`` imports ``folder``; a relative import is resolved."""
    sources = [
        ("models/__init__.py", "from .config import BertConfig\nfrom headwise.models.folder import inspect_folder\n"),
        ("models/config.py", "import json\n"),
        ("models/folder.py", "def count():\n    from headwise.models import BertConfig\n"),
    ]
    graph = import_graph(sources)
    assert graph["headwise.models.folder"] == {"headwise.models.config"}
    assert import_cycles(graph) == []
    three = [("a.py", "import headwise.b\n"), ("b.py", "from headwise import c\n"), ("c.py", "from . import a\n")]
    assert import_cycles(import_graph(three)) == [["headwise.a", "headwise.b", "headwise.c"]]


def test_a_command_reaching_into_another_is_reported():
    sources = [
        ("cli/lab.py", "from headwise.cli._heads_model import run_importance\nfrom headwise.cli._app import app\n"),
        ("cli/patch.py", "from headwise.cli import heads\nfrom headwise.cli._progress import stage_progress\n"),
        ("cli/__init__.py", "from headwise.cli._app import CLIError, app\n"),
        ("cli/heads.py", "from headwise.study import HeadsOptions\nfrom headwise.cli._output import write_pruning\n"),
    ]
    assert command_reaches(sources) == ["cli/lab.py:1: headwise.cli._heads_model", "cli/patch.py:1: headwise.cli.heads"]
