"""What the atlas's evidence adds to the statistics' streaming pass: ``read_rows`` with ``heads``' statistics alone
against the same pass with a :class:`~headwise.analysis.evidence.HeadEvidence` reader beside them (one mark).

    .venv/bin/python benchmarks/evidence_overhead.py                  # B × L = 4 × 512 and 1 × 2,048
    .venv/bin/python benchmarks/evidence_overhead.py --threads 1 16x128

The model: headwise's Llama (random weights; 6 layers, 8 query heads over 4 key/value groups, width 256). Timing:
``benchmarks/timing.py`` (the two contenders alternate; the ratio is the median of the per-round ratios, with their
lowest and highest). Each line names the CPU and the load average at its start. Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import sys
from functools import partial

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(__file__))
from machine import cpu_model  # noqa: E402
from timing import compare, threads  # noqa: E402

from headwise.analysis import DecoderStats, HeadEvidence  # noqa: E402
from headwise.analysis.streaming import read_rows  # noqa: E402
from headwise.models import HeadModel  # noqa: E402
from headwise.models.llama import LlamaConfig, LlamaLM  # noqa: E402

CONFIG = dict(
    model_type="llama", vocab_size=2000, hidden_size=256, intermediate_size=688, num_hidden_layers=6,
    num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=4096,
)  # fmt: skip


def _run(hm, ids, marks) -> None:
    """One pass with the statistics, and the evidence of ``marks`` unless None."""
    stats = DecoderStats(hm.num_layers, hm.num_heads, max_length=ids.shape[1])
    extra = []
    if marks is not None:
        extra = [HeadEvidence(hm.num_layers, hm.num_heads, marks=tuple(marks)).reader(first_text=0, marks=marks)]
    read_rows(hm, ids, None, head_stats=stats.heads, detector_stats=stats.detectors, extra=extra)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shapes", nargs="*", default=["4x512", "1x2048"], help="B x L of each case")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    torch.manual_seed(0)
    hm = HeadModel(LlamaLM(LlamaConfig.from_dict(CONFIG)).eval())
    for shape in args.shapes:
        B, L = (int(v) for v in shape.split("x"))
        ids = torch.as_tensor(np.random.default_rng(0).integers(0, CONFIG["vocab_size"], (B, L)))
        marks = {"punct": ids.numpy() % 17 == 0}

        load = os.getloadavg()[0]
        with threads(args.threads):
            cases = {"stats": partial(_run, hm, ids, None), "stats+evidence": partial(_run, hm, ids, marks)}
            t = compare(cases, rounds=args.rounds)
        lo, hi = t.spread("stats+evidence", "stats")
        med = t.median_s
        print(
            f"{cpu_model()}, {args.threads} thread(s), load {load:.2f}: B={B} L={L} statistics {med['stats']:.3f} s, "
            f"with evidence {med['stats+evidence']:.3f} s: {t.ratio('stats+evidence', 'stats'):.3f}x "
            f"(rounds {lo:.3f}-{hi:.3f})"
        )


if __name__ == "__main__":
    main()
