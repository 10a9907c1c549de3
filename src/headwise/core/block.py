"""The first article's embedding-plus-positions layer and its attention block, on headwise's attention.

Shape legend: B batch, L sequence length, D model width, H heads, V vocabulary size.
"""

from __future__ import annotations

from torch import Tensor, nn

from headwise import checks
from headwise.core.attention import MultiHeadAttention
from headwise.positional.learned import LearnedPositionalEmbedding
from headwise.positional.sinusoidal import SinusoidalPositionalEncoding

POSITIONAL = ("sinusoidal", "learned", None)


class EmbeddingWithPE(nn.Module):
    """Token embedding plus absolute positions: ``emb(ids) + PE[:L]`` (the first article's ``EmbeddingWithPE``).

    Args:
        vocab_size: V.
        d_model: D.
        max_len: the most positions (512 as in the article).
        positional: ``"sinusoidal"`` (Vaswani et al. §3.5, fixed), ``"learned"`` (BERT / GPT-2) or None.
    Shapes: ``token_ids (B, L)`` integers in ``[0, V)`` -> ``(B, L, D)``.
    Raises:
        ValueError: bad sizes; ``L > max_len``; token ids outside the vocabulary.
    """

    def __init__(self, vocab_size: int, d_model: int, max_len: int = 512, *, positional: str | None = "sinusoidal"):
        super().__init__()
        for name, value in (("vocab_size", vocab_size), ("d_model", d_model), ("max_len", max_len)):
            checks.positive_int(name, value)
        checks.one_of("positional", positional, POSITIONAL)
        self.vocab_size, self.d_model, self.max_len = vocab_size, d_model, max_len
        self.emb = nn.Embedding(vocab_size, d_model)
        if positional == "sinusoidal":
            self.pos = SinusoidalPositionalEncoding(d_model, max_len)
        elif positional == "learned":
            self.pos = LearnedPositionalEmbedding(max_len, d_model)
        else:
            self.pos = None

    def forward(self, token_ids: Tensor, offset: int = 0) -> Tensor:
        if token_ids.dim() != 2 or token_ids.is_floating_point():
            raise ValueError(
                f"token_ids: expected an integer tensor (B, L), got {token_ids.dtype} {tuple(token_ids.shape)}"
            )
        if token_ids.numel() and (int(token_ids.min()) < 0 or int(token_ids.max()) >= self.vocab_size):
            raise ValueError(
                f"token_ids: expected ids in [0, {self.vocab_size}), got values in "
                f"[{int(token_ids.min())}, {int(token_ids.max())}]"
            )
        x = self.emb(token_ids)  # (B, L, D)
        return x if self.pos is None else self.pos(x, offset)


class AttentionBlock(nn.Module):
    """Embedding + positions + multi-head self-attention: the first article's ``AttentionBlock``.

    Built on headwise's :class:`MultiHeadAttention` (the article uses ``nn.MultiheadAttention``; the
    parameter count is the same: 1,346,048 at ``(10000, 128, 4)``).

    ``forward(token_ids (B, L), *, key_padding_mask=None, is_causal=False, need_weights=False,
    average_weights=True)`` returns ``out (B, L, D)`` — or ``(out, weights)`` when ``need_weights``.
    """

    def __init__(
        self,
        vocab_size: int,
        d_model: int,
        num_heads: int,
        max_len: int = 512,
        *,
        positional: str | None = "sinusoidal",
        dropout: float = 0.0,
    ):
        super().__init__()
        self.emb_pe = EmbeddingWithPE(vocab_size, d_model, max_len, positional=positional)
        self.mha = MultiHeadAttention(d_model, num_heads, dropout=dropout)

    def forward(
        self,
        token_ids: Tensor,
        *,
        key_padding_mask: Tensor | None = None,
        is_causal: bool = False,
        need_weights: bool = False,
        average_weights: bool = True,
    ):
        x = self.emb_pe(token_ids)  # (B, L, D) — embedding + position
        out, weights = self.mha(
            x,
            key_padding_mask=key_padding_mask,
            is_causal=is_causal,
            need_weights=need_weights,
            average_weights=average_weights,
        )
        return (out, weights) if need_weights else out
