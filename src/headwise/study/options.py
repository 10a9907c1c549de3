"""The options of a heads study — ``headwise heads``'s options as one frozen record, checked in one place.

:class:`HeadsOptions` is built once (by the command line, or by a caller of the library) and handed to the
pipelines of :mod:`headwise.study`. Its checks that need no model run when it is built; those that need the
model (a layer it has, a probe that fits its positions, queries within the example) run in
:func:`headwise.study.plan_decoder`. Every error is a ValueError naming the option as the command line spells
it (``--probe-repeats``, ``TEXT``), so the message a user reads is the same from either door.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from headwise import checks

__all__ = ["HeadsOptions", "sample_corpus"]

#: The option names that are not ``--`` + the field's name with dashes.
_SPELLED = {"text": "TEXT", "cache": "--no-cache"}


def sample_corpus() -> Path:
    """The bundled corpus (``--corpus sample``): 1,200 public-domain sentences, one per line."""
    from importlib import resources

    return Path(str(resources.files("headwise") / "data" / "corpus" / "web_sentences.txt"))


@dataclass(frozen=True)
class HeadsOptions:
    """What a heads study reads and writes (the options of ``headwise heads``).

    Attributes:
        text: the example, and the statistics' only text without ``corpus`` (None: the corpus's first line, or the
            probe's first sequence).
        corpus: a UTF-8 text file, one sentence per line, or ``"sample"`` (:func:`sample_corpus`).
        model: what :func:`headwise.models.open_model` opens (a folder, a GGUF file, a bundled name), ``"untrained"``
            (the first article's untrained block), or None (the bundled encoder).
        cache: a GGUF file's de-quantised copy may be cached on disk (``--no-cache``: False).
        layer: only this layer's heads in the printed table (0-based; None: all).
        out: the output folder.
        batch_size: texts per model call.
        batch_size_auto: ``batch_size`` is the default, not the user's: a corpus run across ranks may take fewer
            documents a shard so that every rank gets one (:func:`headwise.study.shards.corpus_batch_size`).
        importance: add every head's estimated ablation, the exact ablation of the heads a search chooses (the top
            ``top_k`` by the estimate and by Michel et al.'s importance, a few at random, more by their bounds),
            Michel et al.'s importance and the pruning curve (:func:`headwise.study.estimate_importance`).
        exact: with ``importance``, every head's exact ablation and the full pruning curves instead
            (:func:`headwise.study.run_importance`).
        top_k: with ``importance``, the exact top heads sought: the top ``top_k`` by |estimate| and by Michel et
            al.'s importance measured first, then more as their bounds give (None: the default,
            :func:`headwise.study.default_top_k`; at most the model's heads, checked once it is open).
        max_exact: with ``importance``, most heads measured exactly (None: :func:`headwise.study.default_budget`);
            at least ``top_k``.
        importance_sentences: corpus sentences the importance is measured on.
        ablation: how ``importance`` removes a head: ``"zero"`` (ξ_h = 0) or ``"mean"`` (its mean output over the
            batch's real positions) — :data:`headwise.analysis.batched.MODES`.
        probe_length: decoders: random tokens in the probe's segment (shortened to fit the model).
        probe_repeats: decoders: copies of the segment in the probe.
        seed: seed of the probe and of the random pruning orders.
        block_size: decoders: query rows per block of the streaming pass (None: automatic).
        queries: decoders: ``"A:B"``, the example's queries kept at full resolution (parsed against the example by
            :func:`headwise.study.plan_decoder`).
        queries_only: decoders: those queries' page alone, from a pass over their rows (no statistics).
        composition: decoders: add the weights' circuits — Q/K/V-composition and copying scores
            (:func:`headwise.study.composition_columns`).
        max_memory: the budget for the process's peak resident memory (``"1.5GB"``; None: what the machine has
            free, with a margin): a model that does not fit it whole in float32 runs layer by layer
            (:func:`headwise.models.open_model`'s ``max_memory``); checked against the model when it opens.
    Raises:
        ValueError: naming the option: an empty ``text``, a ``corpus`` that is missing or a folder, a non-positive
            ``block_size``, ``queries_only`` without ``queries`` or with ``importance``, a count out of range.
    """

    text: str | None = None
    corpus: str | None = None
    model: str | None = None
    cache: bool = True
    layer: int | None = None
    out: Path = Path("headwise-out/heads")
    batch_size: int = 32
    batch_size_auto: bool = False
    importance: bool = False
    importance_sentences: int = 64
    ablation: str = "zero"
    exact: bool = False
    top_k: int | None = None
    max_exact: int | None = None
    probe_length: int = 32
    probe_repeats: int = 2
    seed: int = 0
    block_size: int | None = None
    queries: str | None = None
    queries_only: bool = False
    composition: bool = False
    max_memory: str | None = None

    def __post_init__(self):
        for name in ("text", "corpus", "model", "queries", "max_memory"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise TypeError(f"{self.flag(name)}: expected a string or None, got {type(value).__name__}")
        for name in ("layer", "block_size"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise TypeError(f"{self.flag(name)}: expected an integer or None, got {value!r}")
        if self.text is not None and not self.text.strip():
            raise ValueError(f"{self.flag('text')}: expected a non-empty text, got an empty one")
        path = self.corpus_path
        if path is not None and not path.exists():
            raise ValueError(f"--corpus: no such file: '{path}'")
        if path is not None and path.is_dir():
            raise ValueError(f"--corpus: '{path}' is a folder; expected a text file")
        if self.block_size is not None and self.block_size <= 0:
            raise ValueError(f"--block-size: expected a positive number of query rows, got {self.block_size}")
        if self.queries_only and self.queries is None:
            raise ValueError("--queries-only: expected --queries A:B (the queries to draw)")
        if self.queries_only and self.importance:
            raise ValueError("--queries-only: draws the chosen queries alone; run --importance without it")
        if self.queries_only and self.composition:
            raise ValueError("--queries-only: draws the chosen queries alone; run --composition without it")
        for name in ("batch_size", "importance_sentences"):
            checks.positive_int(self.flag(name), getattr(self, name))
        for name in ("probe_length", "probe_repeats"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 2:
                raise ValueError(f"{self.flag(name)}: expected an integer ≥ 2, got {value!r}")
        checks.non_negative_int("--seed", self.seed)
        checks.one_of("--ablation", self.ablation, ("zero", "mean"))
        if self.exact and not self.importance:
            raise ValueError("--exact: expected with --importance (it says how the importance is measured)")
        if self.top_k is not None:
            if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 1:
                raise ValueError(f"--top-k: expected a positive number of heads, got {self.top_k!r}")
            if not self.importance or self.exact:
                raise ValueError(f"--top-k: expected with --importance and without --exact, got --top-k {self.top_k}")
        if self.max_exact is not None:
            if isinstance(self.max_exact, bool) or not isinstance(self.max_exact, int) or self.max_exact < 1:
                raise ValueError(f"--max-exact: expected a positive number of heads, got {self.max_exact!r}")
            if not self.importance or self.exact:
                raise ValueError(
                    f"--max-exact: expected with --importance and without --exact, got --max-exact {self.max_exact}"
                )
            if self.top_k is not None and self.max_exact < self.top_k:
                raise ValueError(f"--max-exact: expected at least --top-k ({self.top_k}) heads, got {self.max_exact}")
        object.__setattr__(self, "out", Path(self.out))

    @staticmethod
    def flag(name: str) -> str:
        """The option ``name`` (a field) as the command line spells it: ``"probe_repeats"`` → ``"--probe-repeats"``."""
        if name not in {f.name for f in dataclasses.fields(HeadsOptions)}:
            raise ValueError(f"name: expected a field of HeadsOptions, got {name!r}")
        return _SPELLED.get(name, "--" + name.replace("_", "-"))

    def check_layer(self, num_layers: int) -> None:
        """ValueError naming ``--layer`` when it is not one of a model's ``num_layers`` layers (None: all, fine)."""
        if self.layer is not None and not 0 <= self.layer < num_layers:
            raise ValueError(f"--layer: expected 0 … {num_layers - 1} for this model, got {self.layer}")

    @property
    def corpus_path(self) -> Path | None:
        """The corpus file (``"sample"``: the bundled one), or None."""
        if self.corpus is None:
            return None
        return sample_corpus() if self.corpus == "sample" else Path(self.corpus)
