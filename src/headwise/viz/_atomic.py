"""Atomic text files: write to a temporary name in the destination folder, then ``os.replace``."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

__all__ = ["write_text_atomic"]


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` so that a reader sees the old file or the whole new one.

    Raises:
        OSError: the folder is missing or not writable (no temporary file is left behind).
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.tmp")  # same folder: os.replace is atomic
    try:
        with open(tmp, "x", encoding="utf-8", newline="") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path
