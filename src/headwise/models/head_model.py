"""The one model view: what :func:`headwise.models.open_model` returns and every tool acts on.

Shape legend: B batch, L padded length, S key length, NL layers, H heads per layer, Dh head width, D model width,
V vocabulary.

:class:`HeadModel` holds the module (headwise's own — BERT, a lab decoder, any stack of headwise's attention
modules — or a Hugging Face model running on headwise's attention backend) with what the analysis needs: its kind
(encoder / decoder), head counts, tokenizer, the ids a probe must not draw. One constructor builds it for every
kind, from the module alone (``HeadModel(module, name=…, tokenizer=…)``); it picks the module's *runner* once
(:mod:`headwise.models.runners`: headwise encoder, headwise decoder, Hugging Face), which knows how that backend runs
and where its attention modules are. Its methods encode texts, run the model, return every layer's per-head weights
and gate heads.

**Named points.** Every hook point has a stable name (:mod:`headwise.points`: ``layers.{i}.attn.heads``,
``layers.{i}.attn.qk``, ``layers.{i}.attn.pattern``, ``layers.{i}.resid_pre``, ``layers.{i}.attn.out``,
``layers.{i}.mlp.in``, ``layers.{i}.mlp.out``, ``resid_final``): :meth:`HeadModel.point_names` lists them,
:meth:`HeadModel.hooks` hooks functions on them by name, :meth:`HeadModel.run_with_cache` records them. Gates,
streaming statistics and patching all act through these names.

**Gates.** :meth:`HeadModel.gated` multiplies each head's output by a gate ξ where the heads enter the
output projection (before the heads are mixed), as Michel et al. 2019 define head masking: ξ = 1 changes
nothing, ξ = 0 removes the head. It acts at each layer's ``layers.{i}.attn.heads``
(:class:`headwise.core.hooks.HookPoint` ``hook_heads``): headwise's modules carry theirs, the Hugging Face backend
keeps one per attention module (:func:`headwise.hf.backend.hook_points`) — where :func:`headwise.hf.ablate` acts
too.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from headwise.models.memory import whole_refused
from headwise.models.runners import MAX_ANALYSIS_LENGTH, runner_for
from headwise.models.token_text import token_pieces, token_texts

if TYPE_CHECKING:
    from headwise.models.memory import MemoryPlan
    from headwise.models.streamed import LayerStream

__all__ = ["HeadModel", "EncodedTexts", "MAX_ANALYSIS_LENGTH"]


@dataclass
class EncodedTexts:
    """Texts as token ids: ``ids`` and ``mask`` ``(B, L)`` long (mask 1 = real token), right-padded;
    ``tokens`` the token strings of each text (no padding); ``truncated`` which texts were cut."""

    ids: object
    mask: object
    tokens: list[list[str]]
    truncated: list[bool] = field(default_factory=list)


def _in_vocabulary(token: int | None, vocab_size: int | None) -> int | None:
    """``token`` where it is an id of the vocabulary (any id where the size is not known), else None."""
    if token is None or vocab_size is None or 0 <= token < vocab_size:
        return token
    return None


# -- the view -----------------------------------------------------------------------------------------------------


class HeadModel:
    """A model, ready for head analysis and for the tools that act on its named points.

    ``HeadModel(module, *, kind=None, family=None, name=None, max_length=None, vocab_size=None, tokenizer=None,
    bos_id=None, special_ids=(), stream=None, memory=None)`` — the one constructor, for every kind: headwise's own
    modules (BERT, the lab's ``TransformerLM``, any ``nn.Module`` holding headwise's attention modules, run as
    ``module(ids)``) and Hugging Face ``PreTrainedModel`` s on headwise's attention backend. What is not given is
    read from the module (the config's ``model_type``, its positions and vocabulary); the loaders of
    :func:`headwise.models.open_model` give the rest (name, tokenizer, special ids, the stream and the memory
    plan). The view is whole when made: nothing outside it sets its attributes; the points the anatomy adds are
    declared to its :class:`~headwise.points.NamedPoints` here (the anatomy itself is found on first use).

    Attributes:
        model: the ``torch.nn.Module``.
        kind: ``"decoder"`` (causal) or ``"encoder"``.
        family: the config's ``model_type`` (headwise's BERT: ``"bert"``; a bare module: its class name).
        name: the folder's name (or the bundled model's).
        num_layers: NL, the attention layers.
        num_heads: H (query heads; the most of any layer where layers differ).
        heads_per_layer: H of each layer.
        max_length: the longest input analysed: a decoder's context; an encoder's positions, at most
            :data:`MAX_ANALYSIS_LENGTH`.
        vocab_size: V (None where the module does not say).
        tokenizer: a ``tokenizers.Tokenizer`` or None (the folder has none).
        bos_id: the id a probe starts with (given; else the config's ``bos_token_id`` where it is inside the
            vocabulary), or None.
        special_ids: ids the probe never draws (the tokenizer's special tokens, BOS / EOS / PAD; those outside
            the vocabulary dropped).
        stream: the :class:`~headwise.models.streamed.LayerStream` of a model opened layer by layer (it owns the
            hooks and the pins), else None.
        memory: the :class:`~headwise.models.memory.MemoryPlan` :func:`~headwise.models.open_model` chose, or None.
        backend: ``"headwise"`` (headwise's own modules) or ``"hf+headwise"`` (Hugging Face on headwise
            attention).
        attention_modules: the NL attention modules, in layer order.
        points: the named points (:class:`headwise.points.NamedPoints`, a mapping ``name -> Point``).
    Raises:
        TypeError: not an ``nn.Module``. ValueError: a Hugging Face model not on headwise's attention, a family
        that writes its own attention (named), a module with no headwise attention inside.
    """

    def __init__(
        self,
        model,
        *,
        kind: str | None = None,
        family: str | None = None,
        name: str | None = None,
        max_length: int | None = None,
        vocab_size: int | None = None,
        tokenizer=None,
        bos_id: int | None = None,
        special_ids: Iterable[int] = (),
        stream: LayerStream | None = None,
        memory: MemoryPlan | None = None,
    ):
        runner = runner_for(model)
        self._runner = runner
        self.model = model
        self.backend = runner.backend
        self.attention_modules = runner.attention(model)
        self.points = runner.points(model, self.attention_modules, self._anatomy_points)
        self.heads_per_layer = [runner.num_heads(m) for m in self.attention_modules]
        self.num_layers = len(self.attention_modules)
        self.num_heads = max(self.heads_per_layer)
        self.kind = kind or runner.kind
        self.family = family or runner.family(model)
        self.name = name or self.family
        self.max_length = int(max_length or runner.max_length(model, self.kind))
        self.vocab_size = vocab_size if vocab_size is not None else runner.vocab_size(model)
        self.tokenizer = tokenizer
        self.bos_id = bos_id if bos_id is not None else _in_vocabulary(runner.bos_id(model), self.vocab_size)
        self.special_ids = tuple(i for i in special_ids if _in_vocabulary(i, self.vocab_size) is not None)
        self.memory = memory
        self.stream = stream

    def __repr__(self) -> str:
        return f"HeadModel({self.title}, backend={self.backend!r})"

    @property
    def title(self) -> str:
        return f"{self.name} ({self.family} {self.kind}, {self.num_layers} layers × {self.num_heads} heads)"

    @property
    def hf(self) -> bool:
        """Whether the module is a Hugging Face model."""
        return self.backend == "hf+headwise"

    @property
    def anatomy(self):
        """The model's parts, found once and kept (:class:`headwise.models.anatomy.Anatomy`): per layer the block,
        its norms, the q/k/v projections with their head layouts, the output projection, the writes' norms and
        multiplier, the MLP; the embeddings, final norm and unembedding. Every tool reads the model through it.

        Raises:
            AnatomyError: a structure headwise does not read (one sentence, the same for every tool); ValueError:
                a model opened layer by layer, outside :func:`headwise.models.pinned.attention_pinned` and
                :func:`headwise.models.layer_walk.layer_walk`.
        """
        if self.stream is not None and not (self.stream.pin_depth or self.stream.walk_depth):
            self.check_whole("this tool")
        found = self.__dict__.get("_anatomy")  # kept once found (not made before: a refusal leaves no entry)
        if found is None:
            from headwise.models.anatomy_probe import read_anatomy

            found = self.__dict__["_anatomy"] = read_anatomy(self)
        return found

    @contextlib.contextmanager
    def holding(self, *parts) -> Iterator[None]:
        """Within the block, the weights of ``parts`` — layer indices, or modules (the final norm) — are in: on a
        model opened layer by layer, brought in where they were not and released after
        (:meth:`~headwise.models.streamed.LayerStream.holding`: a reader of a layer's weights outside its forward
        pass, a norm called on recorded activations); a model opened whole: nothing."""
        if self.stream is None:
            yield
            return
        with contextlib.ExitStack() as stack:
            for part in parts:
                stack.enter_context(self.stream.holding(self.stream.unit_of(part)))
            yield

    def weight_rows(self, module, rows):
        """Rows ``rows (n,)`` (long) of ``module``'s ``weight`` ``(V, D)``, ``(n, D)`` float32 — an embedding's or an
        unembedding's rows, read alone from the checkpoint of a model opened layer by layer."""
        import torch

        if self.stream is None:
            return module.weight.detach()[rows.to(module.weight.device)].to(torch.float32)
        distinct, where = torch.unique(rows, sorted=True, return_inverse=True)
        return self.stream.weight_rows(module, distinct)[where]

    def check_whole(self, what: str) -> None:
        """ValueError (one line naming the memory ``what`` would need) when the model was opened layer by layer."""
        if self.stream is not None:
            raise whole_refused(self.name, self.memory, what)

    def _anatomy_points(self) -> dict:
        """The points the anatomy adds to the view (:func:`headwise.models.anatomy.anatomy_points`)."""
        from headwise.models.anatomy import anatomy_points

        return anatomy_points(self.anatomy)

    @property
    def width(self) -> int:
        """D, the width of the residual stream: the token embedding's rows (else the unembedding's, else the
        config's ``hidden_size``); read from the parameters' shapes, on the meta device too.

        Raises:
            ValueError: none of them says it."""
        import torch

        from headwise.models.anatomy_recording import input_embedding
        from headwise.points import unembedding

        for module in (input_embedding(self.model), unembedding(self.model)):
            weight = getattr(module, "weight", None)
            if isinstance(weight, torch.Tensor) and weight.dim() == 2:
                return int(weight.shape[-1])
        config = getattr(self.model, "config", None)
        size = getattr(getattr(config, "get_text_config", lambda: config)(), "hidden_size", None)
        if isinstance(size, int):
            return size
        raise ValueError(f"model: {self.name} has no token embedding whose width could be read")

    @property
    def max_heads(self) -> int:
        """The most query heads of any layer (H of the ``(…, NL, H)`` grids)."""
        return self.num_heads

    @property
    def device(self):
        """The device of the module's first parameter (CPU for a module without one)."""
        import torch

        param = next((p for p in self.model.parameters() if p.device.type != "meta"), None)
        return param.device if param is not None else torch.device("cpu")  # layer by layer: the CPU

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
                warnings.warn(f"texts[{k}]: {len(ids)} tokens, more than the model's {self.max_length} positions; "
                              f"truncated to the first {self.max_length}", TruncationWarning, stacklevel=2)  # fmt: skip
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
        with self._runner.math_path(self.attention_modules, math_path):
            return self._runner.run(self.model, ids, mask)

    def logits(self, ids, *, last_only: bool = False):
        """``ids (B, L)`` -> logits ``(B, L, V)`` (the model's final logits, soft-capping included), no cache.

        ``last_only``: a Hugging Face model computes the last position's logits alone (``logits_to_keep=1``:
        ``(B, 1, V)``, the unembedding of one position instead of L); headwise's modules return all L.
        """
        return self._runner.logits(self.model, ids, last_only)

    def attentions(self, ids, mask=None) -> list[np.ndarray]:
        """Per-head weights of every layer: NL float32 arrays ``(B, H, L, L)``.

        Hugging Face models: through :func:`headwise.hf.capture` (headwise attention).
        """
        import torch

        with torch.no_grad():
            maps = self._runner.attentions(self.model, ids, mask)
        if len(maps) != self.num_layers:
            raise RuntimeError(f"{self.name}: captured {len(maps)} attention layers, expected {self.num_layers}")
        return [m.float().cpu().numpy() for m in maps]

    # -- named points --------------------------------------------------------------------------------
    def point_names(self) -> list[str]:
        """Every point's name, in forward order (see :mod:`headwise.points` for what each holds)."""
        return list(self.points)

    def hooks(self, fns: Mapping[str, Callable] | Sequence[tuple[str, Callable]]):
        """A context manager: inside it, ``fns[name]`` is hooked at each named point — ``fn(tensor) ->
        replacement or None``, as TransformerLens's ``run_with_hooks`` — and removed after, also on error.

        Raises:
            ValueError: a name the model does not have (the message lists the closest ones).
        """
        return self.points.hooks(fns)

    def run_with_cache(self, ids, mask=None, *, names: Sequence[str] | str | None = None) -> dict:
        """One forward pass (no gradient; a Hugging Face model's base model, without the language-model head)
        recording the tensor at each named point: ``{name: tensor}`` (detached; ``layers.{i}.attn.qk`` gives its
        :class:`~headwise.core.rows.AttentionRows`). ``names`` None: every point of the pass (the patterns form
        ``L × S`` weights per head; ``unembed.in`` is not in it: the language-model head does not run).

        Raises:
            ValueError: an unknown name (the closest ones listed); RuntimeError: a point that did not run.
        """
        import torch

        if names is None:  # every point of this pass: the language-model head does not run in it
            names = [n for n in self.points if n != "unembed.in"]
        with torch.no_grad(), self.points.cached(names) as cache:
            self._runner.read(self.model, ids, mask)
        wanted = [names] if isinstance(names, str) else list(names)
        missing = [n for n in wanted if n not in cache]
        if missing:
            raise RuntimeError(f"{self.name}: the points {missing} did not run in the forward pass")
        return {n: cache[n] for n in wanted}

    @property
    def head_points(self) -> list:
        """Each layer's ``layers.{i}.attn.heads`` :class:`~headwise.core.hooks.HookPoint`, where gates act."""
        from headwise.points import attention_point

        return [self.points[attention_point(i, "heads")].module for i in range(self.num_layers)]

    @property
    def qk_points(self) -> list:
        """Each layer's ``layers.{i}.attn.qk`` :class:`~headwise.core.hooks.HookPoint` (post-rotary q and k with
        the masks, :class:`~headwise.core.rows.AttentionRows`), where streaming statistics read every head's rows."""
        from headwise.points import attention_point

        return [self.points[attention_point(i, "qk")].module for i in range(self.num_layers)]

    def read_rows(self, ids, mask, readers) -> None:
        """One forward pass (no gradient) with ``readers[layer]`` hooked on each layer's ``layers.{i}.attn.qk``.

        Hugging Face models run their base model (no language-model head: an 8,192-token pass would otherwise
        form ``(L, V)`` logits nobody reads).
        """
        import torch

        from headwise.points import attention_point

        if len(readers) != self.num_layers:
            raise ValueError(f"readers: expected {self.num_layers}, one per layer, got {len(readers)}")
        hooks = [(attention_point(layer, "qk"), reader) for layer, reader in enumerate(readers)]
        with torch.no_grad(), self.points.hooks(hooks, arg="readers"):
            self._runner.read(self.model, ids, mask)

    @contextlib.contextmanager
    def gated(self, gates) -> Iterator[None]:
        """Within the block, multiply each head's output by ``gates`` where heads enter the output projection
        (a hook on every layer's ``layers.{i}.attn.heads``; nested blocks multiply their gates).

        Args:
            gates: ``(NL, H)`` or ``(B, NL, H)`` float tensor (per example: one gate per sequence of the
                batch, so one backward pass gives every example's ∂L/∂ξ). May require grad.
        """
        from headwise.points import attention_point

        if tuple(gates.shape[-2:]) != (self.num_layers, self.num_heads):
            raise ValueError(
                f"gates: expected shape (…, {self.num_layers}, {self.num_heads}), got {tuple(gates.shape)}"
            )

        def gate(layer: int, heads_out):  # (B, H, L, Dh)
            g = gates[..., layer, :]  # (H,) or (B, H)
            shape = (g.shape[0] if g.dim() == 2 else 1, self.num_heads, 1, 1)
            return heads_out * g.reshape(shape).to(heads_out.dtype)

        hooks = [(attention_point(layer, "heads"), functools.partial(gate, layer)) for layer in range(self.num_layers)]
        with self.points.hooks(hooks, arg="gates"):
            yield

    def check_layer_head(self, layer, head) -> tuple[int, int]:
        """``(layer, head)`` if both are ints in range; else ValueError / TypeError naming the value
        (:func:`headwise.checks.layer_number`, :func:`headwise.checks.head_number`)."""
        from headwise.checks import head_number, layer_number

        layer = layer_number("layer", layer, self.num_layers, subject=str(layer))
        return layer, head_number("head", head, layer, self.heads_per_layer[layer], subject=str(head))
