"""headwise as a Hugging Face attention backend, timed side by side with transformers' ``sdpa`` and ``eager``.

One small random Llama-like model (default: 4 layers, width 256, 4 heads of 64, MLP 1024, float32, eval,
no grad), one forward pass over a batch of token ids (default: batch 4, L 512), in two batches: no padding
(the mask function returns no mask: the causal flag goes to the kernel) and left padding (a boolean
``(B, 1, L, S)`` mask). Contenders, each a copy of the same weights loaded with its implementation:

- without weights: ``sdpa``, ``eager``, ``headwise``;
- with every layer's per-head weights: ``eager`` with ``output_attentions=True``, ``headwise`` with
  ``output_attentions=True``, and ``headwise.hf.capture`` on the model loaded with ``sdpa``.

Then the attention call alone, as a layer makes it: ``q, k, v (B, H, L, Dh)`` and the mask the model's
mask function builds for that batch, through transformers' ``sdpa_attention_forward``, Llama's
``eager_attention_forward`` (its additive mask) and headwise's ``attention_forward`` (with and without weights).

Timing: every contender of one batch runs in the same process on the same inputs, alternating round after
round (the order rotating); a contender's time is the median of its per-round times (each the median of
``torch.utils.benchmark.Timer`` runs lasting about ``--target`` seconds), and a ratio is the median of the
per-round ratios. The logits of every contender are checked against eager first (≤ 1e-4 on real positions).

Run: ``PYTHONPATH=src python benchmarks/hf_backend.py`` (``--help`` for sizes; ``--out FILE.json`` to keep
the numbers). Self-contained: it needs only headwise, torch and transformers.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.utils.benchmark as tb

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

import headwise.hf  # noqa: E402  (registers "headwise")
from headwise._io import write_text_atomic  # noqa: E402

PLAIN = ("sdpa", "eager", "headwise")
WEIGHTS = ("eager + output_attentions", "headwise + output_attentions", "headwise.hf.capture")


def build_models(layers: int, width: int, heads: int, vocab: int, seed: int = 0) -> dict:
    """implementation -> the same random Llama-like model loaded with it (``sdpa``, ``eager``, ``headwise``)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        hidden_size=width,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        num_hidden_layers=layers,
        intermediate_size=4 * width,
        vocab_size=vocab,
        max_position_embeddings=8192,
    )
    models = {}
    for implementation in PLAIN:
        torch.manual_seed(seed)
        own = copy.deepcopy(config)  # one config each: a config carries the implementation
        models[implementation] = LlamaForCausalLM._from_config(own, attn_implementation=implementation).eval()
    assert [m.config._attn_implementation for m in models.values()] == list(PLAIN)
    return models


