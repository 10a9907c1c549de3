"""A corpus on disk: the non-empty lines of a UTF-8 text file, streamed (:class:`CorpusFile`), what
:func:`headwise.analysis.analyze_texts` and the studies read a ``--corpus`` through."""

from __future__ import annotations

import os
from collections.abc import Iterator

__all__ = ["CorpusFile"]


class CorpusFile:
    """Stream the non-empty lines of a UTF-8 text file, skipping (and counting) undecodable ones.

    A line that is not valid UTF-8 is skipped, never guessed at; its number is recorded in
    ``undecodable`` (the first 20 kept) and counted in ``num_undecodable``. Surrounding whitespace is
    stripped; blank lines are skipped and counted in ``num_blank``. Iterating again rereads the file.

    Args:
        path: the text file.
    Raises:
        FileNotFoundError: no such file. ValueError: a directory.
    """

    def __init__(self, path):
        self.path = os.fspath(path)
        if not os.path.exists(self.path):
            raise FileNotFoundError(f"corpus: no such file: {self.path}")
        if os.path.isdir(self.path):
            raise ValueError(f"corpus: expected a text file, got a directory: {self.path}")
        self.num_undecodable = 0
        self.num_blank = 0
        self.undecodable: list[int] = []

    def __iter__(self) -> Iterator[str]:
        self.num_undecodable, self.num_blank, self.undecodable = 0, 0, []
        with open(self.path, "rb") as f:
            for number, raw in enumerate(f, start=1):
                try:
                    line = raw.decode("utf-8").strip()
                except UnicodeDecodeError:
                    self.num_undecodable += 1
                    if len(self.undecodable) < 20:
                        self.undecodable.append(number)
                    continue
                if line.startswith("\ufeff"):
                    line = line[1:].strip()
                if not line:
                    self.num_blank += 1
                    continue
                yield line

    def count(self) -> int:
        """Number of lines the iteration yields (one pass over the file, constant memory)."""
        return sum(1 for _ in self)
