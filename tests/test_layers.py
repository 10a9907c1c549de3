"""Source scans of the package's own rules on imports: no package reaches into another's private names,
and only the command line draws terminal UI (``rich``).

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
        ("cli/heads.py", "from rich.table import Table\nimport rich\n"),
    ]
    assert rich_users(sources) == ["viz/heads.py:1", "analysis/corpus.py:2", "_io.py:1"]


def test_clean_sources_pass_both_scans():
    sources = [
        ("viz/heads.py", "from headwise.viz._files import write\nfrom ._files import FORMATS\n"),
        ("cli/heads.py", "from headwise._io import atomic_write\nfrom headwise.cli._app import app\nimport rich\n"),
        ("core/attention.py", "from __future__ import annotations\nfrom headwise.core import masks\n"),
        ("analysis/corpus.py", "import numpy as np\nfrom headwise.viz import FORMATS\n"),
    ]
    assert private_leaks(sources, PACKAGES) == []
    assert rich_users(sources) == []
