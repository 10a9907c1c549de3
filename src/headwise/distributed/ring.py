"""Ring attention (context parallelism): each rank holds a shard of the sequence, the key/value shards
travel around the ring of ranks, and every rank ends with the exact attention of its queries over the
whole sequence.

Shape legend: B batch, H query heads, Hkv key/value heads, L full sequence length, P ranks in the
group, Lp = L / P the shard length, Dh head width.

The algorithm is Liu, Zaharia & Abbeel 2023 ("Ring Attention with Blockwise Transformers for
Near-Infinite Context"), with the numerics of zhuzilin's ring-flash-attention:

- step ``t = 0 … P − 1``: rank ``r`` holds the key/value shard of rank ``(r − t) mod P``, starts sending
  it to rank ``r + 1`` and receiving the next one from ``r − 1`` (``batch_isend_irecv``), and meanwhile
  attends its queries to the shard it holds with a block kernel that also returns the log-sum-exp;
- the partial outputs merge in float32 (float64 for float64 inputs) through their log-sum-exp:
  ``lse = logaddexp(lse, lse_b)``, ``out = out · exp(lse_old − lse) + out_b · exp(lse_b − lse)``;
- causal attention skips blocks that are fully masked; the zigzag layout (rank r holds chunks r and
  2P − 1 − r of 2P chunks, as in Megatron-LM's context parallelism and ring-flash-attention's
  ``zigzag_ring``) gives every rank the same amount of causal work at every step;
- the backward is a second pass round the ring: key/value shards travel again, and beside them an
  accumulator of their gradients ``dK, dV`` that each rank adds its contribution to before passing it
  on; after P hops every accumulator is home.

Sequence layouts (``layout=``): ``"contiguous"`` — rank r holds positions r·Lp … (r + 1)·Lp − 1;
``"zigzag"`` — with c = L / (2P), rank r holds positions r·c … (r + 1)·c − 1 then
(2P − 1 − r)·c … (2P − r)·c − 1. :func:`shard_sequence`, :func:`unshard_sequence`,
:func:`shard_positions` and :func:`gather_sequence` convert between the layouts and the full sequence.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import Tensor
from torch.autograd.function import once_differentiable

from headwise import checks
from headwise.distributed._group import all_gather_rows, describe_rows, require_group
from headwise.distributed.kernels import BlockKernel, accumulation_dtype, resolve_kernel

LAYOUTS = ("contiguous", "zigzag")
_DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)
_ALL = slice(None)


# ----------------------------------------------------------------------------------------------------
# layouts: pure functions of tensors


def _check_divides(length: int, world_size: int, layout: str, what: str) -> int:
    """The number of equal chunks the layout cuts a sequence into, after checking it divides ``length``."""
    checks.one_of("layout", layout, LAYOUTS)
    checks.positive_int("world_size", world_size)
    chunks = world_size if layout == "contiguous" else 2 * world_size
    if length % chunks:
        raise ValueError(
            f"{what}: sequence length {length} is not divisible by {chunks} "
            f"({'the world size' if layout == 'contiguous' else '2 × the world size, for the zigzag layout'} "
            f"{world_size}); pad the sequence to a multiple of {chunks}"
        )
    return chunks


def shard_sequence(x: Tensor, *, rank: int, world_size: int, layout: str = "contiguous", dim: int = 2) -> Tensor:
    """This rank's shard of a full sequence.

    Args:
        x: any tensor whose dimension ``dim`` is the sequence (``(B, H, L, Dh)`` with ``dim=2``, or
            ``(B, L, D)`` with ``dim=1``).
        rank, world_size: the rank's place in the group.
        layout: ``"contiguous"`` or ``"zigzag"`` (module docstring).
    Returns:
        ``x`` with ``L / world_size`` positions along ``dim`` (a copy for zigzag, a view otherwise).
    Raises:
        ValueError: an unknown layout, a rank outside ``0 … world_size − 1``, or a length the layout's
            chunk count does not divide.
    """
    chunks = _check_divides(x.shape[dim], world_size, layout, "shard_sequence")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank: expected 0 … {world_size - 1}, got {rank!r}")
    pieces = x.chunk(chunks, dim=dim)
    if layout == "contiguous":
        return pieces[rank]
    return torch.cat([pieces[rank], pieces[chunks - 1 - rank]], dim=dim)


def unshard_sequence(shards: Sequence[Tensor], *, layout: str = "contiguous", dim: int = 2) -> Tensor:
    """The full sequence from every rank's shard (in rank order): the inverse of :func:`shard_sequence`."""
    checks.one_of("layout", layout, LAYOUTS)
    if layout == "contiguous":
        return torch.cat(list(shards), dim=dim)
    p = len(shards)
    pieces: list[Tensor | None] = [None] * (2 * p)
    for r, shard in enumerate(shards):
        first, second = shard.chunk(2, dim=dim)
        pieces[r], pieces[2 * p - 1 - r] = first, second
    return torch.cat(pieces, dim=dim)


