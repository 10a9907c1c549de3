"""A model's heads studied end to end — the pipelines behind ``headwise heads`` and ``headwise lab prune``.

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
- :func:`run_importance`, :func:`importance_batches`, :func:`importance_texts`, :func:`importance_columns`,
  :func:`importance_summary` — head importance, ablation and pruning curves.

Importing it loads neither torch nor the analysis: they load at the first call.
"""

from __future__ import annotations

from headwise.study.decoder import (
    PROBE_CHUNK,
    VIEW_BINS,
    VIEW_FULL_UP_TO,
    DecoderHeads,
    DecoderPlan,
    ExampleView,
    decoder_heads,
    decoder_report,
    decoder_texts,
    example_view,
    plan_decoder,
    query_rows,
)
from headwise.study.encoder import (
    UNTRAINED,
    EncoderAttend,
    check_encoder,
    encoder_attend,
    encoder_report,
    encoder_texts,
    sentence_heads,
)
from headwise.study.importance import (
    importance_batches,
    importance_columns,
    importance_summary,
    importance_texts,
    run_importance,
)
from headwise.study.inputs import (
    MAX_QUERIES,
    check_length,
    first_lines,
    make_probe,
    parse_queries,
    probe_batches,
    probe_ids,
    text_batches,
)
from headwise.study.options import HeadsOptions, sample_corpus

__all__ = [
    "HeadsOptions",
    "sample_corpus",
    "DecoderPlan",
    "DecoderHeads",
    "ExampleView",
    "plan_decoder",
    "decoder_texts",
    "decoder_heads",
    "decoder_report",
    "example_view",
    "query_rows",
    "check_encoder",
    "EncoderAttend",
    "encoder_attend",
    "encoder_texts",
    "encoder_report",
    "sentence_heads",
    "UNTRAINED",
    "make_probe",
    "probe_ids",
    "probe_batches",
    "text_batches",
    "check_length",
    "first_lines",
    "parse_queries",
    "run_importance",
    "importance_batches",
    "importance_texts",
    "importance_columns",
    "importance_summary",
    "MAX_QUERIES",
    "PROBE_CHUNK",
    "VIEW_BINS",
    "VIEW_FULL_UP_TO",
]
