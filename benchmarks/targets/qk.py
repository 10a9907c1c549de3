"""The circuits' speed on SmolLM2-135M-Instruct: QK attribution of one (head, query) over every key at 1,024
tokens, and the Q/K/V composition scores of all 270 × 270 head pairs.

Goals: the QK attribution takes ≤ 5 s after the model's forward pass (its own time minus one forward of the same
tokens, timed beside it); the composition scores of every pair ≤ 60 s (after the weights are read). Memory of the
QK attribution is bounded by the parts kept — ``(A + B) · J`` terms and one layer's writes projected to the head
— never ``L²``; it is not measured here.
"""

from __future__ import annotations

import statistics
import time

from machine import log
from row import Row

from targets.base import Mode, Target, md_row


def _text_ids(hm, L: int):
    import torch

    from headwise.study import sample_corpus

    words = sample_corpus().read_text(encoding="utf-8").split("\n")
    ids: list[int] = []
    while len(ids) < L:
        ids += hm.tokenizer.encode(" ".join(words)).ids
    return torch.tensor(ids[:L])


class QK(Target):
    name = "qk"
    title = "circuits on SmolLM2: QK attribution at 1,024 tokens, composition scores of all head pairs"

    def measure(self, mode: Mode):
        import torch

        from headwise.circuits import composition_scores, head_weights, qk_attribution
        from headwise.models import open_model

        torch.set_grad_enabled(False)
        hm = open_model("smollm2")
        ids = _text_ids(hm, 1024)
        runs = []
        for k in range(3 if mode.full else 1):
            t0 = time.perf_counter()
            hm.run_with_cache(ids[None], names=[])
            forward = time.perf_counter() - t0
            t0 = time.perf_counter()
            qk_attribution(hm, ids, 29, 8, 1023)
            total = time.perf_counter() - t0
            runs.append({"forward_s": forward, "qk_s": total, "after_forward_s": total - forward})
            log(f"circuits qk run {k + 1}: {runs[-1]}")
        t0 = time.perf_counter()
        weights = head_weights(hm)
        read = time.perf_counter() - t0
        t0 = time.perf_counter()
        composition_scores(weights)
        composition = time.perf_counter() - t0
        log(f"circuits composition: read {read:.1f} s, scores {composition:.1f} s")
        after = statistics.median(r["after_forward_s"] for r in runs)
        rows = [
            Row.at_most(
                "QK attribution, SmolLM2, one (head, query) over 1,024 keys: seconds after the forward",
                after,
                5.0,
                f"median of {len(runs)}; the forward alone {statistics.median(r['forward_s'] for r in runs):.1f} s",
            ),
            Row.at_most(
                "composition scores of all 270 × 270 head pairs of SmolLM2 (Q, K, V, per group): seconds",
                composition,
                60.0,
                f"reading the weights (norms folded): {read:.1f} s",
            ),
        ]
        return self.result(rows, qk=runs, composition_s=composition, read_s=read)

    def render(self, r):
        lines = [
            "SmolLM2-135M-Instruct, float32, the bundled sample corpus cut to 1,024 tokens; layer 29 head 8 at the "
            "last query (the most parts: 1 + 29 × 11 + 2 per side). `qk` is `qk_attribution` end to end (its own "
            "forward pass included), `after` that minus one `run_with_cache` forward of the same tokens.",
            "",
            md_row(["run", "forward", "qk", "after the forward"]),
            "|---|---|---|---|",
        ]
        for k, run in enumerate(r.data["qk"]):
            lines.append(
                md_row([k + 1, f"{run['forward_s']:.2f} s", f"{run['qk_s']:.2f} s", f"{run['after_forward_s']:.2f} s"])
            )
        lines += [
            "",
            f"Composition scores: {r.data['composition_s']:.1f} s (weights read in {r.data['read_s']:.1f} s).",
            "",
        ]
        return lines
