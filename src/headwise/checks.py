"""Argument checks shared by every package, so that their messages cannot drift.

Each raises with the message shape the whole project uses: ``"<name>: expected <what>, got <value>"``.
Pure Python (no torch, no NumPy), so the NumPy reference may use it too. Integers are any
:class:`numbers.Integral` but ``bool`` (NumPy integers included, returned as ``int``); numbers any
:class:`numbers.Real` but ``bool`` (returned as ``float``).
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def positive_int(name: str, value) -> int:
    """``int(value)`` if it is an integer (not a bool) ≥ 1; else ValueError naming ``name``."""
    if not _is_int(value) or value <= 0:
        raise ValueError(f"{name}: expected a positive integer, got {value!r}")
    return int(value)


def non_negative_int(name: str, value) -> int:
    """``int(value)`` if it is an integer (not a bool) ≥ 0; else ValueError naming ``name``."""
    if not _is_int(value) or value < 0:
        raise ValueError(f"{name}: expected a non-negative integer, got {value!r}")
    return int(value)


def positive_number(name: str, value) -> float:
    """``float(value)`` if it is a finite real number > 0; else ValueError naming ``name``."""
    if not _is_real(value) or not 0 < value < float("inf"):
        raise ValueError(f"{name}: expected a positive number, got {value!r}")
    return float(value)


def probability(name: str, value) -> float:
    """``float(value)`` if it lies in ``[0, 1)`` (a dropout rate); else ValueError naming ``name``."""
    if not _is_real(value) or not 0.0 <= value < 1.0:
        raise ValueError(f"{name}: expected a probability in [0, 1), got {value!r}")
    return float(value)


def number_in(
    name: str, value, low: float, high: float, *, low_closed: bool = True, high_closed: bool = False
) -> float:
    """``float(value)`` if it is a real number in the interval from ``low`` to ``high``; else ValueError.

    ``low_closed`` / ``high_closed`` say whether the ends belong to the interval; the message writes it
    as ``[low, high)`` and so on. NaN is never inside.
    """
    above = _is_real(value) and (value >= low if low_closed else value > low)
    if not (above and (value <= high if high_closed else value < high)):
        interval = f"{'[' if low_closed else '('}{low}, {high}{']' if high_closed else ')'}"
        raise ValueError(f"{name}: expected a number in {interval}, got {value!r}")
    return float(value)


def one_of(name: str, value, choices: Iterable):
    """``value`` if it is one of ``choices``; else ValueError naming ``name`` and listing them."""
    choices = tuple(choices)
    if value not in choices:
        raise ValueError(f"{name}: expected one of {choices}, got {value!r}")
    return value


def layer_number(name: str, layer, num_layers: int, *, subject: str | None = None, model: str | None = None) -> int:
    """``int(layer)`` if it is an integer in ``[0, num_layers)``: the one layer range check of every package.

    Args:
        name: the argument named in the message (``"layers"``, ``"--head"``).
        subject: how the value is named after ``name:`` (default ``"layer <n>"``).
        model: the model's name for the short form a command line prints (``"expected 0 … 5 (all-MiniLM-L6-v2
            has 6 layers), got 9"``); None: ``"<subject> is out of range: the model has N attention layers
            (0..N-1)"``.
    Raises:
        TypeError: not an integer (a bool is not); ValueError: out of range.
    """
    if not _is_int(layer):
        raise TypeError(f"{name}: expected layer numbers as ints, got {layer!r}")
    if not 0 <= layer < num_layers:
        if model is not None:
            raise ValueError(f"{name}: expected 0 … {num_layers - 1} ({model} has {num_layers} layers), got {layer}")
        raise ValueError(
            f"{name}: {subject or f'layer {layer}'} is out of range: the model has {num_layers} attention layers "
            f"(0..{num_layers - 1})"
        )
    return int(layer)


def head_number(name: str, head, layer: int, num_heads: int, *, subject: str | None = None) -> int:
    """``int(head)`` if it is an integer in ``[0, num_heads)`` (the heads of layer ``layer``).

    Raises:
        TypeError: not an integer; ValueError: ``"<name>: <subject> is out of range in layer L, which has H heads
        (0..H-1)"`` (``subject`` defaults to ``"head <n>"``).
    """
    if not _is_int(head):
        raise TypeError(f"{name}: expected head numbers as ints in layer {layer}, got {head!r}")
    if not 0 <= head < num_heads:
        raise ValueError(
            f"{name}: {subject or f'head {head}'} is out of range in layer {layer}, which has {num_heads} heads "
            f"(0..{num_heads - 1})"
        )
    return int(head)