def shard_positions(length: int, *, rank: int, world_size: int, layout: str = "contiguous", device=None) -> Tensor:
    """Global token positions ``(L / world_size,)`` (int64) held by ``rank``: what RoPE needs on a shard."""
    return shard_sequence(torch.arange(length, device=device), rank=rank, world_size=world_size, layout=layout, dim=0)


def gather_sequence(
    x: Tensor, *, group: dist.ProcessGroup | None = None, layout: str = "contiguous", dim: int = 2
) -> Tensor:
    """The full sequence on every rank from each rank's shard (an all-gather; not differentiable).

    Raises:
        RuntimeError: no process group is initialised.
    """
    _, world = require_group(group, who="gather_sequence")
    import torch.distributed._functional_collectives as fc

    moved = x.movedim(dim, 0).contiguous()  # (Lp, …): gloo needs contiguous buffers
    gather = getattr(fc, "all_gather_single", None) or fc.all_gather_tensor
    full = gather(moved, 0, group if group is not None else dist.group.WORLD)  # (P·Lp, …)
    if isinstance(full, fc.AsyncCollectiveTensor):
        full = full.wait()
    shards = [s.movedim(0, dim) for s in full.chunk(world, dim=0)]
    return unshard_sequence(shards, layout=layout, dim=dim)


# ----------------------------------------------------------------------------------------------------
# the ring


class _Ring:
    """Point-to-point exchange with the ring neighbours of one process group."""

    def __init__(self, group: dist.ProcessGroup | None, rank: int, world: int):
        self.group, self.rank, self.world = group, rank, world
        base = group if group is not None else dist.group.WORLD
        self.next = dist.get_global_rank(base, (rank + 1) % world)
        self.prev = dist.get_global_rank(base, (rank - 1) % world)

    def start(self, send: Tensor, tag: int):
        """Send ``send`` (contiguous) to the next rank, receive the same shape from the previous one."""
        if self.world == 1:
            return None, send
        recv = torch.empty_like(send)
        try:
            works = dist.batch_isend_irecv(
                [
                    dist.P2POp(dist.isend, send, self.next, self.group, tag),
                    dist.P2POp(dist.irecv, recv, self.prev, self.group, tag),
                ]
            )
        except RuntimeError as e:
            raise self._lost(e) from e
        return works, recv

    def finish(self, pending) -> Tensor:
        works, recv = pending
        try:
            for w in works or ():
                w.wait()
        except RuntimeError as e:  # gloo / NCCL: a peer crashed, hung past the timeout or left
            raise self._lost(e) from e
        return recv

    def _lost(self, error: RuntimeError) -> RuntimeError:
        """The error every healthy rank raises when a ring exchange fails (within the collective timeout)."""
        detail = " ".join(str(error).split())
        return RuntimeError(
            f"ring_attention: rank {dist.get_rank()} could not exchange key/value shards with its ring "
            f"neighbours (sending to rank {self.next}, receiving from rank {self.prev}): a rank crashed, "
            f"stopped answering within the collective timeout, or left the ring ({detail})"
        )


