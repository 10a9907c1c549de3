"""The output folders the commands write: checked, or created, before any work (errors naming the option)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["check_out", "out_folder", "prepare_folder"]


def prepare_folder(path: Path, option: str) -> Path:
    """Create the output folder ``path`` (and its parents) if needed.

    Raises:
        ValueError: ``path`` is a file, or cannot be created (the message names ``option``).
    """
    check_out(path, option)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"{option}: cannot create the folder '{path}': {e.strerror or e}") from None
    return path


def check_out(path: Path, option: str = "--out") -> None:
    """Refuse an output folder that is a file (written whole later, or not at all).

    Raises:
        ValueError: ``path`` exists and is not a folder (the message names ``option``).
    """
    if path.exists() and not path.is_dir():
        raise ValueError(f"{option}: '{path}' exists and is not a folder")


def out_folder(out: Path, option: str = "--out") -> Path:
    """Check that ``out`` can become an output folder written whole later (its parent is created).

    Raises:
        ValueError: ``out`` is a file, or its parent cannot be created (the message names ``option``).
    """
    check_out(out, option)
    try:
        out.absolute().parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"{option}: cannot create the folder '{out.parent}': {e.strerror or e}") from None
    return out
