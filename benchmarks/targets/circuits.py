"""Circuits on SmolLM2-135M: EAP and EAP-IG over every edge, exact path patching into one key group, EAP at long
inputs — each case a fresh process (``python benchmarks/targets/circuits.py CASE`` prints one JSON line).

Cases (8 indirect-object pairs of 14 tokens, "When Mary and John went to the store, John gave a drink to" with
other names, places and objects; the corrupted prompt repeats the other name):

- ``eap``: :func:`headwise.circuits.edge_attribution` over every edge (30 layers × 9 query heads, 3 key/value
  groups, 30 MLPs: 270 + 30 + 1 senders); goal ≤ 30 s and peak ≤ 4 GB;
- ``eap-ig``: the same with 5 integrated-gradient steps; goal ≤ 120 s;
- ``atp``: ``"atp*"`` (every query and key receiver's pattern recomputed exactly) beside ``"eap"`` in the same
  process, alternating, three rounds each after a warm-up; the median of each and their ratio; goal: atp* ≤ 3 ×
  EAP's time (the peak is the process's, both methods run in it);
- ``path``: :func:`headwise.circuits.path_patch` of all 270 heads, one at a time, into one receiver's key
  group (layer 29, group 0); goal ≤ 120 s;
- ``eap-long``: EAP over every edge on one pair of 2,048 tokens (:func:`long_pairs`: the bundled web
  sentences, then an indirect-object sentence whose second mention of a name differs); goal: peak ≤ 8 GB,
  time stated. ``python benchmarks/targets/circuits.py eap-long 2048 P`` runs P such pairs (each its own
  names, the same text before them).

Times are wall seconds of the call after the model is loaded; peaks are the process's resident high-water mark
(``VmHWM``, as ``benchmarks/memcase.py``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
NAMES = [" Mary", " John", " Tom", " Anna", " James", " Sarah", " David", " Emma"]
PLACES = [" store", " park", " school", " beach"]
THINGS = [" drink", " book", " ball", " gift"]
CASES = ("eap", "eap-ig", "atp", "path", "eap-long")


def _peak_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def ioi_pairs(tok, P: int = 8):
    """``(clean (P, L), corrupted (P, L), answer ids, wrong ids)`` with every prompt the same length."""
    import torch

    clean, corrupted, answer, wrong = [], [], [], []
    for p in range(P):
        a, b = NAMES[p % len(NAMES)], NAMES[(p + 1) % len(NAMES)]
        place, thing = PLACES[p % len(PLACES)], THINGS[(p // 2) % len(THINGS)]
        text = f"When{a} and{b} went to the{place},{{}} gave a{thing} to"
        clean.append(tok.encode(text.format(b)).ids)
        corrupted.append(tok.encode(text.format(a)).ids)
        answer.append(tok.encode(a, add_special_tokens=False).ids[0])
        wrong.append(tok.encode(b, add_special_tokens=False).ids[0])
    lengths = {len(r) for r in clean + corrupted}
    if len(lengths) != 1:
        raise RuntimeError(f"IOI prompts of different lengths {lengths}")
    return torch.tensor(clean), torch.tensor(corrupted), answer, wrong


def long_pairs(tok, length: int = 2048, P: int = 1):
    """``(clean (P, length), corrupted, answer ids, wrong ids)``: the first tokens of the bundled web sentences,
    then :func:`ioi_pairs`' sentences (the last 14 tokens) — a clean and a corrupted prompt differ in one name."""
    import torch

    import headwise

    clean, corrupted, answer, wrong = ioi_pairs(tok, P)
    corpus = Path(headwise.__file__).parent / "data" / "corpus" / "web_sentences.txt"
    text = tok.encode(corpus.read_text()[:40000], add_special_tokens=False).ids
    need = length - clean.shape[1]
    if need < 0 or len(text) < need:
        raise ValueError(f"length: expected {clean.shape[1]}..{clean.shape[1] + len(text)} tokens, got {length}")
    prefix = torch.tensor(text[:need]).expand(P, need)
    return torch.cat([prefix, clean], 1), torch.cat([prefix, corrupted], 1), answer, wrong


