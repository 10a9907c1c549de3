"""Named hook points: every place a tool acts on a model's forward pass, under one stable name.

Shape legend: B batch, L query length, S key length, D model width, H query heads, Dh head width, NL layers.

The names follow TransformerLens's (``blocks.{i}.hook_resid_pre`` …), in the layout of the model's own modules
(``model.layers.{i}``); ``i`` counts attention layers (:func:`headwise.hf.attention_layers` order, or
``modules()`` order for headwise's modules):

- ``layers.{i}.resid_pre`` — the block's input ``(B, L, D)`` (TransformerLens ``blocks.{i}.hook_resid_pre``;
  a forward pre-hook on the block);
- ``layers.{i}.attn.qk`` — the post-rotary queries and keys with the masks, as one
  :class:`~headwise.core.rows.AttentionRows` (``hook_q`` and ``hook_k``, with what forms the scores; read-only);
- ``layers.{i}.attn.pattern`` — the weights ``(B, H, L, S)`` the maths used (``hook_pattern``; read-only);
- ``layers.{i}.attn.heads`` — the per-head outputs ``(B, H, L, Dh)`` just before ``W_O`` (``hook_z``);
- ``layers.{i}.attn.out`` — the attention's write ``(B, L, D)`` (``hook_attn_out``; the attention module's output);
- ``layers.{i}.mlp.in`` / ``layers.{i}.mlp.out`` — the MLP's input and write ``(B, L, D)`` (``hook_mlp_in`` /
  ``hook_mlp_out``; a pre-hook and a hook on the MLP);
- ``resid_final`` — the last block's output ``(B, L, D)``, the final norm's input (``blocks.{NL-1}.hook_resid_post``);
- ``unembed.in`` — the unembedding's input ``(B, L, D)``, the final norm's output (``ln_final.hook_normalized``);
  replaceable (a replacement of other rows — the scored positions alone — gives logits of those rows only);
- ``layers.{i}.attn.in`` — the attention module's input ``(B, L, D)``, after its input norm (``hook_attn_in``'s
  normalised form);
- the anatomy's points, where the model view reads one (:func:`headwise.models.anatomy.anatomy_points`):
  ``layers.{i}.attn.q`` / ``attn.k`` / ``attn.v`` (each side's heads as projected, ``hook_q`` / ``hook_k`` /
  ``hook_v``), ``layers.{i}.attn.rotary`` (the rotary ``(cos, sin)`` handed to the attention) and
  ``layers.{i}.mlp.resid`` (the residual the MLP reads, before its norm; ``hook_mlp_in``).

The three attention points are the :class:`~headwise.core.hooks.HookPoint` s every attention module has
(headwise's own; :func:`headwise.hf.backend.hook_points` for Hugging Face modules). The others exist where the
structure shows them, found at run time rather than from a list of families: the block is the attention
module's ancestor that is an item of a layer list (``model.layers.3``, ``transformer.h.3``, ``encoder.layer.3``;
one attention module per block), the MLP the block's child named ``mlp`` (``ff``, ``feed_forward`` …) or the
pair ``ffn_in`` / ``ffn_out``, the attention's write the output of an attention module that holds its output
projection (``o_proj``, ``c_proj``, ``Wo`` …). So a BERT of Hugging Face (its output projection and MLP
projections sit with the residual's LayerNorm) has no ``attn.out`` or ``mlp`` points; a post-norm block's
``attn.out`` is the write before the norm.

A hook is ``fn(tensor) -> replacement or None`` (TransformerLens's ``run_with_hooks``). Nothing is registered
until a name is asked for: a model without hooks runs as if this module did not exist.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from headwise.core.hooks import HookPoint
from headwise.structure import blocks, child

__all__ = [
    "Point",
    "ColumnsPoint",
    "ArgumentPoint",
    "NormedInputPoint",
    "NamedPoints",
    "ATTENTION_POINTS",
    "attention_point",
    "MLP_NAMES",
    "OUT_PROJ_NAMES",
    "POINT_ORDER",
    "HIDDEN",
    "hidden_argument",
    "with_hidden",
    "output_tensor",
    "unembedding",
]

Hook = Callable[[Tensor], "Tensor | None"]

#: The attention points of each layer, by the attribute of the HookPoint that makes them.
ATTENTION_POINTS = {"qk": "hook_qk", "pattern": "hook_pattern", "heads": "hook_heads"}
#: A block's child that is its MLP.
MLP_NAMES = ("mlp", "ff", "feed_forward", "ffn", "block_sparse_moe")
#: An attention module's child that is its output projection.
OUT_PROJ_NAMES = ("o_proj", "c_proj", "out_proj", "dense", "Wo", "wo")
_MLP_PAIR = ("ffn_in", "ffn_out")
_NAME = re.compile(r"layers\.(\d+)\.(.+)")
#: Each layer's points in forward order (the part after ``layers.{i}.``).
POINT_ORDER = (
    "resid_pre",
    "attn.in",
    "attn.q",
    "attn.k",
    "attn.v",
    "attn.rotary",
    "attn.qk",
    "attn.pattern",
    "attn.heads",
    "attn.out",
    "mlp.resid",
    "mlp.in",
    "mlp.out",
)


def layer_point(layer: int, kind: str) -> str:
    """The name of one layer's point: ``layer_point(3, "mlp.out") == "layers.3.mlp.out"`` (``kind`` one of
    :data:`POINT_ORDER`; the one place a layer's point name is assembled).

    Raises:
        ValueError: ``kind`` is not a layer's point.
    """
    if kind not in POINT_ORDER:
        raise ValueError(f"kind: expected one of {', '.join(POINT_ORDER)}, got {kind!r}")
    return f"layers.{layer}.{kind}"


def attention_point(layer: int, kind: str) -> str:
    """The name of one attention point: ``attention_point(3, "heads") == "layers.3.attn.heads"``."""
    return layer_point(layer, f"attn.{kind}")


class Point:
    """One named place in the forward pass.

    Attributes:
        name: its name.
        module: the module it hooks: a :class:`HookPoint`, or the block / MLP / attention module whose input or
            output it is.
        where: ``"point"`` (a HookPoint), ``"input"`` (the module's first tensor argument, a forward pre-hook)
            or ``"output"`` (the module's output, or its first item when it returns a tuple; a forward hook).
    """

    __slots__ = ("name", "module", "where")

    def __init__(self, name: str, module: nn.Module, where: str):
        self.name, self.module, self.where = name, module, where

    def __repr__(self) -> str:
        return f"Point({self.name!r}, {type(self.module).__name__}, {self.where})"

    def add_hook(self, fn: Hook) -> RemovableHandle:
        """Register ``fn(tensor) -> replacement or None`` here; ``handle.remove()`` takes it off."""
        if not callable(fn):
            raise TypeError(f"{self.name}: expected a callable fn(tensor) -> tensor or None, got {type(fn).__name__}")
        if self.where == "point":
            return self.module.add_hook(fn)
        if self.where == "input":
            return self.module.register_forward_pre_hook(_input_hook(fn), with_kwargs=True)
        return self.module.register_forward_hook(_output_hook(fn))


#: The keyword a module may be handed its hidden state by (Hugging Face blocks and attention modules).
HIDDEN = "hidden_states"


def hidden_argument(args, kwargs) -> Tensor | None:
    """The hidden state a module is called with — its first positional tensor, else its ``hidden_states`` keyword —
    or None: the one rule of which argument is the hidden state."""
    if args and isinstance(args[0], Tensor):
        return args[0]
    x = kwargs.get(HIDDEN)
    return x if isinstance(x, Tensor) else None


def with_hidden(args, kwargs, new: Tensor) -> tuple[tuple, dict]:
    """``(args, kwargs)`` with the hidden state (:func:`hidden_argument`) replaced by ``new``."""
    if args and isinstance(args[0], Tensor):
        return (new, *args[1:]), kwargs
    return args, {**kwargs, HIDDEN: new}


def output_tensor(output) -> Tensor | None:
    """A module's output tensor: the output itself, or its first item when it returns a tuple or list."""
    y = output[0] if isinstance(output, (tuple, list)) else output
    return y if isinstance(y, Tensor) else None


def _input_hook(fn: Hook):
    def hook(_module, args, kwargs):
        x = hidden_argument(args, kwargs)
        if x is None:
            return None
        new = fn(x)
        return None if new is None else with_hidden(args, kwargs, new)

    return hook


def _output_hook(fn: Hook):
    def hook(_module, _args, output):
        if isinstance(output, (tuple, list)):
            new = fn(output[0])
            return None if new is None else type(output)((new, *output[1:]))
        return fn(output)

    return hook


class ColumnsPoint(Point):
    """Heads' columns of a projection's output: ``fn(t (B, L, n, Dh)) -> replacement or None``, where ``t`` are the
    output's ``columns (n, Dh)`` (a fused projection's layout undone); a replacement is written back into those
    columns (the others unchanged). A forward hook on ``module``."""

    __slots__ = ("columns",)

    def __init__(self, name: str, module: nn.Module, columns: Tensor):
        super().__init__(name, module, "columns")
        self.columns = columns

    def add_hook(self, fn: Hook) -> RemovableHandle:
        if not callable(fn):
            raise TypeError(f"{self.name}: expected a callable fn(tensor) -> tensor or None, got {type(fn).__name__}")
        columns = self.columns

        def hook(_module, _args, output):
            y = output[0] if isinstance(output, (tuple, list)) else output
            cols = columns.to(y.device)
            new = fn(y[..., cols])
            if new is None:
                return None
            y = y.clone()
            y[..., cols.reshape(-1)] = new.reshape(*new.shape[:-2], -1).to(y.dtype)
            return type(output)((y, *output[1:])) if isinstance(output, (tuple, list)) else y

        return self.module.register_forward_hook(hook)


class ArgumentPoint(Point):
    """A keyword argument of a module's call, read-only: ``fn(value) -> None`` (the rotary ``(cos, sin)`` a family
    hands its attention as ``position_embeddings``). A forward pre-hook on ``module``."""

    __slots__ = ("argument",)

    def __init__(self, name: str, module: nn.Module, argument: str):
        super().__init__(name, module, "argument")
        self.argument = argument

    def add_hook(self, fn: Hook) -> RemovableHandle:
        if not callable(fn):
            raise TypeError(f"{self.name}: expected a callable fn(value) -> None, got {type(fn).__name__}")
        argument = self.argument

        def hook(_module, _args, kwargs):
            value = kwargs.get(argument)
            if value is not None:
                fn(value)

        return self.module.register_forward_pre_hook(hook, with_kwargs=True)


class NormedInputPoint(Point):
    """The residual stream a module reads through a norm it shares with another reader (Phi-2's, GPT-J's,
    Cohere's MLP reads the attention's input norm): ``fn(r (B, L, D)) -> replacement or None`` with ``r`` the
    block's input; a replacement ``r'`` changes this module's input alone, to ``norm(r')``. Pre-hooks on the block
    (which keeps ``r``) and on ``module``."""

    __slots__ = ("norm", "block")

    def __init__(self, name: str, module: nn.Module, norm: nn.Module, block: nn.Module):
        super().__init__(name, module, "normed")
        self.norm, self.block = norm, block

    def add_hook(self, fn: Hook) -> RemovableHandle:
        if not callable(fn):
            raise TypeError(f"{self.name}: expected a callable fn(tensor) -> tensor or None, got {type(fn).__name__}")
        kept: dict = {}
        norm = self.norm

        def keep(_module, args, kwargs):
            kept["r"] = hidden_argument(args, kwargs)

        def read(_module, args, kwargs):
            new = fn(kept.pop("r"))
            return None if new is None else with_hidden(args, kwargs, output_tensor(norm(new)))

        handles = [
            self.block.register_forward_pre_hook(keep, with_kwargs=True),
            self.module.register_forward_pre_hook(read, with_kwargs=True),
        ]
        return _Handles(handles)


class _Handles:
    """Several hook handles removed as one."""

    def __init__(self, handles: list):
        self.handles = handles

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def _order(names) -> list[str]:
    """Point names in forward order: by layer, then :data:`POINT_ORDER`; ``resid_final`` last."""

    def key(name: str):
        m = _NAME.fullmatch(name)
        if m is None:
            return (1 << 30, 0, name)
        kind = m.group(2)
        return (int(m.group(1)), POINT_ORDER.index(kind) if kind in POINT_ORDER else len(POINT_ORDER), name)

    return sorted(names, key=key)


def unembedding(root: nn.Module) -> nn.Module | None:
    """A language model's output embedding (``get_output_embeddings()``, or a child named ``unembed`` /
    ``lm_head``), or None."""
    get = getattr(root, "get_output_embeddings", None)
    if callable(get):
        try:
            found = get()
        except (NotImplementedError, AttributeError):
            found = None
        if isinstance(found, nn.Module):
            return found
    return child(root, ("unembed", "lm_head"))


class NamedPoints(Mapping):
    """The points of one model by name (a read-only mapping ``name -> Point``, in forward order).

    Args:
        root: the model (the module whose structure holds the blocks).
        attention: its NL attention modules in layer order.
        attention_hooks: ``module -> object`` with the module's ``hook_heads`` / ``hook_qk`` / ``hook_pattern``
            HookPoints (the module itself for headwise's modules; :func:`headwise.hf.backend.hook_points`).

        provider: a callable returning further points, declared with the rest (the model view's anatomy points:
            ``attn.q`` …, ``mlp.resid``); asked once, on the first lookup of a name the structure does not give or
            on listing the names; a ValueError from it (a structure the anatomy does not read) leaves those points
            out.

    The attention points are found at once; the block and MLP points on the first lookup of one of them or of
    the list of names. A lookup (``points[name]``, ``name in points``, the names listed) has one meaning: every
    point the model has, the provider's included. :meth:`found` is what the provider itself reads while it
    works: the points of the structure alone.
    """

    def __init__(
        self,
        root: nn.Module,
        attention: list[nn.Module],
        attention_hooks: Callable[[nn.Module], object],
        provider: Callable[[], Mapping[str, Point]] | None = None,
    ):
        self.root = root
        self.attention = list(attention)
        self._provider = provider
        self._attention: dict[str, Point] = {}
        for layer, m in enumerate(self.attention):
            hooks = attention_hooks(m)
            for kind, attr in ATTENTION_POINTS.items():
                point = getattr(hooks, attr, None)
                if isinstance(point, HookPoint):
                    name = attention_point(layer, kind)
                    self._attention[name] = Point(name, point, "point")
        self._all: dict[str, Point] | None = None

    def _table(self) -> dict[str, Point]:
        if self._all is None:
            self._all = self._build()
        return self._all

    def _build(self) -> dict[str, Point]:
        found = blocks(self.root, self.attention)
        table: dict[str, Point] = {}

        def add(name: str, module: nn.Module | None, where: str) -> None:
            if module is not None:
                table[name] = Point(name, module, where)

        for layer, m in enumerate(self.attention):
            block = found[layer] if found else None
            add(layer_point(layer, "resid_pre"), block, "input")
            add(layer_point(layer, "attn.in"), m, "input")
            for kind in ATTENTION_POINTS:
                name = attention_point(layer, kind)
                if name in self._attention:
                    table[name] = self._attention[name]
            if block is None:
                continue
            add(layer_point(layer, "attn.out"), m if child(m, OUT_PROJ_NAMES) is not None else None, "output")
            mlp = child(block, MLP_NAMES)
            pair = [child(block, (n,)) for n in _MLP_PAIR]
            if mlp is None and None not in pair:
                add(layer_point(layer, "mlp.in"), pair[0], "input")
                add(layer_point(layer, "mlp.out"), pair[1], "output")
            else:
                add(layer_point(layer, "mlp.in"), mlp, "input")
                add(layer_point(layer, "mlp.out"), mlp, "output")
        if found:
            add("resid_final", found[-1], "output")
        add("unembed.in", unembedding(self.root), "input")
        return table

    def _extend(self) -> bool:
        """Add the provider's points (asked once); whether any were added."""
        provider, self._provider = self._provider, None
        if provider is None:
            return False
        try:
            found = dict(provider())
        except ValueError:
            return False
        table = self._table()
        table.update(found)
        self._all = {name: table[name] for name in _order(table)}
        return bool(found)

    def found(self, name: str) -> Point | None:
        """The point ``name`` among those found from the structure itself, or None — never asks the provider (what
        the anatomy reads while it is being found)."""
        return self._attention.get(name) or self._table().get(name)

    # -- the mapping -------------------------------------------------------------------------------------------
    def __getitem__(self, name: str) -> Point:
        point = self._attention.get(name) if isinstance(name, str) else None
        if point is None:
            point = self._table().get(name) if isinstance(name, str) else None
        if point is None and isinstance(name, str) and self._extend():
            point = self._table().get(name)
        if point is None:
            raise KeyError(name)
        return point

    def __iter__(self) -> Iterator[str]:
        self._extend()
        return iter(self._table())

    def __len__(self) -> int:
        self._extend()
        return len(self._table())

    def point(self, arg: str, name) -> Point:
        """The point named ``name``; else ValueError naming ``arg``, the name and the closest names."""
        if not isinstance(name, str):
            raise TypeError(f"{arg}: expected point names as str, got {name!r}")
        try:
            return self[name]
        except KeyError:
            pass
        names = list(self._table())
        close = difflib.get_close_matches(name, names, n=4, cutoff=0.6)
        m = _NAME.fullmatch(name)
        if m and int(m.group(1)) >= len(self.attention):
            hint = f"the model has {len(self.attention)} attention layers (0..{len(self.attention) - 1})"
        else:
            hint = f"close names: {', '.join(close)}" if close else f"names look like {', '.join(names[:4])}, …"
        raise ValueError(f"{arg}: no point named {name!r} on this model; {hint} (all: point_names())")

    # -- hooks -------------------------------------------------------------------------------------------------
    @contextmanager
    def hooks(self, fns: Mapping[str, Hook] | list[tuple[str, Hook]], *, arg: str = "hooks") -> Iterator[None]:
        """Inside the block, ``fns[name]`` is hooked at each named point (``fn(tensor) -> replacement or None``);
        every hook is removed after, also on error. A list of ``(name, fn)`` pairs may name a point twice (the
        hooks run in the order given)."""
        items = list(fns.items() if isinstance(fns, Mapping) else fns)
        points = [self.point(arg, name) for name, _ in items]  # every name resolved before any hook is registered
        handles: list[RemovableHandle] = []
        try:
            for point, (_, fn) in zip(points, items):
                handles.append(point.add_hook(fn))
            yield
        finally:
            for handle in handles:
                handle.remove()

    @contextmanager
    def cached(self, names, *, arg: str = "names", detach: bool = True) -> Iterator[dict]:
        """Inside the block, each forward pass records the tensor at every named point into the yielded dict
        (``{name: tensor}``, the last pass's; detached unless ``detach=False``). None: every point."""
        names = list(self) if names is None else [names] if isinstance(names, str) else list(names)
        store: dict = {}

        def keep(name: str, x):
            store[name] = x.detach() if detach and isinstance(x, Tensor) else x

        with self.hooks([(name, _Keeper(keep, name)) for name in names], arg=arg):
            yield store


class _Keeper:
    """``fn(x)`` that stores ``x`` under a name and changes nothing."""

    __slots__ = ("keep", "name")

    def __init__(self, keep, name: str):
        self.keep, self.name = keep, name

    def __call__(self, x) -> None:
        self.keep(self.name, x)


# -- a module's whole call at a point: for engines that reshape a forward (batched copies, replay, recomputation) --


@contextmanager
def call_hooks(points: NamedPoints, names, *, before=None, after=None, arg: str = "names") -> Iterator[None]:
    """Inside the block, hooks that see the whole call of each named point's module, where a point's own hooks see
    one tensor: ``before(k, args, kwargs) -> (args, kwargs) or None`` before the module runs (every argument, the
    batch-shaped masks and positions a model hands its blocks included), ``after(k, output) -> output or None`` on
    what it returns, in its own return type (a tuple for a Hugging Face block); ``k`` is the name's index in
    ``names``. Removed after, also on error."""
    modules = [points.point(arg, name).module for name in names]
    handles: list[RemovableHandle] = []
    try:
        for k, module in enumerate(modules):
            if before is not None:
                handles.append(module.register_forward_pre_hook(_CallHook(before, k, False), with_kwargs=True))
            if after is not None:
                handles.append(module.register_forward_hook(_CallHook(after, k, True)))
        yield
    finally:
        for handle in handles:
            handle.remove()


@contextmanager
def replaced_calls(points: NamedPoints, names, call, *, arg: str = "names") -> Iterator[None]:
    """Inside the block, calling the module of each named point runs ``call(k, forward, *args, **kwargs)`` (``forward``
    the module's own, ``k`` the name's index in ``names``) — a forward that starts at a layer has the blocks below
    return what they returned before; activation checkpointing recomputes a block from its input. Hooks registered
    on the module still run around the call. Each module gets its own ``forward`` back after, also on error — an
    enclosing block's replacement where one was in place (blocks nest)."""
    modules = [points.point(arg, name).module for name in names]
    before = [module.__dict__.get("forward") for module in modules]  # an enclosing block's replacement, if any
    try:
        for k, module in enumerate(modules):
            module.forward = _Call(call, k, module.forward)
        yield
    finally:
        for module, previous in zip(modules, before):
            if previous is None:
                module.__dict__.pop("forward", None)
            else:
                module.forward = previous


class _CallHook:
    """A forward pre-hook (``fn(k, args, kwargs)``) or hook (``after``: ``fn(k, output)``) of :func:`call_hooks`."""

    __slots__ = ("fn", "k", "after")

    def __init__(self, fn, k: int, after: bool):
        self.fn, self.k, self.after = fn, k, after

    def __call__(self, _module, args, *rest):
        return self.fn(self.k, rest[-1]) if self.after else self.fn(self.k, args, rest[0])


class _Call:
    """``call(k, forward, *args, **kwargs)`` in place of a module's ``forward`` (:func:`replaced_calls`)."""

    __slots__ = ("call", "k", "forward")

    def __init__(self, call, k: int, forward):
        self.call, self.k, self.forward = call, k, forward

    def __call__(self, *args, **kwargs):
        return self.call(self.k, self.forward, *args, **kwargs)
