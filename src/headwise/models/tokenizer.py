"""BERT tokenizer loading (``tokenizers``, from ``tokenizer.json`` or ``vocab.txt``) and batch encoding.

Shape legend: B batch, L padded length.

Texts are encoded as single segments, ``[CLS] text [SEP]``, padded on the right to the batch's longest.
**Too long**: a text of more than ``max_length`` tokens (the model's 512 positions by default) is
truncated to its first ``max_length − 1`` word pieces plus ``[SEP]``, and a :class:`TruncationWarning`
says which text and how many tokens it had. Empty (or all-whitespace) texts are refused.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

__all__ = ["EncodedBatch", "TruncationWarning", "load_tokenizer", "encode"]


class TruncationWarning(UserWarning):
    """A text had more tokens than the model's positions and was cut."""


@dataclass
class EncodedBatch:
    """A tokenized, padded batch.

    Attributes:
        input_ids: ``(B, L)`` long. attention_mask: ``(B, L)`` long, 1 = real token, 0 = padding.
        tokens: per text, its token strings (padding included, ``[PAD]``).
        num_tokens: per text, its token count before truncation (``[CLS]`` and ``[SEP]`` included).
        truncated: per text, whether it was cut to ``max_length``.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    tokens: list[list[str]]
    num_tokens: list[int]
    truncated: list[bool]


def load_tokenizer(folder: str | os.PathLike):
    """A ``tokenizers.Tokenizer`` for a BERT checkpoint folder, with its own padding and truncation off.

    Reads ``tokenizer.json`` when present, otherwise builds a WordPiece tokenizer from ``vocab.txt``
    (lower-casing as ``tokenizer_config.json``'s ``do_lower_case`` says, default True).

    Raises:
        FileNotFoundError: neither file. ValueError: an unreadable tokenizer file (naming it).
    """
    from tokenizers import Tokenizer
    from tokenizers.implementations import BertWordPieceTokenizer

    folder = Path(folder)
    tj, vocab = folder / "tokenizer.json", folder / "vocab.txt"
    if tj.is_file():
        try:
            tok = Tokenizer.from_file(os.fspath(tj))
        except Exception as e:  # tokenizers raises a bare Exception on bad JSON
            raise ValueError(f"{tj}: not a valid tokenizer.json ({' '.join(str(e).split())})") from None
    elif vocab.is_file():
        lower = True
        cfg = folder / "tokenizer_config.json"
        if cfg.is_file():
            try:
                lower = bool(json.loads(cfg.read_text(encoding="utf-8")).get("do_lower_case", True))
            except (UnicodeDecodeError, json.JSONDecodeError) as e:
                raise ValueError(f"{cfg}: not a valid JSON file ({e})") from None
        try:
            tok = BertWordPieceTokenizer(os.fspath(vocab), lowercase=lower)._tokenizer
        except Exception as e:
            raise ValueError(f"{vocab}: not a valid WordPiece vocabulary ({' '.join(str(e).split())})") from None
    else:
        raise FileNotFoundError(f"{folder}: no tokenizer.json or vocab.txt (the tokenizer of the checkpoint)")
    for special in ("[CLS]", "[SEP]", "[PAD]"):
        if tok.token_to_id(special) is None:
            raise ValueError(f"{folder}: the tokenizer has no {special} token, expected a BERT vocabulary")
    tok.no_padding()
    tok.no_truncation()
    return tok


def encode(tokenizer, texts: Sequence[str], *, max_length: int = 512) -> EncodedBatch:
    """Tokenize texts as ``[CLS] text [SEP]``, truncate to ``max_length`` (with a warning), pad right.

    Args:
        tokenizer: a ``tokenizers.Tokenizer`` from :func:`load_tokenizer`.
        texts: one or more non-empty strings.
        max_length: the most tokens per text, ``[CLS]`` and ``[SEP]`` included (≥ 2).
    Returns:
        :class:`EncodedBatch`.
    Raises:
        ValueError: no text, an empty text, ``max_length`` < 2. TypeError: a text that is not a string.
    Warns:
        TruncationWarning: for each text longer than ``max_length`` tokens.
    """
    if isinstance(texts, str):
        texts = [texts]
    texts = list(texts)
    if not texts:
        raise ValueError("texts: expected at least one text, got none")
    for k, t in enumerate(texts):
        if not isinstance(t, str):
            raise TypeError(f"texts[{k}]: expected a string, got {type(t).__name__}")
        if not t.strip():
            raise ValueError(f"texts[{k}]: expected a non-empty text, got {t!r}")
    if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 2:
        raise ValueError(f"max_length: expected an integer ≥ 2, got {max_length!r}")
    cls_id, sep_id, pad_id = (tokenizer.token_to_id(s) for s in ("[CLS]", "[SEP]", "[PAD]"))
    rows, counts, cut = [], [], []
    for k, enc in enumerate(tokenizer.encode_batch(texts)):
        ids = list(enc.ids)
        if not ids or ids[0] != cls_id:  # a tokenizer.json without BERT's post-processor
            ids = [cls_id] + ids + [sep_id]
        counts.append(len(ids))
        if len(ids) > max_length:
            warnings.warn(
                f"texts[{k}]: {len(ids)} tokens, more than the model's {max_length} positions; "
                f"truncated to the first {max_length}",
                TruncationWarning,
                stacklevel=2,
            )
            ids = ids[: max_length - 1] + [sep_id]
            cut.append(True)
        else:
            cut.append(False)
        rows.append(ids)
    length = max(map(len, rows))
    input_ids = torch.full((len(rows), length), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), length), dtype=torch.long)
    for b, ids in enumerate(rows):
        input_ids[b, : len(ids)] = torch.tensor(ids)
        attention_mask[b, : len(ids)] = 1
    tokens = [[tokenizer.id_to_token(i) for i in row] for row in input_ids.tolist()]
    return EncodedBatch(input_ids, attention_mask, tokens, counts, cut)
