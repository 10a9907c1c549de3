"""The lab's tasks: token sequences and the targets a model is trained and judged on.

Every generator draws from a ``numpy.random.Generator`` it is given, so a run is reproducible from its
seed, and returns int64 tensors. Shape legend: B batch, L sequence length, V vocabulary size.

**Induction** (:func:`repeated_segments`, :func:`induction_probe`). In-context copying — "[A][B] … [A] →
[B]" — is learnt by a previous-token head composed with an induction head (Olsson et al. 2022). The
training data decides whether that general circuit forms, or a shortcut that only fits the data:

- a fixed layout ("n tokens, then the same n") is solved by a head that looks a fixed distance back —
  a positional shortcut that fails on a repeat anywhere else;
- periodic sequences (a segment tiled) are solved by looking one period back, and every token is a
  repeat, so the model never learns to tell a repeat from a random token;
- a single copy at a random place gives a weak signal (few predictable tokens per sequence), and the
  phase change comes late.

:func:`repeated_segments` therefore puts 2–4 copies of a random segment of random length at random,
non-overlapping places among random tokens: no distance or period is shared between sequences, a
quarter to a half of the tokens are predictable, and the rest are unpredictable random tokens.

**Relations** (:func:`relation_task`): targets that need one, two or three earlier tokens, for comparing
one head with many at the same width (:mod:`headwise.lab.heads_vs_one`). In ``pair`` and ``triple`` the
target names the earlier tokens themselves, as one class (``x[t−1]·V + x[t−4]`` for ``pair``): each token
alone already predicts part of the target, so attending to either offset lowers the loss from the first
step, and the task is learnt in hundreds of steps. In ``difference`` and ``sum`` the target is independent
of each token alone (for a fixed ``x[t−1]``, ``(x[t−1] ± x[t−5]) mod V`` is uniform): nothing rewards
attending to either offset until both are attended to, and runs sit at chance for thousands of steps.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from headwise import checks

__all__ = [
    "RELATIONS",
    "place_copies",
    "repeated_segments",
    "induction_probe",
    "relation_task",
    "relation_targets",
    "relation_classes",
]

#: relation tasks: name -> (what the target is, the offsets it reads)
RELATIONS = {
    "difference": ("(x[t−1] − x[t−5]) mod V: two tokens, an order-sensitive combination", (1, 5)),
    "sum": ("(x[t−1] + x[t−5]) mod V: two tokens, a symmetric combination (the control)", (1, 5)),
    "previous": ("x[t−1]: one token", (1,)),
    "pair": ("(x[t−1], x[t−4]) as one class x[t−1]·V + x[t−4]: two tokens, kept apart", (1, 4)),
    "triple": ("(x[t−1], x[t−3], x[t−6]) as one class: three tokens, kept apart", (1, 3, 6)),
}

#: the relations whose target names the tokens themselves: V ** (number of offsets) classes
_TUPLES = ("pair", "triple")


def relation_classes(task: str, vocab_size: int) -> int:
    """How many target classes a relation has: ``V`` for ``difference``, ``sum`` and ``previous``;
    ``V ** k`` for a relation naming ``k`` tokens (``pair``: V², ``triple``: V³)."""
    checks.one_of("task", task, tuple(RELATIONS))
    return vocab_size ** len(RELATIONS[task][1]) if task in _TUPLES else vocab_size


def place_copies(rng: np.random.Generator, length: int, n: int, copies: int) -> list[int]:
    """Start positions of ``copies`` non-overlapping segments of ``n`` tokens in ``length``, uniformly spread.

    The free tokens ``length − copies·n`` are cut into ``copies + 1`` gaps at uniformly drawn points
    (a gap may be empty, so copies may touch).
    """
    free = length - copies * n
    if free < 0:
        raise ValueError(f"copies: {copies} segments of {n} tokens do not fit in {length}")
    cuts = np.sort(rng.integers(0, free + 1, size=copies))
    return [int(cuts[i]) + i * n for i in range(copies)]


def repeated_segments(
    rng: np.random.Generator,
    batch: int,
    *,
    length: int,
    vocab_size: int,
    min_segment: int = 4,
    max_segment: int = 32,
    max_copies: int = 4,
) -> Tensor:
    """Training sequences for induction: random tokens with 2–``max_copies`` copies of one random segment.

    Per sequence: a segment length n uniform in ``[min_segment, max_segment]``, a number of copies k
    uniform in ``[2, min(max_copies, length // n)]``, a segment of n uniform random tokens, and the k
    copies at random non-overlapping places (:func:`place_copies`); every other token is uniform random.

    Returns:
        ``(B, L)`` int64 token ids in ``[0, V)``.
    """
    for name, value in (("batch", batch), ("length", length), ("vocab_size", vocab_size)):
        checks.positive_int(name, value)
    checks.positive_int("min_segment", min_segment)
    if not min_segment <= max_segment <= length // 2:
        raise ValueError(
            f"max_segment: expected {min_segment} ≤ max_segment ≤ length // 2 = {length // 2}, got {max_segment}"
        )
    if isinstance(max_copies, bool) or not isinstance(max_copies, int) or max_copies < 2:
        raise ValueError(f"max_copies: expected an integer ≥ 2, got {max_copies!r}")
    x = rng.integers(0, vocab_size, size=(batch, length))  # (B, L)
    for b in range(batch):
        n = int(rng.integers(min_segment, max_segment + 1))
        k = int(rng.integers(2, min(max_copies, length // n) + 1))
        segment = rng.integers(0, vocab_size, size=n)
        for start in place_copies(rng, length, n, k):
            x[b, start : start + n] = segment
    return torch.from_numpy(x)


def induction_probe(
    rng: np.random.Generator,
    batch: int,
    *,
    length: int,
    vocab_size: int,
    min_segment: int = 8,
    max_segment: int = 24,
) -> tuple[Tensor, Tensor, Tensor]:
    """Held-out induction sequences: random tokens in which one segment of 8–24 tokens appears twice.

    The segment length is uniform in ``[min_segment, max_segment]``, both copies at random
    non-overlapping places (:func:`place_copies`), every token uniform random.

    Returns:
        ``ids (B, L)``; ``copy (B, L)`` bool, True on tokens 2 … n of the second copy — those an
        induction head can predict (the token before each is in the copy, so its earlier occurrence
        says what comes next); ``first (B, L)`` bool, True on the second copy's first token, which
        nothing in the sequence predicts.
    """
    for name, value in (("batch", batch), ("length", length), ("vocab_size", vocab_size)):
        checks.positive_int(name, value)
    if not 1 <= min_segment <= max_segment or 2 * max_segment > length:
        raise ValueError(
            f"max_segment: expected 1 ≤ min_segment ≤ max_segment ≤ length / 2 = {length // 2}, "
            f"got {min_segment}…{max_segment}"
        )
    x = rng.integers(0, vocab_size, size=(batch, length))  # (B, L)
    copy = np.zeros((batch, length), dtype=bool)
    first = np.zeros((batch, length), dtype=bool)
    for b in range(batch):
        n = int(rng.integers(min_segment, max_segment + 1))
        s1, s2 = place_copies(rng, length, n, 2)
        segment = rng.integers(0, vocab_size, size=n)
        x[b, s1 : s1 + n] = segment
        x[b, s2 : s2 + n] = segment
        copy[b, s2 + 1 : s2 + n] = True
        first[b, s2] = True
    return torch.from_numpy(x), torch.from_numpy(copy), torch.from_numpy(first)


def relation_targets(x: Tensor, task: str, vocab_size: int) -> tuple[Tensor, Tensor]:
    """The targets of a relation task for inputs ``x (B, L)``: ``(targets (B, L), scored (B, L) bool)``.

    ``scored`` is False on the first positions, where the relation reaches before the sequence.
    """
    checks.one_of("task", task, tuple(RELATIONS))
    offsets = RELATIONS[task][1]
    reach = max(offsets)
    y = torch.zeros_like(x)
    if task == "difference":
        y[:, reach:] = (x[:, reach - 1 : -1] - x[:, :-reach]) % vocab_size  # x[t−1] − x[t−5]
    elif task == "sum":
        y[:, reach:] = (x[:, reach - 1 : -1] + x[:, :-reach]) % vocab_size
    elif task in _TUPLES:
        L = x.shape[1]
        for offset in offsets:  # class = Σ x[t − o_i] · V^(k − 1 − i), the first offset most significant
            y[:, reach:] = y[:, reach:] * vocab_size + x[:, reach - offset : L - offset]
    else:
        y[:, 1:] = x[:, :-1]
    scored = torch.zeros_like(x, dtype=torch.bool)
    scored[:, reach:] = True
    return y, scored


def relation_task(
    rng: np.random.Generator, batch: int, *, task: str, length: int, vocab_size: int
) -> tuple[Tensor, Tensor, Tensor]:
    """Uniform random tokens and a relation's targets: ``(x (B, L), targets (B, L), scored (B, L))``."""
    checks.one_of("task", task, tuple(RELATIONS))
    for name, value in (("batch", batch), ("length", length), ("vocab_size", vocab_size)):
        checks.positive_int(name, value)
    if length <= max(RELATIONS[task][1]):
        raise ValueError(f"length: expected more than {max(RELATIONS[task][1])} tokens for {task!r}, got {length}")
    x = torch.from_numpy(rng.integers(0, vocab_size, size=(batch, length)))  # (B, L)
    return (x, *relation_targets(x, task, vocab_size))
