"""The peers headwise is measured against, built with headwise's weights (checked to agree before timing).

- ``torch``: ``torch.nn.MultiheadAttention(batch_first=True)`` through ``headwise.interop.to_torch``.
- ``hf``: Hugging Face ``BertAttention`` (``attn_implementation="sdpa"``), built offline from a ``BertConfig``;
  it is self-attention plus its output dense — and the residual + LayerNorm that ``BertSelfOutput`` adds,
  which headwise does not do (so it carries a little more work: one add and one LayerNorm over (B, L, D)).
- ``article``: the from-scratch module of the first article ("LLM Under the Hood, Part 4"), copied verbatim
  below as ``ArticleMultiHeadAttention`` (its own name there is ``MultiHeadAttention``).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

import headwise
from headwise.interop import to_torch


# --- copied from the first article ("LLM Under the Hood — Part 4: Multi-Head Attention"), class renamed
class ArticleMultiHeadAttention(nn.Module):
    def __init__(self, d_model, num_heads):
        super().__init__()
        assert d_model % num_heads == 0
        self.h = num_heads
        self.d_k = d_model // num_heads
        self.Wq = nn.Linear(d_model, d_model)
        self.Wk = nn.Linear(d_model, d_model)
        self.Wv = nn.Linear(d_model, d_model)
        self.Wo = nn.Linear(d_model, d_model)

    def forward(self, x):
        B, L, _ = x.shape
        # Project and split into (B, num_heads, L, d_k)
        Q = self.Wq(x).view(B, L, self.h, self.d_k).transpose(1, 2)
        K = self.Wk(x).view(B, L, self.h, self.d_k).transpose(1, 2)
        V = self.Wv(x).view(B, L, self.h, self.d_k).transpose(1, 2)

        scores = (Q @ K.transpose(-2, -1)) / (self.d_k**0.5)  # (B, h, L, L)
        weights = F.softmax(scores, dim=-1)
        out = weights @ V  # (B, h, L, d_k)

        # Recombine heads: (B, h, L, d_k) → (B, L, d_model)
        out = out.transpose(1, 2).contiguous().view(B, L, self.h * self.d_k)
        return self.Wo(out)


# --- end of the copy -------------------------------------------------------------------------------------------


def article_from(m: headwise.MultiHeadAttention) -> ArticleMultiHeadAttention:
    out = ArticleMultiHeadAttention(m.d_model, m.num_heads).to(m.Wq.weight.dtype)
    out.load_state_dict({k: v for k, v in m.state_dict().items() if k.split(".")[0] in ("Wq", "Wk", "Wv", "Wo")})
    return out


def hf_bert_attention_from(m: headwise.MultiHeadAttention):
    """Hugging Face ``BertAttention`` (sdpa) with ``m``'s weights; dropout 0."""
    from transformers import BertConfig
    from transformers.models.bert.modeling_bert import BertAttention

    config = BertConfig(
        hidden_size=m.d_model,
        num_attention_heads=m.num_heads,
        intermediate_size=4 * m.d_model,
        attention_probs_dropout_prob=0.0,
        hidden_dropout_prob=0.0,
    )
    config._attn_implementation = "sdpa"
    hf = BertAttention(config).to(m.Wq.weight.dtype)
    with torch.no_grad():
        for mine, theirs in (
            (m.Wq, hf.self.query),
            (m.Wk, hf.self.key),
            (m.Wv, hf.self.value),
            (m.Wo, hf.output.dense),
        ):
            theirs.weight.copy_(mine.weight)
            theirs.bias.copy_(mine.bias)
    return hf


def build(D: int, H: int, *, peers=("torch", "hf", "article"), dtype=torch.float32, seed: int = 0):
    """headwise's module and its peers with the same weights, in eval mode.

    Returns:
        ``{"headwise": m, "torch": ..., "hf": ..., "article": ...}`` (only the peers asked for).
    """
    torch.manual_seed(seed)
    m = headwise.MultiHeadAttention(D, H, dtype=dtype).eval()
    out = {"headwise": m}
    if "torch" in peers:
        out["torch"] = to_torch(m).eval()
    if "hf" in peers:
        out["hf"] = hf_bert_attention_from(m).eval()
    if "article" in peers:
        out["article"] = article_from(m).eval()
    return out


def calls(mods: dict, x: torch.Tensor, **kw) -> dict:
    """Zero-argument forward calls on ``x`` for each module (self-attention, weights not asked for)."""
    fns = {}
    for name, mod in mods.items():
        if name == "headwise":
            fns[name] = lambda mod=mod: mod(x, **kw)[0]
        elif name == "torch":
            fns[name] = lambda mod=mod: mod(x, x, x, need_weights=False)[0]
        elif name == "hf":
            fns[name] = lambda mod=mod: mod(x)[0]
        elif name == "article":
            fns[name] = lambda mod=mod: mod(x)
    return fns


def check_agreement(mods: dict, x: torch.Tensor, atol: float) -> dict:
    """Max |difference| of each peer's output from headwise's (HF: its dense output before the residual and
    LayerNorm, i.e. ``output.dense(self(x))``). Raises AssertionError above ``atol``."""
    with torch.inference_mode():
        want = mods["headwise"](x)[0].float()
        diffs = {}
        for name, mod in mods.items():
            if name == "headwise":
                continue
            if name == "torch":
                got = mod(x, x, x, need_weights=False)[0]
            elif name == "hf":
                got = mod.output.dense(mod.self(x)[0])
            else:
                got = mod(x)
            diffs[name] = float((got.float() - want).abs().max())
            assert diffs[name] <= atol, f"{name} disagrees with headwise: max |diff| = {diffs[name]:.3g} > {atol}"
    return diffs
