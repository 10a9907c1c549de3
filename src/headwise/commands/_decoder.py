"""The decoder a command reads: opened through the one door, texts and answer tokens encoded and checked.

Shared by the flows that read a decoder's next-token logits (``headwise patch``, ``headwise circuit``); every
mistake is a ValueError naming the option.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from headwise.commands import said

if TYPE_CHECKING:
    from headwise.models import HeadModel

__all__ = ["open_decoder", "encode_text", "encode_token"]


def open_decoder(
    model: str,
    *,
    reads: str = "patching reads a decoder's next-token logits",
    max_memory: str | None = None,
    whole: str | None = None,
):
    """The model of ``--model`` through the one door (:func:`headwise.models.open_model`), as a decoder with a
    tokenizer; ``reads`` ends the message refusing an encoder (what the command needs of a decoder).

    ``max_memory``: ``--max-memory`` (a model that does not fit opens layer by layer; a bad budget names the
    smallest that works). ``whole``: what the command does that reads every layer's weights at once (a backward
    pass), refused in one line naming the memory it would need when the model opened layer by layer.
    """
    from headwise.models import open_model
    from headwise.models.memory import MemoryBudgetError, whole_refused

    try:
        hm = open_model(model, max_memory=max_memory)
    except MemoryBudgetError as e:  # the user's budget named as given; the default's: the model does not fit
        raise ValueError(("" if e.given else "--model: ") + said(e)) from None
    except (OSError, ValueError) as e:  # OSError: a GGUF cache that cannot be written
        raise ValueError(f"--model: {' '.join(str(e).split())}") from None
    if hm.kind != "decoder":
        raise ValueError(f"--model: {hm.name} is an encoder ({hm.family}); {reads}")
    if hm.tokenizer is None:
        raise ValueError(f"--model: {hm.name} has no tokenizer.json; --clean and --corrupted are texts")
    if whole is not None and hm.stream is not None:
        raise ValueError(said(whole_refused(hm.name, hm.memory, whole)))
    return hm


def encode_text(hm: HeadModel, option: str, text: str) -> list[int]:
    """``text`` as the model reads it (its tokenizer, its own special tokens)."""
    if not text.strip():
        raise ValueError(f"{option}: expected a non-empty text, got {text!r}")
    ids = list(hm.tokenizer.encode(text).ids)
    if len(ids) > hm.max_length:
        raise ValueError(f"{option}: {len(ids)} tokens, more than the model's {hm.max_length} positions")
    return ids


def encode_token(hm: HeadModel, option: str, token: str) -> int:
    """The one id ``token`` encodes to (no special tokens added), else a one-line error saying what it gave."""
    tok = hm.tokenizer
    enc = tok.encode(token, add_special_tokens=False)
    ids, pieces = list(enc.ids), list(enc.tokens)
    if len(ids) != 1:
        hint = " (a leading space is part of a byte-level BPE token: try ' " + token.strip() + "')"
        hint = hint if not token.startswith(" ") and len(ids) > 1 else ""
        raise ValueError(
            f"{option}: {token!r} encodes to {len(ids)} tokens {pieces} (ids {ids}); expected exactly one{hint}"
        )
    unk = getattr(tok.model, "unk_token", None)
    if unk is not None and pieces[0] == unk and token != unk:
        raise ValueError(f"{option}: {token!r} is not in the vocabulary (it encodes to the unknown token {unk!r})")
    if not 0 <= ids[0] < hm.vocab_size:
        raise ValueError(f"{option}: {token!r} encodes to id {ids[0]}, outside the model's {hm.vocab_size} logits")
    return ids[0]
