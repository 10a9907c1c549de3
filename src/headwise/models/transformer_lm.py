"""``TransformerLM``: a small decoder-only language model built from headwise's own layers.

Token embedding (+ learned absolute positions, or RoPE inside attention) -> ``num_layers`` pre-LN
:class:`~headwise.core.layers.DecoderLayer` (attention-only when ``d_ff`` is None, as the models of
Elhage et al. 2021 and Olsson et al. 2022) -> final LayerNorm -> unembedding.

Shape legend: B batch, L sequence length (at most ``context_length``), D model width, H heads,
V vocabulary size, N layers.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import partial

import torch
from torch import Tensor, nn

from headwise import checks
from headwise.core.hooks import hooked
from headwise.core.layers import ACTIVATIONS, DecoderLayer
from headwise.positional.rope import RotaryEmbedding

__all__ = ["LMConfig", "TransformerLM", "POSITIONAL"]

POSITIONAL = ("rope", "learned")


@dataclass(frozen=True)
class LMConfig:
    """Everything that describes a :class:`TransformerLM` (saved as ``config.json`` beside the weights).

    Attributes:
        vocab_size: V.
        context_length: the longest sequence L the model accepts.
        d_model: D.
        num_layers: N.
        num_heads: H; must divide D (head width ``D / H``).
        d_ff: the feed-forward width, or None for attention-only layers.
        positional: ``"rope"`` (rotary, Su et al. 2021, in every attention) or ``"learned"`` (GPT-2's
            learned absolute positions added to the embedding).
        activation: the feed-forward activation, ``"relu"`` or ``"gelu"``.
    """

    vocab_size: int = 256
    context_length: int = 64
    d_model: int = 64
    num_layers: int = 2
    num_heads: int = 4
    d_ff: int | None = None
    positional: str = "rope"
    activation: str = "gelu"

    def __post_init__(self):
        for name in ("vocab_size", "context_length", "d_model", "num_layers", "num_heads"):
            checks.positive_int(name, getattr(self, name))
        if self.d_ff is not None:
            checks.positive_int("d_ff", self.d_ff)
        if self.d_model % self.num_heads:
            raise ValueError(f"num_heads: expected a divisor of d_model={self.d_model}, got {self.num_heads}")
        if self.positional == "rope" and (self.d_model // self.num_heads) % 2:
            raise ValueError(
                f"num_heads: RoPE needs an even head width, got d_model / num_heads = {self.d_model}/{self.num_heads}"
            )
        checks.one_of("positional", self.positional, POSITIONAL)
        checks.one_of("activation", self.activation, ACTIVATIONS)

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> LMConfig:
        """The config from ``to_dict``'s output. Raises ValueError on unknown or missing keys."""
        if not isinstance(data, dict):
            raise ValueError(f"config: expected a JSON object, got {type(data).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"config: unknown keys {unknown} (expected some of {sorted(known)})")
        return cls(**data)


class TransformerLM(nn.Module):
    """A decoder-only transformer language model on headwise's :class:`DecoderLayer`.

    ``model(token_ids (B, L))`` -> logits ``(B, L, V)``: position t predicts token t + 1. Any ids in
    ``[0, V)``, no BOS token needed, ``1 ≤ L ≤ context_length``.

    Attributes:
        config: the :class:`LMConfig`.
        vocab_size, context_length: from the config.
    """

    def __init__(self, config: LMConfig):
        super().__init__()
        if not isinstance(config, LMConfig):
            raise TypeError(f"config: expected an LMConfig, got {type(config).__name__}")
        self.config = config
        self.vocab_size, self.context_length = config.vocab_size, config.context_length
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.pos_embed = None
        if config.positional == "learned":
            self.pos_embed = nn.Embedding(config.context_length, config.d_model)
        self.layers = nn.ModuleList(
            DecoderLayer(
                config.d_model,
                config.num_heads,
                config.d_ff,
                activation=config.activation,
                norm_first=True,
                positional=RotaryEmbedding(config.head_dim) if config.positional == "rope" else None,
            )
            for _ in range(config.num_layers)
        )
        self.norm = nn.LayerNorm(config.d_model)
        self.unembed = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.apply(self._init)

    @staticmethod
    def _init(m: nn.Module) -> None:
        """GPT-2's initialisation: normal(0, 0.02) weights, zero biases."""
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def check_ids(self, token_ids: Tensor) -> None:
        """Raise ValueError / TypeError unless ``token_ids`` is an integer ``(B, L)`` tensor of ids in ``[0, V)``."""
        if not isinstance(token_ids, Tensor):
            raise TypeError(f"token_ids: expected a torch.Tensor, got {type(token_ids).__name__}")
        if token_ids.dim() != 2 or token_ids.is_floating_point() or token_ids.dtype == torch.bool:
            raise ValueError(
                f"token_ids: expected an integer tensor (B, L), got {token_ids.dtype} {tuple(token_ids.shape)}"
            )
        B, L = token_ids.shape
        if not 1 <= L <= self.context_length:
            raise ValueError(f"token_ids: expected 1 to {self.context_length} positions, got shape {(B, L)}")
        if token_ids.numel() and (int(token_ids.min()) < 0 or int(token_ids.max()) >= self.vocab_size):
            raise ValueError(
                f"token_ids: expected ids in [0, {self.vocab_size}), got values in "
                f"[{int(token_ids.min())}, {int(token_ids.max())}]"
            )

    def forward(self, token_ids: Tensor, *, need_weights: bool = False, head_mask: Tensor | None = None):
        """Logits ``(B, L, V)``; with ``need_weights`` also every layer's weights ``[(B, H, L, L)] * N``.

        Args:
            token_ids: ``(B, L)`` integer ids in ``[0, V)``, ``1 ≤ L ≤ context_length``.
            need_weights: also return the per-head attention weights of every layer.
            head_mask: ``(N, H)`` float gates multiplying each head's output before ``Wo`` (1 keeps a
                head, 0 removes it; Michel et al. 2019's ξ_h — differentiable, for head importance).
        Raises:
            ValueError / TypeError: not an integer ``(B, L)`` tensor, ``L`` outside ``[1, context_length]``,
            ids outside ``[0, V)``, a ``head_mask`` that is not ``(N, H)`` floats.
        """
        self.check_ids(token_ids)
        N, H = self.config.num_layers, self.config.num_heads
        if head_mask is not None and (
            not isinstance(head_mask, Tensor) or tuple(head_mask.shape) != (N, H) or not head_mask.is_floating_point()
        ):
            got = tuple(head_mask.shape) if isinstance(head_mask, Tensor) else type(head_mask).__name__
            raise ValueError(f"head_mask: expected a float tensor (N, H) = ({N}, {H}), got {got}")
        x = self.embed(token_ids)  # (B, L, D)
        if self.pos_embed is not None:
            x = x + self.pos_embed(torch.arange(token_ids.shape[1], device=token_ids.device))  # (L, D) broadcast
        weights = []
        gates = []  # (hook point, gate) per layer: head_mask acts where the heads meet Wo
        if head_mask is not None:
            gates = [(layer.self_attn.hook_heads, partial(_gate_heads, m)) for layer, m in zip(self.layers, head_mask)]
        with hooked(gates):
            for layer in self.layers:
                if need_weights:
                    x, w = layer(x, need_weights=True, average_weights=False)  # (B, L, D), (B, H, L, L)
                    weights.append(w)
                else:
                    x = layer(x)  # (B, L, D)
        logits = self.unembed(self.norm(x))  # (B, L, V)
        return (logits, weights) if need_weights else logits


def _gate_heads(gates: Tensor, heads_out: Tensor) -> Tensor:
    """A ``hook_heads`` hook: head h's output ``(B, H, L, Dh)`` multiplied by ``gates[h]``."""
    return heads_out * gates.to(heads_out.dtype)[:, None, None]  # (H, 1, 1) broadcast
