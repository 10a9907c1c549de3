"""The prompt pairs of a circuit run as the model reads them: texts or token ids, answers as one token each.

Shape legend: P prompt pairs, L length.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = ["answer_ids", "prompt_ids"]


def prompt_ids(name: str, value, target) -> tuple[Tensor, list]:
    """``(ids (P, L), shown)`` from a list of strings (tokenized) or token ids ``(L,)`` / ``(P, L)``."""
    if isinstance(value, str):
        value = [value]
    if isinstance(value, Sequence) and value and all(isinstance(v, str) for v in value):
        if target.tokenizer is None:
            raise ValueError(f"{name}: the model {target.name} has no tokenizer; give token ids (P, L)")
        rows = []
        for k, text in enumerate(value):
            if not text.strip():
                raise ValueError(f"{name}[{k}]: expected a non-empty text, got {text!r}")
            rows.append(target.encode([text]).ids[0])
        lengths = {len(r) for r in rows}
        if len(lengths) > 1:
            raise ValueError(
                f"{name}: every prompt must have the same number of tokens (patching swaps the same positions), "
                f"got lengths {[len(r) for r in rows]}"
            )
        return torch.stack(rows), list(value)
    ids = value if isinstance(value, Tensor) else torch.tensor(value)
    if ids.dim() == 1:
        ids = ids[None]
    if ids.dim() != 2 or ids.is_floating_point() or ids.dtype == torch.bool:
        raise ValueError(
            f"{name}: expected texts or integer token ids (L,) or (P, L), got {ids.dtype} {tuple(ids.shape)}"
        )
    return ids.long(), ids.tolist()


def answer_ids(name: str, value, P: int, target) -> tuple[list[int], list]:
    """``(ids, shown)``: one answer token id per pair from a text of one token or an id (one value serves every
    pair); ValueError / TypeError naming ``name`` otherwise."""
    if isinstance(value, (str, int)) and not isinstance(value, bool):
        value = [value] * P
    if isinstance(value, Tensor):
        value = value.reshape(-1).tolist()
    if not isinstance(value, Sequence) or len(value) != P:
        raise ValueError(f"{name}: expected one answer per prompt pair ({P}), got {value!r}")
    ids = []
    for k, v in enumerate(value):
        if isinstance(v, str):
            if target.tokenizer is None:
                raise ValueError(f"{name}[{k}]: the model {target.name} has no tokenizer; give a token id")
            got = target.tokenizer.encode(v, add_special_tokens=False).ids
            if len(got) != 1:
                raise ValueError(f"{name}[{k}]: {v!r} is {len(got)} tokens; expected exactly one")
            ids.append(int(got[0]))
        elif isinstance(v, int) and not isinstance(v, bool):
            if target.vocab_size is not None and not 0 <= v < target.vocab_size:
                raise ValueError(f"{name}[{k}]: token id {v} outside the vocabulary [0, {target.vocab_size})")
            ids.append(v)
        else:
            raise TypeError(f"{name}[{k}]: expected a text or a token id, got {v!r}")
    return ids, list(value)
