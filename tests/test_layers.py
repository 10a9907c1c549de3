"""Source scans of the package's own rules on imports: no package reaches into another's private names,
and only the command line draws terminal UI (``rich``)."""

from __future__ import annotations

import ast
from pathlib import Path

import headwise

SRC = Path(headwise.__file__).resolve().parent


def _package(path: Path) -> str | None:
    """The subpackage a source file belongs to (``"viz"``), None for a module at the package root."""
    parts = path.relative_to(SRC).parts
    return parts[0] if len(parts) > 1 else None


def _imports(path: Path):
    """``(line, module, names)`` of every import of ``path``, relative imports resolved."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    here = ["headwise", *path.relative_to(SRC).with_suffix("").parts]
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


def _sources():
    return sorted(p for p in SRC.rglob("*.py") if "data" not in p.relative_to(SRC).parts)


def test_no_private_name_crosses_a_boundary():
    """A package's private modules (``viz/_files.py``) serve that package alone: ``from
    headwise.viz._files import X`` from cli/ is a leak, from viz/heads.py it is not. A module's private
    names (``ring._check_layout``) serve that module alone, not even its siblings. Modules at the package
    root (``headwise._io``, the one way files are written) are shared by every package."""
    subpackages = {p.name for p in SRC.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    leaks = []
    for path in _sources():
        own = _package(path)
        for line, module, names in _imports(path):
            parts = module.split(".")
            if parts[0] != "headwise" or len(parts) < 2:
                continue
            other_package = parts[1] in subpackages and parts[1] != own
            if (other_package and any(_private(p) for p in parts[2:])) or any(_private(n) for n in names):
                leaks.append(f"{path.relative_to(SRC)}:{line}: {module} {names}")
    assert leaks == []


def test_only_the_command_line_imports_rich():
    users = [
        f"{path.relative_to(SRC)}:{line}"
        for path in _sources()
        if _package(path) != "cli"
        for line, module, _ in _imports(path)
        if module == "rich" or module.startswith("rich.")
    ]
    assert users == []


def test_the_scan_sees_a_leak():
    """The scan is not vacuous: it reads the imports this file's rules are about."""
    found = {(module, tuple(names)) for _, module, names in _imports(SRC / "cli" / "_output.py")}
    assert ("headwise.viz", ("FORMATS",)) in found
    assert ("headwise.cli._app", ("CLIError",)) in found
