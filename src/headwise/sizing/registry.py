"""The built-in architectures, read from ``headwise/data/architectures.json``, and lookup by name."""

from __future__ import annotations

import difflib
import functools
import json
import re
from importlib import resources

from headwise.sizing.arch import Architecture

__all__ = ["get_arch", "list_archs", "load_architectures", "normalize_name"]

DATA_FILE = "architectures.json"


def normalize_name(name: str) -> str:
    """Lower-case ``name`` and drop everything but letters and digits: ``"Llama-3-8B"`` -> ``"llama38b"``."""
    return re.sub(r"[^0-9a-z]", "", str(name).lower())


@functools.lru_cache(maxsize=1)
def load_architectures() -> tuple[Architecture, ...]:
    """Read every architecture of the package's data file, in file order.

    Returns:
        The architectures.

    Raises:
        ValueError: the data file is malformed, or two entries share a name or alias.
    """
    text = resources.files("headwise").joinpath("data", DATA_FILE).read_text(encoding="utf-8")
    entries = json.loads(text)["architectures"]
    archs = tuple(Architecture.from_dict(e, where=f"{DATA_FILE}[{i}]") for i, e in enumerate(entries))
    _index(archs)  # refuses clashing names
    return archs


def _index(archs: tuple[Architecture, ...]) -> dict[str, Architecture]:
    index: dict[str, Architecture] = {}
    for arch in archs:
        for key in {normalize_name(n) for n in (arch.name, *arch.aliases)}:
            if key in index and index[key] is not arch:
                raise ValueError(f"{DATA_FILE}: {arch.name!r} and {index[key].name!r} share the name {key!r}")
            index[key] = arch
    return index


@functools.lru_cache(maxsize=1)
def _lookup() -> dict[str, Architecture]:
    return _index(load_architectures())


def list_archs() -> list[str]:
    """Names of the built-in architectures, in the data file's order."""
    return [a.name for a in load_architectures()]


def get_arch(name: str) -> Architecture:
    """A built-in architecture by name or alias, ignoring case, spaces, ``-``, ``_`` and ``.``.

    ``"llama-3-8b"``, ``"Llama-3-8B"``, ``"llama3_8b"`` and ``"meta-llama/Meta-Llama-3-8B"`` all find
    Llama-3-8B.

    Args:
        name: the name.

    Returns:
        The architecture.

    Raises:
        ValueError: no architecture has that name; the message suggests the closest known names.
    """
    if isinstance(name, Architecture):
        return name
    if not isinstance(name, str):
        raise TypeError(f"name must be a string, got {type(name).__name__}")
    lookup = _lookup()
    key = normalize_name(name)
    if key in lookup:
        return lookup[key]
    close = difflib.get_close_matches(key, list(lookup), n=8, cutoff=0.5)
    suggestions = list(dict.fromkeys(lookup[k].name for k in close))[:3]
    if suggestions:
        raise ValueError(
            f"unknown architecture {name!r}; closest known: {', '.join(suggestions)} "
            f"({len(load_architectures())} known, see headwise.sizing.list_archs())"
        )
    raise ValueError(f"unknown architecture {name!r}; known: {', '.join(list_archs())}")
