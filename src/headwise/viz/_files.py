"""Figure files, written atomically (:func:`headwise._io.atomic_write`: a temporary name in the
destination folder, then ``os.replace``).

A reader of the destination path sees either the previous file or the complete new one, never a
half-written picture.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from headwise._io import atomic_write

#: Formats matplotlib writes that the command line accepts, by file suffix.
FORMATS = ("png", "svg", "pdf")


@dataclass(frozen=True)
class HeatmapFile:
    """A picture written to disk.

    Attributes:
        path: where it is.
        width, height: its size in pixels (``figsize · dpi``).
    """

    path: Path
    width: int
    height: int


def image_format(path: str | os.PathLike) -> str:
    """The format named by ``path``'s suffix.

    Raises:
        ValueError: the suffix is not one of :data:`FORMATS`.
    """
    suffix = Path(path).suffix.lower().lstrip(".")
    if suffix not in FORMATS:
        raise ValueError(f"path: expected a file name ending in .png, .svg or .pdf, got {str(path)!r}")
    return suffix


def save_figure(fig, path: str | os.PathLike, *, dpi: int) -> Path:
    """Write ``fig`` (a ``matplotlib.figure.Figure``) to ``path`` atomically.

    Args:
        fig: the figure.
        path: destination; its folder must exist. The format comes from the suffix (png, svg, pdf).
        dpi: dots per inch; the picture is ``figsize · dpi`` pixels (no tight cropping).
    Returns:
        ``path`` as a :class:`~pathlib.Path`.
    Raises:
        ValueError: an unsupported suffix.
        OSError: the folder is missing or not writable (nothing is left behind).
    """
    path = Path(path)
    fmt = image_format(path)
    with atomic_write(path, "wb") as fh:
        fig.savefig(fh, format=fmt, dpi=dpi)
    return path


def inline_page(stem: str, marker: str, payload: dict) -> str:
    """An offline page: ``{stem}.html`` of this package with ``{stem}.js`` and ``payload`` (as JSON) inlined at its
    ``/*__{marker}_JS__*/`` and ``/*__{marker}_DATA__*/`` comments. JSON inside ``<script>``: no ``<`` may appear
    raw (no ``</script>``, no ``<!--``), so it is written ``\\u003c`` (the same string)."""
    package = resources.files("headwise.viz")
    template = (package / f"{stem}.html").read_text(encoding="utf-8")
    script = (package / f"{stem}.js").read_text(encoding="utf-8")
    blob = json.dumps(payload, ensure_ascii=False, separators=(",", ":")).replace("<", "\\u003c")
    if "</script" in script.lower():
        raise ValueError(f"{stem}.js: the script must not contain '</script'")
    return template.replace(f"/*__{marker}_DATA__*/", blob).replace(f"/*__{marker}_JS__*/", script)


def layer_head_axes(ax, num_layers: int, num_heads: int) -> None:
    """A layer × head map's axes: every head numbered along x, at most about 30 layer numbers along y."""
    ax.set_xticks(range(num_heads), [str(x) for x in range(num_heads)], fontsize=6)
    step = max(1, num_layers // 30)
    ax.set_yticks(range(0, num_layers, step), [str(x) for x in range(0, num_layers, step)], fontsize=6)
    ax.set_xlabel("head", fontsize=7)
    ax.set_ylabel("layer", fontsize=7)