def _pack(a: Tensor, b: Tensor) -> Tensor:
    """One flat contiguous buffer holding ``a`` then ``b`` (one message per hop instead of two)."""
    return torch.cat([a.reshape(-1), b.reshape(-1)])


def _unpack(buf: Tensor, a_shape: torch.Size, b_shape: torch.Size) -> tuple[Tensor, Tensor]:
    n = math.prod(a_shape)
    return buf[:n].view(a_shape), buf[n:].view(b_shape)  # contiguous views


def _block_plan(*, causal: bool, layout: str, rank: int, src: int, half: int):
    """Which part of this rank's queries attends which part of rank ``src``'s keys, or None (skipped).

    Returns ``(query slice, key slice, causal within the block)`` along the shard's sequence axis.
    Zigzag, with this rank's chunks (r, 2P−1−r) and the source's (s, 2P−1−s): for s < r both query
    chunks see the source's first chunk only; for s > r the second query chunk sees both source chunks
    and the first query chunk sees neither.
    """
    if not causal:
        return _ALL, _ALL, False
    if src == rank:
        return _ALL, _ALL, True  # the diagonal block; zigzag's two local chunks are in order too
    if layout == "contiguous":
        return (_ALL, _ALL, False) if src < rank else None
    if src < rank:
        return _ALL, slice(0, half), False
    return slice(half, None), _ALL, False


def _seq(x: Tensor, s: slice) -> Tensor:
    """``x[:, :, s]`` made contiguous (kernels and gloo want contiguous tensors)."""
    return x if s == _ALL else x[:, :, s].contiguous()


