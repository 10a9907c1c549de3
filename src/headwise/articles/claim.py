"""A claim of a source article, how to read its printed figure, and how to check it against headwise.

A :class:`Claim` keeps the article's words verbatim (``printed``, copied from the article, its
section named) and a function that recomputes the figure with headwise (``compute``). A
:class:`Rule` reads the figure out of the words and says whether the computed value agrees.

Status of a checked claim:

- ``pass``: the computed value agrees with what the article prints.
- ``erratum``: the article is known to be wrong here; the computed value disagrees with the
  article *and* agrees with the correction (``correct``, transcribed from the errata list).
- ``FAIL``: anything else — a disagreement, an erratum that no longer holds, or an exception.
"""

from __future__ import annotations

import ast
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "Claim",
    "Result",
    "Rule",
    "Shape",
    "Count",
    "Decimals",
    "Below",
    "Above",
    "Approx",
    "Text",
    "Holds",
    "check",
    "PASS",
    "ERRATUM",
    "FAIL",
    "QUANTITIES",
]

PASS, ERRATUM, FAIL = "pass", "erratum", "FAIL"

#: What a claim about a real model's size may claim (see :attr:`Claim.quantity`).
QUANTITIES = ("attention", "total", "attention_share")

_FLOAT = r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?"


def _last_brackets(text: str) -> str:
    """The last bracketed group of ``text``, nested brackets included (``"PE[1] : [0.8, 0.5]"`` -> ``"[0.8, 0.5]"``)."""
    end = text.rindex("]")
    depth = 0
    for i in range(end, -1, -1):
        depth += {"]": 1, "[": -1}.get(text[i], 0)
        if depth == 0:
            return text[i : end + 1]
    raise ValueError(f"unbalanced brackets in {text!r}")


class Rule:
    """How a printed figure is read (``parse``), compared (``agrees``) and a computed one shown (``show``)."""

    #: a few words on the comparison, shown with the claim
    describe = ""

    def parse(self, text: str) -> Any:
        raise NotImplementedError

    def agrees(self, expected: Any, computed: Any) -> bool:
        raise NotImplementedError

    def show(self, computed: Any) -> str:
        return str(computed)


class Shape(Rule):
    """A tensor shape: ``torch.Size([2, 10, 128])`` or ``(3, 4)``; exact.

    Args:
        style: how a computed shape is shown: ``"torch"`` (``torch.Size([3, 4])``) or ``"numpy"`` (``(3, 4)``).
    """

    describe = "exact"

    def __init__(self, style: str = "torch"):
        if style not in ("torch", "numpy"):
            raise ValueError(f"style: expected 'torch' or 'numpy', got {style!r}")
        self.style = style

    def parse(self, text: str) -> tuple[int, ...]:
        m = re.search(r"[\[(]\s*(\d+(?:\s*,\s*\d+)*)\s*,?\s*[\])]", text)
        if not m:
            raise ValueError(f"no shape in {text!r}")
        return tuple(int(n) for n in m.group(1).split(","))

    def agrees(self, expected, computed) -> bool:
        return tuple(expected) == tuple(int(n) for n in computed)

    def show(self, computed) -> str:
        dims = [str(int(n)) for n in computed]
        if self.style == "numpy":
            return f"({dims[0]},)" if len(dims) == 1 else f"({', '.join(dims)})"
        return f"torch.Size([{', '.join(dims)}])"


class Count(Rule):
    """An integer such as ``66,048`` or ``h=12`` (the last integer in the text); exact."""

    describe = "exact"
    _WORDS = {"zero": 0, "one": 1, "two": 2, "three": 3, "four": 4}

    def parse(self, text: str) -> int:
        word = text.strip().lower()
        if word in self._WORDS:
            return self._WORDS[word]
        found = re.findall(r"\d[\d,]*", text)
        if not found:
            raise ValueError(f"no integer in {text!r}")
        return int(found[-1].replace(",", ""))

    def agrees(self, expected, computed) -> bool:
        return int(computed) == expected

    def show(self, computed) -> str:
        return f"{int(computed):,}"


class Decimals(Rule):
    """Numbers as the article rounds them: a scalar, a list ``[0.8415, …]`` or a NumPy-printed matrix.

    Agrees when the computed array has the printed shape and rounds (``np.round``) to the printed
    numbers at ``places`` decimals.
    """

    def __init__(self, places: int = 4):
        self.places = places
        self.describe = f"to {places} decimals"

    def parse(self, text: str) -> np.ndarray:
        if "]" in text:
            body = _last_brackets(text)
            body = re.sub(r"(?<=[\d.])\s+(?=[-+\d.])", ", ", body)  # NumPy prints "0.472  0.2676"
            body = re.sub(r"\]\s*\[", "], [", body)
            return np.asarray(ast.literal_eval(body), dtype=np.float64)
        found = re.findall(_FLOAT, text)
        if not found:
            raise ValueError(f"no number in {text!r}")
        return np.asarray(float(found[-1]))

    def agrees(self, expected, computed) -> bool:
        c = np.asarray(computed, dtype=np.float64)
        return c.shape == expected.shape and bool(np.all(np.abs(np.round(c, self.places) - expected) < 1e-9))

    def show(self, computed) -> str:
        c = np.round(np.asarray(computed, dtype=np.float64), self.places)
        if c.ndim == 0:
            return f"{float(c):.{self.places}f}"
        if c.ndim == 1:
            return "[" + ", ".join(f"{v:.{self.places}f}" for v in c) + "]"
        return np.array2string(c, precision=self.places, floatmode="maxprec", suppress_small=False)