def make_batch(batch: int, length: int, vocab: int, padded: bool, seed: int = 1) -> dict:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (batch, length), generator=g)
    mask = torch.ones(batch, length, dtype=torch.long)
    if padded:  # left padding: item b has b * L / (2B) padding tokens
        for b in range(batch):
            mask[b, : b * length // (2 * batch)] = 0
    return {"input_ids": ids, "attention_mask": mask}


def contenders(models: dict, inputs: dict) -> dict:
    """name -> zero-argument callable returning the model output (with ``attentions`` for the weight ones)."""

    def captured():
        with headwise.hf.capture(models["sdpa"]) as attn:
            out = models["sdpa"](**inputs)
        out.attentions = tuple(attn.weights)
        return out

    return {
        "sdpa": lambda: models["sdpa"](**inputs),
        "eager": lambda: models["eager"](**inputs),
        "headwise": lambda: models["headwise"](**inputs),
        "eager + output_attentions": lambda: models["eager"](**inputs, output_attentions=True),
        "headwise + output_attentions": lambda: models["headwise"](**inputs, output_attentions=True),
        "headwise.hf.capture": captured,
    }


def attention_calls(models: dict, inputs: dict, heads: int, seed: int = 2) -> dict:
    """name -> zero-argument attention call of the first layer on random q, k, v, with this batch's masks."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import create_causal_mask
    from transformers.models.llama.modeling_llama import eager_attention_forward

    model = models["sdpa"]
    B, L = inputs["input_ids"].shape
    width = model.config.hidden_size
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, heads, L, width // heads, generator=g) for _ in range(3))  # (B, H, L, Dh)
    embeds = torch.zeros(B, L, width)
    mask = {}
    for name in PLAIN:  # the mask each implementation's mask function builds for this batch
        mask[name] = create_causal_mask(models[name].config, embeds, inputs["attention_mask"], None)
    layer = model.model.layers[0].self_attn
    scale = layer.scaling
    attention = headwise.hf.attention_forward
    return {
        "sdpa": lambda: sdpa_attention_forward(layer, q, k, v, mask["sdpa"], scaling=scale),
        "eager": lambda: eager_attention_forward(layer, q, k, v, mask["eager"], scaling=scale),
        "headwise": lambda: attention(layer, q, k, v, mask["headwise"], scaling=scale),
        "headwise + weights": lambda: attention(
            layer, q, k, v, mask["headwise"], scaling=scale, output_attentions=True
        ),
    }


def check(calls: dict, inputs: dict, tol: float = 1e-4) -> dict:
    """Largest |logits - eager's| on real positions, and |weights - eager's| on real query rows."""
    real = inputs["attention_mask"].bool()
    reference = calls["eager + output_attentions"]()
    found = {}
    for name, call in calls.items():
        out = call()
        diff = (out.logits - reference.logits)[real].abs().max().item()
        if diff > tol:
            raise AssertionError(f"{name}: logits differ from eager by {diff:.2e} > {tol}")
        found[name] = {"logits": diff}
        if name in WEIGHTS:
            rows = real[:, None, :, None]
            found[name]["weights"] = max(
                (a - b).masked_select(rows.expand_as(a)).abs().max().item()
                for a, b in zip(out.attentions, reference.attentions)
            )
    return found


def time_side_by_side(calls: dict, rounds: int, target_s: float) -> dict:
    names = list(calls)
    numbers = {}
    for name in names:  # warm up, then fix how many calls make about target_s
        calls[name]()
        t0 = time.perf_counter()
        calls[name]()
        numbers[name] = max(1, int(target_s / max(time.perf_counter() - t0, 1e-6)))
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            times[name].append(
                tb.Timer(stmt="fn()", globals={"fn": calls[name]}, num_threads=torch.get_num_threads())
                .timeit(numbers[name])
                .median
            )
    return times


def summarise(times: dict) -> dict:
    base = times["sdpa"]
    return {
        name: {
            "ms": 1e3 * statistics.median(t),
            "x_sdpa": statistics.median(a / b for a, b in zip(t, base)),
            "x_eager": statistics.median(a / b for a, b in zip(t, times["eager"])),
        }
        for name, t in times.items()
    }


def table(results: dict) -> str:
    lines = []
    for batch_name, rows in results["batches"].items():
        lines.append(f"\n{batch_name}")
        head = f"  {'contender':32s} {'ms':>9s} {'x sdpa':>8s} {'x eager':>8s}"
        lines.append(f"{head} {'max |Δ| (eager)':>14s} {'max |Δw|':>9s}")
        for name, row in rows["timing"].items():
            acc = rows["agreement"][name]
            w = f"{acc['weights']:.1e}" if "weights" in acc else "—"
            lines.append(
                f"  {name:32s} {row['ms']:9.2f} {row['x_sdpa']:8.2f} {row['x_eager']:8.2f} "
                f"{acc.get('logits', acc.get('out')):14.1e} {w:>9s}"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--target", type=float, default=0.5, help="seconds per contender per round")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    models = build_models(args.layers, args.width, args.heads, args.vocab)
    results = {
        "config": {k: v for k, v in vars(args).items() if k != "out"},
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "transformers": __import__("transformers").__version__,
        },
        "batches": {},
    }
    with torch.no_grad():
        for padded in (False, True):
            inputs = make_batch(args.batch, args.length, args.vocab, padded)
            calls = contenders(models, inputs)
            agreement = check(calls, inputs)
            timing = summarise(time_side_by_side(calls, args.rounds, args.target))
            name = "left padding" if padded else "no padding"
            results["batches"][name] = {"timing": timing, "agreement": agreement}
            alone = attention_calls(models, inputs, args.heads)
            real = inputs["attention_mask"].bool()[:, None, :, None]  # (B, 1, L, 1): real query rows
            reference = alone["eager"]()[0]
            agreement = {
                n: {"out": (call()[0] - reference).masked_select(real.transpose(1, 2)).abs().max().item()}
                for n, call in alone.items()
            }
            timing = summarise(time_side_by_side(alone, args.rounds, args.target))
            results["batches"][f"{name}, attention call alone"] = {"timing": timing, "agreement": agreement}
    print(json.dumps(results["config"]), json.dumps(results["machine"]))
    print(table(results))
    if args.out is not None:
        write_text_atomic(args.out, json.dumps(results, indent=1) + "\n")
    return results


if __name__ == "__main__":
    main()
