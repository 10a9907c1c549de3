"""A model whose weights stay where they are stored, brought in one layer at a time (accelerate's disk offload and
layer-by-layer runners such as AirLLM do the same).

The module is built with its parameters on PyTorch's ``meta`` device (no memory, no initialisation; buffers — RoPE's
frequencies — made as usual). Its *units* are each block of its layer list and each module outside it that holds
parameters itself (the embeddings, the final norm, the unembedding). A forward pre-hook on a unit reads that unit's
tensors from the checkpoint (:class:`StoredTensors`: a safetensors file opened with ``safe_open`` for the unit alone,
or a GGUF file's blocks de-quantised), turns them into float32 and puts them on the module; a forward hook puts the
meta tensors back and drops what the unit kept (a stacked Q/K/V weight), keeping the freed float32 tensors of a
block, by shape, to read the next block into (:class:`~headwise.models.buffers.BufferPool`: warm memory, where a
fresh allocation would be first-touched page by page; never a tensor anything else still holds). A batch's forward
pass so runs through layer i with layer i's weights alone, then layer i + 1: the maths is the float32 route's on the
same weights, and the process holds one unit's weights (float32, plus the stored bytes read to make them, whose
mapping is closed with the unit) and the activations.

- :class:`StoredTensors` — the protocol of a checkpoint read by names; :class:`SafetensorsTensors` for folders
  (:mod:`headwise.models.stored`, what the stream reads from; re-exported here).
- :func:`meta_parameters` — a context in which modules are built with meta parameters and real buffers.
- :class:`LayerStream` — the hooks, :func:`units_of` the units of a module. A checkpoint that reads rows
  (:class:`RowTensors`: safetensors files, a GGUF file) has its large embedding read for the rows of the tokens a
  batch holds, and its large unembedding applied a slice of output rows at a time (:data:`SLICE_BYTES`), so neither
  matrix is ever held whole in float32. :meth:`LayerStream.pinned` keeps chosen parameters in across passes (a tool's
  attention parts, :mod:`headwise.models.pinned`); :meth:`LayerStream.row_slices` reads such a matrix outside a pass.

Shape legend: NL layers, B batch, L length, V vocabulary (rows of an embedding or unembedding), D model width.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence

import torch
from torch import Tensor, nn

from headwise.models.buffers import BufferPool
from headwise.models.stored import RowTensors, SafetensorsTensors, StoredTensors
from headwise.structure import layer_list

__all__ = [
    "SLICE_BYTES",
    "RowTensors",
    "StoredTensors",
    "SafetensorsTensors",
    "LayerStream",
    "meta_parameters",
    "units_of",
    "layer_list",
    "stored_names",
]


#: An embedding or unembedding larger than this in float32 is read by rows where the checkpoint can (RowTensors); an
#: unembedding is then applied this many bytes of float32 rows at a time.
SLICE_BYTES = 16 * 2**20


@contextlib.contextmanager
def meta_parameters() -> Iterator[None]:
    """Within the block, every parameter a module registers is moved to the ``meta`` device as it is registered: its
    initialisation then runs on a meta tensor (no time, no memory), while buffers (RoPE's frequencies) are made on the
    CPU as usual (accelerate's ``init_empty_weights(include_buffers=False)``)."""
    register = nn.Module.register_parameter

    def on_meta(module, name, param):
        register(module, name, param)
        if param is not None and param.device.type != "meta":
            module._parameters[name] = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)

    nn.Module.register_parameter = on_meta
    try:
        yield
    finally:
        nn.Module.register_parameter = register


def units_of(model: nn.Module) -> dict[str, nn.Module]:
    """The parts brought in one at a time, in forward order where the module tree says it: every block of
    :func:`layer_list`, and every module outside it that holds parameters itself (the embeddings, the final norm, the
    unembedding). Name → module (names as ``model.named_modules`` gives them)."""
    prefix, blocks = layer_list(model)
    inside = {id(m) for m in blocks.modules()}
    units: dict[str, nn.Module] = {}
    for name, m in model.named_modules():
        if id(m) in inside and m is not blocks:
            continue
        if any(True for _ in m.parameters(recurse=False)):
            units[name] = m
    for k, block in enumerate(blocks):
        units[f"{prefix}.{k}"] = block
    return units


class LayerStream:
    """The hooks that bring each unit's weights in when it runs and release them after.

    Args:
        model: the module, its parameters on the meta device (:func:`meta_parameters`).
        tensors: the checkpoint (:class:`StoredTensors`).
        stored_name: the model's parameter name (``model.layers.3.mlp.up_proj.weight``) → the stored name, or None for
            a parameter the checkpoint does not hold (refused).
        where: the checkpoint, named in errors.
        on_unit: called with ``(unit name, index, units)`` as each unit is brought in (progress), or None.
    Attributes:
        units: name → module; stored: name → ``{relative parameter name: stored name}``; float32_bytes / stored_bytes:
            name → bytes; loads: units brought in so far; seconds: time spent reading and converting.
    """

    def __init__(
        self,
        model: nn.Module,
        tensors: StoredTensors,
        stored_name: Callable[[str], str | None],
        *,
        where: str,
        on_unit: Callable[[str, int, int], None] | None = None,
    ):
        self.model, self.tensors, self.where, self.on_unit = model, tensors, where, on_unit
        self.units = units_of(model)
        have = set(tensors.names())
        self.problem: str | None = None  # the first parameter the checkpoint lacks or holds in another shape
        self.stored: dict[str, dict[str, str]] = {}
        self.float32_bytes: dict[str, int] = {}
        self.stored_bytes: dict[str, int] = {}
        for unit, module in self.units.items():
            names, f32, st = {}, 0, 0
            recurse = unit in self._block_units()
            for rel, p in module.named_parameters(recurse=recurse, remove_duplicate=False):
                full = f"{unit}.{rel}" if unit else rel
                theirs = stored_name(full)
                f32 += 4 * p.numel()
                if theirs is None or theirs not in have:
                    self.problem = self.problem or f"{where}: tensor {theirs or full!r} is missing from the checkpoint"
                    continue
                if tuple(tensors.shape(theirs)) != tuple(p.shape):
                    self.problem = self.problem or (
                        f"{where}: tensor {theirs!r} has shape {tuple(tensors.shape(theirs))}; the config expects "
                        f"{tuple(p.shape)}"
                    )
                names[rel] = theirs
                st += tensors.stored_bytes(theirs)
            self.stored[unit], self.float32_bytes[unit], self.stored_bytes[unit] = names, f32, st
        self._meta = {
            unit: {rel: self._slot(m, rel)[0]._parameters[self._slot(m, rel)[1]] for rel in self.stored[unit]}
            for unit, m in self.units.items()
        }
        self.loads, self.seconds = 0, 0.0
        # a block's float32 weights at most: what a pass frees and reads again, layer after layer
        self._buffers = BufferPool(max((self.float32_bytes[u] for u in self.block_units()), default=0))
        self._handles: list = []
        self._order = list(self.units)
        self.sliced = {u: n for u, m in self.units.items() if (n := self._by_rows(u, m)) is not None}
        self._padding: dict[str, int | None] = {}
        self._pins: dict[str, set[str]] = {}  # unit -> relative names of its pinned parameters (:meth:`pinned`)
        self._pin_depth = 0  # blocks of :meth:`pinned` open now
        self._walk_depth = 0  # blocks of :meth:`walking` open now
        self._holds: set[str] = set()  # units a :meth:`holding` block holds in
        #: ``"forward"``, or ``"backward"`` while a layer walk's backward pass brings the layers in reverse (progress)
        self.direction = "forward"

    def _by_rows(self, unit: str, module: nn.Module) -> str | None:
        """The stored name of ``unit``'s matrix when the unit is read by rows: an ``nn.Embedding`` (or a subclass that
        looks its rows up in ``weight``) or a plain bias-free ``nn.Linear`` whose float32 weight is over
        :data:`SLICE_BYTES`, in a checkpoint that reads its rows; else None."""
        if not hasattr(self.tensors, "load_rows") or list(self.stored[unit]) != ["weight"]:
            return None
        if not (isinstance(module, nn.Embedding) or (type(module) is nn.Linear and module.bias is None)):
            return None
        theirs = self.stored[unit]["weight"]
        if 4 * module.weight.numel() <= SLICE_BYTES or not self.tensors.rows_ok(theirs):
            return None
        return theirs

    def _rows_per_slice(self, unit: str) -> int:
        weight = self.units[unit].weight
        return max(1, SLICE_BYTES // (4 * weight[0].numel()))

    def _block_units(self) -> set[str]:
        return set(self.block_units())

    def block_units(self) -> list[str]:
        """The units of the layer list's blocks, in order (``block_units()[l]`` is layer l's)."""
        prefix, blocks = layer_list(self.model)
        return [f"{prefix}.{k}" for k in range(len(blocks))]

    @contextlib.contextmanager
    def walking(self) -> Iterator[None]:
        """Counts a block of :func:`headwise.models.layer_walk.layer_walk` open (:attr:`walk_depth`)."""
        self._walk_depth += 1
        try:
            yield
        finally:
            self._walk_depth -= 1

    @property
    def walk_depth(self) -> int:
        """How many blocks of :func:`~headwise.models.layer_walk.layer_walk` are open now: the model is
        differentiated layer by layer, and its anatomy can be read."""
        return self._walk_depth

    @staticmethod
    def _slot(module: nn.Module, rel: str) -> tuple[nn.Module, str]:
        owner, _, leaf = rel.rpartition(".")
        return (module.get_submodule(owner) if owner else module), leaf

    def _current(self, module: nn.Module, rel: str) -> nn.Parameter:
        owner, leaf = self._slot(module, rel)
        return owner._parameters[leaf]

    def sizes(self) -> dict[str, tuple[int, int]]:
        """Unit name → ``(float32 bytes, stored bytes)`` held at once, what :func:`headwise.models.memory.plan_memory`
        takes. A unit read by rows holds one slice (an embedding's rows for a batch's tokens are at most its output,
        ``(B, L, D)``, which the activations count)."""
        out = {}
        for u in self.units:
            f32, st = self.float32_bytes[u], self.stored_bytes[u]
            if u in self.sliced:
                share = self._rows_per_slice(u) / self.units[u].weight.shape[0]
                f32, st = int(f32 * share), int(st * share)
            out[u] = (f32, st)
        return out

    def attach(self) -> LayerStream:
        """Register the hooks (once). Returns self.

        Raises:
            ValueError: a parameter the checkpoint lacks, or holds in another shape, naming the tensor.
        """
        if self.problem is not None:
            raise ValueError(self.problem)
        from headwise.models.memory import map_large_allocations

        map_large_allocations()
        if not self._handles:
            for unit, module in self.units.items():
                if unit in self.sliced and isinstance(module, nn.Linear):
                    module.forward = lambda x, u=unit: self._sliced_linear(u, x)  # this instance's forward, by slices
                    continue
                if unit in self.sliced:
                    pre = module.register_forward_pre_hook(
                        lambda m, a, k, u=unit: self._gather(u, a, k), with_kwargs=True
                    )
                else:
                    pre = module.register_forward_pre_hook(lambda m, a, u=unit: self.bring(u))
                self._handles.append(pre)
                self._handles.append(module.register_forward_hook(lambda m, a, o, u=unit: self._ran(u)))
        return self

    def load_all(self) -> None:
        """Bring every unit in for good, hooks removed: the whole model in float32 from the same reader (a matrix two
        units share — a tied unembedding — read once and shared again). The stream is not used after.

        Raises:
            ValueError: a parameter the checkpoint lacks, or holds in another shape, naming the tensor.
        """
        if self.problem is not None:
            raise ValueError(self.problem)
        self.detach()
        self._pins = {}
        done: dict[int, nn.Parameter] = {}  # id of a meta parameter -> the parameter loaded for it
        for unit, module in self.units.items():
            names = self.stored[unit]
            todo = [rel for rel in names if id(self._meta[unit][rel]) not in done]
            loaded = self.tensors.load(list(dict.fromkeys(names[rel] for rel in todo)))
            for rel in names:
                meta = self._meta[unit][rel]
                if id(meta) not in done:
                    done[id(meta)] = nn.Parameter(loaded[names[rel]], requires_grad=meta.requires_grad)
                owner, leaf = self._slot(module, rel)
                owner._parameters[leaf] = done[id(meta)]
            del loaded

    def detach(self) -> None:
        """Remove the hooks (and the sliced forwards); :meth:`attach` puts them back."""
        for h in self._handles:
            h.remove()
        self._handles = []
        for unit in self.sliced:
            self.units[unit].__dict__.pop("forward", None)

    def _gather(self, unit: str, args: tuple, kwargs: dict):
        """An embedding's pre-hook: its rows for the distinct tokens of ``ids`` as its weight, ``ids`` renumbered into
        them (the module's own forward then runs: a scaled embedding keeps its scale)."""
        import time

        ids = args[0] if args else kwargs["input"]
        start = time.perf_counter()
        distinct, where = torch.unique(ids, sorted=True, return_inverse=True)  # (n,), ids' shape
        module = self.units[unit]
        module._parameters["weight"] = nn.Parameter(self.tensors.load_rows(self.sliced[unit], distinct),
                                                    requires_grad=False)  # fmt: skip
        self._padding[unit] = module.padding_idx
        module.padding_idx = None  # a row index of the whole table; padding rows only matter to gradients
        self.seconds += time.perf_counter() - start
        self._count(unit)
        return ((where, *args[1:]), kwargs) if args else (args, {**kwargs, "input": where})

    def _sliced_linear(self, unit: str, x: Tensor) -> Tensor:
        """A large unembedding applied a slice of output rows at a time: ``(..., D)`` → ``(..., V)``; where a
        gradient is recorded, differentiated by reading the slices again (:class:`_SlicedLinear`)."""
        if torch.is_grad_enabled() and x.requires_grad:
            return _SlicedLinear.apply(x, self, unit)
        return self._sliced_forward(unit, x)

    def _sliced_forward(self, unit: str, x: Tensor) -> Tensor:
        import time

        import torch.nn.functional as F

        module, name = self.units[unit], self.sliced[unit]
        rows, step = module.out_features, self._rows_per_slice(unit)
        out = x.new_empty(*x.shape[:-1], rows)  # (..., V)
        for r0 in range(0, rows, step):
            start = time.perf_counter()
            w = self.tensors.load_rows(name, torch.arange(r0, min(rows, r0 + step)))  # (n, D)
            self.seconds += time.perf_counter() - start
            out[..., r0 : r0 + w.shape[0]] = F.linear(x, w)
            del w
        self._count(unit)
        return out

    def _count(self, unit: str) -> None:
        self.loads += 1
        if self.on_unit is not None:
            self.on_unit(unit, self._order.index(unit), len(self._order))

    def bring(self, unit: str, only: Sequence[str] | None = None) -> None:
        """Read ``unit``'s tensors still on the meta device, in float32, onto its module (a unit already in, or whose
        parameters are all pinned: nothing); ``only``: those of these relative names alone (:meth:`select`)."""
        import time

        module = self.units[unit]
        names = self.stored[unit]
        wanted = names if only is None else [rel for rel in only if rel in names]
        todo = [rel for rel in wanted if self._current(module, rel).device.type == "meta"]  # pinned ones are in
        if not todo:
            return
        start = time.perf_counter()
        wanted = list(dict.fromkeys(names[rel] for rel in todo))
        into = self._buffers.take({name: self.tensors.shape(name) for name in wanted})
        loaded = self.tensors.load(wanted, into=into) if into else self.tensors.load(wanted)
        for rel in todo:
            owner, leaf = self._slot(module, rel)
            owner._parameters[leaf] = nn.Parameter(loaded[names[rel]], requires_grad=False)
        self.seconds += time.perf_counter() - start
        self._count(unit)

    def process_bytes(self) -> int:
        """What the process holds now (:func:`~headwise.models.memory.current_rss`) less the kept buffers, which the
        next unit is read into: the base a need adds the next unit's bytes to."""
        from headwise.models.memory import current_rss

        return current_rss() - self._buffers.bytes

    @property
    def pooled_bytes(self) -> int:
        """Bytes of freed float32 buffers the stream keeps to read the next block into (resident, but not a unit's)."""
        return self._buffers.bytes

    def drain(self) -> None:
        """Let the kept buffers go (their memory back to the system)."""
        from headwise.models.memory import return_freed

        self._buffers.clear()
        return_freed()

    def _ran(self, unit: str) -> None:
        """A unit's forward hook: released, unless a :meth:`holding` block holds it."""
        if unit not in self._holds:
            self.release(unit)

    def release(self, unit: str) -> None:
        """Put ``unit``'s meta tensors back (its pinned parameters stay) and drop what its modules kept of the
        weights."""
        from headwise.core.projections import forget_stacked
        from headwise.models.memory import return_freed

        module = self.units[unit]
        pinned = self._pins.get(unit, ())
        freed = []
        for rel, meta in self._meta[unit].items():
            if rel not in pinned:
                owner, leaf = self._slot(module, rel)
                freed.append(owner._parameters[leaf])
                owner._parameters[leaf] = meta
        if unit not in self.sliced:  # a block's float32 buffers, kept to read the next block into (warm memory)
            self._buffers.keep(freed)
        del freed
        if unit in self._padding:
            module.padding_idx = self._padding.pop(unit)
        for m in module.modules():
            forget_stacked(m)
        return_freed()

    @contextlib.contextmanager
    def held(self, units: Sequence[str] | None = None) -> Iterator[None]:
        """Within the block, ``units`` (default: all) stay in, whatever runs (for a caller that reads weights outside
        a forward pass); released after."""
        chosen = list(self.units) if units is None else list(units)
        self.detach()
        try:
            for u in chosen:
                self.bring(u)
            yield
        finally:
            for u in chosen:
                self.release(u)
            self.attach()

    def unit_of(self, part: int | nn.Module) -> str:
        """The unit of ``part``: a layer index (its block), or a module (the unit that is it or holds it)."""
        if isinstance(part, int):
            return self.block_units()[part]
        for unit, module in self.units.items():
            if module is part or any(m is part for m in module.modules()):
                return unit
        raise ValueError(f"{self.where}: the {type(part).__name__} is not part of the model read layer by layer")

    @contextlib.contextmanager
    def holding(self, unit: str, only: Sequence[str] | None = None) -> Iterator[None]:
        """Within the block, ``unit``'s weights are in: brought in if they were not, kept in if the unit runs (its
        forward hook does not release it), and released after; a unit already in — a block running now, a pinned
        part — is left as it was. For a reader of one unit's weights outside a forward pass (a norm called on
        recorded activations). ``only``: the unit's parameters of these relative names alone are read (the rest
        stays on the meta device unless the unit runs; :meth:`select` names them, as for :meth:`pinned`)."""
        module = self.units[unit]
        wanted = self.stored[unit] if only is None else [rel for rel in only if rel in self.stored[unit]]
        brought = unit not in self._holds and any(self._current(module, rel).device.type == "meta" for rel in wanted)
        if brought:
            self.bring(unit, only)
            self._holds.add(unit)
        try:
            yield
        finally:
            if brought:
                self._holds.discard(unit)
                self.release(unit)

    # -- pinned parameters: kept in across the forward hooks' release -------------------------------------------

    def select(self, keep: Callable[[str, nn.Parameter], bool]) -> dict[str, list[str]]:
        """Unit → the relative names of its parameters that ``keep(full name, meta parameter)`` selects (full names as
        ``model.named_parameters`` gives them: ``model.layers.3.self_attn.q_proj.weight``). A unit read by rows
        (:attr:`sliced`) is never selected: its matrix is read a slice at a time."""
        chosen = {}
        for unit, metas in self._meta.items():
            rels = [rel for rel, p in metas.items() if unit not in self.sliced and keep(f"{unit}.{rel}".lstrip("."), p)]
            if rels:
                chosen[unit] = rels
        return chosen

    def chosen_sizes(self, chosen: Mapping[str, Sequence[str]]) -> dict[str, tuple[int, int]]:
        """Unit → ``(float32 bytes, stored bytes)`` of the parameters ``chosen`` names (:meth:`select`)."""
        return {
            unit: (sum(4 * self._meta[unit][r].numel() for r in rels),
                   sum(self.tensors.stored_bytes(self.stored[unit][r]) for r in rels if r in self.stored[unit]))
            for unit, rels in chosen.items()
        }  # fmt: skip

    @contextlib.contextmanager
    def pinned(self, chosen: Mapping[str, Sequence[str]]) -> Iterator[None]:
        """Within the block, the parameters ``chosen`` names (unit → relative names, :meth:`select`) are in, in
        float32, and stay in when their unit's forward hook releases the rest of it; :meth:`bring` reads only what is
        still on the meta device. After the block those this call pinned go back to the meta device (blocks nest:
        an inner block leaves the outer one's pins).

        Raises:
            ValueError: a parameter the checkpoint lacks, or holds in another shape, naming the tensor.
        """
        if self.problem is not None:
            raise ValueError(self.problem)
        added: dict[str, list[str]] = {}
        try:
            done: dict[int, nn.Parameter] = {}  # id of a meta parameter -> the parameter read for it (tied: once)
            for unit, rels in chosen.items():
                module, names = self.units[unit], self.stored[unit]
                new = [r for r in rels if r not in self._pins.get(unit, ())]
                todo = [r for r in new if self._current(module, r).device.type == "meta"]
                wanted = [r for r in todo if id(self._meta[unit][r]) not in done]
                loaded = self.tensors.load(list(dict.fromkeys(names[r] for r in wanted))) if wanted else {}
                for r in todo:
                    meta = self._meta[unit][r]
                    if id(meta) not in done:
                        done[id(meta)] = nn.Parameter(loaded[names[r]], requires_grad=False)
                    owner, leaf = self._slot(module, r)
                    owner._parameters[leaf] = done[id(meta)]
                del loaded
                self._pins.setdefault(unit, set()).update(new)
                added[unit] = new
            self._pin_depth += 1
            try:
                yield
            finally:
                self._pin_depth -= 1
        finally:
            self._unpin(added)

    @property
    def pin_depth(self) -> int:
        """How many blocks of :meth:`pinned` are open now (0: nothing pinned; the model view reads its anatomy on a
        model opened layer by layer only inside one, :func:`headwise.models.pinned.attention_pinned`)."""
        return self._pin_depth

    def _unpin(self, added: Mapping[str, Sequence[str]]) -> None:
        from headwise.core.projections import forget_stacked
        from headwise.models.memory import return_freed

        for unit, rels in added.items():
            module = self.units[unit]
            for r in rels:
                self._pins[unit].discard(r)
                owner, leaf = self._slot(module, r)
                owner._parameters[leaf] = self._meta[unit][r]
                forget_stacked(owner)
            if not self._pins[unit]:
                del self._pins[unit]
        return_freed()

    # -- an embedding's or unembedding's rows, outside a forward pass ----------------------------------------------

    def _weight_name(self, module: nn.Module) -> str:
        """The stored name of ``module``'s ``weight``, ``module`` a unit (an embedding, an unembedding)."""
        for unit, m in self.units.items():
            if m is module and "weight" in self.stored[unit]:
                return self.stored[unit]["weight"]
        raise ValueError(f"{self.where}: the {type(module).__name__} is not a part read on its own")

    def _reads_rows(self, name: str) -> bool:
        return hasattr(self.tensors, "load_rows") and self.tensors.rows_ok(name)

    def weight_rows(self, module: nn.Module, rows: Tensor) -> Tensor:
        """Rows ``rows`` (sorted, distinct, ``(n,)``) of ``module``'s ``weight`` ``(V, D)`` in float32, ``(n, D)``:
        taken from the module where its weight is in, else read from the checkpoint — those rows alone where it
        reads rows (:class:`RowTensors`), else the whole matrix, read and dropped. ``module``: a unit whose matrix
        is ``weight`` (an embedding, an ``nn.Linear`` unembedding)."""
        w = module.weight
        if w.device.type != "meta":
            return w.detach()[rows.to(w.device)].to(torch.float32)
        name = self._weight_name(module)
        if self._reads_rows(name):
            return self.tensors.load_rows(name, rows)
        return self.tensors.load([name])[name][rows]

    def row_slices(self, modules: Sequence[nn.Module]) -> Iterator[tuple[int, list[Tensor]]]:
        """``modules``' weights ``(V, D)`` (the same V: an embedding and an unembedding) in float32, a slice of rows
        at a time: ``(r0, [rows r0 … r0 + n − 1 of each, (n, D)])`` — :data:`SLICE_BYTES` of rows where every
        matrix reads rows, else one slice of all V rows. A matrix two modules share (a tied unembedding) is read
        once per slice; each slice is dropped when the next is read."""
        V = modules[0].weight.shape[0]
        names = {id(m): None if m.weight.device.type != "meta" else self._weight_name(m) for m in modules}
        by_rows = all(n is None or self._reads_rows(n) for n in names.values())
        width = max(m.weight.shape[1] for m in modules)
        step = max(1, SLICE_BYTES // (4 * width)) if by_rows else V
        for r0 in range(0, V, step):
            rows = torch.arange(r0, min(V, r0 + step))
            read: dict = {}
            for m in modules:
                if (names[id(m)] or id(m)) not in read:
                    read[names[id(m)] or id(m)] = self.weight_rows(m, rows)
            yield r0, [read[names[id(m)] or id(m)] for m in modules]

    def slice_bytes(self, module: nn.Module) -> int:
        """Float32 bytes of one slice :meth:`row_slices` reads of ``module``'s weight (the whole matrix where the
        checkpoint does not read rows)."""
        (V, D), w = module.weight.shape, module.weight
        whole = w.device.type == "meta" and not self._reads_rows(self._weight_name(module))
        return 4 * D * (V if whole else min(V, max(1, SLICE_BYTES // (4 * D))))

    def whole_bytes(self) -> int:
        """Bytes of every parameter in float32 (a matrix shared by two units counted once)."""
        unique = {id(p): p for p in self.model.parameters()}
        return sum(4 * p.numel() for p in unique.values())


def stored_names(mapping: Mapping[str, str]) -> Callable[[str], str | None]:
    """A ``stored_name`` function from a mapping of the model's names to the checkpoint's."""
    return mapping.get


class _SlicedLinear(torch.autograd.Function):
    """``y = x · Wᵀ`` for a unit read by rows, ``W (V, D)`` read a slice of rows at a time in the forward pass and
    again in the backward pass, ``∂x = Σ_slices ∂y[…, slice] · W[slice]`` (the weights take no gradient): autograd
    keeps no slice."""

    @staticmethod
    def forward(ctx, x: Tensor, stream: LayerStream, unit: str) -> Tensor:
        ctx.stream, ctx.unit = stream, unit
        return stream._sliced_forward(unit, x)

    @staticmethod
    def backward(ctx, g: Tensor):
        stream, unit = ctx.stream, ctx.unit
        dx = None
        for r0, (w,) in stream.row_slices([stream.units[unit]]):  # (n, D)
            part = g[..., r0 : r0 + w.shape[0]] @ w.to(g.dtype)
            dx = part if dx is None else dx + part
        return dx, None, None
