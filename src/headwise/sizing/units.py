"""Human-readable counts and byte sizes, shared by the command line and the docs."""

from __future__ import annotations

__all__ = ["format_count", "format_bytes"]


def format_count(n: float, digits: int = 2) -> str:
    """``124439808`` -> ``"124.44M"``; ``6738415616`` -> ``"6.74B"``; below 1000 as is.

    Args:
        n: a count.
        digits: decimals after the point.

    Returns:
        The count with a K / M / B / T suffix (powers of 1000).
    """
    for scale, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(n) >= scale:
            return f"{n / scale:.{digits}f}{suffix}"
    return f"{n:.0f}"


def format_bytes(n: float, digits: int = 2) -> str:
    """``131072`` -> ``"128.00 KiB"``; binary units (KiB, MiB, GiB, TiB).

    Args:
        n: a size in bytes.
        digits: decimals after the point.

    Returns:
        The size with a binary unit; below 1 KiB as ``"<n> B"``.
    """
    for scale, suffix in ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if abs(n) >= scale:
            return f"{n / scale:.{digits}f} {suffix}"
    return f"{n:.0f} B"
