"""Argument checks shared by every package, so that their messages cannot drift.

Each raises with the message shape the whole project uses: ``"<name>: expected <what>, got <value>"``.
Pure Python (no torch, no NumPy), so the NumPy reference may use it too.
"""

from __future__ import annotations

from collections.abc import Iterable


def positive_int(name: str, value) -> int:
    """``value`` if it is an ``int`` (not a bool) ≥ 1; else ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name}: expected a positive integer, got {value!r}")
    return value


def non_negative_int(name: str, value) -> int:
    """``value`` if it is an ``int`` (not a bool) ≥ 0; else ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name}: expected a non-negative integer, got {value!r}")
    return value


def positive_number(name: str, value) -> float:
    """``float(value)`` if it is a finite real number > 0; else ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
        raise ValueError(f"{name}: expected a positive number, got {value!r}")
    return float(value)


def probability(name: str, value) -> float:
    """``float(value)`` if it lies in ``[0, 1)`` (a dropout rate); else ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
        raise ValueError(f"{name}: expected a probability in [0, 1), got {value!r}")
    return float(value)


def one_of(name: str, value, choices: Iterable):
    """``value`` if it is one of ``choices``; else ValueError naming ``name`` and listing them."""
    choices = tuple(choices)
    if value not in choices:
        raise ValueError(f"{name}: expected one of {choices}, got {value!r}")
    return value
