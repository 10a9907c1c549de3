"""A model's structure, read from its module tree: a part by its child name, the list of blocks, each attention
module's block — the one finder of each, for the named points (:mod:`headwise.points`), the anatomy
(:mod:`headwise.models.anatomy_probe`) and a model streamed layer by layer (:mod:`headwise.models.streamed`).
"""

from __future__ import annotations

from torch import nn

__all__ = ["blocks", "child", "layer_list"]


def child(module: nn.Module, names: tuple[str, ...]) -> nn.Module | None:
    """``module``'s first child module among ``names`` (``child(block, MLP_NAMES)``), or None: the one way a part is
    found by its name."""
    for name in names:
        found = getattr(module, name, None)
        if isinstance(found, nn.Module):
            return found
    return None


def layer_list(model: nn.Module) -> tuple[str, nn.ModuleList]:
    """The model's list of blocks: the ``nn.ModuleList`` holding the most parameters (``model.layers``,
    ``transformer.h``, ``gpt_neox.layers``), with its name.

    Raises:
        ValueError: a model without one.
    """
    best = None
    for name, m in model.named_modules():
        if isinstance(m, nn.ModuleList) and len(m):
            count = sum(p.numel() for p in m.parameters())
            if best is None or count > best[0]:
                best = (count, name, m)
    if best is None:
        raise ValueError(f"model: no list of layers in the {type(model).__name__} to run one layer at a time")
    return best[1], best[2]


def blocks(root: nn.Module, attention: list[nn.Module]) -> list[nn.Module] | None:
    """Each attention module's block: the item of the model's list of blocks (:func:`layer_list`) that holds it, or
    None when the model has no such list, an attention module is outside it (or is an item itself), or two share a
    block (cross-attention: no single residual stream per layer)."""
    try:
        prefix, items = layer_list(root)
    except ValueError:
        return None
    paths = {id(m): name for name, m in root.named_modules()}
    start = f"{prefix}." if prefix else ""
    found = []
    for m in attention:
        path = paths.get(id(m), "")
        index, dot, rest = path.removeprefix(start).partition(".")
        if not path.startswith(start) or not index.isdigit() or not dot or not rest:
            return None
        found.append(items[int(index)])
    return found if len({id(b) for b in found}) == len(found) else None
