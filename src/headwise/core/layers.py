"""The first article's Part 5: the encoder layer and the decoder layer around headwise's attention.

Vaswani et al. 2017 §3.1: every sublayer (attention, then the position-wise feed-forward network) is
wrapped as ``LayerNorm(x + Sublayer(x))`` — **post-LN**. Most models since GPT-2 (Radford et al. 2019;
Xiong et al. 2020 on why it trains more stably) put the norm first: ``x + Sublayer(LayerNorm(x))`` —
**pre-LN**. One switch, ``norm_first``, chooses, with the meaning of ``torch.nn.TransformerEncoderLayer``'s
argument of the same name; the parameters are the same either way, so are their names' roles.

Shape legend: B batch, L query length, S key length (memory or cache included), D model width,
H heads, F feed-forward width (``d_ff``).

Parameters of an :class:`EncoderLayer` (biases everywhere, as Vaswani et al. and ``nn.TransformerEncoderLayer``):
attention ``4·D² + 4·D``, feed-forward ``2·D·F + F + D``, two LayerNorms ``2·2·D``. At ``D = 32, F = 64``
that is 4,224 + 4,192 + 128 = 8,544, the first article's "8,544-parameter encoder layer", for any head
count dividing 32.
"""

from __future__ import annotations

from torch import Tensor, nn

from headwise import checks
from headwise.core.attention import MultiHeadAttention
from headwise.core.cache import KVCache
from headwise.positional.base import PositionalPart

__all__ = ["ACTIVATIONS", "FeedForward", "EncoderLayer", "DecoderLayer", "encoder_layer_params"]

ACTIVATIONS = ("relu", "gelu")


def encoder_layer_params(d_model: int, d_ff: int) -> dict[str, int]:
    """The parameter count of an :class:`EncoderLayer` by part, from the formula (not from a module).

    Returns:
        ``{"attention": 4·D² + 4·D, "feed_forward": 2·D·F + F + D, "layer_norm": 4·D, "total": …}``.
    """
    checks.positive_int("d_model", d_model)
    checks.positive_int("d_ff", d_ff)
    parts = {
        "attention": 4 * d_model * d_model + 4 * d_model,
        "feed_forward": 2 * d_model * d_ff + d_ff + d_model,
        "layer_norm": 2 * 2 * d_model,
    }
    return {**parts, "total": sum(parts.values())}


class FeedForward(nn.Module):
    """The position-wise feed-forward network, Vaswani et al. §3.3: ``W2 · act(W1 · x + b1) + b2``.

    Args:
        d_model: D.
        d_ff: F, the inner width (4·D in Vaswani et al.: 2048 for D = 512).
        activation: ``"relu"`` (Vaswani et al.) or ``"gelu"`` (BERT, GPT-2; the exact erf form).
        dropout: dropout on the inner activations while training, in [0, 1).
    Shapes: ``x (…, D) -> (…, D)``, each position on its own.
    """

    def __init__(self, d_model: int, d_ff: int, *, activation: str = "relu", dropout: float = 0.0):
        super().__init__()
        checks.positive_int("d_model", d_model)
        checks.positive_int("d_ff", d_ff)
        checks.one_of("activation", activation, ACTIVATIONS)
        checks.probability("dropout", dropout)
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)
        self.activation = nn.ReLU() if activation == "relu" else nn.GELU()
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear2(self.dropout(self.activation(self.linear1(x))))  # (…, F) -> (…, D)


def _check_norm_first(norm_first) -> bool:
    if not isinstance(norm_first, bool):
        raise TypeError(f"norm_first: expected a bool (False: post-LN, True: pre-LN), got {norm_first!r}")
    return norm_first


