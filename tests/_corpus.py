"""A tiny decoder and a small corpus for the distributed corpus runs, and helpers to compare their outputs."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

from _decoders import WORDS, save_decoder

#: Positions of the tiny decoder (one corpus line is longer: cut to the context).
POSITIONS = 64


def make_corpus(path: Path, lines: int = 30, *, seed: int = 0) -> Path:
    """``lines`` random sentences of 3–40 words of the tiny vocabulary (the fifth is 90 words: longer than the
    context), with a blank and a non-UTF-8 line among them (skipped)."""
    rng = random.Random(seed)
    text = [" ".join(rng.choice(WORDS[:18]) for _ in range(rng.randint(3, 40))) for _ in range(lines)]
    text[4] = " ".join(rng.choice(WORDS[:18]) for _ in range(90))
    raw = "\n".join(text[:3] + [""] + text[3:]).encode() + b"\n\xff\xfe broken\n"
    path.write_bytes(raw)
    return path


def free_port() -> int:
    """A TCP port nobody listens on now (for a rendezvous)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_model(folder: Path, seed: int = 0) -> Path:
    return save_decoder(folder, "llama", init=0.5, positions=POSITIONS, seed=seed)


def max_difference(a, b, path: str = "") -> float:
    """The largest absolute difference between two JSON values of the same structure (AssertionError naming the
    path where the structures, strings, integers or None differ)."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), f"{path}: keys {set(a) ^ set(b)}"
        return max([max_difference(a[k], b[k], f"{path}/{k}") for k in a] or [0.0])
    if isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), f"{path}: lengths"
        return max([max_difference(x, y, f"{path}[{i}]") for i, (x, y) in enumerate(zip(a, b))] or [0.0])
    if isinstance(a, float) and isinstance(b, float):
        assert math.isnan(a) == math.isnan(b), path
        return 0.0 if math.isnan(a) else abs(a - b)
    assert a == b, f"{path}: {a!r} != {b!r}"
    return 0.0


def heads_json(out: Path) -> dict:
    return json.loads((out / "heads.json").read_text())
