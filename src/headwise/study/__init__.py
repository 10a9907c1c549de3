"""A model's heads studied end to end — the flows behind ``headwise heads``, ``demo``, ``patch`` and ``circuit``.

The floor between the pictures and the metrics: it opens nothing itself but drives an opened model
(:class:`headwise.models.HeadModel`) through :mod:`headwise.analysis`, and may import ``analysis/``, ``models/``,
``hf/`` and ``core/`` — never ``viz/``, ``lab/`` or ``cli/``. It draws no terminal UI: progress goes to callbacks,
warnings to a ``warn`` callback. Errors are ValueErrors naming the option (:class:`HeadsOptions`).

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
- :func:`open_heads_model`, :func:`heads_backend`, :func:`view_command`, :func:`view_note`, :func:`drawn`,
  :func:`importance_line`, :func:`heads_across_ranks` — the rest of ``headwise heads``'s flow, the terminal's aside.
- :func:`encoder_model`, :func:`encoder_study`, :func:`decoder_study` → :class:`HeadsFound` (progress through
  :class:`Bars`), :func:`check_opened`, :func:`heads_importance`, :func:`heads_composition`
  (:func:`composition_result`) and the table's :func:`head_row` (:data:`COLUMNS`, :data:`DECODER_COLUMNS`) —
  ``headwise heads``'s flow, on one process or across ranks, everything it prints and draws computed.
- :func:`patch_study` → :class:`PatchFound`, :func:`patch_target`, :func:`parse_heads`, :func:`patching_json`,
  :func:`patch_csv`, :func:`top_line` — ``headwise patch``'s flow: the sweep on one process or across ranks, the
  direct logit attribution, ``patching.json`` / ``patching.csv`` assembled.
- :func:`circuit_study` → :class:`CircuitFound`, :func:`add_qk`, :func:`circuit_heads`, :func:`circuit_lines` —
  ``headwise circuit``'s flow: the circuit on one process or across ranks, the QK attribution of its strongest heads;
  :func:`write_mib`, :func:`mib_evaluation`, :func:`mib_lines` — its MIB files and the scoring of a MIB-format file.
- :func:`run_importance`, :func:`importance_batches`, :func:`importance_texts`, :func:`importance_columns`,
  :func:`importance_summary` — head importance, ablation and pruning curves; :func:`estimate_importance` →
  :class:`EstimatedImportance` (``--importance``'s default: every head estimated at once, the exact ablation of the
  top k and a few at random, the pruning curve at :data:`GRID`), :func:`estimate_across_ranks` the same across ranks.

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
    "headwise.study.circuit_run": [
        "CIRCUIT_STEPS", "CircuitFound", "add_qk", "circuit_heads", "circuit_lines", "circuit_study",
        "check_mib", "mib_evaluation", "mib_lines", "write_mib",
    ],
    "headwise.study.patch_ranks": ["PatchRun", "SweepShard", "patch_across_ranks", "plan_sweep"],
    "headwise.study.circuit_ranks": ["CIRCUIT_STAGES", "CircuitRun", "circuit_across_ranks"],
    "headwise.study.encoder": [
        "UNTRAINED", "EncoderAttend", "check_encoder", "encoder_attend", "encoder_report", "encoder_texts",
        "sentence_heads",
    ],
    "headwise.study.heads_run": [
        "COMMAND_TEXT_UP_TO", "RankedHeads", "drawn", "heads_across_ranks", "heads_backend", "importance_line",
        "open_heads_model", "sweep_note", "view_command", "view_note",
    ],
    "headwise.study.heads_flow": [
        "COLUMNS", "DECODER_COLUMNS", "Bars", "HeadsFound", "check_opened", "composition_line", "composition_result",
        "decoder_study", "encoder_model", "encoder_study", "head_row", "heads_composition", "heads_importance",
        "positional_line", "probe_line", "roles_line",
    ],
    "headwise.study.importance": [
        "importance_batches", "importance_columns", "importance_summary", "importance_texts", "run_importance",
    ],
    "headwise.study.inputs": [
        "MAX_QUERIES", "check_length", "first_lines", "make_probe", "parse_queries", "probe_batches", "probe_ids",
        "text_batches",
    ],
    "headwise.study.options": ["HeadsOptions", "sample_corpus"],
    "headwise.study.patch_report": [
        "PATCH_DIRECTIONS", "PATCH_METHODS", "PatchFound", "parse_heads", "patch_csv", "patching_json", "patch_study",
        "patch_target", "top_line",
    ],
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
