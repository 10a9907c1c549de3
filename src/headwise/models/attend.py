"""Adapters that run a model on texts and return its attention maps with the batch they read.

Shape legend: B batch, H heads, L padded length, NL layers.

Each adapter returns a function ``attend(texts) -> (attentions, batch)`` for
:func:`headwise.analysis.analyze_texts` and :func:`headwise.analysis.analyze_sentence`: ``attentions``
is a list of NL NumPy arrays ``(B, H, L, L)`` (float32), ``batch`` the :class:`EncodedBatch` the model
read (its ``tokens`` and ``attention_mask`` are what the metrics need to tell [CLS], [SEP], punctuation
and padding apart).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from headwise.models.tokenizer import EncodedBatch, encode

__all__ = ["model_attend", "block_attend"]

#: What an adapter's ``attend`` returns: NL maps ``(B, H, L, L)`` and the encoded batch.
Attended = tuple[list[np.ndarray], EncodedBatch]


def model_attend(model, tokenizer, *, max_length: int | None = None) -> Callable[[list[str]], Attended]:
    """``attend`` for a :class:`headwise.models.BertEncoder` and its tokenizer.

    Texts are tokenized as single segments (``[CLS] text [SEP]``), padded to the batch's longest and
    truncated, with a warning, to ``max_length`` (default: the model's position limit), see
    :func:`headwise.models.encode`. The encoder runs without gradients; its per-layer weights
    ``(B, H, L, L)`` come back as float32 NumPy arrays.
    """

    def attend(texts: list[str]) -> Attended:
        batch = encode(tokenizer, texts, max_length=max_length or model.config.max_position_embeddings)
        with torch.no_grad():
            out = model(batch.input_ids, attention_mask=batch.attention_mask)
        return [a.float().cpu().numpy() for a in out.attentions], batch

    return attend


def block_attend(block, tokenizer, *, max_length: int) -> Callable[[list[str]], Attended]:
    """``attend`` for a one-layer model ``block(input_ids, key_padding_mask) -> (B, H, L, L)`` weights.

    Used for the untrained demo block of the first article (``headwise heads --model untrained``):
    ``block`` is any callable taking ``input_ids (B, L)`` and a ``key_padding_mask (B, L)`` (True =
    padding) and returning the per-head weights of its one attention layer.
    """

    def attend(texts: list[str]) -> Attended:
        batch = encode(tokenizer, texts, max_length=max_length)
        with torch.no_grad():
            weights = block(batch.input_ids, batch.attention_mask == 0)
        return [np.asarray(weights.float().cpu().numpy())], batch

    return attend