def _ring_forward(q, k, v, ring: _Ring, causal, layout, scale, kernel: BlockKernel):
    b, h, lq, _ = q.shape
    acc = accumulation_dtype(q.dtype)
    out = torch.zeros(b, h, lq, v.shape[-1], dtype=acc, device=q.device)  # (B, H, Lp, Dh)
    lse = torch.full((b, h, lq), float("-inf"), dtype=acc, device=q.device)  # (B, H, Lp)
    kv = _pack(k, v)
    for step in range(ring.world):
        pending = ring.start(kv, tag=0) if step < ring.world - 1 else None
        src = (ring.rank - step) % ring.world
        plan = _block_plan(causal=causal, layout=layout, rank=ring.rank, src=src, half=lq // 2)
        if plan is not None:
            qs, ks, block_causal = plan
            kb, vb = _unpack(kv, k.shape, v.shape)
            out_b, lse_b = kernel.forward(_seq(q, qs), _seq(kb, ks), _seq(vb, ks), causal=block_causal, scale=scale)
            o, l_old = out[:, :, qs], lse[:, :, qs]  # views, updated in place
            l_new = torch.logaddexp(l_old, lse_b.to(acc))
            o.mul_(torch.exp(l_old - l_new)[..., None])
            o.addcmul_(out_b, torch.exp(lse_b.to(acc) - l_new)[..., None])  # no (B, H, Lp, Dh) temporary
            l_old.copy_(l_new)
            del out_b, lse_b  # free the block result before the next kernel call
        if pending is not None:
            kv = ring.finish(pending)
    return out.to(q.dtype), lse


def _ring_backward(dout, q, k, v, out, lse, ring: _Ring, causal, layout, scale, kernel: BlockKernel):
    lq = q.shape[2]
    acc = accumulation_dtype(q.dtype)
    dq = torch.zeros(q.shape, dtype=acc, device=q.device)
    kv = _pack(k, v)
    dkv = torch.zeros(kv.numel(), dtype=acc, device=q.device)  # (dK, dV) of the shard held, flattened
    dkv_pending = None
    for step in range(ring.world):
        kv_pending = ring.start(kv, tag=0) if step < ring.world - 1 else None
        src = (ring.rank - step) % ring.world
        plan = _block_plan(causal=causal, layout=layout, rank=ring.rank, src=src, half=lq // 2)
        if plan is not None:
            qs, ks, block_causal = plan
            kb, vb = _unpack(kv, k.shape, v.shape)
            dq_b, dk_b, dv_b = kernel.backward(
                _seq(dout, qs),
                _seq(q, qs),
                _seq(kb, ks),
                _seq(vb, ks),
                _seq(out, qs),
                _seq(lse, qs),
                causal=block_causal,
                scale=scale,
            )
            dq[:, :, qs] += dq_b
        if dkv_pending is not None:
            dkv = ring.finish(dkv_pending)  # the accumulator of shard src, from the previous rank
        if plan is not None:
            dk_acc, dv_acc = _unpack(dkv, k.shape, v.shape)
            dk_acc[:, :, ks] += dk_b
            dv_acc[:, :, ks] += dv_b
            del dq_b, dk_b, dv_b  # free the block gradients before the next kernel call
        dkv_pending = ring.start(dkv, tag=1)
        if kv_pending is not None:
            kv = ring.finish(kv_pending)
    dkv = ring.finish(dkv_pending)  # after P hops: this rank's own shard's gradients
    dk, dv = _unpack(dkv, k.shape, v.shape)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, ring, causal, layout, scale, kernel):
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        out, lse = _ring_forward(q, k, v, ring, causal, layout, scale, kernel)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.args = (ring, causal, layout, scale, kernel)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = _ring_backward(dout.contiguous(), q, k, v, out, lse, *ctx.args)
        return dq, dk, dv, None, None, None, None, None


# ----------------------------------------------------------------------------------------------------
# input checks: gathered first, judged identically on every rank


def _summary(t: Tensor) -> list[int]:
    shape = list(t.shape)[:4] + [-1] * max(0, 4 - t.dim())
    code = _DTYPES.index(t.dtype) if t.dtype in _DTYPES else -1
    return [t.dim(), *shape, code]


def _render(row: list[int]) -> str:
    parts = []
    for name, i in (("q", 0), ("k", 6), ("v", 12)):
        ndim, shape, code = row[i], row[i + 1 : i + 1 + min(max(row[i], 0), 4)], row[i + 5]
        dtype = str(_DTYPES[code]).replace("torch.", "") if code >= 0 else "unsupported dtype"
        parts.append(f"{name} {tuple(shape)}{'' if ndim <= 4 else f' ({ndim}-d)'} {dtype}")
    layout = LAYOUTS[row[19]] if row[19] >= 0 else "invalid layout"
    return ", ".join(parts) + f", causal={bool(row[18])}, layout={layout}"


def _check_local(q: Tensor, k: Tensor, v: Tensor, causal: bool, layout: str) -> None:
    """The checks one rank can make alone (their verdict is shared before anyone raises)."""
    checks.one_of("layout", layout, LAYOUTS)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name}: expected a shard (B, H, L/P, Dh), got shape {tuple(t.shape)}")
        if t.dtype not in _DTYPES:
            raise TypeError(f"{name}: expected a floating dtype in {[str(d) for d in _DTYPES]}, got {t.dtype}")
    (b, h, lq, d), (bk, hkv, sk, dk), (bv, hv, sv, _) = q.shape, k.shape, v.shape
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"q, k, v: expected one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if (bk, hkv, sk) != (bv, hv, sv) or bk != b or dk != d:
        raise ValueError(
            f"q, k, v: expected q (B, H, Lp, Dh), k (B, Hkv, Sp, Dh), v (B, Hkv, Sp, Dv), got "
            f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if h % hkv:
        raise ValueError(f"k: its {hkv} key/value heads do not divide the {h} query heads (H % Hkv != 0)")
    if causal and lq != sk:
        raise ValueError(f"causal: needs query and key shards of one length, got {lq} and {sk}")
    if causal and layout == "zigzag" and lq % 2:
        raise ValueError(f"layout: 'zigzag' needs an even shard length (two chunks per rank), got {lq}")


def _check_inputs(q, k, v, causal, layout, kernel, group, rank: int, world: int, validate: bool) -> BlockKernel:
    """Check the inputs on every rank and agree on the verdict; returns the block kernel.

    Each rank first runs its local checks and keeps (does not raise) the error; then one all-gather of
    a small int64 row (shapes, dtypes, causal, layout, error flag) lets every rank see every verdict, so
    a bad input on one rank raises on all of them instead of leaving the others to time out.
    """
    error: Exception | None = None
    block_kernel = None
    try:
        _check_local(q, k, v, causal, layout)
        block_kernel = resolve_kernel(kernel, q.device, q.dtype)
    except (ValueError, TypeError) as e:
        error = e
    tensors_ok = all(isinstance(t, Tensor) for t in (q, k, v))
    if not (validate and world > 1):
        if error is not None:
            raise error
        return block_kernel
    summary = (_summary(q) + _summary(k) + _summary(v)) if tensors_ok else [-1] * 18
    row = summary + [int(bool(causal)), LAYOUTS.index(layout) if layout in LAYOUTS else -1, int(error is not None)]
    device = q.device if tensors_ok else torch.device("cpu")
    rows = all_gather_rows(torch.tensor(row, device=device), group).cpu()  # (P, 21)
    if error is not None:
        raise type(error)(f"{error} (on rank {rank})") from error
    bad = [r for r in range(world) if rows[r, -1]]
    if bad:
        raise ValueError(f"ring_attention: rank(s) {bad} rejected their inputs (see the error raised there)")
    if not bool((rows == rows[0]).all()):
        raise ValueError(
            "ring_attention: the shards differ across ranks; every rank must pass q, k, v of the same "
            f"shape and dtype and the same causal and layout: {describe_rows(rows, _render)}"
        )
    return block_kernel


# ----------------------------------------------------------------------------------------------------


def ring_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    group: dist.ProcessGroup | None = None,
    causal: bool = False,
    layout: str = "contiguous",
    scale: float | None = None,
    kernel: str | BlockKernel | None = None,
    validate: bool = True,
) -> Tensor:
    """Exact attention of this rank's queries over the whole sharded sequence (differentiable).

    Call it on every rank of ``group`` at once with that rank's shards. The result equals
    ``softmax(scale · Q Kᵀ [+ causal mask]) V`` of the full sequence, restricted to this rank's query
    positions (the same layout as ``q``).

    Args:
        q: ``(B, H, Lp, Dh)`` this rank's query shard.
        k, v: ``(B, Hkv, Sp, Dh)`` this rank's key/value shards; ``H % Hkv == 0`` (grouped-query:
            query head h reads key/value head ``h // (H / Hkv)``). Non-contiguous tensors are copied.
        group: the context-parallel process group (None: the default group).
        causal: position i attends positions j ≤ i of the full sequence (needs ``Lp == Sp``).
        layout: ``"contiguous"`` or ``"zigzag"`` — how the full sequence was sharded (module docstring);
            only the causal mask depends on it.
        scale: score scale, default ``1 / sqrt(Dh)``.
        kernel: block kernel — None / ``"auto"``, ``"math"``, ``"flash"``, ``"efficient"`` or an object
            (see :mod:`headwise.distributed.kernels`).
        validate: all-gather every rank's shapes, dtype, ``causal`` and ``layout`` and check they agree
            (one small collective per call); turn off only in a loop whose shapes you have checked.
    Returns:
        ``(B, H, Lp, Dh)`` in ``q``'s dtype (merged in float32, or float64 for float64 inputs).
    Raises:
        RuntimeError: no initialised process group (raised on every rank, without communicating).
        ValueError / TypeError: shapes, dtypes or arguments that are wrong or differ between ranks —
            raised on every rank together, after the all-gather.
    """
    rank, world = require_group(group, who="ring_attention")
    block_kernel = _check_inputs(q, k, v, causal, layout, kernel, group, rank, world, validate)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    return _RingAttention.apply(q, k, v, _Ring(group, rank, world), bool(causal), layout, float(scale), block_kernel)
