"""Which heads ``--importance`` measures exactly: candidates from more than one estimator, then more heads in the
order their bounds give, until no unmeasured head can enter the exact top k — or the budget ends, which is said.

Shape legend: N heads (flat, ``layer · H + head``), k the top heads sought.

Scores (each ``(N,)``, ≥ 0, larger = more likely to matter):

- ``"estimate"``: |the estimated ablation effect| (a decoder's attention-aware attribution patching, an encoder's
  ``θ²/2`` of its turning rate θ);
- ``"michel"``: Michel et al. 2019's ``E_x |∂L(x)/∂ξ_h|``, the gate gradient's magnitude at the intact model. Summed
  over rows first-order terms of an early head cancel where its exact effect does not; the magnitude does not cancel.

**The first round** measures the top k of each score and ``random`` heads drawn (seeded) from the rest (a budget
below it keeps the first score's top k and the random heads, and cuts the others' picks).

**The bound.** Removing head h moves its gate ξ_h from 1 to 0, so ``ΔL_h = −∫₀¹ ∂L/∂ξ_h dξ``: its size is at most
``c · E|∂L/∂ξ_h|`` while the gradient along the way stays within c times its value at the intact model — Michel et
al.'s score bounds a decoder's heads (``bound="michel"``; an encoder's ``θ²/2`` estimate is its own bound). c is not
known; it is measured: ``c = max |exact_h| / s(h)`` over the heads measured so far (the random ones among them), and a
head's bound is ``margin · c · s(h)`` (:data:`MARGIN`) — every measured head is within it by construction. The
signed estimate is not a bound: its first-order terms cancel over rows, so its ratio to exact runs to 30 on SmolLM2.
The unmeasured head with the largest bound is measured next (``round`` a call of the batched engine), c re-measured
after each round. **The search stops** when the largest bound of an unmeasured head is below the k-th largest |exact|
measured (none of them can enter the exact top k, as far as the heads seen so far say) or when ``budget`` heads have
been measured (the summary says which, with the next bound and the threshold).

The bound is empirical, not a proof: a head whose gradient grows along its path more than ``margin`` times every
measured head's did can still be missed. Measured: on SmolLM2's default sample (64 lines, 270 heads, every head also
ablated exactly) the largest ratio over all heads is 1.76 and the search, in the bounds' order, has the exact top 10
within its first 40 heads on every seed tried; with ``margin`` 1 one tiny random GPT-2 of twelve models tried missed
one of its exact top 2, with 1.25 none did (``tests/study/test_importance_search.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["HeadSearch", "default_budget"]

#: The bounds' factor over the largest ratio seen (see the module's text): 1 missed one of a tiny GPT-2's exact top 2.
MARGIN = 1.25
#: Why a head was measured, in the order the reasons are given.
REASONS = ("estimate", "michel", "random", "bound")


def default_budget(heads: int, top_k: int) -> int:
    """Most heads measured exactly by default: 4 × ``top_k``, at most all ``heads`` — SmolLM2's 270 heads: 40, which
    hold the exact top 10 of its default sample on every seed tried (50 on its first 4 or 8 lines; docs/heads.md);
    each is about one forward pass of the sample (2.5 s there), so the default run stays within 2.5 × ``headwise
    heads``'s time."""
    return int(min(heads, 4 * top_k))


