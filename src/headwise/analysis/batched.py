"""The batched head engine: many runs with different heads replaced, as the rows of one forward pass.

Shape legend: P rows of one input batch, L padded length, H query heads, Dh head width, NL layers, J copies of the
input in one pass (one per job), N = J·P rows.

A *job* is a set of heads to replace — one head for a single-head ablation or a patch, a head set for a point of a
pruning curve. J jobs run as one forward of J·P rows: copy j of the input carries job j, and each layer's hook at
``layers.{i}.attn.heads`` (the per-head outputs ``(N, H, L, Dh)`` where the heads meet W_O, :mod:`headwise.points`)
replaces only copy j's heads of job j — with zeros (``"zero"``: Michel et al. 2019's ξ_h = 0), with the head's mean
over the copy's real positions (``"mean"``: :func:`headwise.hf.ablate`'s ``mode="mean"``, whose mean is taken over
the real positions of the batch in the same forward call) or with another run's heads (activation patching,
:mod:`headwise.patching.exact`) — through :func:`headwise.replacement.replace_heads`, the one function that replaces
heads, which :func:`headwise.hf.ablate` calls too. Rows never mix: row ``j·P + p`` is input p run
with job j, equal to running it alone (tested to 1e-5 against one run per job).

**Prefix reuse.** Nothing below a job's lowest layer changes, so when every job of a pass starts at layer l or above
the layers below l run on the P input rows once and the block's input — the residual stream at
``layers.{l}.resid_pre`` — is copied J times there (with the batch-shaped arguments the model hands its blocks: the
padding mask). A sweep ordered by layer runs its single-head jobs through NL − l layers instead of NL, about half the
layer-rows of a plain batch for a sweep over every layer. Used where the model has ``resid_pre`` points (blocks in a
layer list); elsewhere every layer runs on J·P rows, with the same values. Going further, :func:`keep_blocks` runs
the P rows once intact keeping every block's output, and :func:`replayed` makes the blocks below l return those
instead of computing: a pass then runs no layer below its start at all, and passes cut at start layers
(:func:`start_groups`) carry no layer that any of their jobs does not need.

**Layer by layer.** On a model opened layer by layer (:mod:`headwise.models.streamed`) every pass reads every layer
it runs from disk again, so a sweep cut into passes of J jobs reads the model once per pass. With ``layered``
(:func:`staggered`) one pass carries many jobs and runs each block on them a few copies at a time: the pass holds
the residual stream of all its copies at one layer boundary, the activations of one call's copies and one layer's
weights, and reads each layer once for all of them. The copies join the pass at their own start layers (before
block l runs, a copy of the unchanged rows is added for each job starting at l), so a job runs NL − l layers, as
with the prefix; the unchanged rows ride along as copy 0, the rows every joining copy is taken from.

**Batch size.** :func:`choose_copies` picks J from the memory free on the model's device and the rows' size (the
forward's activations and the output of the J·P rows: a decoder's ``(N, L, V)`` logits dominate), at most
:data:`PASS_TOKENS` tokens a pass, so memory is bounded by the batch chosen — linear in L, never L × L (no attention
map is formed: the hook sits after attention). :func:`choose_split` may run a batch's rows in parts, so that a
pass holds more copies (rows are independent: zero ablation and patching; mean ablation takes its mean over the
whole batch and never splits it).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from functools import partial

from headwise._machine import free_memory
from headwise.checks import positive_int
from headwise.points import layer_point
from headwise.replacement import MODES, replace_heads

__all__ = [
    "MODES",
    "PASS_TOKENS",
    "CopyJob",
    "as_job",
    "SweepCost",
    "choose_copies",
    "choose_split",
    "free_memory",
    "job_masks",
    "replace_heads",
    "run_copies",
    "start_layer",
    "shows_blocks",
    "staggered",
    "layered_plan",
    "row_activations",
    "copies_from",
    "keep_blocks",
    "replayed",
    "start_groups",
]


Job = Mapping[int, Sequence[int]]  # {layer: [head, …]}


@dataclass
class SweepCost:
    """What a batched sweep ran.

    Attributes:
        passes: forward passes of copies (one per batch of copies and input batch).
        kept_passes: intact forwards whose blocks' outputs were kept for the passes to start from
            (:func:`keep_blocks`, one per group of input rows; their work is in ``layer_rows`` and ``layer_tokens``).
        rows: rows run through the layers that ran them (a prefix's P rows count once per pass).
        layer_rows: rows × layers computed (the work; one plain forward of P rows is NL · P).
        layer_tokens: tokens × layers computed (rows × their length: the work, padding within a pass included).
        tokens: tokens one plain forward of the rows as the passes run them holds (real tokens and the padding
            within a pass's rows).
        forward_equivalents: ``layer_tokens / (NL · tokens)``, the plain forwards the sweep's work equals.
        copies: J, jobs per pass (the batch size chosen).
        memory_budget: bytes J was chosen for (0 when J was given).
        seconds: wall time of the sweep.
    """

    passes: int = 0
    kept_passes: int = 0
    rows: int = 0
    layer_rows: int = 0
    forward_equivalents: float = 0.0
    layer_tokens: int = 0
    tokens: int = 0
    copies: int = 0
    memory_budget: int = 0
    seconds: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)


#: Most tokens one pass holds, by device type: past these a bigger pass is no faster per row (on a CPU a pass of
#: 54 copies × 288 tokens of SmolLM2 ran each row 2.4 × slower than the plain forward: its logits alone were 3 GB).
PASS_TOKENS = {"cpu": 4096, "cuda": 65536}


def choose_copies(
    jobs: int,
    rows: int,
    length: int,
    row_bytes_per_token: int,
    *,
    budget: int,
    most: int = 64,
    pass_tokens: int | None = None,
) -> int:
    """J: how many copies of ``rows (P) × length (L)`` fit in ``budget`` bytes at ``row_bytes_per_token`` bytes per
    token of one row — at least 1, at most ``min(jobs, most)`` and, given ``pass_tokens``, at most that many tokens
    (J · P · L) in one pass."""
    per_copy = max(1, rows * length * row_bytes_per_token)
    cap = most if pass_tokens is None else min(most, pass_tokens // max(1, rows * length))
    return max(1, min(jobs, cap, budget // per_copy))


def choose_split(
    jobs: int,
    rows: int,
    length: int,
    row_bytes_per_token: int,
    *,
    budget: int,
    most: int = 64,
    pass_tokens: int | None = None,
    split: bool = True,
) -> tuple[int, int]:
    """``(J, P')``: each pass runs J copies of P' of the batch's ``rows`` — as many copies as fit (at most ``jobs``
    and ``most``), since the layers below a pass's lowest layer run once per pass, then as many rows as still fit.
    ``split`` False (mean ablation: the mean is over the whole batch): P' = ``rows`` (:func:`choose_copies`)."""
    if not split:
        return (
            choose_copies(jobs, rows, length, row_bytes_per_token, budget=budget, most=most, pass_tokens=pass_tokens),
            rows,
        )
    fit = budget // max(1, length * row_bytes_per_token)  # rows the memory holds
    if pass_tokens is not None:
        fit = min(fit, pass_tokens // max(1, length))
    fit = max(1, fit)
    J = max(1, min(jobs, most, fit))
    return J, max(1, min(rows, fit // J))


@dataclass(frozen=True)
class CopyJob:
    """One job of :func:`run_copies`, as the engine reads it.

    Attributes:
        heads: ``((layer, head, positions or None), …)``: the heads this copy replaces, each at ``positions`` (a
            tuple of positions) or at every position (None).
        edits: the lowest layer at which the caller's own ``run`` edits this copy's rows (path patching's deltas on a
            receiver's input, added by :meth:`headwise.circuits.Wiring.run`), or None; ``num_layers`` for an edit
            after the last block (the logits' input). The copies start no higher than it.
    """

    heads: tuple[tuple[int, int, tuple[int, ...] | None], ...] = ()
    edits: int | None = None

    @property
    def lowest(self) -> int | None:
        """The lowest layer this job touches (None: none)."""
        layers = [layer for layer, _, _ in self.heads]
        if self.edits is not None:
            layers.append(self.edits)
        return min(layers) if layers else None


def as_job(job) -> CopyJob:
    """A job as :class:`CopyJob`: itself; ``{layer: [head, …]}`` (every position); or a sequence of patches with
    ``layer``, ``head`` and ``positions`` (None: every position; :class:`headwise.patching.Patch`)."""
    if isinstance(job, CopyJob):
        return job
    if isinstance(job, Mapping):
        return CopyJob(tuple((int(layer), int(h), None) for layer, heads in job.items() for h in heads))
    return CopyJob(tuple((int(p.layer), int(p.head), None if p.positions is None else tuple(p.positions)) for p in job))


def _heads_of(model, layer: int) -> int:
    per_layer = getattr(model, "heads_per_layer", None)
    return int(per_layer[layer]) if per_layer else int(model.num_heads)


def job_masks(model, jobs: Sequence, length: int, device=None) -> dict:
    """``{layer: keep}``: True where copy j's job replaces that head — ``(J, H)`` bool, or ``(J, H, L)`` where some
    job of the layer names positions (layers no job touches are absent; H the layer's query heads)."""
    import torch

    jobs = [as_job(job) for job in jobs]
    timed = {layer for job in jobs for layer, _, pos in job.heads if pos is not None}
    masks: dict[int, torch.Tensor] = {}
    for j, job in enumerate(jobs):
        for layer, head, positions in job.heads:
            mask = masks.get(layer)
            if mask is None:
                shape = (len(jobs), _heads_of(model, layer)) + ((length,) if layer in timed else ())
                mask = masks[layer] = torch.zeros(shape, dtype=torch.bool)
            if positions is None:
                mask[j, head] = True
            else:
                mask[j, head, list(positions)] = True
    return {layer: m.to(device) if device is not None else m for layer, m in masks.items()}


def start_layer(model, jobs: Sequence) -> int:
    """The lowest layer any job touches (:class:`CopyJob`'s ``lowest``; an edit past the last block counts as the
    last block) where the model has its ``layers.{l}.resid_pre`` point — the layer the copies start at (0 where the
    model shows no blocks, or a job touches nothing)."""
    layers = [low for low in (as_job(job).lowest for job in jobs) if low is not None]
    if not layers:
        return 0
    low = min(min(layers), model.num_layers - 1)
    points = getattr(model, "points", None)
    if low <= 0 or points is None or layer_point(low, "resid_pre") not in points:
        return 0
    return low


def start_groups(model, jobs: Sequence, prefix: bool = True) -> list[tuple[int, list[int]]]:
    """Jobs grouped by the layer their copies start at (:func:`start_layer` of the job alone; 0 for every job when
    ``prefix`` is False): ``[(layer, [job index, …]), …]``, deepest layer first, jobs in their given order within
    a group. A pass cut at these boundaries runs each job from its own lowest layer — none carries the layers
    between another job's lowest layer and its own."""
    groups: dict[int, list[int]] = {}
    for j, job in enumerate(jobs):
        groups.setdefault(start_layer(model, [job]) if prefix else 0, []).append(j)
    return sorted(groups.items(), key=lambda item: -item[0])


def keep_blocks(model, run: Callable) -> tuple[object, list]:
    """``(run(), outputs)``: ``run()`` (one forward of the P input rows, no job) with every block's output kept —
    ``outputs[i]`` is what the block at ``layers.{i}.resid_pre`` returned (the residual stream at layer i + 1's
    input, in the block's own return type; :func:`headwise.points.call_hooks`). Empty where the model shows no
    blocks."""
    from headwise.points import call_hooks

    points = getattr(model, "points", None)
    names = [layer_point(i, "resid_pre") for i in range(model.num_layers)]
    if points is None or any(n not in points for n in names):
        return run(), []
    outputs: list = [None] * model.num_layers

    def keep(i, out):
        outputs[i] = out

    with call_hooks(points, names, after=keep):
        out = run()
    return out, outputs


@contextlib.contextmanager
def replayed(model, layer: int, outputs: Sequence) -> Iterator[None]:
    """Inside the block, the blocks below ``layer`` compute nothing: each returns what it returned in the forward
    :func:`keep_blocks` kept (the same input rows; :func:`headwise.points.replaced_calls`), so a forward starts at
    ``layers.{layer}.resid_pre`` with the kept residual stream. The model's own code around the blocks (embedding,
    masks, positions) still runs. ``layer`` 0 or no kept outputs: nothing is replaced. Combine with
    :func:`copies_from` for J copies."""
    from headwise.points import replaced_calls

    if layer <= 0 or not outputs:
        yield
        return
    with replaced_calls(model.points, [layer_point(i, "resid_pre") for i in range(layer)], partial(_replay, outputs)):
        yield


def _replay(outputs, i, _forward, *_args, **_kwargs):
    return outputs[i]


def _grow(x, J: int, P: int):
    """``x`` with its batch dimension copied J times where it is a batch-shaped tensor — at least 2-D, P first (a 1-D
    tensor such as the cache positions is left alone) — or a tuple of them."""
    from torch import Tensor

    if isinstance(x, Tensor):
        return x.repeat(J, *([1] * (x.dim() - 1))) if x.dim() >= 2 and x.shape[0] == P else x
    if isinstance(x, tuple) and x and all(isinstance(t, Tensor) for t in x):
        return tuple(_grow(t, J, P) for t in x)
    return x


@contextlib.contextmanager
def copies_from(model, layer: int, J: int, P: int) -> Iterator[None]:
    """Inside the block, a forward of P rows becomes J·P rows at ``layers.{layer}.resid_pre``: the block's input
    (the residual stream) is copied J times, and every block from ``layer`` on gets the batch-shaped arguments the
    model hands it (padding masks, per-row positions) copied alike (:func:`headwise.points.call_hooks`). ``layer`` 0
    or J 1: nothing is hooked.

    Rows are ordered ``j·P + p`` (as ``ids.repeat(J, 1)``)."""
    from headwise.points import HIDDEN, call_hooks

    if layer <= 0 or J <= 1:
        yield
        return

    def grow(k, args, kwargs):
        # the first block copies the residual stream; every block copies the batch-shaped arguments it is handed
        first = k == 0
        args = tuple(_grow(a, J, P) if i > 0 or first else a for i, a in enumerate(args))
        kwargs = {n: _grow(v, J, P) if n != HIDDEN or first else v for n, v in kwargs.items()}
        return args, kwargs

    with call_hooks(model.points, [layer_point(i, "resid_pre") for i in range(layer, model.num_layers)], before=grow):
        yield


def run_copies(
    model,
    run: Callable,
    ids,
    jobs: Sequence,
    *,
    replacement="zero",
    real=None,
    prefix: bool = True,
    kept: Sequence = (),
    layered: int | None = None,
    whole_rows: bool = True,
) -> tuple[object, int]:
    """One forward of J = ``len(jobs)`` copies of the input, copy j with job j's heads replaced (and the caller's
    edits of its rows, made by ``run``) — the one engine of batched copies: importance's ablations and pruning sets,
    patching's sweep, circuits' path and edge patching.

    Args:
        model: the model view (``hooks(fns)`` by point name, ``num_heads``, ``num_layers``, ``points``; its
            ``heads_per_layer`` where layers differ).
        run: ``run(repeat) -> output``: runs the model on the input, copied ``repeat`` times along the batch (the
            caller's own forward: logits, last hidden states, a forward that edits receivers' inputs); ``repeat`` is
            1 when the prefix copies it.
        ids: the input ids ``(P, L)`` (only their shape and device are read).
        jobs: J jobs, each a :class:`CopyJob`, a head set ``{layer: [head, …]}`` or a list of patches with
            ``layer``, ``head``, ``positions`` (:func:`as_job`).
        replacement: ``"zero"``, ``"mean"`` (:func:`replace_heads`) or another run's heads, one ``(P, H, L, Dh)``
            tensor per layer (indexed by layer).
        real: as :func:`replace_heads`.
        prefix: start the copies at the lowest layer the jobs touch (:func:`copies_from`).
        kept: the blocks' outputs of a forward of these rows (:func:`keep_blocks`): given, the layers below the
            copies' start are not run again (:func:`replayed`) — else they run once on the P rows.
        layered: copies per block call: each job's copy joins the pass at its own start layer and each block runs
            its rows this many copies at a time (:func:`staggered`) — every layer read once for all J jobs, the
            activations those of ``layered`` copies (a model opened layer by layer); ``run(1)`` must return a
            tensor with the rows first (the base copy's rows are dropped from it). Where the model shows no blocks:
            as None.
        whole_rows: with ``layered``, ``run(1)``'s output holds every copy's rows, ``(J + 1)·P`` first (the base's
            dropped here, the others put back in job order); False: the caller's ``run`` selected its own rows of
            the jobs' copies (rows ``(j + 1)·P + p`` of the pass, ``P`` … ``(J + 1)·P``), returned as they are —
            the jobs must then be given in the order of their start layers.
    Returns:
        ``(output of the J·P rows, the layer the copies started at)``.
    Raises:
        RuntimeError: a source's heads that do not fit the layer's (named).
    """
    import torch

    jobs = [as_job(job) for job in jobs]
    J, P = len(jobs), ids.shape[0]
    if layered is not None and J and shows_blocks(model):
        per_call = positive_int("layered", layered)
        return _run_layered(model, run, ids, jobs, replacement, real, kept, per_call, whole_rows)
    hooks = _heads_hooks(job_masks(model, jobs, ids.shape[1], ids.device), _Window(0, J), replacement, real)
    low = start_layer(model, jobs) if prefix and (J > 1 or kept) else 0
    with torch.no_grad(), model.hooks(hooks), replayed(model, low, kept), copies_from(model, low, J, P):
        out = run(1 if low > 0 else J)
    return out, low


def shows_blocks(model) -> bool:
    """True where the model shows every block of its layer list (``layers.{i}.resid_pre`` for every layer)."""
    points = getattr(model, "points", None)
    return points is not None and all(layer_point(i, "resid_pre") in points for i in range(model.num_layers))


@dataclass
class _Window:
    """The copies the rows of the block call running now hold: ``start`` … ``stop`` − 1 (the heads' hook reads
    their rows of the jobs' masks)."""

    start: int
    stop: int


def _heads_hooks(masks: dict, window: _Window, replacement, real) -> dict:
    """``{layers.{l}.attn.heads: hook}``: each layer's jobs' heads replaced in the rows of the copies ``window``
    names (:func:`_replacing`)."""
    from headwise.points import attention_point

    return {
        attention_point(layer, "heads"): partial(_replacing, layer, keep, window, replacement, real)
        for layer, keep in masks.items()
    }


def _replacing(layer, keep, window, replacement, real, out):
    source = replacement if isinstance(replacement, str) else replacement[layer]
    try:
        return replace_heads(out, keep[window.start : window.stop], window.stop - window.start, source, real)
    except RuntimeError as e:
        raise RuntimeError(f"layer {layer}: {e}") from None


def _run_layered(model, run, ids, jobs: list, replacement, real, kept, per_call: int, whole_rows: bool):
    """:func:`run_copies` with ``layered``: the copies join the pass layer by layer and each block runs its rows
    ``per_call`` copies at a time (see :func:`staggered`). Returns ``(output of the J·P rows in job order, the
    lowest start layer)``."""
    import torch

    J, P = len(jobs), ids.shape[0]
    starts = [start_layer(model, [job]) for job in jobs]
    order = sorted(range(J), key=lambda j: starts[j])  # stable: jobs of one start layer in their given order
    if not whole_rows and order != list(range(J)):
        raise ValueError("jobs: a layered pass whose run selects its own rows takes its jobs in start-layer order")
    begins = [starts[j] for j in order]
    masks = job_masks(model, [CopyJob(), *(jobs[j] for j in order)], ids.shape[1], ids.device)  # copy 0: the base
    window = _Window(0, 1)
    hooks = _heads_hooks(masks, window, replacement, real)
    low = begins[0]
    with torch.no_grad(), model.hooks(hooks), replayed(model, low, kept), staggered(model, begins, P, per_call, window):
        out = run(1)
    if not whole_rows:
        return out, low
    if not isinstance(out, torch.Tensor) or out.shape[0] != (J + 1) * P:
        raise RuntimeError(
            f"run_copies: a layered pass expects the rows of {J + 1} copies of {P} from run(1), got "
            f"{type(out).__name__} {tuple(getattr(out, 'shape', ()))}"
        )
    inverse = torch.empty(J, dtype=torch.long)
    inverse[torch.tensor(order)] = torch.arange(J)
    out = out[P:].reshape(J, P, *out.shape[1:])[inverse.to(out.device)]
    return out.reshape(J * P, *out.shape[2:]), low


@contextlib.contextmanager
def staggered(model, begins: Sequence[int], P: int, per_call: int, window: _Window) -> Iterator[None]:
    """Inside the block, a forward of P rows carries 1 + J copies of them through the blocks, each job's copy joining
    at its own start layer: copy 0 is the input as it is (the base), and when block l runs, a copy of the base's
    rows joins for every job starting at l (``begins``: the start layer of each job, non-decreasing). Each block
    runs its rows ``per_call`` copies at a time (``window`` names the copies of the call running now), with the
    batch-shaped arguments the model hands it copied alike, and writes each call's output into the block's one
    output — so a pass reads each layer once for all its jobs, holds the residual stream of its copies at a block's
    input and output and the activations of ``per_call`` copies, and no job runs a layer below its own start.
    Rows are ordered ``c·P + p`` (copy c: 0 the base, j + 1 the j-th job). Hooks at ``layers.{l}.resid_pre`` see
    the rows as they reach the block, before the copies starting there join."""
    import bisect

    from headwise.points import HIDDEN, replaced_calls

    low = begins[0] if begins else 0
    counts = [1 + bisect.bisect_right(begins, i) for i in range(model.num_layers)]

    def call(k, forward, *args, **kwargs):
        positional = bool(args)
        hidden = args[0] if positional else kwargs[HIDDEN]
        n, have = counts[low + k], hidden.shape[0] // P  # the jobs starting here join as copies of the base's rows
        out, rest = None, []
        for a in range(0, n, per_call):
            b = min(n, a + per_call)
            window.start, window.stop = a, b
            rows = _copies_rows(hidden, P, have, a, b)
            call_args = (rows, *(_grow(v, b - a, P) for v in args[1:])) if positional else ()
            call_kwargs = {
                name: rows if not positional and name == HIDDEN else _grow(v, b - a, P) for name, v in kwargs.items()
            }
            got = forward(*call_args, **call_kwargs)
            first = got[0] if isinstance(got, tuple) else got
            if out is None:  # the block's output for every copy, filled call by call (no second copy of it)
                out = first.new_empty((n * P, *first.shape[1:]))
            out[a * P : b * P] = first
            if isinstance(got, tuple):
                rest.append((b - a, got[1:]))
        window.start, window.stop = 0, n
        return out if not rest else (out, *_joined(rest, P))

    names = [layer_point(i, "resid_pre") for i in range(low, model.num_layers)]
    with replaced_calls(model.points, names, call):
        yield


def layered_plan(model, rows: int, length: int, per_job: int, jobs: int, *, room: int, per_call: int | None = None):
    """``(jobs a pass, copies a block call)`` of a layered pass (:func:`staggered`) on a model opened layer by layer
    (None where it was opened whole or shows no blocks): ``room`` — the bytes its budget leaves beside what a layer
    walk holds (the process, one layer's weights and working set; the caller weighs that,
    :func:`headwise.models.layer_walk.walk_need`, which this floor does not import) — holds one block call's
    activations (:func:`row_activations`, for ``per_call`` copies or as many as a quarter of the room holds) and
    ``per_job`` bytes a job (its copy's residual stream, its output) for each job and the base copy; at least 1, at
    most ``jobs``.

    Args:
        rows, length: the input's ``(P, L)``.
        per_job: bytes a job's copy holds through the pass.
        room: bytes for the pass's copies and one call's activations.
        per_call: copies a block call runs at most (None: as the room allows).
    """
    if getattr(model, "stream", None) is None or not shows_blocks(model):
        return None
    per_copy = row_activations(model, rows, length)
    room -= per_job  # the base copy
    fit = max(1, room // 4 // max(1, per_copy))
    call = max(1, min(fit, per_call or fit, jobs + 1))
    return max(1, min(jobs, (room - call * per_copy) // max(1, per_job))), call


def row_activations(model, rows: int, length: int) -> int:
    """Bytes of one copy's activations in a block call, ``(rows, length)`` tokens: a token's ≈ its largest layer's
    float32 parameters per model width (the widest products: an MLP's hidden units, the stacked projections) and its
    attention scores. The largest layer: a stream's unit (a model opened layer by layer) or the layer list's block."""
    stream = getattr(model, "stream", None)
    if stream is not None:
        largest = max((f32 for f32, _ in stream.sizes().values()), default=0)
    else:
        from headwise.structure import layer_list

        try:
            _, blocks = layer_list(model.model)
        except ValueError:  # no layer list: its parameters all count as one block's
            blocks = [model.model]
        largest = 4 * max((sum(p.numel() for p in block.parameters()) for block in blocks), default=0)
    heads = max(getattr(model, "heads_per_layer", None) or [model.num_heads])
    return rows * length * (largest // max(1, model.width) + 4 * heads * length)


def _copies_rows(hidden, P: int, have: int, a: int, b: int):
    """The input rows of copies ``a`` … ``b`` − 1 of a block: ``hidden``'s (its ``have`` copies), then copies of the
    base's rows (copy 0) for the copies joining at this block."""
    import torch

    if b <= have:
        return hidden[a * P : b * P]
    base = hidden[:P]
    joining = base.repeat(b - max(a, have), *([1] * (base.dim() - 1)))
    return joining if a >= have else torch.cat([hidden[a * P : have * P], joining])


def _joined(rest: list, P: int) -> tuple:
    """The items after the first of a block's tuple outputs, one per call (``rest``: ``(copies, items)``), as one:
    an item with each call's rows first concatenated, anything else the first call's."""
    import torch

    def rows(item, copies) -> bool:
        return isinstance(item, torch.Tensor) and item.dim() >= 1 and item.shape[0] == copies * P

    first = rest[0][1]
    return tuple(
        torch.cat([items[i] for _, items in rest]) if all(rows(items[i], c) for c, items in rest) else item
        for i, item in enumerate(first)
    )
