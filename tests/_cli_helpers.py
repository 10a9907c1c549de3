"""Checks shared by the command-line tests."""

from __future__ import annotations


def assert_user_error(outcome, *words: str) -> None:
    """Exit 2, one line on stderr starting ``headwise: error:``, no traceback, naming ``words``."""
    assert outcome.code == 2, (outcome.code, outcome.out, outcome.err)
    lines = outcome.err.strip().splitlines()
    assert len(lines) == 1, outcome.err
    assert lines[0].startswith("headwise: error:"), lines[0]
    assert "Traceback" not in outcome.err + outcome.out
    for w in words:
        assert w in lines[0], (w, lines[0])
