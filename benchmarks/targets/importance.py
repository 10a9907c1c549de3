"""``headwise heads --importance`` — the default route (every head estimated, the top k measured exactly, the pruning
curve at a small grid) against its goals, and in full mode beside ``--exact`` (every head measured, the full curves);
the plain statistics at 1,024 tokens beside the sdpa forward.

Each case is a fresh process of this checkout, timed from interpreter start to every file written, the load average
recorded before and after (a shared machine's time is not a verdict). Cases:

- ``smollm2``: ``headwise heads --model smollm2 --corpus sample --importance`` (the default sample: 64 lines). Goal
  ≤ 180 s. Full mode adds the same with ``--exact`` (about 15 minutes) and its FLOP floor.
- ``minilm``: ``headwise heads --corpus sample --importance`` (the bundled all-MiniLM-L6-v2, 64 sentences). Goal
  ≤ 120 s. Full mode adds ``--exact``.
- ``smollm2_1024`` (full only): ``--importance --exact`` on one 1,024-token line, against the forward passes it needs
  (the sweep's forward-equivalents, read from heads.json, plus the gates' forward and backward counted as 3) at the
  sdpa forward's time on those tokens. Goal ≤ 1.2 ×.
- ``stats_1024``: ``headwise heads --model smollm2 TEXT`` on 1,024 tokens ÷ the sdpa forward of those tokens
  (``benchmarks/heads_long.py``). Goal ≤ 4.
- ``floor`` (full only): the machine's floor of ``--exact`` on SmolLM2 — (the sweep's forward-equivalents + 3 for the
  gates' forward and backward) × the tokens run × 2 × the model's parameters per token, at the best float32 GEMM rate
  measured in the same run on the same threads (:func:`gemm_rate`); MiniLM's the same with the forward-mode
  importance's :data:`MINILM_IMPORTANCE_FORWARDS`.
- ``sweep_1024``: in one fresh process (2 threads), the exact importance run alone on one 1,024-token line, beside
  the model's own sdpa forward measured in the same process; goal: time ≤ 1.2 × (forward-equivalents + 3) × the sdpa
  forward.
- ``long`` (only with ``HEADWISE_BENCH_LONG=8192``, not run by default): in a fresh process at that many tokens,
  the gates' pass (blocks recomputed) and two sweep passes — the peak resident memory (goal ≤ 8 GB) and seconds a
  pass; the whole run's time is stated as an extrapolation (passes × seconds a pass), labelled so.

Run one case by hand (JSON on stdout): ``PYTHONPATH=benchmarks python benchmarks/targets/importance.py sweep 1024``
or ``… long 8192``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from machine import ROOT, cpu_model, log
from row import Row

from targets.base import Mode, Target, md_row


def timed(src: str, argv: list[str], out: Path) -> dict:
    """``headwise ARGV --out OUT`` with ``PYTHONPATH=src``: wall seconds, the load average before and after, and
    heads.json's importance summary (its sweep, route and agreement)."""
    env = {**os.environ, "PYTHONPATH": src, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    load = os.getloadavg()[0]
    start = time.perf_counter()
    p = subprocess.run(
        [sys.executable, "-m", "headwise", *argv, "--out", str(out)], env=env, cwd=ROOT, capture_output=True, text=True
    )
    wall = time.perf_counter() - start
    loads = [load, os.getloadavg()[0]]
    if p.returncode != 0:
        return {"error": (p.stderr.strip().splitlines() or ["failed"])[-1], "seconds": None, "load": loads}
    summary = json.loads((out / "heads.json").read_text()).get("importance", {})
    return {
        "seconds": wall,
        "load": loads,
        "route": summary.get("route"),
        "sweep": summary.get("sweep", {}),
        "agreement": summary.get("agreement"),
        "base_loss": summary.get("base_loss"),
    }


def one_line(L: int, tmp: Path) -> Path:
    """A one-line corpus of exactly L SmolLM2 tokens (``benchmarks/heads_long.py``'s text)."""
    import heads_long

    from headwise.models import open_model

    text, _ = heads_long.tokens(open_model("smollm2"), L)
    path = tmp / f"line{L}.txt"
    path.write_text(text.replace("\n", " ") + "\n")
    return path


def gemm_rate(threads: int = 2, n: int = 2048, rounds: int = 5) -> float:
    """The best float32 matrix-product rate (FLOP/s) of ``rounds`` ``n × n`` products on ``threads`` threads."""
    import torch

    torch.set_num_threads(threads)
    a, b = torch.randn(n, n), torch.randn(n, n)
    best = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best


#: all-MiniLM-L6-v2's FLOPs per token of one forward, its embedding lookup aside: 2 × 6 layers × (4 · 384² attention
#: projections + 2 · 384 · 1,536 feed-forward) ≈ 2 × 10.6 M (attention's own products at ~30-token sentences: < 1 %).
MINILM_FLOP_PER_TOKEN = 2 * 6 * (4 * 384**2 + 2 * 384 * 1536)

#: The forward-mode importance's forward-equivalents for MiniLM: H tangents from each layer up (12 · Σ (6 − l) / 6)
#: plus the primal.
MINILM_IMPORTANCE_FORWARDS = 12 * 7 / 2 + 1


def floor_seconds(sweep: dict, flop_per_token: float, rate: float) -> float:
    """Seconds the run's unavoidable FLOPs take at ``rate``: (forward-equivalents + 3 for the gates' forward and
    backward) × the tokens one forward runs × ``flop_per_token``."""
    return (sweep.get("forward_equivalents", 0) + 3) * sweep.get("tokens", 0) * flop_per_token / rate


SWEEP = """
import json, resource, sys, time, torch
torch.set_num_threads(2)
sys.path.insert(0, sys.argv[3])
import heads_long
from transformers import AutoModelForCausalLM
from headwise.analysis import head_importance
from headwise.analysis import importance as I
from headwise.models import open_model
L, what = int(sys.argv[1]), sys.argv[2]
hm = open_model("smollm2")
flop = 2 * sum(p.numel() for p in hm.model.parameters())
_, ids = heads_long.tokens(hm, L)
ids = torch.tensor([ids])
batches = [(ids, torch.ones_like(ids))]
peak = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
out = {"L": L, "flop_per_token": flop}
if what == "sweep":
    sdpa = AutoModelForCausalLM.from_pretrained(hm.model.config._name_or_path, attn_implementation="sdpa").eval()
    with torch.no_grad():
        sdpa(ids)
        t = time.perf_counter()
        sdpa(ids)
        out["sdpa_forward_s"] = time.perf_counter() - t
    del sdpa
    t = time.perf_counter()
    r = head_importance(hm, batches, seed=0)
    out["importance_s"] = time.perf_counter() - t
    out["sweep"] = r.sweep
else:
    t = time.perf_counter()
    from headwise.analysis.gates import decoder_importance

    decoder_importance(hm, batches, "next_token", lambda *a: None)
    out["gates_s"] = time.perf_counter() - t
    out["gates_peak_mib"] = peak()
    from headwise.analysis.batched import SweepCost

    cost = SweepCost()
    t = time.perf_counter()
    I.ablation_objectives(hm, batches, [{0: [0]}, {0: [1]}], copies=1, cost=cost)
    out["sweep_passes"] = cost.passes + cost.kept_passes
    out["pass_s"] = (time.perf_counter() - t) / out["sweep_passes"]
out["peak_mib"] = peak()
print(json.dumps(out))
"""


def in_process(what: str, L: int) -> dict:
    """The ``SWEEP`` script (``what``: ``"sweep"`` or ``"long"``) at L tokens in a fresh process on this checkout."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    p = subprocess.run(
        [sys.executable, "-c", SWEEP, str(L), what, str(ROOT / "benchmarks")],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if p.returncode != 0:
        return {"error": (p.stderr.strip().splitlines() or ["failed"])[-1]}
    return json.loads(p.stdout.strip().splitlines()[-1])


def long_case(L: int) -> dict:
    """Peak memory and seconds a pass at L tokens, and the whole run's time extrapolated: the gates' pass, then
    (forward-equivalents of a one-line sweep, about 295 for SmolLM2's 426 head sets, + 1 kept forward) × a full
    pass's seconds."""
    d = in_process("long", L)
    if "error" not in d:
        d["extrapolated_total_s"] = d["gates_s"] + (295 + 1) * d["pass_s"]
        d["extrapolation"] = "gates_s + (295 + 1 forward-equivalents) × pass_s — an extrapolation, not a run"
    return d


class Importance(Target):
    name = "importance"
    title = (
        "`headwise heads --importance`: the estimate route against its goals, beside `--exact`; the statistics at "
        "1,024 tokens"
    )

    def measure(self, mode: Mode):
        import heads_long

        data: dict = {}
        rows = []
        src = str(ROOT / "src")
        goals = {"smollm2": 180.0, "minilm": 120.0}
        with tempfile.TemporaryDirectory() as tmp_name:
            tmp = Path(tmp_name)
            cases = {
                "smollm2": ["heads", "--model", "smollm2", "--corpus", "sample", "--importance"],
                "minilm": ["heads", "--corpus", "sample", "--importance"],
            }
            if mode.full:
                cases["smollm2_1024"] = ["heads", "--model", "smollm2", "--corpus", str(one_line(1024, tmp)),
                                         "--importance", "--exact"]  # fmt: skip
            for case, argv in cases.items():
                got = {"new": timed(src, argv, tmp / f"{case}_new")}
                log(f"importance {case} new: {got['new']}")
                if mode.full and case in goals:
                    got["exact"] = timed(src, [*argv, "--exact"], tmp / f"{case}_exact")
                    log(f"importance {case} exact: {got['exact']}")
                data[case] = got
            data["stats_1024"] = heads_long.measure(1024)
            log(f"importance stats_1024: {data['stats_1024']}")
            data["gemm_flops"] = gemm_rate()
            data["sweep_1024"] = in_process("sweep", 1024)
            log(f"importance sweep_1024: {data['sweep_1024']}")
            if os.environ.get("HEADWISE_BENCH_LONG"):
                data["long"] = long_case(int(os.environ["HEADWISE_BENCH_LONG"]))
                log(f"importance long: {data['long']}")
        rate = data["gemm_flops"]
        flop = data["sweep_1024"].get("flop_per_token") or 2 * 134.5e6
        for case, label in (("smollm2", "SmolLM2"), ("minilm", "MiniLM")):
            d = data[case]["new"]
            sw, agree = d.get("sweep") or {}, d.get("agreement") or {}
            rho = agree.get("spearman")
            note = (
                f"load {d['load'][0]:.1f} → {d['load'][1]:.1f}; estimate {sw.get('estimate_seconds', 0):.0f} s, "
                f"exact heads and pruning {sw.get('seconds', 0):.0f} s ({sw.get('forward_equivalents', 0):.0f} "
                f"forward-equivalents); Spearman over the measured heads {'–' if rho is None else f'{rho:.2f}'}"
            )
            rows.append(
                Row.at_most(f"heads --importance, {label}, default sample: seconds", d["seconds"], goals[case], note)
            )
        exact = data["smollm2"].get("exact", {})
        if exact.get("seconds") and exact.get("sweep"):
            floor = floor_seconds(exact["sweep"], flop, rate)
            rows.append(
                Row(
                    "heads --importance --exact, SmolLM2: time ÷ the FLOP floor (forward-equivalents + 3) × tokens × "
                    "2 × params ÷ best GEMM rate",
                    exact["seconds"] / floor,
                    None,
                    None,
                    f"{exact['seconds']:.0f} s; floor {floor:.0f} s at {rate / 1e9:.0f} GFLOP/s (2 threads, "
                    f"{cpu_model()})",
                )
            )
        mini = data["minilm"].get("exact", {})
        if mini.get("seconds") and mini.get("sweep"):
            sweep = mini["sweep"]
            floor = (
                (sweep.get("forward_equivalents", 0) + MINILM_IMPORTANCE_FORWARDS)
                * sweep.get("tokens", 0)
                * MINILM_FLOP_PER_TOKEN
                / rate
            )
            rows.append(
                Row(
                    "heads --importance --exact, MiniLM: time ÷ the FLOP floor (sweep forward-equivalents + 43) × "
                    "tokens × 2 × 10.6 M ÷ best GEMM rate",
                    mini["seconds"] / floor,
                    None,
                    None,
                    f"{mini['seconds']:.0f} s; floor {floor:.0f} s at {rate / 1e9:.0f} GFLOP/s (2 threads, "
                    f"{cpu_model()})",
                )
            )
        s1 = data["sweep_1024"]
        if s1.get("importance_s") and s1.get("sdpa_forward_s"):
            needed = (s1["sweep"]["forward_equivalents"] + 3) * s1["sdpa_forward_s"]
            rows.append(
                Row.at_most(
                    "importance alone, SmolLM2, one 1,024-token line: time ÷ (forward-equivalents + 3) × sdpa forward",
                    s1["importance_s"] / needed,
                    1.2,
                    f"{s1['importance_s']:.0f} s; {s1['sweep']['forward_equivalents'] + 3:.0f} forwards × "
                    f"{s1['sdpa_forward_s']:.2f} s, same process, 2 threads, {cpu_model()}",
                )
            )
        if "long" in data and "peak_mib" in data["long"]:
            d = data["long"]
            rows.append(
                Row.at_most(
                    f"importance at {d['L']} tokens: peak resident memory of the gates' pass and two sweep passes, GB",
                    d["peak_mib"] / 1024,
                    8.0,
                    f"{d['pass_s']:.0f} s a pass; whole run extrapolated {d['extrapolated_total_s'] / 60:.0f} min",
                )
            )
        if "smollm2_1024" in data:
            d = data["smollm2_1024"]["new"]
            sdpa = data["stats_1024"]["sdpa_forward_s"]
            passes = ((d.get("sweep") or {}).get("forward_equivalents") or 0) + 3
            rows.append(
                Row.at_most(
                    "heads --importance --exact, SmolLM2, one 1,024-token line: time ÷ (forwards needed × sdpa "
                    "forward)",
                    d["seconds"] / (passes * sdpa) if d.get("seconds") and sdpa else None,
                    1.2,
                    f"{d.get('seconds') or 0:.0f} s; {passes:.0f} forwards × {sdpa:.2f} s",
                )
            )
        s = data["stats_1024"]
        rows.append(
            Row.at_most(
                "heads --model smollm2, 1,024 tokens: time ÷ the sdpa forward's",
                s["heads_s"] / s["sdpa_forward_s"] if s.get("heads_s") and s.get("sdpa_forward_s") else None,
                4.0,
                f"{s.get('heads_s') or 0:.1f} s vs {s.get('sdpa_forward_s') or 0:.2f} s",
            )
        )
        return self.result(rows, cases=data)

    def render(self, r):
        lines = [
            "Each case a fresh process of this checkout, from interpreter start to files written; the default route "
            "(estimate, the top k exact, the small grid) and, in full mode, `--exact`, one after the other.",
            "",
            md_row(["case", "default route", "--exact", "load", "agreement (measured heads)", "sweep"]),
            "|---|---|---|---|---|---|",
        ]
        for case, d in r.data["cases"].items():
            if case in ("stats_1024", "gemm_flops", "sweep_1024", "long"):
                continue
            new, exact = d["new"], d.get("exact", {})
            sw, agree = new.get("sweep") or {}, new.get("agreement") or {}
            rho = agree.get("spearman")
            lines.append(
                md_row(
                    [
                        case,
                        f"{new['seconds']:.0f} s" if new.get("seconds") else new.get("error", "—"),
                        f"{exact['seconds']:.0f} s" if exact.get("seconds") else "—",
                        f"{new['load'][0]:.1f} → {new['load'][1]:.1f}" if new.get("load") else "—",
                        "—" if rho is None else f"Spearman {rho:.2f}, top-k {agree.get('top_k_overlap', 0):.0%}",
                        f"{sw.get('passes')} passes, {sw.get('forward_equivalents', 0):.0f} forward-equivalents"
                        if sw
                        else "—",
                    ]
                )
            )
        return lines + [""]


if __name__ == "__main__":
    print(
        json.dumps(in_process(sys.argv[1], int(sys.argv[2])) if sys.argv[1] == "sweep" else long_case(int(sys.argv[2])))
    )
