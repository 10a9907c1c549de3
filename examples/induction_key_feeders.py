"""Which earlier heads feed a decoder's induction heads' keys: exact path patching on repeated random tokens.

    python examples/induction_key_feeders.py [--model smollm2] [--pairs 8] [--length 20] [--out feeders.json]

An induction head at the second copy of a repeated sequence attends to the token after the current token's
first occurrence: its *key* at that position must say "the token before me was …", which an earlier
previous-token head writes there (Olsson et al. 2022). Here, on SmolLM2-135M by default:

1. Prompts: ``<bos> R R[:-1]`` with R ``--length`` random tokens (ids 1,000–20,000, seeded), answer R[-1]; the
   corrupted prompt ``<bos> R' R[:-1]`` has a different first copy, so nothing can be copied (wrong: R'[-1]).
   Metric: logit(R[-1]) − logit(R'[-1]) at the last position (:func:`headwise.patching.logit_difference`).
2. The induction heads: the mean attention, over the second copy, from each position to the one after its
   token's first occurrence (the induction score on these prompts), ≥ ``--threshold``.
3. For each key/value group holding an induction head, every earlier sender (the embeddings, each head and MLP
   of an earlier layer) is patched alone along one path — into that group's keys only
   (:func:`headwise.circuits.path_patch`, receiver ``"L{l}.KV{g}.k"``, ``direction="noise"``: the clean run
   with that sender's corrupted write added to the group's key input and nothing else). The effect is the
   metric's change, as a share of the clean − corrupted gap (−1: the whole answer gone). Each sender's
   previous-token score (mean attention from position i to i − 1 over both copies) stands beside it.
4. The same for the group's values, as a contrast: a key feeder that matters for the keys and not for the
   values is a feeder of *where* the head looks, not of what it copies.

GQA: SmolLM2 has 9 query heads in 3 key/value groups per layer; a group's keys are one input shared by its
three query heads, so "feeding the keys of L17H4" is feeding the keys of L17's group 1 (heads 3–5).
Prints the tables docs/circuits.md quotes and writes them as JSON.
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import torch


def prompts(hm, pairs: int, length: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    bos = [] if hm.bos_id is None else [int(hm.bos_id)]
    low, high = min(1000, hm.vocab_size // 4), min(20000, hm.vocab_size)  # ordinary tokens of a large vocabulary
    r = torch.randint(low, high, (pairs, length), generator=g)
    r2 = torch.randint(low, high, (pairs, length), generator=g)
    start = torch.tensor(bos * pairs, dtype=torch.long).reshape(pairs, len(bos))
    clean = torch.cat([start, r, r[:, :-1]], dim=1)
    corrupted = torch.cat([start, r2, r[:, :-1]], dim=1)
    return clean, corrupted, r[:, -1].tolist(), r2[:, -1].tolist(), start.shape[1]


def scores(hm, clean: torch.Tensor, length: int, offset: int):
    """(NL, H) induction scores on the second copy and previous-token scores over the whole prompt."""
    names = [f"layers.{layer}.attn.pattern" for layer in range(hm.num_layers)]
    cache = hm.run_with_cache(clean, names=names)
    pattern = torch.stack([cache[n].float() for n in names], 1)  # (P, NL, H, L, L)
    second = torch.arange(offset + length, clean.shape[1])  # positions of the second copy
    induction = pattern[:, :, :, second, second - length + 1].mean((0, 3))  # (NL, H)
    rows = torch.arange(offset + 1, clean.shape[1])
    previous = pattern[:, :, :, rows, rows - 1].mean((0, 3))
    return induction, previous


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--pairs", type=int, default=8)
    ap.add_argument("--length", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threshold", type=float, default=0.4)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--groups", default=None, help="key/value groups to study, e.g. L17.KV1,L18.KV2 (default: all)")
    ap.add_argument("--parts", default="k,v", help="the group's inputs patched: k, v or both")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    from headwise.circuits import build_graph, path_patch, wiring
    from headwise.models import open_model
    from headwise.patching import logit_difference

    t0 = time.perf_counter()
    hm = open_model(args.model)
    clean, corrupted, answer, wrong = prompts(hm, args.pairs, args.length, args.seed)[:4]
    offset = clean.shape[1] - 2 * args.length + 1
    metric = logit_difference(answer, wrong)
    w = wiring(hm)
    induction, previous = scores(hm, clean, args.length, offset)
    heads = [(la, h) for la in range(induction.shape[0]) for h in range(induction.shape[1])]
    found = sorted((float(induction[la, h]), la, h) for la, h in heads if induction[la, h] >= args.threshold)[::-1]
    print(f"{hm.title}: {args.pairs} prompts of {clean.shape[1]} tokens (seed {args.seed})")
    print("induction heads (score on these prompts): " + ", ".join(f"L{la}H{h} {s:.2f}" for s, la, h in found))
    graph = build_graph(w)
    group_of = {(la, h): graph.node(f"L{la}.H{h}").kv_group for la, h in heads if la < graph.num_layers}
    groups = sorted({(la, group_of[(la, h)]) for _, la, h in found})
    if args.groups:
        wanted = set(args.groups.split(","))
        groups = [(la, g) for la, g in groups if f"L{la}.KV{g}" in wanted]
    result = {
        "model": hm.name,
        "cpu": platform.processor() or platform.machine(),
        "prompts": {"pairs": args.pairs, "length": int(clean.shape[1]), "seed": args.seed},
        "induction_heads": [{"head": f"L{la}H{h}", "score": round(s, 4)} for s, la, h in found],
        "groups": [],
    }
    for layer, group in groups:
        senders = ["embed"] + [f"L{la}.H{h}" for la in range(layer) for h in range(hm.num_heads)]
        senders += [f"L{la}.MLP" for la in range(layer)]
        members = [f"L{la}H{h}" for _, la, h in found if (la, group_of[(la, h)]) == (layer, group)]
        entry = {"group": f"L{layer}.KV{group}", "heads": members}
        for part in args.parts.split(","):
            t = time.perf_counter()
            receiver = [f"L{layer}.KV{group}.{part}"]
            pp = path_patch(
                w, clean, corrupted, metric, senders, receiver, direction="noise", batch_size=args.batch_size
            )
            gap = float((pp.metric_clean - pp.metric_corrupted).mean())
            share = (pp.effect / gap).tolist()  # (J,) share of the gap the path removes (negative: needed)
            order = sorted(range(len(senders)), key=lambda j: share[j])
            rows = []
            for j in order[:8]:
                s = senders[j]
                prev = None
                if s.startswith("L") and ".H" in s:
                    la, h = (int(x) for x in s[1:].split(".H"))
                    prev = round(float(previous[la, h]), 3)
                rows.append({"sender": s, "share": round(share[j], 4), "previous_token_score": prev})
            all_heads = path_patch(w, clean, corrupted, metric, [senders], receiver, direction="noise")
            entry[part] = {
                "top": rows,
                "all_senders_together": round(float(all_heads.effect[0]) / gap, 4),
                "clean_metric": round(float(pp.metric_clean.mean()), 4),
                "corrupted_metric": round(float(pp.metric_corrupted.mean()), 4),
                "seconds": round(time.perf_counter() - t, 1),
            }
            print(
                f"\n{entry['group']} ({', '.join(entry['heads'])}) {part}: clean {entry[part]['clean_metric']:+.2f}, "
                f"corrupted {entry[part]['corrupted_metric']:+.2f}; every earlier sender together "
                f"{entry[part]['all_senders_together']:+.3f} of the gap ({entry[part]['seconds']} s)"
            )
            for r in rows:
                prev = "" if r["previous_token_score"] is None else f" (previous-token {r['previous_token_score']:.2f})"
                print(f"  {r['sender']:>8} {r['share']:+.3f}{prev}")
        result["groups"].append(entry)
    result["seconds"] = round(time.perf_counter() - t0, 1)
    print(f"\n{result['seconds']} s")
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            json.dump(result, fh, indent=1)


if __name__ == "__main__":
    main()
