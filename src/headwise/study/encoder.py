"""An encoder's heads studied (and the first article's untrained block): every head's metrics over a corpus and the
example sentence, through :func:`headwise.analysis.analyze_texts` / :func:`headwise.analysis.analyze_sentence`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from headwise.study.options import HeadsOptions

if TYPE_CHECKING:
    from headwise.models import HeadModel

__all__ = [
    "UNTRAINED",
    "EncoderAttend",
    "check_encoder",
    "encoder_attend",
    "encoder_report",
    "encoder_texts",
    "sentence_heads",
]

#: The untrained block of the first article (``--model untrained``): sizes and seed.
UNTRAINED = {"d_model": 128, "num_heads": 4, "seed": 0}


@dataclass(frozen=True)
class EncoderAttend:
    """How the encoder flow reads a model (:func:`encoder_attend`).

    Attributes:
        attend: ``attend(texts) -> (maps, TokenInfo)``, ``maps`` one ``(B, H, T, T)`` array per layer, as
            :func:`headwise.analysis.analyze_texts` takes it.
        num_layers, num_heads: the model's layers and heads per layer.
        max_length: the most tokens one text is read with (longer ones are cut, with a TruncationWarning).
        title: what to call the model in tables and pictures.
    """

    attend: Callable
    num_layers: int
    num_heads: int
    max_length: int
    title: str


def check_encoder(options: HeadsOptions) -> None:
    """The checks of ``options`` an encoder (or the untrained block) needs before it is loaded.

    Raises:
        ValueError: neither TEXT nor a corpus; ``--importance`` without a corpus.
    """
    if options.text is None and options.corpus is None:
        raise ValueError("expected a TEXT or --corpus FILE (or --corpus sample for the bundled sentences)")
    if options.importance and options.corpus is None:
        raise ValueError("--importance: expected --corpus FILE (the sentences the objective is measured on)")


def encoder_attend(model: str | None, hm: HeadModel = None) -> EncoderAttend:
    """The :class:`EncoderAttend` of ``--model``: ``"untrained"`` (the first article's ``AttentionBlock``, seeded, on
    the bundled model's WordPiece tokens), or the encoder ``hm`` opened through :func:`headwise.models.open_model`:
    headwise's BERT through :func:`headwise.models.model_attend`, a Hugging Face encoder through
    :meth:`HeadModel.attentions` with its own classifier and separator tokens.

    Raises:
        ValueError: the bundled tokenizer the untrained block reads with cannot be loaded (naming ``--model``).
    """
    from headwise import models

    if model == "untrained":
        import torch

        from headwise.core.block import AttentionBlock

        try:
            _, tokenizer = models.load_bert()
        except (FileNotFoundError, ValueError) as e:
            raise ValueError(f"--model: {e}") from None
        torch.manual_seed(UNTRAINED["seed"])
        block = AttentionBlock(tokenizer.get_vocab_size(), UNTRAINED["d_model"], UNTRAINED["num_heads"]).eval()

        def run(ids, padding):
            return block(ids, key_padding_mask=padding, need_weights=True, average_weights=False)[1]

        title = f"untrained AttentionBlock (D={UNTRAINED['d_model']}, H={UNTRAINED['num_heads']}, seed 0)"
        return EncoderAttend(models.block_attend(run, tokenizer, max_length=512), 1, UNTRAINED["num_heads"], 512, title)
    if hm.family != "bert":
        return EncoderAttend(_head_model_attend(hm), hm.num_layers, hm.num_heads, hm.max_length, hm.title)
    title = f"{hm.name} ({hm.num_layers} layers × {hm.num_heads} heads)"
    attend = models.model_attend(hm.model, hm.tokenizer)
    return EncoderAttend(attend, hm.num_layers, hm.num_heads, hm.model.config.max_position_embeddings, title)


def _head_model_attend(hm: HeadModel):
    """``attend(texts) -> (maps, TokenInfo)`` for a Hugging Face encoder: its own classifier and separator."""
    from headwise.analysis import token_info

    def name(key: str) -> str | None:
        i = getattr(hm.model.config, key, None)
        return hm.tokenizer.id_to_token(i) if isinstance(i, int) and hm.tokenizer is not None else None

    cls = name("cls_token_id") or name("bos_token_id") or "[CLS]"
    sep = name("sep_token_id") or name("eos_token_id") or "[SEP]"

    def attend(texts):
        enc = hm.encode(texts)
        info = token_info(enc.tokens, length=enc.ids.shape[1], cls_token=cls, sep_token=sep)
        return hm.attentions(enc.ids, enc.mask), info

    return attend


def encoder_texts(options: HeadsOptions, *, warn: Callable[[str], None]):
    """The corpus as a :class:`~headwise.analysis.CorpusFile` and its count of sentences; the lines skipped as not
    UTF-8 reported to ``warn`` (where the first five were).

    Raises:
        ValueError: no non-empty UTF-8 line (naming ``--corpus`` and what was skipped).
    """
    from headwise.analysis import CorpusFile

    corpus = options.corpus_path
    reader = CorpusFile(corpus)
    total = reader.count()
    if total == 0:  # one line: the error says what was skipped
        skipped = f" ({reader.num_undecodable} undecodable line(s) skipped)" if reader.num_undecodable else ""
        raise ValueError(f"--corpus: no non-empty UTF-8 line in '{corpus}'{skipped}")
    if reader.num_undecodable:
        where = ", ".join(map(str, reader.undecodable[:5]))
        warn(
            f"--corpus: skipped {reader.num_undecodable} line(s) that are not valid UTF-8 "
            f"(line {where}{' …' if reader.num_undecodable > 5 else ''})"
        )
    return reader, total


def encoder_report(reader, model: EncoderAttend, batch_size: int, *, warn: Callable[[str], None], progress=None):
    """Every head's metrics over the corpus ``reader`` (:func:`headwise.analysis.analyze_texts`): a
    :class:`~headwise.analysis.HeadReport`. The lines cut to the model's length are counted and reported to ``warn``
    once; other warnings are issued again as they came.

    Args:
        progress: ``(texts done, tokens done)`` after every batch.
    """
    from headwise.analysis import analyze_texts
    from headwise.models import TruncationWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", TruncationWarning)
        report = analyze_texts(
            reader,
            model.attend,
            num_layers=model.num_layers,
            num_heads=model.num_heads,
            max_length=model.max_length,
            batch_size=batch_size,
            progress=progress,
        )
    n = model.max_length
    cut = [w for w in caught if issubclass(w.category, TruncationWarning)]
    if cut:
        warn(f"--corpus: {len(cut)} line(s) longer than {n} tokens were truncated to {n}")
    for w in caught:
        if not issubclass(w.category, TruncationWarning):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return report


def sentence_heads(hm: HeadModel, text: str, model: EncoderAttend, *, warn: Callable[[str], None]):
    """The example sentence's heads (:func:`headwise.analysis.analyze_sentence`) with its tokens as the text they add
    (:meth:`HeadModel.token_texts`; ``hm`` None: the untrained block on the bundled WordPiece tokens), and their ids.

    Returns:
        ``(sentence, pieces, ids)``: the :class:`~headwise.analysis.SentenceHeads` with the shown tokens, the
        tokenizer's pieces, and the ids (None when the text did not re-encode to the pieces: the pieces are shown).
    """
    import dataclasses

    from headwise.analysis import analyze_sentence
    from headwise.models import TruncationWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", TruncationWarning)
        sentence = analyze_sentence(
            text, model.attend, num_layers=model.num_layers, num_heads=model.num_heads, max_length=model.max_length
        )
    for w in caught:
        if issubclass(w.category, TruncationWarning):
            warn(f"TEXT: {str(w.message).split(': ', 1)[-1]}")
    shown, ids = _sentence_texts(hm, text, sentence.tokens)
    return dataclasses.replace(sentence, tokens=shown), sentence.tokens, ids


def _sentence_texts(hm: HeadModel, text: str, pieces: list[str]) -> tuple[list[str], list[int] | None]:
    """The example sentence's tokens as text and their ids. Falls back to the pieces if the text does not re-encode
    to them (it always should: the same tokenizer read it)."""
    from headwise import models
    from headwise.models.token_text import token_pieces, token_texts

    if hm is not None:
        ids = hm.encode([text]).ids[0][: len(pieces)].tolist()
        texts = hm.token_texts(ids)
        same = hm.token_strings(ids) == list(pieces)
    else:
        tokenizer = models.load_tokenizer(models.default_model_path())
        ids = models.encode(tokenizer, [text]).input_ids[0][: len(pieces)].tolist()
        texts = token_texts(tokenizer, ids)
        same = token_pieces(tokenizer, ids) == list(pieces)
    return (texts, ids) if same else (list(pieces), None)
