"""Decoding with a KV cache: one token at a prefix of 4096 against Hugging Face ``LlamaAttention`` +
``DynamicCache`` (same weights) and against the read-bandwidth roofline, a bf16 KV cache, and tokens/s
through a 12-layer stack with one and two threads.

Roofline: a decoded token must read the four weight matrices (4·D² values) and every cached key and
value (2·prefix·Hkv·Dh values) at least once; at the read bandwidth measured in the same rounds that takes
``bytes / bandwidth``. The fraction reported is that time over the measured one (1 = at the roofline).
"""

from __future__ import annotations

import statistics
import time

import torch
from machine import log
from row import Row
from timing import compare, threads

import headwise
from headwise.core import kernels, one_query
from targets.base import Mode, Target, contender_table, fmt
from targets.limits import bandwidth_per_round, fraction_of_roofline, read

HW, HW16, HF = "headwise", "headwise, bf16 cache", "HF LlamaAttention + DynamicCache"
HW_T, HW16_T = "headwise, torch's products (compiled kernels off)", "headwise, bf16 cache, torch's products"
ONE_Q_T = "kernel: attention_one_query, torch's products"
PROJ_NB = "projections alone: compiled rows"
STACK, STACK_SUMS = "12-layer stack, one token", "12-layer stack's bytes summed by torch"
KERNEL = "kernel: SDPA alone (1 query, cached K and V)"
ONE_Q = "kernel: one_query.attention_one_query alone"
ONE_Q16 = "kernel: one_query.attention_one_query alone, bf16 K and V"
GQA, MQA, WIN = "headwise, GQA (4 KV heads)", "headwise, MQA (1 KV head)", "headwise, sliding window 1024"
PROJ_MKL, PROJ_DNN = "projections alone: addmv (MKL)", "projections alone: oneDNN linear"
WINDOW = 1024


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


