"""Context parallelism for :class:`headwise.MultiHeadAttention`: the module run on sequence shards,
its attention computed by :func:`headwise.distributed.ring_attention`.

Shape legend: B batch, L full sequence length, P ranks in the group, Lp = L / P the shard length,
D model width, H heads, Hkv key/value heads, Dh head width.

The projections are per token and need no communication: each rank projects its own shard with the
(replicated) weights, rotates it with RoPE at its *global* positions, and the ring does the rest.
"""

from __future__ import annotations

import torch.distributed as dist
from torch import Tensor, nn

from headwise import checks
from headwise.core.attention import MultiHeadAttention
from headwise.distributed._group import require_group
from headwise.distributed.kernels import BlockKernel
from headwise.distributed.ring import LAYOUTS, ring_attention, shard_positions
from headwise.positional.base import PositionalPart


class ContextParallelAttention(nn.Module):
    """A ``MultiHeadAttention`` that takes this rank's sequence shard and attends over the whole sequence.

    ``ContextParallelAttention(mha, group)(x_shard, is_causal=True)`` on every rank equals the shard of
    ``mha(x, is_causal=True)`` (the same weights; ``state_dict`` keys are ``attention.*``). Parameter
    gradients on each rank are that rank's share: sum them over the group (DDP/FSDP over the group do,
    or call :meth:`reduce_gradients`).

    Supported: self- and cross-attention (key/value shards), causal or not, GQA/MQA, RoPE (rotated at
    global positions), any ``scale``. Not supported (a ValueError says so): ALiBi and other score biases,
    masks other than causal, a KV cache, attention weights, dropout while training.

    Args:
        attention: a :class:`headwise.MultiHeadAttention`, the same on every rank.
        group: the context-parallel process group (None: the default group).
        layout: how the sequence is sharded — ``"contiguous"`` or ``"zigzag"``
            (:func:`headwise.distributed.shard_sequence`).
        kernel: the ring's block kernel (see :func:`headwise.distributed.ring_attention`).
    Raises:
        TypeError: ``attention`` is not a headwise attention module.
        ValueError: an unknown layout, or a positional part that adds a score bias (ALiBi).
    """

    def __init__(
        self,
        attention: nn.Module,
        group: dist.ProcessGroup | None = None,
        *,
        layout: str = "contiguous",
        kernel: str | BlockKernel | None = None,
    ):
        super().__init__()
        if not isinstance(attention, MultiHeadAttention):
            raise TypeError(f"attention: expected a headwise.MultiHeadAttention, got {type(attention).__name__}")
        checks.one_of("layout", layout, LAYOUTS)
        part = attention.positional
        if part is not None and type(part).score_bias is not PositionalPart.score_bias:
            raise ValueError(
                f"attention.positional: {type(part).__name__} adds a score bias, which the ring's block "
                "kernels do not take; context parallelism supports RoPE or no positional part"
            )
        self.attention, self.group, self.layout, self.kernel = attention, group, layout, kernel

    def extra_repr(self) -> str:
        return f"layout={self.layout!r}"

    def forward(
        self,
        query: Tensor,
        key: Tensor | None = None,
        value: Tensor | None = None,
        *,
        is_causal: bool = False,
        position_ids: Tensor | None = None,
    ) -> tuple[Tensor, None]:
        """Attend from this rank's ``query`` shard to the whole (sharded) key/value sequence.

        Args:
            query: ``(B, Lp, D)`` this rank's shard of the queries.
            key, value: ``(B, Sp, kdim)``, ``(B, Sp, vdim)`` this rank's shards (default: ``query``).
            is_causal: position i attends positions j ≤ i of the full sequence.
            position_ids: global positions ``(Lp,)`` or ``(B, Lp)`` of this rank's queries for RoPE
                (default: those of the layout, :func:`headwise.distributed.shard_positions`); key
                positions default the same way.
        Returns:
            ``(out (B, Lp, D), None)`` — this rank's shard of the output (no weights), like
            ``MultiHeadAttention``'s ``(out, weights)``.
        Raises:
            RuntimeError: no initialised process group.
            ValueError / TypeError: inputs that do not fit the module (raised by each rank alone, before any
                communication), or shards that differ between ranks (raised on every rank by the ring).
        """
        m = self.attention
        rank, world = require_group(self.group, who="ContextParallelAttention")
        if m.training and m.dropout > 0:
            raise ValueError(f"attention.dropout: {m.dropout} while training is not supported by ring attention")
        self_attention = key is None and value is None
        key = query if key is None else key
        value = key if value is None else value
        for name, t, width in (("query", query, m.d_model), ("key", key, m.kdim), ("value", value, m.vdim)):
            if not isinstance(t, Tensor) or t.dim() != 3 or t.shape[-1] != width:
                shape = tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
                raise ValueError(f"{name}: expected this rank's shard (B, Lp, {width}), got {shape}")
        B, Lp, _ = query.shape
        Sp, dh = key.shape[1], m.head_dim

        q = m.Wq(query).view(B, Lp, -1, dh).transpose(1, 2)  # (B, H, Lp, Dh)
        k = m.Wk(key).view(B, Sp, -1, dh).transpose(1, 2)  # (B, Hkv, Sp, Dh)
        v = m.Wv(value).view(B, Sp, -1, dh).transpose(1, 2)  # (B, Hkv, Sp, Dh)
        if m.positional is not None:
            if position_ids is None:
                q_pos = shard_positions(
                    Lp * world, rank=rank, world_size=world, layout=self.layout, device=query.device
                )  # (Lp,)
            else:
                q_pos = position_ids.to(query.device)
            if self_attention:
                k_pos = q_pos
            else:
                k_pos = shard_positions(
                    Sp * world, rank=rank, world_size=world, layout=self.layout, device=query.device
                )  # (Sp,)
            q, k = m.positional.rotate_qk(q, k, q_pos, k_pos)
        out = ring_attention(
            q, k, v, group=self.group, causal=is_causal, layout=self.layout, scale=m.scale, kernel=self.kernel
        )  # (B, H, Lp, Dh)
        return m.Wo(out.transpose(1, 2).reshape(B, Lp, -1)), None  # (B, Lp, H·Dh) -> (B, Lp, D)

    def reduce_gradients(self) -> None:
        """Sum every parameter gradient over the group (all-reduce), so each rank holds the full gradient."""
        require_group(self.group, who="ContextParallelAttention.reduce_gradients")
        for p in self.attention.parameters():
            if p.grad is not None:
                grad = p.grad.contiguous()
                dist.all_reduce(grad, group=self.group)
                p.grad = grad
