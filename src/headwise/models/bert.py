"""A BERT encoder (Devlin et al. 2019) whose self-attention is headwise's :class:`MultiHeadAttention`.

Shape legend: B batch, L sequence length, D hidden width, H heads, F feed-forward width.

Post-LayerNorm, as the original BERT and Hugging Face's ``BertModel``:

    x₀ = LayerNorm(word[ids] + position[0 … L−1] + token_type[segment ids])
    a  = LayerNorm(x + MultiHeadAttention(x, key_padding_mask = padding))
    x' = LayerNorm(a + W₂ act(W₁ a))                        (act: exact GELU for "gelu")

Module names describe what they are (``embed.word``, ``layers.0.attn.Wq``, ``layers.0.ffn_in``); the
checkpoint's names are mapped to them in :mod:`headwise.models.checkpoint`. No pooler: the encoder returns
hidden states and attention weights, which is what the analysis uses.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from headwise.core.attention import MultiHeadAttention
from headwise.models.config import BertConfig

__all__ = ["BertEncoder", "BertOutput", "BertEmbeddings", "BertLayer"]


@dataclass
class BertOutput:
    """What :class:`BertEncoder` returns.

    Attributes:
        last_hidden_state: ``(B, L, D)``, the last layer's output.
        hidden_states: ``num_layers + 1`` tensors ``(B, L, D)``: the embeddings' output, then each layer's.
        attentions: ``num_layers`` tensors ``(B, H, L, L)`` of attention weights (rows: queries; padded
            keys get weight 0), or None when not asked for.
    """

    last_hidden_state: Tensor
    hidden_states: tuple[Tensor, ...]
    attentions: tuple[Tensor, ...] | None


def _activation(name: str) -> nn.Module:
    if name == "gelu":
        return nn.GELU()  # exact erf GELU, Hugging Face's "gelu"
    if name in ("gelu_new", "gelu_pytorch_tanh"):
        return nn.GELU(approximate="tanh")
    return nn.ReLU()


class BertEmbeddings(nn.Module):
    """Word + learned absolute position + token-type embeddings, then LayerNorm and dropout."""

    def __init__(self, config: BertConfig):
        super().__init__()
        d = config.hidden_size
        self.word = nn.Embedding(config.vocab_size, d, padding_idx=config.pad_token_id)
        self.position = nn.Embedding(config.max_position_embeddings, d)
        self.token_type = nn.Embedding(config.type_vocab_size, d)
        self.norm = nn.LayerNorm(d, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids: Tensor, token_type_ids: Tensor) -> Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)  # (L,)
        # (word + token type) + position: Hugging Face's order of the two float additions.
        x = self.word(input_ids) + self.token_type(token_type_ids) + self.position(positions)[None]  # (B, L, D)
        return self.dropout(self.norm(x))


class BertLayer(nn.Module):
    """One post-LayerNorm encoder layer: self-attention and a feed-forward block, each with a residual."""

    def __init__(self, config: BertConfig):
        super().__init__()
        d = config.hidden_size
        self.attn = MultiHeadAttention(
            d, config.num_attention_heads, bias=True, dropout=config.attention_probs_dropout_prob
        )
        self.attn_norm = nn.LayerNorm(d, eps=config.layer_norm_eps)
        self.ffn_in = nn.Linear(d, config.intermediate_size)
        self.act = _activation(config.hidden_act)
        self.ffn_out = nn.Linear(config.intermediate_size, d)
        self.ffn_norm = nn.LayerNorm(d, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, x: Tensor, padding: Tensor | None, need_weights: bool) -> tuple[Tensor, Tensor | None]:
        """``x (B, L, D)``, ``padding (B, L)`` bool True = padded key -> ``(x', weights (B, H, L, L) or None)``."""
        a, weights = self.attn(x, key_padding_mask=padding, need_weights=need_weights, average_weights=False)
        a = self.attn_norm(x + self.dropout(a))  # (B, L, D)
        f = self.ffn_out(self.act(self.ffn_in(a)))  # (B, L, F) -> (B, L, D)
        return self.ffn_norm(a + self.dropout(f)), weights


class BertEncoder(nn.Module):
    """BERT's embeddings and encoder layers, without the pooler.

    Build it empty with ``BertEncoder(config)``; load a checkpoint with :func:`headwise.models.load_bert`.

    ``model(input_ids, attention_mask=None, *, token_type_ids=None, output_attentions=True)``:

    Args:
        input_ids: ``(B, L)`` integer token ids, ``L ≤ max_position_embeddings``.
        attention_mask: ``(B, L)``, 1 (True) for a real token, 0 for padding (Hugging Face's convention;
            the opposite of headwise's boolean masks, converted here); default all real.
        token_type_ids: ``(B, L)`` segment ids (default 0).
        output_attentions: return the attention weights (computed on the readable math path);
            False uses the fast backend and returns ``attentions=None``.
    Returns:
        :class:`BertOutput`.
    Raises:
        ValueError / TypeError: ids that are not a 2-D integer tensor or lie outside the vocabulary, a
        sequence longer than the position table, masks or segment ids whose shape differs from ``input_ids``.
    """

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config
        self.embed = BertEmbeddings(config)
        self.layers = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))

    def _check(self, input_ids, attention_mask, token_type_ids) -> None:
        c = self.config
        if not isinstance(input_ids, Tensor) or input_ids.dim() != 2 or input_ids.is_floating_point():
            raise TypeError(f"input_ids: expected an integer tensor (B, L), got {input_ids!r:.80}")
        if input_ids.dtype == torch.bool:
            raise TypeError("input_ids: expected an integer tensor (B, L), got a bool tensor")
        length = input_ids.shape[1]
        if length > c.max_position_embeddings:
            raise ValueError(
                f"input_ids: {length} tokens, more than max_position_embeddings={c.max_position_embeddings} "
                "(truncate first: headwise.models.encode does, with a warning)"
            )
        if input_ids.numel() and (int(input_ids.min()) < 0 or int(input_ids.max()) >= c.vocab_size):
            raise ValueError(
                f"input_ids: expected ids in [0, {c.vocab_size}), got values in "
                f"[{int(input_ids.min())}, {int(input_ids.max())}]"
            )
        for name, t in (("attention_mask", attention_mask), ("token_type_ids", token_type_ids)):
            if t is not None and (not isinstance(t, Tensor) or t.shape != input_ids.shape):
                shape = tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
                raise ValueError(f"{name}: expected shape {tuple(input_ids.shape)} like input_ids, got {shape}")
        t = token_type_ids
        if t is not None and t.numel() and (int(t.min()) < 0 or int(t.max()) >= c.type_vocab_size):
            raise ValueError(f"token_type_ids: expected values in [0, {c.type_vocab_size})")

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        *,
        token_type_ids: Tensor | None = None,
        output_attentions: bool = True,
    ) -> BertOutput:
        self._check(input_ids, attention_mask, token_type_ids)
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        padding = None if attention_mask is None else attention_mask == 0  # (B, L): True = padded key
        x = self.embed(input_ids, token_type_ids)  # (B, L, D)
        hidden, attentions = [x], []
        for layer in self.layers:
            x, w = layer(x, padding, output_attentions)
            hidden.append(x)
            attentions.append(w)
        return BertOutput(
            last_hidden_state=x,
            hidden_states=tuple(hidden),
            attentions=tuple(attentions) if output_attentions else None,
        )
