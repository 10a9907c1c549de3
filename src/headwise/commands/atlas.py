"""``headwise atlas``'s flow and its library face, :func:`atlas`: every head of a decoder with what it does, the
evidence from a corpus, what it writes, how much it matters and whom it works with — ``atlas.json`` and the offline
``atlas.html`` (:mod:`headwise.viz.atlas_page`).

One streaming pass over the corpus gives the statistics and roles of ``headwise heads``, the attention evidence
(each head's strongest contexts, its attention by offset, what its attention lands on) and what every head writes
(:class:`headwise.study.atlas.AtlasPass`); then the importance (``--importance``'s estimate, the strongest heads
measured exactly) and the weights' circuits (Q-, K- and V-composition partners, the OV circuit's copying) — each the
same run ``headwise heads --importance --composition`` makes.
"""

from __future__ import annotations

import dataclasses
import json
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from headwise.commands import said
from headwise.commands.heads import Bars

__all__ = ["Atlas", "AtlasOptions", "AtlasResult", "atlas", "atlas_max_exact", "run"]


@dataclass(frozen=True)
class AtlasOptions:
    """What ``headwise atlas`` reads and writes.

    Attributes:
        model: what :func:`headwise.models.open_model` opens (a folder, a GGUF file, ``"smollm2"``).
        corpus: a UTF-8 text file, one text per line, or ``"sample"`` (the bundled corpus).
        out: the output folder (None: nothing written — the library's :func:`atlas`).
        top: contexts kept per head (its strongest attention, its largest writes).
        importance: measure every head's importance (``--importance``'s run); composition: the weights' circuits.
        max_exact: most heads measured exactly (None: :func:`atlas_max_exact`, the top k + 6).
        batch_size, importance_sentences, ablation, top_k, seed, max_memory, cache: as ``headwise heads``'s.
    Raises:
        ValueError: naming the option, as :class:`~headwise.study.HeadsOptions` does.
    """

    model: str | None = "smollm2"
    corpus: str = "sample"
    out: Path | None = Path("headwise-out/atlas")
    top: int = 8
    importance: bool = True
    composition: bool = True
    batch_size: int = 32
    importance_sentences: int = 64
    ablation: str = "zero"
    top_k: int | None = None
    max_exact: int | None = None
    seed: int = 0
    max_memory: str | None = None
    cache: bool = True

    def __post_init__(self):
        from headwise import checks

        checks.positive_int("--top", self.top)
        if self.top > 64:
            raise ValueError(f"--top: expected at most 64 contexts a head, got {self.top}")
        self.heads_options()  # every check of the shared options, naming them as the command line does

    def heads_options(self):
        """The :class:`~headwise.study.HeadsOptions` of the same run of ``headwise heads``."""
        from headwise.study.options import HeadsOptions

        return HeadsOptions(
            corpus=self.corpus, model=self.model, cache=self.cache,
            out=self.out if self.out is not None else Path("."), batch_size=self.batch_size,
            importance=self.importance, importance_sentences=self.importance_sentences, ablation=self.ablation,
            top_k=self.top_k, max_exact=self.max_exact, seed=self.seed, composition=self.composition,
            max_memory=self.max_memory,
        )  # fmt: skip


class Atlas:
    """Every head's record (a dict of ``atlas.json``'s format, ``headwise.atlas/1``; docs/heads.md).

    ``atlas["L3.H5"]`` or ``atlas[3, 5]`` is one head's record; ``atlas.heads`` all of them, layer-major;
    ``atlas.to_dict()`` the whole JSON-ready dict; ``atlas.html()`` the offline page; in a notebook the atlas shows
    itself, and ``atlas.card("L3.H5")`` shows the page opened at that head's card.
    """

    def __init__(self, data: dict):
        self.data = data
        self._by_id = {h["id"]: h for h in data["heads"]}

    @property
    def heads(self) -> list[dict]:
        return self.data["heads"]

    def __len__(self) -> int:
        return len(self.heads)

    def __getitem__(self, key) -> dict:
        from headwise.circuits.graph import head_id

        name = head_id(*key) if isinstance(key, tuple) else key
        if name not in self._by_id:
            raise KeyError(f"head: expected a head of this atlas (L0.H0 … {self.heads[-1]['id']}), got {key!r}")
        return self._by_id[name]

    def to_dict(self) -> dict:
        return self.data

    def to_json(self) -> str:
        return json.dumps(self.data, ensure_ascii=False, allow_nan=False)

    def html(self) -> str:
        """The self-contained offline page (:func:`headwise.viz.atlas_page.atlas_html`)."""
        from headwise.viz.atlas_page import atlas_html

        return atlas_html(self.data)

    def card(self, head, *, height: int = 720):
        """A notebook view of the page opened at ``head``'s card (``"L3.H5"`` or ``(3, 5)``)."""
        from headwise.viz.notebook import HTMLView

        name = self[head]["id"]
        page = self.html().replace("</head>", f"<script>location.hash = {json.dumps('#' + name)};</script></head>", 1)
        return HTMLView(page, height=height, title=f"{self.data['model']['name']} {name}")

    def _repr_html_(self) -> str:
        from headwise.viz.notebook import HTMLView

        return HTMLView(self.html(), height=760, title=self.data["model"]["name"])._repr_html_()

    def save(self, folder) -> dict[str, Path]:
        """``atlas.json`` and ``atlas.html`` written into ``folder`` (each atomically, both made first)."""
        from headwise._io import write_text_atomic

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        texts = {"atlas.json": self.to_json(), "atlas.html": self.html()}  # both made before either is written
        return {name: write_text_atomic(folder / name, text) for name, text in texts.items()}