class EncoderLayer(nn.Module):
    """Self-attention and a feed-forward network, each with a residual connection and a LayerNorm.

    Post-LN (``norm_first=False``, Vaswani et al. §3.1, the default of ``nn.TransformerEncoderLayer``)::

        x = LayerNorm1(x + Dropout(SelfAttention(x)))
        x = LayerNorm2(x + Dropout(FeedForward(x)))

    Pre-LN (``norm_first=True``)::

        x = x + Dropout(SelfAttention(LayerNorm1(x)))
        x = x + Dropout(FeedForward(LayerNorm2(x)))

    With the same weights it computes what ``nn.TransformerEncoderLayer(batch_first=True)`` computes
    (tested to agree in float64).

    Args:
        d_model: D.
        num_heads: H; must divide D.
        d_ff: F, the feed-forward inner width.
        dropout: on the attention weights, the feed-forward activations and both residual branches.
        activation: ``"relu"`` or ``"gelu"``.
        norm_first: False for post-LN, True for pre-LN.
        layer_norm_eps: LayerNorm's epsilon (1e-5 as PyTorch).
        positional: a part acting inside attention (``RotaryEmbedding``, ``ALiBi``), or None.
    Raises:
        ValueError / TypeError: sizes, rates or switches that do not fit.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        d_ff: int,
        *,
        dropout: float = 0.0,
        activation: str = "relu",
        norm_first: bool = False,
        layer_norm_eps: float = 1e-5,
        positional: PositionalPart | None = None,
    ):
        super().__init__()
        checks.probability("dropout", dropout)
        self.norm_first = _check_norm_first(norm_first)
        self.self_attn = MultiHeadAttention(d_model, num_heads, dropout=dropout, positional=positional)
        self.ff = FeedForward(d_model, d_ff, activation=activation, dropout=dropout)
        self.norm1 = nn.LayerNorm(d_model, eps=layer_norm_eps)
        self.norm2 = nn.LayerNorm(d_model, eps=layer_norm_eps)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)

    def extra_repr(self) -> str:
        return f"norm_first={self.norm_first}"

    def forward(
        self,
        x: Tensor,
        *,
        attn_mask: Tensor | None = None,
        key_padding_mask: Tensor | None = None,
        is_causal: bool = False,
        need_weights: bool = False,
        average_weights: bool = True,
    ):
        """``x (B, L, D)`` -> ``(B, L, D)``, or ``(out, weights)`` when ``need_weights``.

        Masks as :class:`MultiHeadAttention` (boolean True = may not attend; float added to the scores);
        weights ``(B, L, S)`` averaged over heads, or ``(B, H, L, S)`` with ``average_weights=False``.
        """
        kw = {
            "attn_mask": attn_mask,
            "key_padding_mask": key_padding_mask,
            "is_causal": is_causal,
            "need_weights": need_weights,
            "average_weights": average_weights,
        }
        if self.norm_first:
            a, weights = self.self_attn(self.norm1(x), **kw)
            x = x + self.dropout1(a)
            x = x + self.dropout2(self.ff(self.norm2(x)))
        else:
            a, weights = self.self_attn(x, **kw)
            x = self.norm1(x + self.dropout1(a))
            x = self.norm2(x + self.dropout2(self.ff(x)))
        return (x, weights) if need_weights else x


class DecoderLayer(nn.Module):
    """Causal self-attention, optional cross-attention on an encoder's output, optional feed-forward.

    - ``cross_attention=True`` is Vaswani et al.'s decoder layer (three sublayers; with the same weights
      it computes what ``nn.TransformerDecoderLayer(batch_first=True)`` computes).
    - ``cross_attention=False`` is the decoder-only layer of GPT (two sublayers).
    - ``d_ff=None`` drops the feed-forward sublayer: the attention-only layer of Elhage et al. 2021 and
      Olsson et al. 2022, used by :mod:`headwise.lab` to grow induction heads.

    Each sublayer is wrapped post-LN or pre-LN as in :class:`EncoderLayer`. Self-attention is causal
    (query slot i sees key slots j ≤ i, counted from the start of ``cache``).

    Args:
        d_model: D.
        num_heads: H; must divide D.
        d_ff: F, or None for no feed-forward sublayer.
        cross_attention: add the encoder-decoder attention sublayer (then ``forward`` needs ``memory``).
        dropout, activation, norm_first, layer_norm_eps: as :class:`EncoderLayer`.
        positional: a part for the self-attention (RoPE, ALiBi), or None.
        bias: biases on the attention projections.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        d_ff: int | None = None,
        *,
        cross_attention: bool = False,
        dropout: float = 0.0,
        activation: str = "relu",
        norm_first: bool = True,
        layer_norm_eps: float = 1e-5,
        positional: PositionalPart | None = None,
        bias: bool = True,
    ):
        super().__init__()
        checks.probability("dropout", dropout)
        if not isinstance(cross_attention, bool):
            raise TypeError(f"cross_attention: expected a bool, got {cross_attention!r}")
        self.norm_first = _check_norm_first(norm_first)
        self.self_attn = MultiHeadAttention(d_model, num_heads, dropout=dropout, positional=positional, bias=bias)
        self.norm1 = nn.LayerNorm(d_model, eps=layer_norm_eps)
        self.dropout1 = nn.Dropout(dropout)
        self.cross_attn = self.norm2 = self.dropout2 = None
        if cross_attention:
            self.cross_attn = MultiHeadAttention(d_model, num_heads, dropout=dropout, bias=bias)
            self.norm2 = nn.LayerNorm(d_model, eps=layer_norm_eps)
            self.dropout2 = nn.Dropout(dropout)
        self.ff = self.norm3 = self.dropout3 = None
        if d_ff is not None:
            self.ff = FeedForward(d_model, d_ff, activation=activation, dropout=dropout)
            self.norm3 = nn.LayerNorm(d_model, eps=layer_norm_eps)
            self.dropout3 = nn.Dropout(dropout)

    def extra_repr(self) -> str:
        return f"norm_first={self.norm_first}"

    def _sublayer(self, x: Tensor, norm: nn.LayerNorm, dropout: nn.Dropout, fn) -> tuple[Tensor, Tensor | None]:
        """One residual sublayer, post-LN or pre-LN; ``fn(h) -> (out, weights)``."""
        if self.norm_first:
            out, weights = fn(norm(x))
            return x + dropout(out), weights
        out, weights = fn(x)
        return norm(x + dropout(out)), weights

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        *,
        attn_mask: Tensor | None = None,
        key_padding_mask: Tensor | None = None,
        memory_key_padding_mask: Tensor | None = None,
        need_weights: bool = False,
        average_weights: bool = True,
        position_ids: Tensor | None = None,
        cache: KVCache | None = None,
    ):
        """``x (B, L, D)`` (and ``memory (B, S, D)`` with cross-attention) -> ``(B, L, D)``.

        Args:
            x: the decoder's input.
            memory: the encoder's output; required exactly when the layer has cross-attention.
            attn_mask, key_padding_mask: extra self-attention masks, combined with causality.
            memory_key_padding_mask: ``(B, S)``, True where ``memory`` is padding.
            need_weights: also return the self-attention weights.
            average_weights: weights ``(B, L, S)`` averaged over heads, or ``(B, H, L, S)``.
            position_ids, cache: passed to the self-attention (RoPE positions; a :class:`KVCache`).
        Returns:
            ``out (B, L, D)``, or ``(out, self-attention weights)`` when ``need_weights``.
        Raises:
            ValueError: ``memory`` given to a layer without cross-attention, or missing with one.
        """
        if (memory is None) != (self.cross_attn is None):
            want = "an encoder output (B, S, D)" if self.cross_attn is not None else "None (no cross-attention)"
            raise ValueError(f"memory: expected {want}, got {None if memory is None else tuple(memory.shape)}")

        def self_attention(h):
            return self.self_attn(
                h,
                attn_mask=attn_mask,
                key_padding_mask=key_padding_mask,
                is_causal=True,
                need_weights=need_weights,
                average_weights=average_weights,
                position_ids=position_ids,
                cache=cache,
            )

        x, weights = self._sublayer(x, self.norm1, self.dropout1, self_attention)
        if self.cross_attn is not None:
            x, _ = self._sublayer(
                x,
                self.norm2,
                self.dropout2,
                lambda h: self.cross_attn(h, memory, memory, key_padding_mask=memory_key_padding_mask),
            )
        if self.ff is not None:
            x, _ = self._sublayer(x, self.norm3, self.dropout3, lambda h: (self.ff(h), None))
        return (x, weights) if need_weights else x
