"""Decoding with a KV cache: one token at a long prefix, and tokens/s through a 12-layer stack."""

from __future__ import annotations

import statistics
import time

import torch
from machine import log
from row import Row
from timing import compare, threads

import headwise
from targets.base import Mode, Target, contender_table

RECOMPUTE, DECODE = "recompute (causal forward of 4097)", "decode 1 token"


def step(stack, caches, y: torch.Tensor) -> torch.Tensor:
    """One pass of ``y (B, n, D)`` through a stack of residual attention layers, each appending to its cache."""
    for m, cache in zip(stack, caches):
        y = y + m(y, is_causal=True, cache=cache)[0]
    return y


def generate(stack, caches, token: torch.Tensor, n_new: int) -> list[float]:
    """Decode ``n_new`` tokens one at a time from ``token (B, 1, D)``; seconds each token took."""
    seconds = []
    for _ in range(n_new):
        t0 = time.perf_counter()
        token = step(stack, caches, token)
        seconds.append(time.perf_counter() - t0)
    return seconds


class Decode(Target):
    name = "decode"
    title = "decoding with KVCache"
    D, H, prefix, layers = 768, 12, 4096, 12

    def measure(self, mode: Mode):
        D, H, prefix = self.D, self.H, self.prefix
        torch.manual_seed(0)
        m = headwise.MultiHeadAttention(D, H).eval()
        x = torch.randn(1, prefix + 1, D)
        cache = headwise.KVCache.for_module(m, 1, prefix + 1)
        with torch.inference_mode():
            m(x[:, :prefix], is_causal=True, cache=cache)
            full, _ = m(x, is_causal=True)

            def decode():
                cache.crop(prefix)  # forget the token the previous call appended
                return m(x[:, prefix:], is_causal=True, cache=cache)[0]

            err = float((decode() - full[:, prefix:]).abs().max())
            fns = {RECOMPUTE: lambda: m(x, is_causal=True)[0], DECODE: decode}
            log(f"decode prefix {prefix}: {list(fns)}")
            res = compare(fns, rounds=mode.rounds, target_s=mode.target_s)
            # the same pair with one torch thread: on a shared machine every parallel region of a small op
            # can wait for the second thread to be scheduled, which one thread never does
            with threads(1):
                res_1 = compare(fns, rounds=max(2, mode.rounds // 2), target_s=mode.target_s)
        r, r_1 = res.ratio(DECODE, RECOMPUTE), res_1.ratio(DECODE, RECOMPUTE)

        n_prompt, n_new = (4096, 64) if mode.full else (512, 8)
        torch.manual_seed(1)
        stack = [headwise.MultiHeadAttention(D, H).eval() for _ in range(self.layers)]
        caches = [headwise.KVCache.for_module(mm, 1, n_prompt + n_new) for mm in stack]
        with torch.inference_mode():
            t0 = time.perf_counter()
            h = step(stack, caches, torch.randn(1, n_prompt, D))
            t_prefill = time.perf_counter() - t0
            per_token = generate(stack, caches, h[:, -1:], n_new)
            for c in caches:
                c.crop(n_prompt)
            with threads(1):
                per_token_1 = generate(stack, caches, h[:, -1:], n_new)
        n_threads = torch.get_num_threads()
        tps, tps_1 = 1 / statistics.median(per_token), 1 / statistics.median(per_token_1)
        rows = [
            Row.at_most(
                "one decoded token ÷ full causal recompute at prefix 4096",
                r,
                1 / 200,
                f"1/{1 / r:.0f}, {n_threads} threads",
                shown="≤ 1/200 = 0.005",
            ),
            Row.at_most(
                "the same with one torch thread for both", r_1, 1 / 200, f"1/{1 / r_1:.0f}", shown="≤ 1/200 = 0.005"
            ),
            Row(
                f"tokens/s, 12-layer stack (D=768, H=12), prompt {n_prompt}, {n_new} new tokens",
                tps,
                note=f"{n_threads} threads, median of {n_new} tokens; {tps_1:.0f} tokens/s with 1 thread",
            ),
        ]
        return self.result(
            rows,
            config={"D": D, "H": H, "prefix": prefix, "B": 1},
            max_abs_diff_decode_vs_full=err,
            timing=res.to_json(),
            timing_1_thread=res_1.to_json(),
            table=res.table([RECOMPUTE]),
            table_1_thread=res_1.table([RECOMPUTE]),
            stack={
                "layers": self.layers,
                "prompt": n_prompt,
                "new_tokens": n_new,
                "prefill_s": t_prefill,
                "median_token_s": statistics.median(per_token),
                "tokens_per_s": tps,
                "threads": n_threads,
                "tokens_per_s_1_thread": tps_1,
            },
        )

    def render(self, r):
        st = r.data["stack"]
        lines = contender_table(r.data["table"]) + [""]
        lines += ["With one torch thread for both:", ""] + contender_table(r.data["table_1_thread"]) + [""]
        return lines + [
            f"Decoded output equals the full causal forward to {r.data['max_abs_diff_decode_vs_full']:.1e}. "
            f"12-layer stack (residual headwise attention layers, D = 768, H = 12, float32, B = 1): prompt "
            f"{st['prompt']:,} tokens prefilled in {st['prefill_s']:.2f} s, then {st['new_tokens']} tokens at "
            f"a median {st['median_token_s'] * 1e3:.1f} ms each = **{st['tokens_per_s']:.0f} tokens/s**.",
            "",
        ]

    def notes(self, r, results):
        st = r.data["stack"]
        return [
            f"- **decode tokens/s.** With {st['threads']} threads {st['tokens_per_s']:.0f} tokens/s, with 1 thread "
            f"{st['tokens_per_s_1_thread']:.0f}: a decode step is ~50 small ops, and on this shared machine each "
            "parallel region can wait for the second thread to be scheduled; one thread never waits."
        ]