@dataclass
class AtlasResult:
    """What ``headwise atlas`` prints and writes: the :class:`Atlas` (``atlas.json``, ``atlas.html``) and the lines
    that fit a screen (:func:`headwise.study.atlas.summary_lines`)."""

    atlas: Atlas
    lines: list[str]


def atlas(model, corpus=None, *, top: int = 8, importance: bool = True, composition: bool = True, **options) -> Atlas:
    """Every head of ``model`` explained over ``corpus``: the library face of ``headwise atlas``.

    Args:
        model: a :class:`~headwise.models.HeadModel` or what :func:`headwise.models.open_model` opens.
        corpus: a text file (one text per line), ``"sample"`` or None (the bundled corpus).
        top, importance, composition, options: as :class:`AtlasOptions`.
    Returns:
        :class:`Atlas`.
    """
    name = model if isinstance(model, str) or model is None else None
    opts = AtlasOptions(model=name or "smollm2", corpus=corpus or "sample", out=None, top=top,
                        importance=importance, composition=composition, **options)  # fmt: skip
    return run(opts, warn=lambda m: None, hm=None if name is not None else model).atlas


def run(options: AtlasOptions, *, warn: Callable[[str], None], bars: Bars | None = None, hm=None) -> AtlasResult:
    """``headwise atlas``: the model opened (or ``hm``), checked against the options, ``--out`` created, the corpus
    pass, the importance and the weights' circuits, assembled into an :class:`Atlas` (the caller writes it). A model
    opened layer by layer is refused in the one sentence every whole-model tool says (its need named).

    Raises:
        ValueError: one line naming the option (a model without a tokenizer, a budget the run does not fit, a model
            opened layer by layer, a launch under torchrun: the atlas runs in one process).
    """
    from headwise.commands._folders import prepare_folder
    from headwise.commands.heads import check_opened, check_room, composition_result
    from headwise.distributed.ranks import launched
    from headwise.models.memory import MemoryBudgetError
    from headwise.study.decoder import decoder_heads, decoder_texts, plan_decoder
    from headwise.study.heads_model import heads_backend, open_heads_model

    opts, hopts, bars = options, options.heads_options(), bars or Bars()
    if launched():
        raise ValueError("atlas: runs in one process; under torchrun, split the corpus with headwise heads")
    if hm is None:
        try:
            # headwise heads' route: a Llama-family decoder on headwise's own modules, any other on Hugging Face's
            hm = open_heads_model(
                opts.model, cache=opts.cache, backend=heads_backend(hopts), warn=warn, max_memory=opts.max_memory
            )
        except MemoryBudgetError as e:
            raise ValueError(("" if e.given else "--model: ") + said(e)) from None
    hm.check_whole("the atlas")  # the evidence and the writes read every layer's parts within each batch
    if hm.tokenizer is None:
        raise ValueError(f"--model: {hm.title} has no tokenizer; the atlas reads a corpus of text")
    if hm.kind != "decoder":
        return _encoder(hm, opts, dataclasses.replace(hopts, composition=False), warn=warn, bars=bars)
    check_opened(hm, hopts)
    with bars.layers(hm):
        plan = plan_decoder(hm, hopts)
        check_room(hm, plan)
        if opts.out is not None:
            prepare_folder(opts.out, "--out")
        texts, total = decoder_texts(hopts)
        atlas_pass = _atlas_pass(hm, opts, total)
        with bars.corpus(total) as progress:
            found = decoder_heads(hm, hopts, plan, texts, warn=warn, progress=progress, observe=atlas_pass)
        importance = _importance(hm, opts, hopts, plan.probe, warn=warn, bars=bars)
        comp = composition_result(hm, warn=warn, bars=bars) if opts.composition else None
    return _result(Atlas(_assemble(hm, opts, found.report, atlas_pass, importance, comp)))


