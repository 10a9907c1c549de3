"""The lab's training throughput (tokens/s) beside its model's FLOPs per token.

FLOPs per token of a training step: 3 × the forward's (the backward costs twice the forward), and the
forward's are 2 × the weights of every ``nn.Linear`` (one multiply and one add each: projections,
feed-forward, the unembedding) plus the attention products, 4·D per key per layer, over (L + 1) / 2 keys
on average under a causal mask — Kaplan et al. 2020's count (§2.1) with the unembedding included.
"""

from __future__ import annotations

import importlib.util

import torch
from machine import log
from row import Row
from timing import threads

from targets.base import Mode, Target, md_row

MISSING = "headwise.lab is not part of this checkout yet: nothing measured"


def flops_per_token(model: torch.nn.Module, d_model: int, num_layers: int, length: int) -> float:
    """Training FLOPs per token (see the module docstring)."""
    linear = sum(m.in_features * m.out_features for m in model.modules() if isinstance(m, torch.nn.Linear))
    attention = num_layers * 4 * d_model * (length + 1) / 2
    return 3 * (2 * linear + attention)


class Lab(Target):
    name = "lab"
    title = "the lab's training throughput"
    config = {"vocab_size": 256, "context_length": 128, "d_model": 256, "num_layers": 4, "num_heads": 8, "d_ff": 1024}
    batch_size = 32

    def measure(self, mode: Mode):
        if importlib.util.find_spec("headwise.lab") is None:
            return self.result([Row("lab training throughput (tokens/s)", None, note=MISSING)], missing=MISSING)
        from headwise.lab import LMConfig, TrainConfig, TransformerLM, train
        from headwise.lab.trainer import lm_batches

        cfg = LMConfig(**self.config)
        B, L = self.batch_size, cfg.context_length
        batch = lm_batches(lambda rng: torch.from_numpy(rng.integers(0, cfg.vocab_size, (B, L))))
        steps = 60 if mode.full else 15
        runs = {}
        for n in (torch.get_num_threads(), 1):
            torch.manual_seed(0)
            model = TransformerLM(cfg)
            train(model, batch, TrainConfig(steps=3, warmup=1), num_threads=n)  # warm-up, not timed
            with threads(n):
                result = train(model, batch, TrainConfig(steps=steps, warmup=1), num_threads=n)
            runs[n] = result.tokens / result.seconds
            log(f"lab: {n} threads, {runs[n]:.0f} tokens/s")
        per_token = flops_per_token(model, cfg.d_model, cfg.num_layers, L)
        n2 = max(runs)
        rows = [
            Row(
                f"lab training throughput (tokens/s), {cfg.num_layers} layers, D={cfg.d_model}, L={L}, B={B}",
                runs[n2],
                note=f"{per_token / 1e6:.1f} MFLOP per token → {runs[n2] * per_token / 1e9:.1f} GFLOP/s; "
                f"{runs[1]:.0f} tokens/s with 1 thread",
            )
        ]
        return self.result(
            rows,
            config=self.config,
            batch_size=B,
            steps=steps,
            params=sum(p.numel() for p in model.parameters()),
            flops_per_token=per_token,
            tokens_per_s={str(n): v for n, v in runs.items()},
        )

    def render(self, r):
        d = r.data
        if "missing" in d:
            return [d["missing"] + ".", ""]
        lines = [
            f"`TransformerLM({', '.join(f'{k}={v}' for k, v in d['config'].items())})`, {d['params']:,} parameters, "
            f"AdamW through `headwise.lab.train`, batch {d['batch_size']}, {d['steps']} timed steps after 3 untimed; "
            f"{d['flops_per_token'] / 1e6:.2f} MFLOP per token (see `benchmarks/targets/lab.py`).",
            "",
            "| threads | tokens/s | GFLOP/s |",
            "|---|---|---|",
        ]
        for n, v in d["tokens_per_s"].items():
            lines.append(md_row([n, f"{v:,.0f}", f"{v * d['flops_per_token'] / 1e9:.1f}"]))
        return lines + [""]
