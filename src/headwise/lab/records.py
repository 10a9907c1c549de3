"""The lab's result files as text: JSON (tuples as lists, anything else unknown as its string) and CSV rows of named
columns — what ``headwise lab`` writes, each file atomically, beside its pictures."""

from __future__ import annotations

import csv
import io
import json

__all__ = ["csv_text", "json_text"]


def json_text(data) -> str:
    """``data`` as indented JSON, ending in a newline."""
    return json.dumps(data, indent=2, default=lambda o: list(o) if isinstance(o, tuple) else str(o)) + "\n"


def csv_text(rows: list[dict], columns: list[str]) -> str:
    """``rows`` as CSV with a header of ``columns`` (keys outside them left out)."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n", extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()
