"""The probe and its recording, the evidence the anatomy is read from: probe tokens that cannot hide a structure
(:func:`probe_ids`: distinct, none special, none zero-embedded), the model's token embedding they go through
(:func:`input_embedding`), and :class:`Recording`, which keeps the inputs and outputs of chosen modules in the one
pass :func:`headwise.models.anatomy_probe.read_anatomy` runs.

Shape legend: L length, D model width.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch
from torch import Tensor, nn

from headwise.models.anatomy import AnatomyError
from headwise.points import hidden_argument, output_tensor, unembedding

__all__ = ["ProbedView", "Recording", "input_embedding", "probe_ids"]


@runtime_checkable
class ProbedView(Protocol):
    """What the anatomy finder reads of the view it is found for — :class:`headwise.models.HeadModel`, which finds its
    anatomy when first asked (``hm.anatomy``). Typed by this protocol rather than the class so that the view and its
    finder do not import each other (a test checks that the view satisfies it)."""

    model: nn.Module
    kind: str
    family: str
    bos_id: int | None
    special_ids: tuple[int, ...]
    vocab_size: int
    num_layers: int
    heads_per_layer: list[int]
    attention_modules: list[nn.Module]
    points: object
    stream: object

    @property
    def device(self) -> torch.device: ...

    def forward(self, ids, mask=None, *, math_path: bool = False): ...

    def logits(self, ids, *, last_only: bool = False): ...

    def hooks(self, fns): ...

    def holding(self, *parts): ...


_PROBE_LENGTH = 7


def _first_tensor(args, kwargs) -> Tensor | None:
    """The hidden state (:func:`headwise.points.hidden_argument`), else the first floating-point argument."""
    x = hidden_argument(args, kwargs)
    if x is not None:
        return x
    return next((v for v in (*args, *kwargs.values()) if isinstance(v, Tensor) and v.is_floating_point()), None)


_out = output_tensor


def probe_ids(hm: ProbedView, length: int = _PROBE_LENGTH) -> Tensor:
    """``(1, length)`` token ids that cannot hide a structure: distinct, none special (the model's special ids,
    its config's pad / bos / eos ids), none whose embedding row is zero; drawn with a fixed seed."""
    emb = input_embedding(hm.model)
    out = unembedding(hm.model)
    V = hm.vocab_size or (emb.weight.shape[0] if isinstance(getattr(emb, "weight", None), Tensor) else 0)
    if not V and isinstance(getattr(out, "weight", None), Tensor):
        V = out.weight.shape[0]
    avoid = set(hm.special_ids)
    config = getattr(hm.model, "config", None)
    for name in ("pad_token_id", "bos_token_id", "eos_token_id", "unk_token_id"):
        value = getattr(config, name, None)
        for v in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(v, int):
                avoid.add(v)
    if hm.bos_id is not None:
        avoid.add(int(hm.bos_id))
    order = torch.randperm(V, generator=torch.Generator().manual_seed(0)).tolist() if V else []
    order = [i for i in order if i not in avoid]
    chosen = []
    for k in range(0, len(order), 4 * length):  # candidates' rows read a few at a time (opened layer by layer too)
        part = order[k : k + 4 * length]
        nonzero = _nonzero_rows(hm, emb, part) if emb is not None else [True] * len(part)
        chosen += [i for i, keep in zip(part, nonzero) if keep][: length - len(chosen)]
        if len(chosen) == length:
            break
    if len(chosen) < 2:
        raise AnatomyError(hm.family, f"fewer than 2 of its {V} token ids are neither special nor zero-embedded")
    return torch.tensor([chosen], dtype=torch.long, device=hm.device)


def _nonzero_rows(hm: ProbedView, emb: nn.Module, ids: list[int]) -> list[bool]:
    """Whether each of the embedding's rows ``ids`` has a nonzero entry; ids past its rows count as nonzero. A
    weight on the meta device (a model opened layer by layer) is read through ``hm.stream``, those rows alone."""
    inside = sorted(i for i in ids if i < emb.weight.shape[0])
    if emb.weight.device.type == "meta":
        rows = hm.stream.weight_rows(emb, torch.tensor(inside, dtype=torch.long))  # (n, D)
    else:
        rows = emb.weight.detach()[torch.tensor(inside, dtype=torch.long, device=emb.weight.device)]
    found = dict(zip(inside, rows.ne(0).any(-1).tolist()))
    return [found.get(i, True) for i in ids]


def input_embedding(model: nn.Module) -> nn.Module | None:
    """A model's token embedding (``get_input_embeddings()``, or a child named as embeddings are), or None."""
    get = getattr(model, "get_input_embeddings", None)
    if callable(get):
        try:
            emb = get()
        except (NotImplementedError, AttributeError):
            emb = None
        if isinstance(emb, nn.Module):
            return emb
    for name in ("embed", "tok_emb", "token_embedding", "embeddings"):
        emb = getattr(model, name, None)
        if isinstance(emb, nn.Embedding):
            return emb
        inner = getattr(emb, "token", None) or getattr(emb, "word_embeddings", None)
        if isinstance(inner, nn.Embedding):
            return inner
    return None


class Recording:
    """Inputs and outputs of chosen modules in one pass: ``inp[key]``, ``out[key]`` (detached)."""

    def __init__(self):
        self.inp: dict = {}
        self.out: dict = {}
        self.handles: list = []

    def watch(self, key, module: nn.Module) -> None:
        def pre(_m, args, kwargs):  # the first call's (a module called twice keeps its first); copies, since a
            if key not in self.inp:  # family may add to an output in place (Falcon: mlp_output += attention_output)
                x = _first_tensor(args, kwargs)
                self.inp[key] = None if x is None else x.detach().clone()

        def post(_m, _args, output):
            if key not in self.out:
                y = _out(output)
                self.out[key] = None if y is None else y.detach().clone()

        self.handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
        self.handles.append(module.register_forward_hook(post))

    def keep_kwarg(self, key, module: nn.Module, name: str) -> None:
        """Keep ``module``'s keyword argument ``name`` of its first call in ``inp[key]`` (a tuple of copies)."""

        def pre(_m, _args, kwargs):
            value = kwargs.get(name)
            if key not in self.inp and value is not None:
                self.inp[key] = tuple(v.detach().clone() for v in value) if isinstance(value, tuple) else value

        self.handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))

    def close(self) -> None:
        for h in self.handles:
            h.remove()
