"""A synthetic ``atlas.json`` (format ``"headwise.atlas/1"``, ``/work/notes``' schema) for tests of the atlas page
and of whatever reads the format: every field present, the optional ones null or empty on some heads."""

from __future__ import annotations

import numpy as np

ROLES = [
    {"name": "previous-token", "description": "attends to the token just before the query", "threshold": 0.5},
    {"name": "first-token", "description": "rests on the first token", "threshold": 0.6},
    {"name": "induction", "description": "attends to the token after an earlier copy of the query", "threshold": 0.4},
    {"name": "duplicate-token", "description": "attends to earlier copies of the query", "threshold": 0.3},
    {"name": "other", "description": "no role's evidence passes its threshold", "threshold": None},
]

WORDS = [" the", " cat", " sat", " on", " mat", ".", " Paris", " is", " a", " city", " and", " of", "\n", " dog"]

#: The token carrying markup that ``synthetic_atlas(..., markup=True)`` puts in contexts, writes and OV mappings.
MARKUP = "</script><b>x</b>"


def _round(x: float) -> float:
    return float(f"{float(x):.4g}")


def _context(rng, n: int, *, markup: bool, text_count: int) -> dict:
    tokens = [str(t) for t in rng.choice(WORDS, n)]
    if n > 8 and rng.random() < 0.3:
        tokens[n // 2] = "…"
    query = int(rng.integers(1, n))
    key = int(rng.integers(0, query + 1))
    if markup:
        tokens[key] = MARKUP
    return {
        "tokens": tokens,
        "query": query,
        "key": key,
        "weight": _round(rng.uniform(0.2, 1.0)),
        "text": int(rng.integers(0, text_count)),
        "position": int(rng.integers(query, 400)),
    }


def synthetic_atlas(
    num_layers: int,
    num_heads: int,
    *,
    seed: int = 0,
    markup: bool = False,
    contexts: int = 8,
    context_tokens: int = 24,
) -> dict:
    """An atlas of ``num_layers × num_heads`` heads, valid per the schema, reproducible from ``seed``.

    Heads ``(layer + head) % 5 == 4`` have no role (primary "other"); every third head's importance is exact, the
    others estimated, and the last head's importance is null; odd heads have null ``ov`` and ``loss_effect``;
    head L0.H1 has no contexts, outputs or partners. With ``markup``, the first head of every layer carries
    :data:`MARKUP` as its contexts' key token and as a raised token, and L0.H0's OV maps it.
    """
    rng = np.random.default_rng(seed)
    total = num_layers * num_heads
    text_count = 120
    named = [r["name"] for r in ROLES if r["name"] != "other"]
    importance = np.abs(rng.normal(size=total)) * 0.2
    order = np.argsort(-importance, kind="stable")
    rank = np.empty(total, int)
    rank[order] = np.arange(1, total + 1)
    heads = []
    for layer in range(num_layers):
        for head in range(num_heads):
            i = layer * num_heads + head
            hid = f"L{layer}.H{head}"
            has_markup = markup and head == 0
            if (layer + head) % 5 == 4:
                roles = []
            else:
                first = named[(layer + head) % len(named)]
                roles = [{"name": first, "score": _round(0.9 - 0.01 * head), "threshold": 0.4, "detail": "probe"}]
                if head % 2 == 0:
                    second = named[(layer + head + 1) % len(named)]
                    roles.append({"name": second, "score": 0.41, "threshold": 0.3, "detail": "corpus statistics"})
            shares = rng.dirichlet(np.ones(12)) * 0.9
            quiet = hid == "L0.H1"
            partners_in = [
                {"head": f"L{lay}.H{(head + k) % num_heads}", "kind": "QKV"[k % 3], "score": _round(0.3 / (k + 1))}
                for k, lay in enumerate(range(max(0, layer - 2), layer))
            ]
            partners_out = [
                {"head": f"L{lay}.H{(head + 1) % num_heads}", "kind": "K", "score": 0.2}
                for lay in range(layer + 1, min(num_layers, layer + 2))
            ]
            raises = [{"token": str(rng.choice(WORDS)), "value": _round(0.3 - 0.05 * k)} for k in range(3)]
            if has_markup:
                raises[0]["token"] = MARKUP
            exact = i % 3 == 0
            entry = {
                "id": hid,
                "layer": layer,
                "head": head,
                "role": roles[0]["name"] if roles else "other",
                "roles": roles,
                "stats": {
                    "entropy": _round(rng.uniform(0.2, 3)),
                    "entropy_ratio": _round(rng.uniform(0, 1)),
                    "first": _round(rng.uniform(0, 1)),
                    "prev": _round(rng.uniform(0, 1)),
                    "distance": None if head == 1 else _round(rng.uniform(0, 9)),
                    "self": _round(rng.uniform(0, 0.2)),
                },
                "offsets": {
                    "start": 0,
                    "shares": [_round(s) for s in shares],
                    "beyond": 0.05,
                    "first": 0.05,
                },
                "contexts": []
                if quiet
                else [_context(rng, context_tokens, markup=has_markup, text_count=text_count) for _ in range(contexts)],
                "outputs": []
                if quiet
                else [
                    {
                        "tokens": [str(t) for t in rng.choice(WORDS, context_tokens // 2)],
                        "at": int(rng.integers(0, context_tokens // 2)),
                        "norm": _round(rng.uniform(1, 20)),
                        "text": int(rng.integers(0, text_count)),
                        "position": int(rng.integers(0, 300)),
                    }
                    for _ in range(3)
                ],
                "writes": {
                    "raises": raises,
                    "lowers": [{"token": str(rng.choice(WORDS)), "value": _round(-0.1 - 0.05 * k)} for k in range(3)],
                    "label": "mean direct logit attribution over the corpus (final norm frozen at each token)",
                },
                "ov": None
                if head % 2 == 1
                else {
                    "copying": _round(rng.uniform(-1, 1)),
                    "top": [
                        {"from": MARKUP if has_markup and k == 0 else " cat", "to": " cat", "value": 2.1 - k}
                        for k in range(3)
                    ],
                },
                "loss_effect": None
                if head % 2 == 1
                else {
                    "value": _round(rng.normal() * 0.01),
                    "stderr": _round(abs(rng.normal()) * 0.001),
                    "exact": False,
                    "label": "direct effect on the loss",
                },
                "importance": None
                if i == total - 1
                else {
                    "value": _round(importance[i] if i % 7 else -importance[i]),
                    "exact": exact,
                    "rank": int(rank[i]),
                    "label": "measured by ablation on this run"
                    if exact
                    else "estimate (atp*); this run's error: Spearman 0.70 over 16 measured heads",
                },
                "partners": None if quiet else {"in": partners_in, "out": partners_out},
            }
            heads.append(entry)
    return {
        "format": "headwise.atlas/1",
        "model": {
            "name": "synthetic.gguf",
            "kind": "decoder",
            "family": "llama",
            "num_layers": num_layers,
            "num_heads": num_heads,
            "kv_heads": max(1, num_heads // 3),
        },
        "corpus": {"source": "the sample corpus", "texts": text_count, "tokens": 4711},
        "roles": ROLES,
        "importance": {
            "metric": "loss change when the head is zero-ablated, nats",
            "estimator": "atp*",
            "measured": (total + 2) // 3,
            "of": total,
            "agreement": {"spearman": 0.7, "sign": 0.9, "median_ratio": 0.8},
        },
        "heads": heads,
    }