@dataclass
class HeadSearch:
    """The exact heads' search (see the module's text).

    Args:
        scores: ``{name: (N,)}`` each estimator's score, ≥ 0 (:data:`REASONS`' first names, in that order).
        top_k: the exact top heads sought; random: heads drawn from the rest in the first round; seed: their seed.
        budget: most heads measured in all (None: :func:`default_budget`); round: heads measured a round after the
            first (None: ``top_k``).
        margin: the bounds' factor over the largest ratio seen (:data:`MARGIN`); bound: the score whose measured
            ratio bounds the rest (None: the first of ``scores``).
    Use: ``heads = search.first()``; then, until ``heads`` is empty, measure them and ``heads = search.record(heads,
    exact)``. ``search.summary()`` says what was measured, why, and how the search ended.
    """

    scores: dict[str, np.ndarray]
    top_k: int
    random: int = 0
    seed: int = 0
    budget: int | None = None
    round: int | None = None
    margin: float = MARGIN
    bound: str | None = None
    exact: np.ndarray = field(init=False)
    why: dict[int, str] = field(init=False, default_factory=dict)
    rounds: int = field(init=False, default=0)
    stopped: str = field(init=False, default="")

    def __post_init__(self):
        if not self.scores:
            raise ValueError("scores: expected at least one estimator's score, got none")
        self.scores = {name: np.abs(np.asarray(s, dtype=float)).ravel() for name, s in self.scores.items()}
        sizes = {s.shape[0] for s in self.scores.values()}
        if len(sizes) != 1:
            raise ValueError(f"scores: expected one length for every estimator, got {sorted(sizes)}")
        n = sizes.pop()
        if not 1 <= self.top_k <= n:
            raise ValueError(f"top_k: expected 1 … {n} (the model's heads), got {self.top_k}")
        if self.random < 0:
            raise ValueError(f"random_heads: expected ≥ 0, got {self.random}")
        self.budget = default_budget(n, self.top_k) if self.budget is None else int(self.budget)
        if self.budget < self.top_k:
            raise ValueError(f"max_exact: expected at least top_k ({self.top_k}) heads, got {self.budget}")
        self.round = self.top_k if self.round is None else max(1, int(self.round))
        self.bound = next(iter(self.scores)) if self.bound is None else self.bound
        if self.bound not in self.scores:
            raise ValueError(f"bound: expected one of the scores ({', '.join(self.scores)}), got {self.bound!r}")
        self.exact = np.full(n, np.nan)

    @property
    def heads(self) -> int:
        return self.exact.shape[0]

    @property
    def measured(self) -> np.ndarray:
        """``(M,)`` the flat heads measured, in the order they were chosen."""
        return np.fromiter(self.why, dtype=np.int64, count=len(self.why))

    def chosen(self, reason: str) -> np.ndarray:
        """``(m,)`` the flat heads measured for ``reason`` (:data:`REASONS`), in the order chosen."""
        return np.array([f for f, w in self.why.items() if w == reason], dtype=np.int64)

    def first(self) -> list[int]:
        """The first round, at most the budget: the first score's top k (ties by head), ``random`` heads drawn from
        those in no score's top k, then the other scores' top k. A budget below the round cuts the other scores'
        picks first: the random heads measure the first score's error where it was not chosen to look (and are, on
        average, cheaper: later layers)."""
        tops = {name: np.argsort(-s, kind="stable")[: self.top_k].tolist() for name, s in self.scores.items()}
        rest = np.setdiff1d(np.arange(self.heads), np.asarray([f for t in tops.values() for f in t], dtype=np.int64))
        take = min(self.random, rest.size)
        drawn = np.random.default_rng(self.seed).choice(rest, size=take, replace=False).tolist() if take > 0 else []
        names = list(tops)
        order = [(names[0], tops[names[0]]), ("random", drawn), *((name, tops[name]) for name in names[1:])]
        chosen: list[int] = []
        for reason, heads in order:
            for f in heads:
                if int(f) not in self.why and len(chosen) < self.budget:
                    self.why[int(f)] = reason
                    chosen.append(int(f))
        self.rounds = 1
        return chosen

    def record(self, heads, exact) -> list[int]:
        """The exact effects of ``heads`` recorded; returns the next round's heads (empty: the search is over)."""
        self.exact[np.asarray(heads, dtype=np.int64)] = np.asarray(exact, dtype=float)
        nxt = self._next()
        if nxt:
            self.rounds += 1
            for f in nxt:
                self.why[f] = "bound"
        return nxt

    def factors(self) -> dict[str, float]:
        """Each score's factor ``c_s``: the largest |exact| / score over the measured heads with a positive score
        (a measured head with |exact| > 0 and a zero score makes it infinite)."""
        m = self.measured
        ex = np.abs(self.exact[m])
        out = {}
        for name, s in self.scores.items():
            sm = s[m]
            ratio = np.where(sm > 0, ex / np.where(sm > 0, sm, 1), np.where(ex > 0, np.inf, 0.0))
            out[name] = float(ratio.max()) if ratio.size else np.inf
        return out

    def bounds(self) -> np.ndarray:
        """``(N,)`` every head's bound ``margin · c · s(h)`` by the ``bound`` score (the measured heads' too);
        ``inf`` everywhere while its factor is infinite."""
        c = self.factors()[self.bound] * self.margin
        s = self.scores[self.bound]
        if not np.isfinite(c):
            return np.full(self.heads, np.inf)
        return c * s

    def threshold(self) -> float:
        """The k-th largest |exact| measured (0 with fewer than k measured)."""
        ex = np.sort(np.abs(self.exact[self.measured]))[::-1]
        return float(ex[self.top_k - 1]) if ex.size >= self.top_k else 0.0

    def _candidates(self) -> tuple[np.ndarray, np.ndarray]:
        """The unmeasured heads whose bound reaches the threshold, largest bound first, and their bounds."""
        b = self.bounds()
        free = np.ones(self.heads, dtype=bool)
        free[self.measured] = False
        idx = np.nonzero(free & (b >= self.threshold()))[0]
        order = np.lexsort((idx, -b[idx]))
        return idx[order], b[idx[order]]

    def _next(self) -> list[int]:
        idx, _ = self._candidates()
        if idx.size == 0:
            self.stopped = "complete"
            return []
        room = self.budget - len(self.why)
        if room <= 0:
            self.stopped = "budget"
            return []
        return [int(f) for f in idx[: min(self.round, room)]]

    def summary(self, heads_per_layer: int) -> dict:
        """What was measured and why, and how the search ended — for heads.json's ``exact_heads``.

        ``heads``: ``[layer, head]`` in the order measured, ``why`` beside them (:data:`REASONS`); ``stopped``:
        ``"complete"`` (no unmeasured head's bound reaches ``threshold``) or ``"budget"`` (``next_bound``: the
        largest unmeasured bound); ``factors``: each score's ``c_s``."""
        idx, b = self._candidates()
        m = self.measured
        counts = {r: sum(1 for w in self.why.values() if w == r) for r in REASONS}
        h = heads_per_layer
        return {
            "top_k": self.top_k,
            "heads": [[int(f) // h, int(f) % h] for f in m],
            "why": [self.why[int(f)] for f in m],
            "counts": counts,
            "budget": self.budget,
            "rounds": self.rounds,
            "stopped": self.stopped or ("complete" if idx.size == 0 else "budget"),
            "threshold": self.threshold(),
            "next_bound": float(b[0]) if b.size else None,
            "candidates_left": int(idx.size),
            "factors": {k: (v if np.isfinite(v) else None) for k, v in self.factors().items()},
        }
