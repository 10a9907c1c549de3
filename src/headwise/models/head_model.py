"""A loaded model whose heads can be read, gated and ablated: what :func:`headwise.models.open_model` returns.

Shape legend: B batch, L padded length, NL layers, H heads per layer, Dh head width, D model width, V vocabulary.

:class:`HeadModel` holds the module (headwise's own — BERT, a lab decoder — or a Hugging Face model running on
headwise's attention backend) with what the analysis needs: its kind (encoder / decoder), head counts,
tokenizer, the ids a probe must not draw. Its methods encode texts, run the model, return every layer's
per-head weights and gate heads.

**Gates.** :meth:`HeadModel.gated` multiplies each head's output by a gate ξ where the heads enter the
output projection (before the heads are mixed), as Michel et al. 2019 define head masking: ξ = 1 changes
nothing, ξ = 0 removes the head. It acts at each attention layer's ``hook_heads``
(:class:`headwise.core.hooks.HookPoint`): headwise's modules carry theirs, the Hugging Face backend keeps one
per attention module (:func:`headwise.hf.backend.hook_points`) — where :func:`headwise.hf.ablate` acts too.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from headwise.models.token_text import token_pieces, token_texts

__all__ = ["HeadModel", "EncodedTexts", "MAX_ANALYSIS_LENGTH"]

#: Longest input an encoder is analysed on (tokens): its maps are L × L per head. Decoders are read by the
#: streaming pass (:mod:`headwise.analysis.streaming`) up to their context.
MAX_ANALYSIS_LENGTH = 1024


@dataclass
class EncodedTexts:
    """Texts as token ids: ``ids`` and ``mask`` ``(B, L)`` long (mask 1 = real token), right-padded;
    ``tokens`` the token strings of each text (no padding); ``truncated`` which texts were cut."""

    ids: object
    mask: object
    tokens: list[list[str]]
    truncated: list[bool] = field(default_factory=list)


@dataclass
class HeadModel:
    """A loaded model, ready for head analysis.

    Attributes:
        model: the ``torch.nn.Module`` (eval mode, float32).
        kind: ``"decoder"`` (causal) or ``"encoder"``.
        family: the config's ``model_type``.
        name: the folder's name (or the bundled model's).
        num_layers, num_heads: NL and H (query heads).
        max_length: the longest input analysed: a decoder's context; an encoder's positions, at most
            :data:`MAX_ANALYSIS_LENGTH`.
        vocab_size: V.
        tokenizer: a ``tokenizers.Tokenizer`` or None (the folder has none).
        bos_id: the id a probe starts with (the config's ``bos_token_id``), or None.
        special_ids: ids the probe never draws (the tokenizer's special tokens, BOS / EOS / PAD).
        backend: ``"headwise"`` (headwise's own modules) or ``"hf+headwise"`` (Hugging Face on headwise
            attention).
        attention_modules: the NL attention modules, in layer order.
        head_points: each layer's ``hook_heads`` :class:`~headwise.core.hooks.HookPoint`, where gates act.
    """

    model: object
    kind: str
    family: str
    name: str
    num_layers: int
    num_heads: int
    max_length: int
    vocab_size: int
    tokenizer: object | None
    bos_id: int | None
    special_ids: tuple[int, ...]
    backend: str
    attention_modules: list = field(default_factory=list, repr=False)
    head_points: list = field(default_factory=list, repr=False)

    @property
    def title(self) -> str:
        return f"{self.name} ({self.family} {self.kind}, {self.num_layers} layers × {self.num_heads} heads)"

    # -- text --------------------------------------------------------------------------------------
    def encode(self, texts: Sequence[str]) -> EncodedTexts:
        """Tokenize texts with the checkpoint's tokenizer (its own special tokens), truncate to
        :attr:`max_length` (a ``TruncationWarning`` per text), pad right.

        Raises:
            ValueError: no tokenizer, an empty text.
        """
        import torch

        from headwise.models.tokenizer import TruncationWarning, encode

        if self.tokenizer is None:
            raise ValueError(
                f"TEXT: the checkpoint {self.name} has no tokenizer.json; run without a text to analyse its probe"
            )
        texts = [texts] if isinstance(texts, str) else list(texts)
        for k, t in enumerate(texts):
            if not isinstance(t, str) or not t.strip():
                raise ValueError(f"texts[{k}]: expected a non-empty text, got {t!r}")
        if self.family == "bert":
            b = encode(self.tokenizer, texts, max_length=self.max_length)
            tokens = [[t for t, m in zip(row, mask) if m] for row, mask in zip(b.tokens, b.attention_mask.tolist())]
            return EncodedTexts(b.input_ids, b.attention_mask, tokens, b.truncated)
        rows, cut = [], []
        for k, enc in enumerate(self.tokenizer.encode_batch(texts)):
            ids = list(enc.ids)
            if not ids:
                raise ValueError(f"texts[{k}]: the tokenizer gave no token for {texts[k]!r}")
            if len(ids) > self.max_length:
                warnings.warn(
                    f"texts[{k}]: {len(ids)} tokens, more than the model's {self.max_length} positions; "
                    f"truncated to the first {self.max_length}",
                    TruncationWarning,
                    stacklevel=2,
                )
                ids = ids[: self.max_length]
            cut.append(len(enc.ids) > self.max_length)
            rows.append(ids)
        length = max(map(len, rows))
        ids = torch.zeros((len(rows), length), dtype=torch.long)
        mask = torch.zeros((len(rows), length), dtype=torch.long)
        for b, row in enumerate(rows):
            ids[b, : len(row)] = torch.tensor(row)
            mask[b, : len(row)] = 1
        tokens = [[self.tokenizer.id_to_token(i) or f"<{i}>" for i in row] for row in rows]
        return EncodedTexts(ids, mask, tokens, cut)

    def token_strings(self, ids) -> list[str]:
        """The raw vocabulary pieces of one sequence's ids (``ĠMary``, ``##ing``; ``<id>`` without a tokenizer)."""
        if self.tokenizer is None:
            return [f"<{int(i)}>" for i in ids]
        return token_pieces(self.tokenizer, ids)

    def token_texts(self, ids) -> list[str]:
        """What a person reads for one sequence's ids: the text each token adds, spaces and line breaks
        marked (:func:`headwise.models.token_text.token_texts`); ``<id>`` without a tokenizer."""
        if self.tokenizer is None:
            return [f"<{int(i)}>" for i in ids]
        return token_texts(self.tokenizer, ids)

    # -- running ------------------------------------------------------------------------------------
    def forward(self, ids, mask=None, *, math_path: bool = False):
        """Logits ``(B, L, V)`` for a decoder, last hidden states ``(B, L, D)`` for an encoder.

        ``math_path``: headwise's attention modules on their readable path end to end (``backend="math"``: each
        projection an ``nn.Linear`` call, the softmax written out), which forward-mode differentiation goes
        through (the fast kernels do not carry tangents). No effect on Hugging Face models.
        """
        if self.backend == "headwise":
            with _on_math_path(self.attention_modules if math_path else []):
                if self.kind == "encoder":
                    return self.model(ids, mask, output_attentions=False).last_hidden_state
                return self.model(ids)
        out = self.model(input_ids=ids, attention_mask=mask)
        return out.logits if self.kind == "decoder" else out.last_hidden_state

    def attentions(self, ids, mask=None) -> list[np.ndarray]:
        """Per-head weights of every layer: NL float32 arrays ``(B, H, L, L)``.

        Hugging Face models: through :func:`headwise.hf.capture` (headwise attention).
        """
        import torch

        with torch.no_grad():
            if self.backend == "headwise":
                maps = self._headwise_attentions(ids, mask)
            else:
                import headwise.hf

                with headwise.hf.capture(self.model) as attn:
                    self.model(input_ids=ids, attention_mask=mask)
                maps = list(attn.weights)
        if len(maps) != self.num_layers:
            raise RuntimeError(f"{self.name}: captured {len(maps)} attention layers, expected {self.num_layers}")
        return [m.float().cpu().numpy() for m in maps]

    @property
    def qk_points(self) -> list:
        """Each layer's ``hook_qk`` :class:`~headwise.core.hooks.HookPoint` (post-rotary q and k with the masks,
        :class:`~headwise.core.rows.AttentionRows`), where streaming statistics read every head's rows."""
        if self.backend == "hf+headwise":
            from headwise.hf.backend import hook_points

            return [hook_points(m).hook_qk for m in self.attention_modules]
        return [m.hook_qk for m in self.attention_modules]

    def read_rows(self, ids, mask, readers) -> None:
        """One forward pass (no gradient) with ``readers[layer]`` hooked on each layer's :attr:`qk_points`.

        Hugging Face models run their base model (no language-model head: an 8,192-token pass would otherwise
        form ``(L, V)`` logits nobody reads).
        """
        import torch

        from headwise.core.hooks import hooked

        if len(readers) != self.num_layers:
            raise ValueError(f"readers: expected {self.num_layers}, one per layer, got {len(readers)}")
        with torch.no_grad(), hooked(zip(self.qk_points, readers)):
            if self.backend == "headwise":
                if self.kind == "encoder":
                    self.model(ids, mask)
                else:
                    self.model(ids)
            else:
                base = getattr(self.model, "base_model", None) or self.model
                base(input_ids=ids, attention_mask=mask)

    def _headwise_attentions(self, ids, mask):
        if self.kind == "encoder":
            return list(self.model(ids, mask, output_attentions=True).attentions)
        out = self.model(ids, need_weights=True)
        return list(out[1])

    @contextlib.contextmanager
    def gated(self, gates):
        """Within the block, multiply each head's output by ``gates`` where heads enter the output projection
        (a hook on every attention layer's ``hook_heads``; nested blocks multiply their gates).

        Args:
            gates: ``(NL, H)`` or ``(B, NL, H)`` float tensor (per example: one gate per sequence of the
                batch, so one backward pass gives every example's ∂L/∂ξ). May require grad.
        """
        from headwise.core.hooks import hooked

        if tuple(gates.shape[-2:]) != (self.num_layers, self.num_heads):
            raise ValueError(
                f"gates: expected shape (…, {self.num_layers}, {self.num_heads}), got {tuple(gates.shape)}"
            )

        def gate(layer: int, heads_out):  # (B, H, L, Dh)
            g = gates[..., layer, :]  # (H,) or (B, H)
            shape = (g.shape[0] if g.dim() == 2 else 1, self.num_heads, 1, 1)
            return heads_out * g.reshape(shape).to(heads_out.dtype)

        with hooked((point, functools.partial(gate, layer)) for layer, point in enumerate(self.head_points)):
            yield


@contextlib.contextmanager
def _on_math_path(modules):
    """Inside the block, ``modules`` run ``backend="math"``; each gets its own backend back after."""
    saved = [m.backend for m in modules]
    try:
        for m in modules:
            m.backend = "math"
        yield
    finally:
        for m, backend in zip(modules, saved):
            m.backend = backend


# -- loading ---------------------------------------------------------------------------------------