class Below(Rule):
    """A number that only has to be small: agrees when ``computed < threshold`` (the printed figure is shown only)."""

    def __init__(self, threshold: float):
        self.threshold = threshold
        self.describe = f"< {threshold:.0e}"

    def parse(self, text: str):
        return None

    def agrees(self, expected, computed) -> bool:
        return bool(float(computed) < self.threshold)

    def show(self, computed) -> str:
        return f"{float(computed):.2e}"


class Above(Below):
    """A number that has to be clearly non-zero: agrees when ``computed > threshold``."""

    def __init__(self, threshold: float):
        super().__init__(threshold)
        self.describe = f"> {threshold:.0e}"

    def agrees(self, expected, computed) -> bool:
        return bool(float(computed) > self.threshold)


class Approx(Rule):
    """A rounded figure such as ``2.1B``, ``~1.5B``, ``117M`` or ``26%``; agrees within ``rel`` (relative)."""

    _SCALE = {"": 1.0, "K": 1e3, "M": 1e6, "B": 1e9, "T": 1e12, "%": 0.01}

    def __init__(self, rel: float = 0.05):
        self.rel = rel
        self.describe = f"within {rel:.0%}"

    def parse(self, text: str) -> float:
        m = re.search(r"(\d+(?:\.\d+)?)\s*([KMBT%]?)", text)
        if not m:
            raise ValueError(f"no figure in {text!r}")
        return float(m.group(1)) * self._SCALE[m.group(2)]

    def agrees(self, expected, computed) -> bool:
        return bool(math.isclose(float(computed), expected, rel_tol=self.rel))

    def show(self, computed) -> str:
        v = float(computed)
        if 0 < abs(v) < 1:
            return f"{v:.1%}"
        for suffix, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
            if abs(v) >= scale:
                return f"{v / scale:.2f}{suffix} ({int(round(v)):,})"
        return f"{v:g}"


class Text(Rule):
    """A word (a token name); exact."""

    describe = "exact"

    def parse(self, text: str) -> str:
        return text.strip()

    def agrees(self, expected, computed) -> bool:
        return str(computed) == expected


class Holds(Rule):
    """A statement without a figure; ``compute`` returns ``(holds: bool, what was measured: str)``."""

    describe = "holds"

    def parse(self, text: str):
        return True

    def agrees(self, expected, computed) -> bool:
        return bool(computed[0])

    def show(self, computed) -> str:
        return str(computed[1])


@dataclass(frozen=True)
class Claim:
    """One checkable statement of an article.

    Attributes:
        key: a short unique id (``"p4.params.scratch"``).
        article: which article (a key of :data:`headwise.articles.ARTICLES`).
        section: the article's section (its heading, or the figure or table name).
        what: what is claimed, in a few words.
        printed: the article's words, verbatim (a test checks they occur in the article).
        compute: recomputes the figure with headwise; its return value goes to ``rule``.
        rule: how ``value`` is read and compared.
        value: the part of ``printed`` that holds the figure (default: all of ``printed``).
        correct: for a known erratum, the correct figure (as text, read by ``rule``).
        note: why the claim is checked this way, or what the erratum is.
        model: for a claim about a real model's size, the architecture (a name
            :func:`headwise.sizing.get_arch` knows); ``headwise size`` shows the claim beside it.
        quantity: what of that model is claimed: one of :data:`QUANTITIES` (``attention``: attention
            parameters over all layers; ``total``: all parameters; ``attention_share``: their ratio).
    """

    key: str
    article: str
    section: str
    what: str
    printed: str
    compute: Callable[[], Any]
    rule: Rule
    value: str | None = None
    correct: str | None = None
    note: str = ""
    model: str | None = None
    quantity: str | None = None

    def __post_init__(self):
        if (self.model is None) != (self.quantity is None):
            raise ValueError(
                f"claim {self.key}: expected model and quantity together, got {self.model!r}, {self.quantity!r}"
            )
        if self.quantity is not None and self.quantity not in QUANTITIES:
            raise ValueError(f"claim {self.key}: quantity: expected one of {QUANTITIES}, got {self.quantity!r}")

    @property
    def figure(self) -> str:
        """The printed figure the rule reads (``value`` or all of ``printed``)."""
        return self.printed if self.value is None else self.value

    @property
    def expected(self) -> Any:
        """The printed figure, parsed."""
        return self.rule.parse(self.figure)


@dataclass(frozen=True)
class Result:
    """A checked claim.

    Attributes:
        claim: the claim.
        status: ``"pass"``, ``"erratum"`` or ``"FAIL"``.
        computed: the value headwise computed (None if it raised).
        shown: ``computed`` as the rule prints it, or the error.
    """

    claim: Claim
    status: str
    computed: Any
    shown: str


def check(claim: Claim) -> Result:
    """Recompute ``claim`` with headwise and compare; never raises (an exception is a ``FAIL``)."""
    try:
        computed = claim.compute()
        shown = claim.rule.show(computed)
        agrees = claim.rule.agrees(claim.expected, computed)
        if claim.correct is None:
            status = PASS if agrees else FAIL
        else:
            fixed = claim.rule.agrees(claim.rule.parse(claim.correct), computed)
            status = ERRATUM if fixed and not agrees else FAIL
    except Exception as e:  # a claim that cannot be recomputed is a failed claim, shown in the table
        return Result(claim, FAIL, None, f"error: {type(e).__name__}: {e}")
    return Result(claim, status, computed, shown)
