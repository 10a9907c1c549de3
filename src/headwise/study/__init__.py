"""A model's heads studied: the library pieces the commands' flows (:mod:`headwise.commands`) are made of.

The floor between the flows and the metrics: it opens nothing itself but drives an opened model
(:class:`headwise.models.HeadModel`) through :mod:`headwise.analysis` (and :mod:`headwise.circuits`), and may import
``circuits/``, ``patching/``, ``analysis/``, ``models/``, ``hf/`` and ``core/`` — never ``commands/``, ``viz/``,
``lab/`` or ``cli/``. It draws no terminal UI: progress goes to callbacks, warnings to a ``warn`` callback. Errors are
ValueErrors naming the option (:class:`HeadsOptions`).

- :class:`HeadsOptions` — the options of a heads study, one frozen record checked in one place.
- :func:`plan_decoder` → :class:`DecoderPlan` — the options checked against a decoder (layer, tokenizer, probe,
  queries); :func:`decoder_texts`, :func:`decoder_heads` → :class:`DecoderHeads` (the report and the
  :class:`ExampleView` drawn); :func:`query_rows` (the chosen queries alone); :func:`decoder_report`,
  :func:`example_view` — the streaming pass over batches.
- :func:`check_encoder`, :func:`encoder_attend` → :class:`EncoderAttend`, :func:`encoder_texts`,
  :func:`encoder_report`, :func:`sentence_heads` — an encoder's (or the untrained block's) metrics over a corpus and
  the example sentence.
- :func:`make_probe`, :func:`probe_ids`, :func:`probe_batches`, :func:`text_batches`, :func:`check_length`,
  :func:`parse_queries`, :func:`first_lines` — what the model is fed.
- :func:`corpus_heads` → :class:`CorpusRun` — a decoder's corpus statistics across the ranks of a ``torchrun`` launch
  (shards dealt by tokens, saved and resumed, one all-reduce: :mod:`headwise.study.shards`); :func:`encoder_corpus`,
  the same for an encoder; :func:`importance_across_ranks` → :class:`ImportanceRun`, ``--importance``'s batches
  split. The ranks themselves (:func:`launched`, :func:`init_group`, :func:`deal`, :func:`all_gather_json`, the
  timeout) are :mod:`headwise.distributed.ranks`', re-exported here.
- :func:`open_heads_model`, :func:`heads_backend` — the model ``headwise heads`` reads and its route;
  :func:`heads_across_ranks` → :class:`RankedHeads`, its corpus run and ``--importance`` across the ranks.
- :data:`COLUMNS`, :data:`DECODER_COLUMNS`, :func:`head_row`, :func:`roles_line`, :func:`probe_line`,
  :func:`positional_line`, :func:`composition_line`, :func:`importance_line`, :func:`view_command`,
  :func:`view_note`, :func:`drawn` — what ``headwise heads`` prints of a study, as text.
- :func:`run_importance`, :func:`importance_batches`, :func:`importance_texts`, :func:`importance_columns`,
  :func:`importance_summary` — head importance, ablation and pruning curves; :func:`estimate_importance` →
  :class:`EstimatedImportance` (``--importance``'s default: every head estimated at once, the exact ablation of the
  heads :class:`HeadSearch` chooses — the top k of two estimators, a few at random, then more by their bounds — the
  pruning curve at :data:`GRID`), :func:`estimate_across_ranks` the same across ranks.

Importing it loads nothing else (PEP 562): each name's module loads at its first use, torch and the analysis at the
first call — the command line imports this package at start-up for every command.
"""

from __future__ import annotations

import importlib

_MODULES = {
    "headwise.study.decoder": [
        "PROBE_CHUNK", "VIEW_BINS", "VIEW_FULL_UP_TO", "DecoderHeads", "DecoderPlan", "ExampleView", "decoder_heads",
        "composition_columns",
        "decoder_report", "decoder_texts", "example_view", "plan_decoder", "probe_detectors", "query_rows",
    ],
    "headwise.distributed.ranks": [
        "DEFAULT_TIMEOUT_S", "CollectiveTimeout", "Launch", "agree", "all_gather_json", "barrier", "deal", "init_group",
        "launched", "rank_group", "refuse_together",
    ],
    "headwise.study.shards": ["Shard", "ShardStore", "assign_shards", "corpus_batch_size", "plan_shards",
                              "weights_sha256"],
    "headwise.study.corpus_ranks": ["CorpusRun", "corpus_heads"],
    "headwise.study.encoder_ranks": ["encoder_corpus"],
    "headwise.study.importance_ranks": ["ImportanceRun", "estimate_across_ranks", "importance_across_ranks"],
    "headwise.study.importance_estimate": [
        "GRID", "RANDOM_HEADS", "EstimatedImportance", "agreement", "default_top_k", "estimate_importance",
    ],
    "headwise.study.importance_search": ["HeadSearch", "default_budget"],
    "headwise.study.patch_ranks": ["PatchRun", "SweepShard", "patch_across_ranks", "plan_sweep"],
    "headwise.study.circuit_ranks": ["CIRCUIT_STAGES", "CircuitRun", "circuit_across_ranks"],
    "headwise.study.encoder": [
        "UNTRAINED", "EncoderAttend", "check_encoder", "encoder_attend", "encoder_report", "encoder_texts",
        "sentence_heads",
    ],
    "headwise.study.heads_model": ["heads_backend", "open_heads_model"],
    "headwise.study.heads_ranks": ["RankedHeads", "heads_across_ranks"],
    "headwise.study.heads_lines": [
        "COLUMNS", "COMMAND_TEXT_UP_TO", "DECODER_COLUMNS", "composition_line", "drawn", "head_row",
        "importance_line", "ordinal", "positional_line", "probe_line", "role_summary", "roles_line", "SCREEN_ROWS",
        "search_words", "sweep_note", "view_command", "view_note",
    ],
    "headwise.study.importance": [
        "importance_batches", "importance_columns", "importance_summary", "importance_texts", "run_importance",
    ],
    "headwise.study.inputs": [
        "MAX_QUERIES", "check_length", "first_lines", "make_probe", "parse_queries", "probe_batches", "probe_ids",
        "text_batches",
    ],
    "headwise.study.options": ["HeadsOptions", "sample_corpus"],
}  # fmt: skip
_LAZY = {name: module for module, names in _MODULES.items() for name in names}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'headwise.study' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value


def __dir__():
    return __all__
