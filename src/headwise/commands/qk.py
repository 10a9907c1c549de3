"""``headwise qk``'s flow: the decoder opened, the text encoded, the head and positions checked, and one head's score
split into query-side × key-side parts (:func:`headwise.circuits.qk_attribution`) — ``qk.json``'s content, for the
command line to write, draw and print.

:func:`run` takes a :class:`QkOptions` (checked in one place, errors naming the option) and returns a
:class:`QkResult`.

Shape legend: L tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from headwise.commands import said

if TYPE_CHECKING:
    from headwise.models import HeadModel

__all__ = ["QkOptions", "QkResult", "parse_head", "position", "run"]


@dataclass(frozen=True)
class QkOptions:
    """What ``headwise qk`` reads and writes (its options).

    Attributes:
        model: a decoder with a tokenizer (a folder, a GGUF file, a bundled name); text: what it reads.
        head: ``"LAYER.HEAD"``; query: the query position (negative: from the end).
        out: the output folder (written whole later, or not at all).
        key: the key position (None: the key the head weights most).
        top: terms kept in the report and parts pictured per side.
        max_memory: the process's peak memory budget (``"1.5GB"``; None: what the machine has free).
    Raises:
        ValueError: naming the option: an ``out`` that is a file, an empty text.
    """

    model: str
    text: str
    head: str
    query: int
    out: Path
    key: int | None = None
    top: int = 12
    max_memory: str | None = None

    def __post_init__(self):
        from headwise.commands._folders import check_out

        object.__setattr__(self, "out", Path(self.out))
        check_out(self.out)
        if not self.text.strip():
            raise ValueError(f"--text: expected a non-empty text, got {self.text!r}")


@dataclass
class QkResult:
    """What :func:`run` found, for the command line to write and print.

    Attributes:
        options: the options run; hm: the model.
        attribution: the :class:`~headwise.circuits.QKAttribution` of the head at the query.
        layer, head: the head; query: the query position (from the start); tokens: the text's tokens.
        report: ``qk.json``'s content.
    """

    options: QkOptions
    hm: HeadModel
    attribution: object
    layer: int
    head: int
    query: int
    tokens: list[str]
    report: dict


def parse_head(spec: str, hm: HeadModel) -> tuple[int, int]:
    """``"3.1"`` (``--head``) as a checked ``(layer, head)`` of ``hm``.

    Raises:
        ValueError: ``--head: …``: not LAYER.HEAD, a layer or head out of range.
    """
    from headwise.checks import head_number, layer_number

    parts = spec.split(".")
    if len(parts) != 2 or not all(p.strip().lstrip("-").isdigit() for p in parts):
        raise ValueError(f"--head: expected LAYER.HEAD (e.g. 3.1), got {spec!r}")
    layer, head = int(parts[0]), int(parts[1])
    layer = layer_number("--head", layer, hm.num_layers, subject=f"layer {layer} in {spec!r}")
    return layer, head_number("--head", head, layer, hm.heads_per_layer[layer], subject=f"head {head} in {spec!r}")


def position(option: str, value: int, L: int, tokens: list[str]) -> int:
    """``value`` as a position 0 … L − 1 of the L ``tokens`` (negative: from the end); ValueError naming ``option``."""
    found = value + L if value < 0 else value
    if not 0 <= found < L:
        raise ValueError(f"{option}: expected a position −{L} … {L - 1} of the {L} tokens {tokens}, got {value}")
    return found


def run(options: QkOptions) -> QkResult:
    """``headwise qk``: the decoder of ``--model`` opened through the one door (a model that does not fit the budget
    opens layer by layer, one layer's weights read at a time), the head and positions checked, the score split.

    Raises:
        ValueError: one line naming the option, before anything is written.
    """
    import torch

    from headwise.circuits import qk_attribution
    from headwise.models import open_model
    from headwise.models.memory import MemoryBudgetError

    o = options
    model, max_memory = o.model, o.max_memory
    try:
        hm = open_model(model, max_memory=max_memory)
    except MemoryBudgetError as e:  # the user's budget named as given; the default's: the model does not fit
        raise ValueError(("" if e.given else "--model: ") + said(e)) from None
    except (OSError, ValueError) as e:
        raise ValueError(f"--model: {' '.join(str(e).split())}") from None
    if hm.kind != "decoder" or hm.tokenizer is None:
        raise ValueError(f"--model: {hm.name} is not a decoder with a tokenizer.json ({hm.kind}, {hm.family})")
    layer, h = parse_head(o.head, hm)
    ids = list(hm.tokenizer.encode(o.text).ids)
    if len(ids) > hm.max_length:
        raise ValueError(f"--text: {len(ids)} tokens, more than the model's {hm.max_length} positions")
    tokens = hm.token_texts(ids)
    i = position("--query", o.query, len(ids), tokens)
    j = None if o.key is None else position("--key", o.key, len(ids), tokens)
    if j is not None and j > i:
        raise ValueError(f"--key: position {j} comes after the query {i}; a decoder's query sees keys 0 … {i}")
    try:
        result = qk_attribution(hm, torch.tensor(ids), layer, h, i, j)
    except ValueError as e:  # a budget too small for every layer's attention parts: named as the option
        raise ValueError(f"--key: {e}" if str(e).startswith("key:") else said(e)) from None
    report = {"model": hm.name, "family": hm.family, "text": o.text, "ids": ids, **result.to_json(o.top)}
    report["note"] = (
        "terms add up to the score q·k·scale before a soft-cap; effect = the model's weight minus the weight "
        "with that part's terms removed from every key's score (exact, norms frozen)"
    )
    return QkResult(o, hm, result, layer, h, i, tokens, report)
