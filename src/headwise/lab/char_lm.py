"""A character-level language-modelling task on the bundled public-domain corpus.

``headwise/data/corpus/web_sentences.txt`` holds 1,200 English sentences (World English Bible, public
domain; its README says how it was built). Every ``held_out_every``-th line (the 10th, 20th, …) is the
test text; the lines halfway between (the 5th, 15th, …) are the validation text, on which settings are
tuned; the rest are joined by newlines into one training stream, from which a batch is ``B`` windows of
``L + 1`` characters at uniformly drawn offsets (inputs the first ``L``, targets the last ``L``). The
test and validation lines are joined the same way and cut into consecutive, non-overlapping windows,
every one of which is scored — fixed evaluation sets, the same for every model.

The vocabulary is every character of the whole file (sorted), so no held-out character is unknown.

Shape legend: B batch, L sequence length, V vocabulary size.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from importlib import resources

import numpy as np
import torch
from torch import Tensor

from headwise import checks

__all__ = ["CharCorpus", "load_corpus", "CORPUS"]

CORPUS = "web_sentences.txt"


@dataclass(frozen=True)
class CharCorpus:
    """A corpus split into a training stream and held-out windows, as character ids.

    Attributes:
        chars: the vocabulary, ``chars[i]`` is id i.
        train: the training stream, ``(N,)`` int64.
        held_out: the test stream (never trained or tuned on), ``(M,)`` int64.
        validation: the validation stream (for tuning), int64.
        lines: how many lines went to ``{"train", "held_out", "validation"}``.
    """

    chars: str
    train: np.ndarray
    held_out: np.ndarray
    validation: np.ndarray
    lines: dict

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def batch(self, rng: np.random.Generator, batch_size: int, length: int) -> tuple[Tensor, Tensor, Tensor]:
        """``B`` random training windows: ``(inputs (B, L), targets (B, L), scored (B, L) all True)``."""
        checks.positive_int("batch_size", batch_size)
        checks.positive_int("length", length)
        starts = rng.integers(0, self.train.size - length - 1, size=batch_size)
        idx = starts[:, None] + np.arange(length + 1)  # (B, L + 1)
        window = torch.from_numpy(self.train[idx])
        return window[:, :-1], window[:, 1:], torch.ones(batch_size, length, dtype=torch.bool)

    def windows(self, length: int, *, split: str = "held_out") -> tuple[Tensor, Tensor, Tensor]:
        """Every consecutive, non-overlapping window of ``L + 1`` characters of the ``"held_out"`` (test) or
        ``"validation"`` text, the last partial one dropped: ``(inputs (W, L), targets (W, L), scored (W, L)
        all True)``."""
        checks.positive_int("length", length)
        checks.one_of("split", split, ("held_out", "validation"))
        stream = getattr(self, split)
        n = (stream.size - 1) // length
        if n < 1:
            raise ValueError(f"length: the {split} text ({stream.size} characters) is shorter than {length + 1}")
        x = torch.from_numpy(stream[: n * length].reshape(n, length))  # (W, L)
        y = torch.from_numpy(stream[1 : n * length + 1].reshape(n, length))  # (W, L)
        return x, y, torch.ones(n, length, dtype=torch.bool)

    def unigram_loss(self) -> float:
        """Test cross-entropy (nats per character) of the training stream's character frequencies,
        add-one smoothed: what a model that ignores context reaches."""
        counts = np.bincount(self.train, minlength=self.vocab_size) + 1.0
        logp = np.log(counts / counts.sum())
        return float(-logp[self.held_out[1:]].mean())

    def bigram_loss(self) -> float:
        """Test cross-entropy (nats per character) of the training stream's character-pair counts,
        add-one smoothed: what a model that sees only the current character reaches. A model whose loss
        is below it uses the characters before the current one — it has learnt to use its attention."""
        V = self.vocab_size
        counts = np.bincount(self.train[:-1] * V + self.train[1:], minlength=V * V).reshape(V, V) + 1.0  # (V, V)
        logp = np.log(counts / counts.sum(1, keepdims=True))
        return float(-logp[self.held_out[:-1], self.held_out[1:]].mean())


@functools.lru_cache(maxsize=4)
def load_corpus(held_out_every: int = 10) -> CharCorpus:
    """The bundled corpus: every ``held_out_every``-th line (the 10th, 20th, …) is the test text, the
    lines halfway between (the 5th, 15th, …) the validation text, the rest the training text."""
    checks.positive_int("held_out_every", held_out_every)
    if held_out_every < 3:
        raise ValueError(f"held_out_every: expected at least 3 (lines must be left to train on), got {held_out_every}")
    text = (resources.files("headwise") / "data" / "corpus" / CORPUS).read_text(encoding="utf-8")
    lines = [line for line in text.splitlines() if line.strip()]
    chars = "".join(sorted(set("\n".join(lines))))
    ids = {c: i for i, c in enumerate(chars)}
    half = held_out_every // 2
    split = [
        "held_out" if (i + 1) % held_out_every == 0 else "validation" if (i + 1) % held_out_every == half else "train"
        for i in range(len(lines))
    ]
    parts = {name: [line for line, s in zip(lines, split) if s == name] for name in ("train", "held_out", "validation")}

    def encode(part: list[str]) -> np.ndarray:
        return np.fromiter((ids[c] for c in "\n".join(part) + "\n"), dtype=np.int64)

    return CharCorpus(
        chars,
        encode(parts["train"]),
        encode(parts["held_out"]),
        encode(parts["validation"]),
        {name: len(p) for name, p in parts.items()},
    )
