"""Tokens as the text they stand for, with visible marks for spaces and line breaks.

A tokenizer's raw pieces are not text: byte-level BPE (GPT-2, Llama 3, Qwen, SmolLM) writes a leading
space as ``Ġ`` and a newline as ``Ċ``, SentencePiece (Llama 2, Gemma) writes a space as ``▁`` and bytes as
``<0x0A>``, WordPiece (BERT) writes a word's continuation as ``##ing``. :func:`token_texts` gives each
token the text it adds to the decoded string: the tokenizer's own decoder applied to the token and the
one before it, minus what the one before decodes to alone — so a SentencePiece ``▁`` in the middle of a
sentence is a space but the first token's is stripped (as the decoder strips it), and a WordPiece
``##ing`` joins its word with no space. Joined, the texts give the decoded string exactly
(``"".join(token_texts(tok, ids, marks=False)) == tok.decode(ids)``, tested for all three kinds), except
where a multi-byte character is split across tokens — such a token shows its bytes (``\\xe2\\x80``) —
and around special tokens, which read as themselves (``[SEP]``, not the decoder's `` [SEP]``).

:func:`visible` then marks what a person could not see: a leading or trailing space as ``␣``, a newline
as ``↵``, a tab as ``⇥``, a carriage return as ``␍``, and an empty text as ``∅``. The raw piece
(:func:`token_pieces`) and the id stay available beside the text.

Cost: two decodes per token, O(L) in the number of tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["token_texts", "token_pieces", "visible", "SPACE", "NEWLINE"]

SPACE, NEWLINE, TAB, RETURN, EMPTY = "␣", "↵", "⇥", "␍", "∅"
_ALWAYS = {"\n": NEWLINE, "\t": TAB, "\r": RETURN}


def _backend(tokenizer):
    """The ``tokenizers.Tokenizer`` behind a transformers fast tokenizer, or the tokenizer itself."""
    return getattr(tokenizer, "backend_tokenizer", tokenizer)


def _decode(tok, ids: list[int]) -> str:
    return tok.decode(ids, skip_special_tokens=False)


def _bytes_of(piece: str) -> str | None:
    """A byte-level BPE piece (GPT-2's byte-to-unicode alphabet) or a ``<0xNN>`` byte token as its bytes:
    printable ASCII as itself, every other byte as ``\\xNN``."""
    if piece.startswith("<0x") and piece.endswith(">") and len(piece) == 6:
        values = [int(piece[3:5], 16)]
    else:
        table = _byte_decoder()
        if not piece or not all(ch in table for ch in piece):
            return None
        values = [table[ch] for ch in piece]
    return "".join(chr(b) if 0x20 <= b < 0x7F else f"\\x{b:02x}" for b in values)


_BYTE_DECODER: dict[str, int] | None = None


def _byte_decoder() -> dict[str, int]:
    """GPT-2's map from its printable stand-ins back to bytes (``bytes_to_unicode``, inverted)."""
    global _BYTE_DECODER
    if _BYTE_DECODER is None:
        printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
        printable += list(range(ord("®"), ord("ÿ") + 1))
        codes, extra = {b: b for b in printable}, 0
        for b in range(256):
            if b not in codes:
                codes[b] = 256 + extra
                extra += 1
        _BYTE_DECODER = {chr(c): b for b, c in codes.items()}
    return _BYTE_DECODER


def token_pieces(tokenizer, ids: Sequence[int]) -> list[str]:
    """The raw vocabulary pieces of ``ids`` (``ĠMary``, ``▁Mary``, ``##ing``); ``<id>`` for an unknown id."""
    tok = _backend(tokenizer)
    return [tok.id_to_token(int(i)) or f"<{int(i)}>" for i in ids]


_SPECIAL: dict[int, tuple[object, int, frozenset[int]]] = {}


def _special_ids(tok) -> frozenset[int]:
    """The ids of ``tok``'s special added tokens, read once per tokenizer and vocabulary size (Gemma 3's 6,000-odd
    added tokens took 10 ms to list: more than the decodes of a short context)."""
    size = tok.get_vocab_size(with_added_tokens=True)
    kept = _SPECIAL.get(id(tok))
    if kept is None or kept[0] is not tok or kept[1] != size:
        if len(_SPECIAL) > 16:
            _SPECIAL.clear()
        special = frozenset(int(i) for i, t in tok.get_added_tokens_decoder().items() if t.special)
        kept = _SPECIAL[id(tok)] = (tok, size, special)
    return kept[2]


def token_texts(tokenizer, ids: Sequence[int], *, marks: bool = True) -> list[str]:
    """The text each token adds to the decoded string, optionally with :func:`visible` marks.

    Args:
        tokenizer: a ``tokenizers.Tokenizer`` or a transformers fast tokenizer (byte-level BPE,
            SentencePiece-style BPE / Unigram, WordPiece — whatever its decoder is).
        ids: ``(L,)`` token ids.
        marks: mark spaces at the edges, line breaks and empty texts (:func:`visible`).
    Returns:
        ``L`` strings. A special token (``<|im_start|>``, ``[CLS]``) reads as itself, with no space mark.
    """
    tok = _backend(tokenizer)
    ids = [int(i) for i in ids]
    special = _special_ids(tok)
    out: list[str] = []
    previous_alone = ""
    for k, i in enumerate(ids):
        alone = _decode(tok, [i])
        if i in special:  # a special token reads as itself, whatever spacing the decoder puts around it
            text = tok.id_to_token(i) or alone
        elif k == 0:
            text = alone
        else:
            pair = _decode(tok, [ids[k - 1], i])
            text = pair[len(previous_alone) :] if pair.startswith(previous_alone) else None
            if text is None or "\ufffd" in text:  # a character split across tokens: no text of its own
                text = alone
        if i not in special and ("\ufffd" in alone or "\ufffd" in text):  # part of a character: its bytes
            text = _bytes_of(tok.id_to_token(i) or "") or text
        out.append(visible(text) if marks else text)
        previous_alone = alone
    return out


def visible(text: str) -> str:
    """``text`` with what a reader cannot see marked: edge spaces ``␣``, ``↵`` ``⇥`` ``␍``, empty ``∅``."""
    if text == "":
        return EMPTY
    for ch, mark in _ALWAYS.items():
        text = text.replace(ch, mark)
    body = text.strip(" ")
    if not body:
        return SPACE * len(text)
    lead = len(text) - len(text.lstrip(" "))
    trail = len(text) - len(text.rstrip(" "))
    return SPACE * lead + body + SPACE * trail
