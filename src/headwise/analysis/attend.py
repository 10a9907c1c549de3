"""Adapters that run a model on texts and return what the metrics need: per-layer maps and token info.

Shape legend: B batch, H heads, L padded length, NL layers.

Each adapter returns a function ``attend(texts) -> (attentions, info)`` for
:func:`headwise.analysis.analyze_texts`: ``attentions`` is a list of NL NumPy arrays ``(B, H, L, L)``
(float32) and ``info`` a :class:`TokenInfo` built from the tokenizer's tokens and attention mask.
torch is imported only when an adapter is called.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from headwise.analysis.tokens import TokenInfo, token_info

__all__ = ["model_attend", "block_attend"]


def model_attend(model, tokenizer, *, max_length: int | None = None) -> Callable[[list[str]], tuple[list, TokenInfo]]:
    """``attend`` for a :class:`headwise.models.BertModel` and its tokenizer.

    Texts are tokenized as single segments (``[CLS] text [SEP]``), padded to the batch's longest and
    truncated, with a warning, to ``max_length`` (default: the model's position limit), see
    :func:`headwise.models.encode`.
    """
    from headwise.models import encode

    def attend(texts: list[str]):
        import torch

        batch = encode(tokenizer, texts, max_length=max_length or model.config.max_position_embeddings)
        with torch.no_grad():
            out = model(batch.input_ids, attention_mask=batch.attention_mask)
        maps = [a.float().cpu().numpy() for a in out.attentions]
        return maps, token_info(batch.tokens, batch.attention_mask.numpy())

    return attend


def block_attend(block, tokenizer, *, max_length: int) -> Callable[[list[str]], tuple[list, TokenInfo]]:
    """``attend`` for a one-layer model ``block(input_ids, key_padding_mask) -> (B, H, L, L)`` weights.

    Used for the untrained demo block of the first article (``headwise heads --model untrained``):
    ``block`` is any callable taking ``input_ids (B, L)`` and a ``key_padding_mask (B, L)`` (True =
    padding) and returning the per-head weights of its one attention layer.
    """
    from headwise.models import encode

    def attend(texts: list[str]):
        import torch

        batch = encode(tokenizer, texts, max_length=max_length)
        with torch.no_grad():
            weights = block(batch.input_ids, batch.attention_mask == 0)
        return [np.asarray(weights.float().cpu().numpy())], token_info(batch.tokens, batch.attention_mask.numpy())

    return attend
