"""The first article's closing teaser for its Part 5, recomputed with :class:`headwise.core.layers.EncoderLayer`.

The article ends: "look at the actual print(model) output of an 8,544-parameter encoder layer". Its
Part 5 is not in the sources, so the sizes are inferred: residual connections, two LayerNorms and a
position-wise feed-forward network at ``d_model = 32, d_ff = 64`` give exactly 8,544 (attention
4·32² + 4·32 = 4,224; feed-forward 2·32·64 + 64 + 32 = 4,192; LayerNorms 2·2·32 = 128), for any
head count that divides 32; no other small ``(d_model, d_ff)`` pair gives 8,544. The claim is checked on the
module, and the module's parts against the formula.
"""

from __future__ import annotations

import functools

from headwise.articles.claim import Claim, Count, Holds
from headwise.articles.under_the_hood import KEY

__all__ = ["claims", "encoder_layer_count"]

_SECTION = "Up next — Part 5: The Transformer Encoder"
_PRINTED = (
    "We will build it in PyTorch and look at the actual print(model) output of an 8,544-parameter encoder layer "
    "captured from a real run."
)
D_MODEL, D_FF = 32, 64


@functools.cache
def encoder_layer_count() -> dict:
    """Parameters of ``EncoderLayer(32, h, 64)`` for every h dividing 32, by part, pre-LN and post-LN."""
    from headwise.core.layers import EncoderLayer, encoder_layer_params

    def count(m) -> int:
        return sum(p.numel() for p in m.parameters())

    counts, parts = {}, {}
    for heads in (1, 2, 4, 8, 16, 32):
        for norm_first in (False, True):
            layer = EncoderLayer(D_MODEL, heads, D_FF, norm_first=norm_first)
            counts[(heads, norm_first)] = count(layer)
            parts[(heads, norm_first)] = {
                "attention": count(layer.self_attn),
                "feed_forward": count(layer.ff),
                "layer_norm": count(layer.norm1) + count(layer.norm2),
            }
    formula = encoder_layer_params(D_MODEL, D_FF)
    return {"counts": counts, "parts": parts, "formula": formula}


def _one_count() -> int:
    counts = set(encoder_layer_count()["counts"].values())
    if len(counts) != 1:
        raise ValueError(f"the count depends on the head count or the norm placement: {sorted(counts)}")
    return counts.pop()


def _parts_match():
    found = encoder_layer_count()
    formula = {k: v for k, v in found["formula"].items() if k != "total"}
    same = all(p == formula for p in found["parts"].values())
    shown = ", ".join(f"{k.replace('_', ' ')} {v:,}" for k, v in formula.items())
    return same, f"{shown} (module = formula for h in 1…32, pre-LN and post-LN)"


def claims() -> list[Claim]:
    """The Part 5 teaser as two claims: the total, and its split into parts."""
    c = functools.partial(Claim, article=KEY, section=_SECTION, printed=_PRINTED)
    return [
        c(
            key="p4.part5.encoder.params",
            what="encoder layer parameters (d_model 32, d_ff 64)",
            value="8,544",
            compute=_one_count,
            rule=Count(),
            note="headwise.core.layers.EncoderLayer(32, h, 64): the same 8,544 for every h dividing 32 and "
            "for post-LN and pre-LN; the sizes are inferred (the article's Part 5 is not in the sources).",
        ),
        c(
            key="p4.part5.encoder.parts",
            what="attention + feed-forward + LayerNorms",
            value="8,544-parameter encoder layer",
            compute=_parts_match,
            rule=Holds(),
        ),
    ]