def _encoder(hm, opts: AtlasOptions, hopts, *, warn, bars: Bars) -> AtlasResult:
    """An encoder's atlas: its full maps read batch by batch into the statistics and the evidence (no unembedding:
    nothing written through one; no weights' circuits), then the importance (the embedding's turning rate)."""
    from headwise.commands._folders import prepare_folder
    from headwise.commands.heads import check_importance_whole, encoder_model
    from headwise.study.encoder import encoder_report, encoder_texts

    hm, enc = encoder_model(hm, hopts, warn=warn)
    check_importance_whole(hm, hopts)
    if opts.out is not None:
        prepare_folder(opts.out, "--out")
    atlas_pass = _atlas_pass(hm, opts)

    def attend(texts):
        maps, info = enc.attend(texts)
        atlas_pass.read_maps(maps, info)
        return maps, info

    reader, total = encoder_texts(hopts, warn=warn)
    with bars.corpus(total) as progress:
        report = encoder_report(reader, dataclasses.replace(enc, attend=attend), hopts.batch_size, warn=warn,
                                progress=progress)  # fmt: skip
    importance = _importance(hm, opts, hopts, None, warn=warn, bars=bars)
    return _result(Atlas(_assemble(hm, opts, report, atlas_pass, importance, None)))


def _importance(hm, opts: AtlasOptions, hopts, probe, *, warn, bars: Bars) -> dict | None:
    """``--importance``'s run without its pruning curve (:func:`headwise.commands.heads.heads_importance`): every
    head's columns and what the page says of the run; None without ``importance``."""
    from headwise.commands.heads import heads_importance

    if not opts.importance:
        return None
    if hopts.max_exact is None:
        hopts = dataclasses.replace(hopts, max_exact=atlas_max_exact(hm, hopts.top_k))
    holder = types.SimpleNamespace(ranked=None, extra={})  # what heads' flow would hand it: no ranks, no files
    result, columns = heads_importance(hm, hopts, holder, probe, warn=warn, bars=bars, curves=False)
    return {"columns": columns, "header": _importance_header(holder.extra["importance"], result, opts.ablation)}


def atlas_max_exact(hm, top_k: int | None) -> int:
    """The atlas's default ``--max-exact``: the top k and :data:`~headwise.study.RANDOM_HEADS` more (at most every
    head) — the search's first round cut to the top k by |estimate| and the random heads, Michel's picks left out —
    so the importance stays a small share of the atlas's time (each head about one forward pass of the sample; an
    early head a whole one: Michel's picks in place of the random heads took SmolLM2's atlas from 1.74 × to
    2.02 × ``headwise heads``). ``headwise heads --importance`` searches on to 4 × the top k."""
    from headwise.study.importance_estimate import RANDOM_HEADS, default_top_k

    n = hm.num_layers * hm.num_heads
    return int(min(n, (default_top_k(n) if top_k is None else top_k) + RANDOM_HEADS))


def _result(found: Atlas) -> AtlasResult:
    from headwise.study.atlas import summary_lines

    return AtlasResult(found, summary_lines(found.to_dict()))


def _atlas_pass(hm, opts: AtlasOptions, texts: int | None = None):
    from headwise.study.atlas import AtlasPass

    return AtlasPass(hm, top=opts.top, texts=texts)


def _assemble(hm, opts: AtlasOptions, report, atlas_pass, importance, comp) -> dict:
    from headwise.study.atlas import atlas_dict

    corpus = "the sample corpus" if opts.corpus == "sample" else Path(opts.corpus).name
    cols, summary = comp if comp is not None else (None, None)
    return atlas_dict(
        hm, report, atlas_pass, corpus=corpus, importance=importance, composition=summary,
        copying=None if cols is None else cols.get("copying"),
    )  # fmt: skip


def _importance_header(summary: dict, result, ablation: str) -> dict:
    """What the page says of the importance run: the metric, the estimator, the heads measured (why, and how the
    search for them ended) and the agreement."""
    from headwise.study.heads_lines import search_words

    n = int(result.importance.size)
    exact = summary.get("route") == "exact"
    measured = n if exact else len(summary.get("exact_heads", {}).get("heads", []))
    agreement = None
    if summary.get("agreement"):  # the page shows numbers: the worst head named in one string
        agreement = {k: v for k, v in summary["agreement"].items() if isinstance(v, int | float)}
        worst = summary["agreement"].get("largest_error")
        if worst:
            agreement["largest_error"] = (
                f"L{worst['layer']}.H{worst['head']}: estimate {worst['estimate']:.4g}, exact {worst['exact']:.4g}"
            )
    return {
        "metric": f"the change of {result.objective} when the head is ablated ({ablation})",
        "estimator": None if exact else summary.get("estimator"),
        "measured": measured,
        "of": n,
        "search": search_words(summary.get("exact_heads") or {}) or None,
        "agreement": agreement,
    }
