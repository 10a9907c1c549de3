"""Indirect-object identification on a small decoder: which heads carry the answer.

    python examples/ioi_patching.py [MODEL_FOLDER] [--out results.json]

Wang et al. 2022's task: "When Mary and John went to the store, John gave a drink to" → " Mary". The
corrupted prompt names the other person as the giver ("…, Mary gave a drink to"), so the answer flips; the
metric is logit(indirect object) − logit(subject) at the last position, for both prompts. Eight prompt pairs
(names, places and objects varied, every one a single token so that all pairs have the same length and run as
one batch) are patched head by head — exact and attribution patching, both directions — and split by direct
logit attribution; the script prints the tables ``docs/patching.md`` quotes and writes them as JSON.

Default model: the SmolLM2-135M-Instruct safetensors folder (30 layers × 9 query heads, 3 key/value heads).
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import time
from pathlib import Path

import torch

DEFAULT = "/tmp/hwcache/gguf/b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
TEMPLATE = "When {io} and {s} went to the {place}, {giver} gave a {obj} to"
# (indirect object, subject, place, object): every name, place and object is one token with its space
PAIRS = [
    ("Mary", "John", "store", "drink"),
    ("Anna", "Tom", "park", "ball"),
    ("Sarah", "David", "school", "book"),
    ("Lisa", "Mark", "beach", "hat"),
    ("Emma", "James", "market", "flower"),
    ("Laura", "Paul", "library", "pen"),
    ("Kate", "Peter", "station", "ticket"),
    ("Alice", "Bob", "restaurant", "gift"),
]


def cpu_name() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    return platform.processor() or "unknown CPU"


def one_token(tok, text: str) -> int:
    ids = tok.encode(text, add_special_tokens=False).ids
    if len(ids) != 1:
        raise SystemExit(f"{text!r} encodes to {len(ids)} tokens {ids}; pick another word")
    return ids[0]


def build(tok):
    clean, corrupted, answer, wrong = [], [], [], []
    for io, s, place, obj in PAIRS:
        c = tok.encode(TEMPLATE.format(io=io, s=s, place=place, obj=obj, giver=s), add_special_tokens=False).ids
        x = tok.encode(TEMPLATE.format(io=io, s=s, place=place, obj=obj, giver=io), add_special_tokens=False).ids
        clean.append(c)
        corrupted.append(x)
        answer.append(one_token(tok, " " + io))
        wrong.append(one_token(tok, " " + s))
    lengths = {len(c) for c in clean} | {len(x) for x in corrupted}
    if len(lengths) != 1:
        raise SystemExit(f"the prompts have lengths {sorted(lengths)}; every pair must have the same length")
    return torch.tensor(clean), torch.tensor(corrupted), answer, wrong


def top(values: torch.Tensor, k: int, *, by_abs: bool = False):
    flat = values.flatten()
    key = flat.abs() if by_abs else flat
    order = torch.argsort(torch.nan_to_num(key, nan=-float("inf")), descending=True)[:k]
    H = values.shape[1]
    return [(int(i) // H, int(i) % H, float(flat[i])) for i in order]


def pearson(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.flatten().double(), b.flatten().double()
    keep = ~(a.isnan() | b.isnan())
    a, b = a[keep] - a[keep].mean(), b[keep] - b[keep].mean()
    return float((a * b).sum() / (a.norm() * b.norm()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default=DEFAULT)
    parser.add_argument("--out", default=None, help="write the measured numbers as JSON here")
    parser.add_argument("--batch-size", type=int, default=27)
    args = parser.parse_args()

    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    import headwise.hf  # noqa: F401  (registers attn_implementation="headwise")
    from headwise.patching import (
        attribution_patch,
        direct_logit_attribution,
        logit_difference,
        patch_heads,
        patch_positions,
        patch_set,
    )

    torch.set_grad_enabled(False)
    folder = Path(args.model)
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="headwise", dtype=torch.float32).eval()
    load_s = time.perf_counter() - t0
    clean, corrupted, answer, wrong = build(tok)
    metric = logit_difference(answer, wrong)
    P, L = clean.shape
    report: dict = {"cpu": cpu_name(), "threads": torch.get_num_threads(), "pairs": P, "tokens": L}
    report["load_seconds"] = load_s
    print(f"CPU: {report['cpu']} ({report['threads']} threads); {P} pairs × {L} tokens; loaded in {load_s:.1f} s")

    exact = patch_heads(model, clean, corrupted, metric, batch_size=args.batch_size)
    print(f"metric clean per pair: {[round(v, 2) for v in exact.metric_clean.tolist()]}")
    print(f"metric corrupted per pair: {[round(v, 2) for v in exact.metric_corrupted.tolist()]}")
    mc, mx = float(exact.metric_clean.mean()), float(exact.metric_corrupted.mean())
    print(f"mean clean {mc:.2f}, corrupted {mx:.2f}")
    print(
        f"exact sweep (denoise): {exact.passes} passes, {exact.rows} sequences, {exact.seconds:.1f} s "
        f"(one forward of the {P} pairs: {exact.forward_seconds * 1000:.0f} ms)"
    )
    norm = exact.normalised
    report.update(
        metric_clean=exact.metric_clean.tolist(),
        metric_corrupted=exact.metric_corrupted.tolist(),
        denoise={"normalised": norm.tolist(), "passes": exact.passes, "seconds": exact.seconds},
        forward_seconds=exact.forward_seconds,
    )
    print("top heads, denoising (corrupted run, clean head), normalised effect:")
    for layer, head, v in top(norm, 10, by_abs=True):
        print(f"  L{layer}H{head}: {v:+.3f}")

    noise = patch_heads(model, clean, corrupted, metric, direction="noise", batch_size=args.batch_size)
    noise_norm = noise.normalised
    report["noise"] = {"normalised": noise_norm.tolist(), "seconds": noise.seconds}
    print("top heads, noising (clean run, corrupted head), normalised (1 = unchanged):")
    for layer, head, v in top(1 - noise_norm, 10, by_abs=True):
        print(f"  L{layer}H{head}: {1 - v:+.3f}")

    attr = attribution_patch(model, clean, corrupted, metric)
    attr_norm = attr.normalised
    r = pearson(norm, attr_norm)
    k = 10
    exact_top = {(a, b) for a, b, _ in top(norm, k, by_abs=True)}
    attr_top = {(a, b) for a, b, _ in top(attr_norm, k, by_abs=True)}
    gap = (attr_norm - norm).abs()
    report["attribution"] = {
        "normalised": attr_norm.tolist(),
        "seconds": attr.seconds,
        "pearson": r,
        "top10_overlap": len(exact_top & attr_top),
        "worst": top(attr_norm - norm, 5, by_abs=True),
    }
    print(
        f"attribution patching: {attr.seconds:.2f} s; Pearson r with exact = {r:.3f}; "
        f"top-{k} overlap {len(exact_top & attr_top)}/{k}; mean |gap| {float(gap.nanmean()):.3f}"
    )
    print("largest disagreements (attribution − exact):")
    for layer, head, _ in top(attr_norm - norm, 5, by_abs=True):
        e, a = float(norm[layer, head]), float(attr_norm[layer, head])
        print(f"  L{layer}H{head}: exact {e:+.3f}, attribution {a:+.3f}")

    dla = direct_logit_attribution(model, clean, metric)
    heads_dla = dla.heads.mean(0).float()
    report["dla"] = {
        "heads": heads_dla.tolist(),
        "mlp": dla.mlp.mean(0).tolist(),
        "embed": float(dla.embed.mean()),
        "total": float(dla.total.mean()),
        "logit_difference": float(dla.logit_difference.mean()),
    }
    print(
        f"direct logit attribution (clean run): parts sum {float(dla.total.mean()):.4f}, "
        f"model {float(dla.logit_difference.mean()):.4f}; heads {float(heads_dla.nansum()):+.2f}, "
        f"MLPs {float(dla.mlp.mean(0).sum()):+.2f}, embeddings {float(dla.embed.mean()):+.2f}"
    )
    for layer, head, v in top(heads_dla, 8, by_abs=True):
        print(f"  L{layer}H{head}: {v:+.2f}")

    chosen = [(a, b) for a, b, _ in top(norm, 6, by_abs=True)]
    per_pos = patch_positions(model, clean, corrupted, metric, chosen).mean(0)  # (K, L)
    per_pos_norm = (per_pos - mx) / (mc - mx)
    names = [tok.id_to_token(int(i)) for i in clean[0]]
    report["positions"] = {"heads": chosen, "tokens": names, "normalised": per_pos_norm.tolist()}
    print("per position (pair 0's tokens), normalised:", " | ".join(names))
    for (layer, head), row in zip(chosen, per_pos_norm):
        print(f"  L{layer}H{head}: " + " ".join(f"{v:+.2f}" for v in row.tolist()))

    together = {}
    for k_ in (3, 6, 10, 20):
        heads = [(a, b) for a, b, _ in top(norm, k_)]
        value = float(patch_set(model, clean, corrupted, metric, heads).mean())
        together[k_] = (value - mx) / (mc - mx)
        print(f"top {k_} heads (by denoising effect) patched together: normalised {together[k_]:+.3f}")
    report["together"] = together

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    report["peak_rss_mib"] = peak
    print(f"peak resident memory: {peak:.0f} MiB")
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
