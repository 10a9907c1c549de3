"""What the restart workers print for their tests to read."""

from __future__ import annotations

import os


def say(line: str) -> None:
    """One line in one write to the pipe the ranks share: their lines never interleave (``print`` writes the text and
    the newline apart when the stream is unbuffered, as with ``PYTHONUNBUFFERED=1``)."""
    os.write(1, (line + "\n").encode())