def variant(D: int, H: int, **kw) -> headwise.MultiHeadAttention:
    """A Llama-shaped headwise module (RoPE, no biases) with other key/value heads or a window."""
    torch.manual_seed(2)
    return headwise.MultiHeadAttention(D, H, bias=False, positional=headwise.RotaryEmbedding(D // H), **kw).eval()


def weight_bytes(m: headwise.MultiHeadAttention) -> int:
    return sum(p.numel() * p.element_size() for p in m.parameters())


def llama_pair(D: int, H: int, max_len: int):
    """Hugging Face ``LlamaAttention`` (sdpa), its rotary table and headwise's module with the same weights."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaAttention, LlamaRotaryEmbedding

    config = LlamaConfig(
        hidden_size=D,
        num_attention_heads=H,
        num_key_value_heads=H,
        head_dim=D // H,
        intermediate_size=4 * D,
        max_position_embeddings=max_len,
        attention_bias=False,
    )
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    hf = LlamaAttention(config, layer_idx=0).eval()
    return config, hf, LlamaRotaryEmbedding(config), headwise.interop.from_hf(hf).eval()


# How each piece of a decoded token was chosen: measured side by side on AMD EPYC (Zen 5, 2 cores, avx512_bf16,
# no AMX; a shared machine whose read bandwidth moved between 26 and 54 GB/s from one minute to the next), one
# layer, D 768, 12 heads, prefix 4,096, float32, 2 threads, in scratch scripts (alternating rounds, medians).
ROUTES = [
    "How each piece was chosen (AMD EPYC Zen 5, 2 threads, prefix 4,096; scratch scripts with alternating rounds on "
    "a shared machine; no Intel machine was available, so the Intel half is unmeasured):",
    "",
    "| piece | before | after | alternatives measured |",
    "|---|---|---|---|",
    "| the harness | `torch.utils.benchmark.Timer` ran every contender with one torch thread (its default), so the "
    "tables before this change are one-thread figures, read bandwidth 27 GB/s | each contender runs with the threads "
    "in force (2: read bandwidth 30–54 GB/s) | — |",
    "| one query's attention (25.2 MB of K and V) | two batched products per key/value head (GEMMs that pack the "
    "keys first): 0.65–0.80 ms alone with 2 threads | the compiled split-key kernel (Numba): each block's scores, "
    "maximum, `exp` and output part in one pass over its keys and values, 0.55–0.60 ms alone; from memory, "
    "inside the 12-layer stack, 0.88 × the time of torch summing the same K and V | blocks of 256 / 1,024 / 4,096 "
    "keys: 1 / 0.84 / 0.76 of the step time (one long run over a head's keys, then its values, reads faster than "
    "many short ones); the C library's `expf`: the kernel 1.5 × slower than with the vectorised polynomial; the head "
    "width as a constant of the compiled code: the score pass 2.4 × faster (MQA, in cache); software prefetch "
    "(non-temporal or not, 8–64 keys ahead): 0.96–1.05, not taken; K transposed: not tried again |",
    "| Q/K/V and output projections (9.4 MB) | oneDNN linear: 92 µs (Wq;Wk;Wv, weights in cache), 628 µs after the "
    "weights left the cache | compiled rows (each weight row read once per input row, rows split among the threads):"
    " 62 µs in cache, 277 µs from memory — torch summing the same weight took 323 µs; inside the compiled decode "
    "step, and on its own for weights of 16 MB or more (smaller ones stay with oneDNN, on torch's threads) | MKL "
    "`addmv` 133 µs in cache, 697 µs from memory |",
    "| everything else (Python, small ops) | ≈ 0.4–0.5 ms a step (RoPE, cache write, masks, views, three "
    "kernels' calls) | one compiled call per token for a `MultiHeadAttention` with a `KVCache` or a ring "
    "(`decode.step`): at a prefix of 16, 87 µs in the compiled call, ≈ 20 µs deciding it applies, ≈ 40 µs "
    "around it | keeping torch's route with the compiled kernels inside: 1.67 × the compiled step's time |",
    "| a sliding window of 1,024 over a ring | the ring copied into stream order every step (3.1–3.9 ms) | the "
    "ring read as it lies (one query's softmax needs no order), its empty and out-of-window slots masked: "
    "0.48–0.64 ms | — |",
    "| a bf16 cache's entries | read as bf16 by oneDNN's bf16 matmul | widened in registers by the compiled kernel "
    "(bf16 is float32's top half) | — |",
    "| threads of a kernel called on its own (a Hugging Face model's attention between torch's operations) | — | "
    "one thread below 16 MB of entries (`kernels.PARALLEL_BYTES`), torch's count above; the compiled decode step "
    "always torch's count | SmolLM2 `generate` at 1,024 and 4,096 tokens, quiet machine: one thread and two equal "
    "within noise; with one busy process beside it, two threads 1.24–1.38 × sdpa's time per token (Numba's and "
    "torch's thread pools spin on each other's cores), one thread 0.64–0.89 ×; Numba's `workqueue` layer: the "
    "kernel 3 × slower; `OMP_WAIT_POLICY=PASSIVE` for Numba's pool: 1.0–1.28 × |",
    "",
]


class Decode(Target):
    name = "decode"
    title = "decoding with a KV cache"
    D, H, prefix, layers = 768, 12, 4096, 12

    def measure(self, mode: Mode):
        from transformers import DynamicCache

        D, H, prefix = self.D, self.H, self.prefix
        config, hf, rope, hw = llama_pair(D, H, prefix + 64)
        x = torch.randn(1, prefix + 1, D)
        cos, sin = rope(x, torch.arange(prefix + 1)[None])
        caches = {
            HW: headwise.KVCache.for_module(hw, 1, prefix + 1),
            HW16: headwise.KVCache.for_module(hw, 1, prefix + 1, dtype=torch.bfloat16),
        }
        hf_cache = DynamicCache(config=config)
        others = {GQA: variant(D, H, num_kv_heads=4), MQA: variant(D, H, num_kv_heads=1)}
        others[WIN] = variant(D, H, sliding_window=WINDOW)
        with torch.inference_mode():
            for c in caches.values():
                hw(x[:, :prefix], is_causal=True, cache=c)
            hf(x[:, :prefix], position_embeddings=(cos[:, :prefix], sin[:, :prefix]), cache=hf_cache)

            def ours(cache):
                def decode():
                    cache.crop(prefix)  # forget the token the previous call appended
                    return hw(x[:, prefix:], is_causal=True, cache=cache)[0]

                return decode

            def without_kernels(fn):
                def call():
                    kernels.enabled = False
                    try:
                        return fn()
                    finally:
                        kernels.enabled = True

                return call

            def theirs():
                extra = hf_cache.get_seq_length() - prefix
                if extra:
                    hf_cache.crop(-extra)  # this version's DynamicCache.crop takes the tokens to remove
                return hf(x[:, prefix:], position_embeddings=(cos[:, prefix:], sin[:, prefix:]), cache=hf_cache)[0]

            kq = torch.randn(1, H, 1, D // H)
            kk, kv_ = caches[HW].k[:, :, :prefix], caches[HW].v[:, :, :prefix]  # (1, H, prefix, Dh)
            kk16, kv16 = caches[HW16].k[:, :, :prefix], caches[HW16].v[:, :, :prefix]
            for name, m in others.items():
                caches[name] = headwise.KVCache.for_module(m, 1, prefix + 1)
                m(x[:, :prefix], is_causal=True, cache=caches[name])

            def other(name):
                m, cache, length = others[name], caches[name], caches[name].length

                def decode():
                    if cache.length <= cache.capacity:  # a full cache rewinds; the ring decodes on past its window
                        cache.crop(length)
                    return m(x[:, prefix:], is_causal=True, cache=cache)[0]

                return decode

            xr, w_qkv, w_o = x[:, prefix:], torch.cat([hw.Wq.weight, hw.Wk.weight, hw.Wv.weight]), hw.Wo.weight
            dnn = torch.ops.mkldnn._linear_pointwise
            fns = {
                HW: ours(caches[HW]),
                HF: theirs,
                HW16: ours(caches[HW16]),
                HW_T: without_kernels(ours(caches[HW])),
                HW16_T: without_kernels(ours(caches[HW16])),
                **{name: other(name) for name in others},
                KERNEL: lambda: torch.nn.functional.scaled_dot_product_attention(kq, kk, kv_),
                ONE_Q: lambda: one_query.attention_one_query(kq, kk, kv_),
                ONE_Q16: lambda: one_query.attention_one_query(kq, kk16, kv16),
                ONE_Q_T: without_kernels(lambda: one_query.attention_one_query(kq, kk, kv_)),
                PROJ_NB: lambda: (kernels.linear_rows(xr, w_qkv), kernels.linear_rows(xr, w_o)),
                PROJ_MKL: lambda: (torch.mv(w_qkv, xr[0, 0]), torch.mv(w_o, xr[0, 0])),
                PROJ_DNN: lambda: (dnn(xr, w_qkv, None, "none", [], ""), dnn(xr, w_o, None, "none", [], "")),
                **read(),
            }
            out = {name: fns[name]().clone() for name in (HW, HF, HW16)}
            agree = float((out[HW] - out[HF]).abs().max())
            assert agree <= 1e-4, f"headwise and HF LlamaAttention disagree by {agree:.3g}"
            bf16_err = float((out[HW16] - out[HW]).abs().max() / out[HW].abs().max())
            log(f"decode prefix {prefix}: {list(fns)}")
            res = compare(fns, rounds=mode.rounds + 2, target_s=mode.target_s)
            # one torch thread: every parallel region of a small op on a shared machine can wait for the
            # second thread to be scheduled, which one thread never does
            with threads(1):
                res_1 = compare(fns, rounds=mode.rounds + 1, target_s=mode.target_s)
        weights = 4 * D * D * 4
        kv = 2 * prefix * D  # values of K and V per token: Hkv·Dh = D here
        nbytes = {HW: weights + kv * 4, HF: weights + kv * 4, HW16: weights + kv * 2, KERNEL: kv * 4}
        nbytes.update({HW_T: weights + kv * 4, HW16_T: weights + kv * 2, ONE_Q_T: kv * 4})
        nbytes.update({ONE_Q: kv * 4, ONE_Q16: kv * 2, PROJ_MKL: weights, PROJ_DNN: weights, PROJ_NB: weights})
        for name, m in others.items():  # the entries a token must read: Hkv heads, the last WINDOW keys
            keys = min(prefix + 1, m.sliding_window or prefix)
            nbytes[name] = weight_bytes(m) + 2 * keys * m.num_kv_heads * m.head_dim * 4
        roof = {n: fraction_of_roofline(res, n, nbytes[n]) for n in nbytes}
        roof_1 = {n: fraction_of_roofline(res_1, n, nbytes[n]) for n in nbytes}
        bw, bw_1 = statistics.median(bandwidth_per_round(res)), statistics.median(bandwidth_per_round(res_1))
        n_threads = torch.get_num_threads()

        n_prompt, n_new = (4096, 64) if mode.full else (512, 16)
        torch.manual_seed(1)
        stack = [headwise.MultiHeadAttention(D, H).eval() for _ in range(self.layers)]
        stack_caches = [headwise.KVCache.for_module(m, 1, n_prompt + n_new) for m in stack]
        with torch.inference_mode():
            h = step(stack, stack_caches, torch.randn(1, n_prompt, D))
            per_token = {}
            for n in (n_threads, 1):
                for c in stack_caches:
                    c.crop(n_prompt)
                with threads(n):
                    per_token[n] = generate(stack, stack_caches, h[:, -1:], n_new)

            # The whole stack's bytes (12 × 35 MB) far exceed the last-level cache, so every token reads them from
            # memory — the realistic case, where a single layer's step partly re-reads its bytes from the cache.
            # Side by side: one token through the stack (each cache rewound), the same bytes summed by torch,
            # and the read anchor.
            def stack_token():
                y = h[:, -1:]
                for m, c in zip(stack, stack_caches):
                    c.crop(n_prompt)
                    y = y + m(y, is_causal=True, cache=c)[0]
                return y

            def stack_sums():
                for m, c in zip(stack, stack_caches):
                    m.Wq.weight.sum(), m.Wk.weight.sum(), m.Wv.weight.sum(), m.Wo.weight.sum()
                    c.k[:, :, :n_prompt].sum(), c.v[:, :, :n_prompt].sum()

            res_stack = compare(
                {STACK: stack_token, STACK_SUMS: stack_sums, **read()}, rounds=mode.rounds, target_s=mode.target_s
            )
        stack_bytes = self.layers * (4 * D * D * 4 + 4 * D * 4 + 2 * n_prompt * D * 4)
        roof_stack = fraction_of_roofline(res_stack, STACK, stack_bytes)
        bw_stack = statistics.median(bandwidth_per_round(res_stack))
        tps = {n: 1 / statistics.median(s) for n, s in per_token.items()}
        us = {n: res.median_s[n] * 1e6 for n in nbytes}
        rows = [
            Row.at_least(
                "one decoded token at prefix 4096: fraction of the read-bandwidth roofline",
                roof[HW],
                0.7,
                f"{us[HW]:.0f} µs for {nbytes[HW] / 1e6:.1f} MB at {bw / 1e9:.1f} GB/s, {n_threads} threads",
            ),
            Row.at_most(f"one decoded token at prefix 4096: time vs {HF}", res.ratio(HW, HF), 0.4),
            *(
                Row.at_least(
                    f"{name}: fraction of its roofline",
                    roof[name],
                    0.7,
                    f"{us[name]:.0f} µs for {nbytes[name] / 1e6:.1f} MB",
                )
                for name in others
            ),
            Row(
                "the compiled decode step ÷ the same module on torch's products (compiled kernels off)",
                res.ratio(HW, HW_T),
                note=f"{us[HW]:.0f} µs vs {us[HW_T]:.0f} µs; bf16 cache {us[HW16]:.0f} µs vs {us[HW16_T]:.0f} µs",
            ),
            Row(
                "the attention alone: one_query.attention_one_query (compiled) ÷ SDPA (1 query, cached K and V)",
                res.ratio(ONE_Q, KERNEL),
                note=f"{us[ONE_Q]:.0f} µs vs {us[KERNEL]:.0f} µs (torch's products {us[ONE_Q_T]:.0f} µs); fractions "
                f"of their roofline {roof[ONE_Q]:.2f} and {roof[KERNEL]:.2f}; bf16 K and V {us[ONE_Q16]:.0f} µs "
                f"({roof[ONE_Q16]:.2f})",
            ),
            Row(
                "the projections alone (weights in cache): compiled rows ÷ oneDNN",
                res.ratio(PROJ_NB, PROJ_DNN),
                note=f"{us[PROJ_NB]:.0f} µs vs {us[PROJ_DNN]:.0f} µs (MKL addmv {us[PROJ_MKL]:.0f} µs) for the fused "
                "Q/K/V and the output",
            ),
            Row(
                "the same with one thread: fraction of the roofline",
                roof_1[HW],
                note=f"{res_1.median_s[HW] * 1e6:.0f} µs; read bandwidth {bw_1 / 1e9:.1f} GB/s with one thread; "
                f"vs HF {res_1.ratio(HW, HF):.2f}",
            ),
            Row(
                "bf16 KV cache: fraction of its roofline (half the K/V bytes)",
                roof[HW16],
                note=f"{us[HW16]:.0f} µs",
            ),
            Row.at_most(
                "bf16 KV cache: step time ÷ the float32 cache's",
                res.ratio(HW16, HW),
                0.6,
                f"its bytes ÷ the float32 cache's: {nbytes[HW16] / nbytes[HW]:.3f} (the weights stay float32); "
                f"bf16 products: {'yes' if one_query.bf16_products() else 'no (widened)'}",
            ),
            Row.at_most("bf16 KV cache: max|out − out(float32 cache)| ÷ max|out(float32 cache)|", bf16_err, 1e-2),
            Row(
                f"12-layer stack, prompt {n_prompt}: one token's fraction of the read-bandwidth roofline (from memory)",
                roof_stack,
                note=f"{res_stack.median_s[STACK] * 1e3:.1f} ms for {stack_bytes / 1e6:.0f} MB at {bw_stack / 1e9:.1f} "
                f"GB/s; torch summing the same bytes {res_stack.median_s[STACK_SUMS] * 1e3:.1f} ms "
                f"({res_stack.ratio(STACK, STACK_SUMS):.2f} × its time)",
            ),
            Row(
                f"tokens/s, 12-layer stack (D=768, H=12), prompt {n_prompt}, {n_threads} threads",
                tps[n_threads],
                note=f"{tps[1]:.0f} tokens/s with 1 thread; median of {n_new} tokens",
            ),
        ]
        return self.result(
            rows,
            config={"D": D, "H": H, "prefix": prefix, "B": 1, "threads": n_threads},
            max_abs_vs_hf=agree,
            bf16_cache_rel_err=bf16_err,
            bytes=nbytes,
            roofline=roof,
            roofline_1_thread=roof_1,
            read_gb_s=bw / 1e9,
            read_gb_s_1_thread=bw_1 / 1e9,
            timing=res.to_json(),
            timing_1_thread=res_1.to_json(),
            table=res.table([HF, HW], names=list(fns)),
            table_1_thread=res_1.table([HF, HW], names=list(fns)),
            stack={
                "layers": self.layers,
                "prompt": n_prompt,
                "new_tokens": n_new,
                "tokens_per_s": {str(n): v for n, v in tps.items()},
                "median_token_s": {str(n): statistics.median(s) for n, s in per_token.items()},
                "roofline": roof_stack,
                "read_gb_s": bw_stack / 1e9,
                "bytes": stack_bytes,
                "timing": res_stack.to_json(),
            },
        )

    def render(self, r):
        d, st = r.data, r.data["stack"]
        roof = ", ".join(f"{n} {fmt(v)}" for n, v in d["roofline"].items())
        roof_1 = ", ".join(f"{n} {fmt(v)}" for n, v in d["roofline_1_thread"].items())
        tps = ", ".join(
            f"**{v:.1f} tokens/s** with {n} thread{'s' if n != '1' else ''}" for n, v in st["tokens_per_s"].items()
        )
        return [
            f"One layer, D = {d['config']['D']}, H = {d['config']['H']}, RoPE, no biases (Llama-shaped), prefix "
            f"{d['config']['prefix']:,}, B = 1, float32; headwise built from the HF module by "
            f"`headwise.interop.from_hf` (outputs agree to {d['max_abs_vs_hf']:.1e}). Bytes a token must read: "
            + ", ".join(f"{n} {b / 1e6:.1f} MB" for n, b in d["bytes"].items())
            + ".",
            "",
            *contender_table(d["table"]),
            "",
            f"Read bandwidth in the same rounds {d['read_gb_s']:.1f} GB/s; fraction of the roofline: {roof}.",
            "",
            "With one torch thread:",
            "",
            *contender_table(d["table_1_thread"]),
            "",
            f"Read bandwidth with one thread {d['read_gb_s_1_thread']:.1f} GB/s; fraction of the roofline: {roof_1}.",
            "",
            f"bf16 KV cache: output differs from the float32 cache's by {fmt(d['bf16_cache_rel_err'])} of its "
            "largest value.",
            "",
            f"12-layer stack (residual headwise attention layers, D = 768, H = 12, float32, B = 1), prompt "
            f"{st['prompt']:,}, {st['new_tokens']} new tokens: {tps}."
            + (
                f" One token through the stack reads {st['bytes'] / 1e6:.0f} MB, far past the last-level cache: "
                f"{fmt(st['roofline'])} of the roofline at the {st['read_gb_s']:.1f} GB/s read in the same rounds."
                if "roofline" in st
                else ""
            ),
            "",
            *ROUTES,
        ]

    def notes(self, r, results):
        d = r.data
        if not any(row.passed is False for row in r.rows):
            return []
        return [
            f"- **decode.** One token reads {d['bytes'][HW] / 1e6:.1f} MB; at the {d['read_gb_s']:.1f} GB/s measured "
            f"in the same rounds that is the roofline, and headwise reaches {fmt(d['roofline'][HW])} of it "
            f"({fmt(d['roofline_1_thread'][HW])} with one thread, where the read bandwidth is "
            f"{d['read_gb_s_1_thread']:.1f} GB/s)."
            + (
                f" The attention kernel alone (SDPA over the cached K and V) reaches {fmt(d['roofline'][KERNEL])} "
                f"of its own roofline ({fmt(d['roofline_1_thread'][KERNEL])} with one thread)."
                if KERNEL in d["roofline"]
                else ""
            )
        ]