def run_case(case: str, length: int = 2048, pairs: int = 1) -> dict:
    import torch

    from headwise.circuits import edge_attribution, path_patch, wiring
    from headwise.models import open_model
    from headwise.patching import logit_difference

    torch.set_num_threads(2)
    hm = open_model("smollm2")
    w = wiring(hm)
    if case == "eap-long":
        clean, corrupted, answer, wrong = long_pairs(hm.tokenizer, length, pairs)
    else:
        clean, corrupted, answer, wrong = ioi_pairs(hm.tokenizer)
    metric = logit_difference(answer, wrong)
    t0 = time.perf_counter()
    if case == "atp":
        edge_attribution(w, clean, corrupted, metric, method="atp*")  # warm-up
        times: dict = {"eap": [], "atp*": []}
        for _ in range(3):
            for method in times:
                t1 = time.perf_counter()
                edge_attribution(w, clean, corrupted, metric, method=method)
                times[method].append(time.perf_counter() - t1)
        median = {m: sorted(v)[1] for m, v in times.items()}
        return {
            "case": case, "seconds": median["atp*"], "eap_seconds": median["eap"],
            "ratio": median["atp*"] / median["eap"], "rounds": times, "peak_mib": _peak_mib(),
            "tokens": int(clean.shape[1]), "pairs": int(clean.shape[0]),
        }  # fmt: skip
    if case in ("eap", "eap-long"):
        out = edge_attribution(w, clean, corrupted, metric)
        extra = {"edges": len(out.graph.edges)}
    elif case == "eap-ig":
        out = edge_attribution(w, clean, corrupted, metric, method="eap-ig", steps=5)
        extra = {"edges": len(out.graph.edges)}
    else:
        senders = [f"L{layer}.H{h}" for layer in range(hm.num_layers) for h in range(hm.heads_per_layer[layer])]
        out = path_patch(w, clean, corrupted, metric, senders, ["L29.KV0.k"], batch_size=30)
        extra = {"senders": len(senders), "passes": out.passes}
    seconds = time.perf_counter() - t0
    return {
        "case": case,
        "seconds": seconds,
        "peak_mib": _peak_mib(),
        "tokens": int(clean.shape[1]),
        "pairs": int(clean.shape[0]),
        **extra,
    }


def measure_case(case: str) -> dict:
    src = str(HERE.parents[1] / "src")  # this checkout's headwise, installed or not
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p)}
    out = subprocess.run([sys.executable, __file__, case], capture_output=True, text=True, check=False, env=env)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode or not lines:
        return {"case": case, "error": (out.stderr or out.stdout)[-2000:]}
    return json.loads(lines[-1])


try:  # as a target of benchmarks/run.py
    from row import Row

    from targets.base import Mode, Target, md_row

    class Circuits(Target):
        name = "circuits"
        title = "circuits on SmolLM2-135M: EAP, EAP-IG, path patching, EAP at 2,048 tokens"

        def measure(self, mode: Mode):
            from machine import log

            data = {}
            for case in CASES if mode.full else ("eap", "atp", "path"):
                data[case] = measure_case(case)
                log(f"circuits {case}: {data[case]}")
                if "error" in data[case]:
                    raise RuntimeError(f"circuits {case}: {data[case]['error']}")
            goals = {"eap": 30.0, "eap-ig": 120.0, "path": 120.0}  # atp: its ratio to eap, below
            rows = [
                Row.at_most(f"circuits {case} on SmolLM2, 8 IOI pairs: seconds", d["seconds"], goals[case], "")
                for case, d in data.items()
                if case in goals
            ]
            if "eap" in data:
                rows.append(Row.at_most("circuits eap: peak MiB", data["eap"]["peak_mib"], 4096.0, ""))
            if "atp" in data:
                d = data["atp"]
                rows.append(Row.at_most("circuits atp* / eap on SmolLM2, 8 IOI pairs: time ratio", d["ratio"], 3.0, ""))
            if "eap-long" in data:
                d = data["eap-long"]
                rows.append(Row.at_most("circuits eap at 2,048 tokens: peak MiB", d["peak_mib"], 8192.0, ""))
            return self.result(rows, cases=data)

        def render(self, r):
            lines = [md_row(["case", "seconds", "peak MiB", "tokens"]), "|---|---|---|---|"]
            for case, d in r.data["cases"].items():
                lines.append(md_row([case, f"{d['seconds']:.1f}", f"{d['peak_mib']:,.0f}", str(d["tokens"])]))
            return lines + [""]

except ImportError:  # run as a script: no benchmark harness on the path
    pass


if __name__ == "__main__":
    print(json.dumps(run_case(sys.argv[1] if len(sys.argv) > 1 else "eap", *map(int, sys.argv[2:4]))))
