"""Files that appear whole or not at all — the one mechanism every writer of headwise uses.

:func:`atomic_write` opens a temporary file beside the destination (``.<name>.<random>.tmp`` in the same
folder, so that the final rename stays on one file system), lets the caller write it, flushes it to disk
and renames it over the destination with ``os.replace`` — atomic on POSIX and Windows. If anything goes
wrong before the rename (an error, a full disk, Ctrl-C: any ``BaseException``), the temporary file is
removed and the destination is untouched: a reader sees the previous file or the complete new one,
never a half-written one. :func:`append_line` adds one line to a log whole or not at all (one ``write`` of the
line to a file opened for appending).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

__all__ = ["append_line", "atomic_write", "atomic_folder", "write_text_atomic", "TEMP_PREFIX", "TEMP_SUFFIX"]

#: Temporary names are ``TEMP_PREFIX + name + "." + 12 hex digits + TEMP_SUFFIX``.
TEMP_PREFIX, TEMP_SUFFIX = ".", ".tmp"
_MODES = ("w", "wb")


@contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "w", *, encoding: str = "utf-8") -> Iterator[IO]:
    """Write ``path`` through a temporary file that is renamed over it only when the block succeeds.

    Args:
        path: the destination; its folder must exist.
        mode: ``"w"`` (text, ``encoding``, no newline translation) or ``"wb"`` (bytes).
        encoding: the text encoding for ``"w"``.
    Yields:
        The open temporary file.
    Raises:
        ValueError: another ``mode``.
        OSError: the folder is missing or not writable, or the disk is full (nothing is left behind).
    """
    if mode not in _MODES:
        raise ValueError(f"mode: expected one of {_MODES}, got {mode!r}")
    path = Path(path)
    tmp = path.with_name(f"{TEMP_PREFIX}{path.name}.{uuid.uuid4().hex[:12]}{TEMP_SUFFIX}")
    # "x": never clobber; the usual permissions (umask), unlike mkstemp's 0600
    text = {"encoding": encoding, "newline": ""} if mode == "w" else {}
    try:
        with open(tmp, mode.replace("w", "x"), **text) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())  # the bytes are on disk before the name points at them
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def append_line(path: str | os.PathLike, line: str) -> None:
    """Append ``line`` (one line, UTF-8; a newline added) to ``path`` in one ``write`` of a file opened with
    ``O_APPEND`` (created when missing): concurrent appenders never interleave within a line on a local file
    system, and an interrupted call adds the whole line or nothing of it.

    Raises:
        ValueError: a line holding a newline. OSError: the folder is missing or not writable.
    """
    if "\n" in line or "\r" in line:
        raise ValueError("line: expected one line, got a text with a line break")
    data = (line + "\n").encode("utf-8")
    fd = os.open(os.fspath(path), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` with :func:`atomic_write`. Returns ``path`` as a Path."""
    with atomic_write(path, "w") as fh:
        fh.write(text)
    return Path(path)


@contextmanager
def atomic_folder(path: str | os.PathLike, *, keep: tuple[str, ...] = ()) -> Iterator[Path]:
    """Fill a folder that appears at ``path`` whole or not at all.

    Yields a fresh temporary folder beside ``path`` (``.<name>.<random>.tmp``); write the files into it
    (with :func:`atomic_write`). When the block succeeds the folder is renamed to ``path``; if ``path``
    already is a folder, it is first renamed aside (``.<name>.<random>.old``) and removed once the new
    one is in place — so at every moment ``path`` is the old folder, the complete new one, or (between
    the two renames) absent with the old one kept aside. If anything goes wrong before the rename
    (an error, Ctrl-C), the temporary folder is removed and ``path`` is untouched. ``keep``: names of entries of
    the old folder moved into the new one just before the swap (a resumable run's shards), unless the block wrote
    its own.

    Raises:
        NotADirectoryError: ``path`` exists and is not a folder.
        OSError: the parent folder is missing or not writable.
    """
    import shutil

    path = Path(path)
    if path.exists() and not path.is_dir():
        raise NotADirectoryError(f"{path}: exists and is not a folder")
    tag = uuid.uuid4().hex[:12]
    tmp = path.with_name(f"{TEMP_PREFIX}{path.name}.{tag}{TEMP_SUFFIX}")
    tmp.mkdir()
    moved: list[str] = []
    try:
        yield tmp
        for name in keep:
            if (path / name).exists() and not (tmp / name).exists():
                os.replace(path / name, tmp / name)
                moved.append(name)
        if path.is_dir() and any(path.iterdir()):
            old = path.with_name(f"{TEMP_PREFIX}{path.name}.{tag}.old")
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)  # onto nothing, or onto an empty folder (POSIX rename)
    except BaseException:
        for name in moved:  # the swap failed: the kept entries go back where they were
            if path.is_dir() and not (path / name).exists():
                os.replace(tmp / name, path / name)
        shutil.rmtree(tmp, ignore_errors=True)
        raise
