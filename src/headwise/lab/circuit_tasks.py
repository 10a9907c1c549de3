"""Tasks whose circuit is known by construction: the ground truth against which circuit methods are scored
(:mod:`headwise.lab.circuit_suite`, ``headwise lab circuits``).

Each task fixes, before any training, four things:

- an attention-only :class:`~headwise.models.transformer_lm.TransformerLM` small enough that the mechanism is
  forced (one or two layers, no MLP: nothing but heads can move a token);
- its training data (``batch(rng, B) -> (inputs, targets, scored)``, :mod:`headwise.lab.trainer`'s task form);
- prompt pairs of one length (``pairs(rng, P) -> (clean, corrupted, answer, wrong)``) that differ only where the
  mechanism reads, so that the difference reaches the answer along the known circuit alone;
- the **known circuit**: edges of the graph (:mod:`headwise.circuits.graph`) written as templates whose heads are
  *roles* — ``"L0.H{prev}->L1.KV{ind}.k"`` — because a trained model may give the job to any head of a layer.

A role is fixed after training by an attention-pattern score measured on held-out sequences of the task (a
stream used neither for training nor for the prompt pairs), never by the patching being scored: the role's heads
are those of its layer whose score is at least :data:`ROLE_THRESHOLD`, or the single best head when none is. The
score of a head is the share of its attention, averaged over the queries that have a target, on the key position
the mechanism needs (``key (B, L)``, −1 where a query has none).

The mechanisms — the ways one head composes with another (Elhage et al. 2021), and none:

=========== ========================================================== ==============================================
task        what the answer needs                                      known circuit (what carries clean → corrupted)
=========== ========================================================== ==============================================
offset      the token 3 back (1 layer): a positional head's values     embed → the copying head's values → logits
retrieve    the one marked token (1 layer): a head that finds it by    embed → the finding head's values → logits
            its key (content, not position), copies its value
induction   ``a X … b Y … a → X`` (Olsson et al.): K-composition       the previous-token head's write → the
                                                                       induction heads' keys → logits
query       ``… X q … q f → X`` (f a filler): the query at f is q, one  the previous-token head's write → the
            back, moved there by a layer-0 head: Q-composition         lookup heads' queries → logits
value       ``… X q … q → X``: the value at q's copy is the token      the previous-token head's write → the
            before it, moved there by a layer-0 head: V-composition    lookup heads' values → logits
=========== ========================================================== ==============================================

Shape legend: B batch, P prompt pairs, L sequence length, V vocabulary, H heads.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from headwise.lab.tasks import repeated_segments
from headwise.models.transformer_lm import LMConfig

__all__ = ["CircuitTask", "DEFAULT_TASKS", "ROLE_THRESHOLD", "TASKS", "expand_known", "pattern_share", "role_heads"]

#: a head takes a role when at least this share of its attention is on the position the mechanism needs
ROLE_THRESHOLD = 0.5

Batch = tuple[Tensor, Tensor, Tensor]
Pairs = tuple[Tensor, Tensor, list[int], list[int]]


@dataclass(frozen=True)
class CircuitTask:
    """One task of the suite (see the module docstring).

    Attributes:
        name, description, mechanism: what it is, in words.
        model: the model trained on it. steps, batch_size, lr, warmup: the training.
        known: the known circuit as edge templates ``"sender->receiver.input"`` with roles in braces.
        roles: ``{role: (layer, what its score measures)}``.
        batch: ``fn(rng, B) -> (inputs (B, L), targets (B, L), scored (B, L) bool)``.
        pairs: ``fn(rng, P) -> (clean (P, L), corrupted (P, L), answer [P], wrong [P])``, the answer at the last
            position.
        probe: ``fn(rng, B) -> (ids (B, L), {role: key (B, L)})``: held-out sequences and, per role, the key
            position each query should attend to (−1: none).
    """

    name: str
    description: str
    mechanism: str
    model: LMConfig
    steps: int
    batch_size: int
    lr: float
    warmup: int
    known: tuple[str, ...]
    roles: dict
    batch: Callable[[np.random.Generator, int], Batch]
    pairs: Callable[[np.random.Generator, int], Pairs]
    probe: Callable[[np.random.Generator, int], tuple[Tensor, dict]]


def pattern_share(weights: Tensor, key: Tensor) -> list[float]:
    """Each head's mean attention on the target key, over the queries that have one.

    Args:
        weights: ``(B, H, L, L)`` one layer's attention weights.
        key: ``(B, L)`` int, the key position each query should attend to, −1 where none.
    Returns:
        ``[H]`` shares in [0, 1] (NaN when no query has a target).
    """
    has = key >= 0  # (B, L)
    if not bool(has.any()):
        return [float("nan")] * weights.shape[1]
    picked = weights.gather(-1, key.clamp_min(0)[:, None, :, None].expand(-1, weights.shape[1], -1, 1))[..., 0]
    return (picked * has[:, None]).sum((0, 2)).div(has.sum()).tolist()  # (B, H, L) -> (H,)


def role_heads(scores: list[float], threshold: float = ROLE_THRESHOLD) -> list[int]:
    """The heads that take a role: score ≥ ``threshold``, or the best one when none is."""
    heads = [h for h, s in enumerate(scores) if s >= threshold]
    return heads or [int(np.nanargmax(scores))]


_ROLE = re.compile(r"\{(\w+)\}")


def expand_known(templates, heads: dict[str, list[int]]) -> list[str]:
    """The known circuit's edge names: every template with each role replaced by each of its heads (a template
    with two roles gives every combination), in template order, without repeats.

    Raises:
        ValueError: a template naming a role that ``heads`` lacks.
    """
    out: list[str] = []
    for template in templates:
        names = [template]
        for role in _ROLE.findall(template):
            if role not in heads:
                raise ValueError(
                    f"known: template {template!r} names the role {role!r}; expected one of {sorted(heads)}"
                )
            names = [n.replace("{" + role + "}", str(h), 1) for n in names for h in heads[role]]
        out += [n for n in names if n not in out]
    return out


def _tensor(x) -> Tensor:
    return torch.as_tensor(np.asarray(x), dtype=torch.long)


# -- offset: the token K back, one layer ---------------------------------------------------------------------------

OFFSET, OFFSET_V, OFFSET_L = 3, 64, 16


def _offset_batch(rng: np.random.Generator, B: int) -> Batch:
    x = _tensor(rng.integers(0, OFFSET_V, size=(B, OFFSET_L)))  # (B, L)
    y = torch.zeros_like(x)
    y[:, OFFSET:] = x[:, :-OFFSET]  # target at t: x[t − 3]
    scored = torch.zeros_like(x, dtype=torch.bool)
    scored[:, OFFSET:] = True
    return x, y, scored


def _offset_pairs(rng: np.random.Generator, P: int) -> Pairs:
    clean = rng.integers(0, OFFSET_V, size=(P, OFFSET_L))
    corrupted = clean.copy()
    at = OFFSET_L - 1 - OFFSET  # the token the last position copies
    corrupted[:, at] = (clean[:, at] + rng.integers(1, OFFSET_V, size=P)) % OFFSET_V
    return _tensor(clean), _tensor(corrupted), clean[:, at].tolist(), corrupted[:, at].tolist()


def _offset_probe(rng: np.random.Generator, B: int):
    x = _offset_batch(rng, B)[0]
    key = torch.arange(OFFSET_L).expand(B, -1) - OFFSET  # (B, L): t − 3, negative before the third token
    return x, {"copy": key.clamp_min(-1)}


# -- retrieve: the one marked token, wherever it is, one layer --------------------------------------------------------

RET_V, RET_L = 64, 16  # plain tokens 0 … 31, marked tokens 32 … 63


def _retrieve(rng: np.random.Generator, B: int):
    x = rng.integers(0, RET_V // 2, size=(B, RET_L))
    at = rng.integers(0, RET_L - 1, size=B)  # never the last position
    x[np.arange(B), at] = rng.integers(RET_V // 2, RET_V, size=B)
    return _tensor(x), torch.from_numpy(at)


def _retrieve_batch(rng: np.random.Generator, B: int) -> Batch:
    x, at = _retrieve(rng, B)
    y = x.gather(1, at[:, None]).expand(-1, RET_L).clone()  # (B, L): the marked token everywhere
    scored = torch.arange(RET_L)[None] > at[:, None]  # after it
    return x, y, scored


def _retrieve_pairs(rng: np.random.Generator, P: int) -> Pairs:
    """The marked token changed to another marked token in the same place: its key stays marked, its value — the
    answer — changes."""
    x, at = _retrieve(rng, P)
    corrupted = x.clone()
    rows = torch.arange(P)
    answer = x[rows, at]
    wrong = RET_V // 2 + (answer - RET_V // 2 + _tensor(rng.integers(1, RET_V // 2, P))) % (RET_V // 2)
    corrupted[rows, at] = wrong
    return x, corrupted, answer.tolist(), wrong.tolist()


def _retrieve_probe(rng: np.random.Generator, B: int):
    x, at = _retrieve(rng, B)
    key = torch.where(torch.arange(RET_L)[None] > at[:, None], at[:, None], -1)  # (B, L)
    return x, {"find": key}


# -- induction: a X … b Y … a -> X, K-composition --------------------------------------------------------------------

IND_V, IND_L = 256, 64


def _induction_batch(rng: np.random.Generator, B: int) -> Batch:
    x = repeated_segments(rng, B, length=IND_L, vocab_size=IND_V)  # the lab's induction data
    y = torch.zeros_like(x)
    y[:, :-1] = x[:, 1:]
    scored = torch.ones_like(x, dtype=torch.bool)
    scored[:, -1] = False
    return x, y, scored


def _induction_pairs(rng: np.random.Generator, P: int) -> Pairs:
    """``n(8) [Pa X Ra] n(8) [Pb Y Rb] n(4) Pa`` → X against the same with the prefixes Pa, Pb (6 tokens each) of the
    two segments swapped → Y: only the tokens *before* X and Y change, so only the keys at X and Y — what the
    previous-token head writes there — tell the two apart; the query (the last Pa) and the values (X, Y) are the
    same."""
    clean, corrupted, answer, wrong = [], [], [], []
    for _ in range(P):
        tokens = rng.choice(IND_V, 14, replace=False)
        pa, pb, x, y = tokens[:6], tokens[6:12], tokens[12], tokens[13]
        n1, ra, n2, rb, n3 = (rng.integers(0, IND_V, n) for n in (8, 5, 8, 5, 4))
        clean.append(np.concatenate([n1, pa, [x], ra, n2, pb, [y], rb, n3, pa]))
        corrupted.append(np.concatenate([n1, pb, [x], ra, n2, pa, [y], rb, n3, pa]))
        answer.append(int(x))
        wrong.append(int(y))
    return _tensor(clean), _tensor(corrupted), answer, wrong


def _induction_probe(rng: np.random.Generator, B: int):
    x = _induction_batch(rng, B)[0]
    prev = (torch.arange(IND_L) - 1).expand(B, -1)  # (B, L): t − 1
    ind = torch.full_like(x, -1)
    for b in range(B):  # the position after the latest earlier copy of the current token
        last: dict[int, int] = {}
        for t, tok in enumerate(x[b].tolist()):
            if tok in last and last[tok] + 1 < t:
                ind[b, t] = last[tok] + 1
            last[tok] = t
    return x, {"prev": prev, "ind": ind}


# -- query and value: a lookup in a list of distinct tokens -----------------------------------------------------------

ITEMS, LIST_N, ASKED = 64, 12, 6  # list tokens 0 … 63; 12 distinct in a list; 6 asked
NOISE = 16  # the query task's filler tokens, ITEMS … ITEMS + 15: what stands at the position that answers
LOOKUP_V = ITEMS + NOISE


def _lookup(rng: np.random.Generator, B: int, *, query: bool):
    """A list of ``LIST_N`` distinct tokens, then ``ASKED`` distinct list tokens asked.

    The target is the token *before* the asked token's copy in the list — what a previous-token head wrote at that
    copy (V-composition). ``query``: each asked token q is followed by a filler token and the target stands at the
    filler — the filler says nothing, so the lookup's query is q, one back (Q-composition as well); otherwise the
    target stands at the asked token itself.

    Returns:
        ``(ids (B, L), targets (B, L), scored (B, L), where (B, L))``: ``where`` the key position the lookup head
        should read from each scored query (q's copy), −1 elsewhere.
    """
    n, m = LIST_N, ASKED
    L = n + (2 * m if query else m)
    ids = np.zeros((B, L), dtype=np.int64)
    targets, where = np.zeros((B, L), dtype=np.int64), np.full((B, L), -1, dtype=np.int64)
    for b in range(B):
        items = rng.choice(ITEMS, n, replace=False)
        ids[b, :n] = items
        asked = 1 + rng.choice(n - 1, m, replace=False)  # copies 1 … n − 1 have a token before them
        if query:
            ids[b, n::2] = items[asked]
            ids[b, n + 1 :: 2] = ITEMS + rng.integers(0, NOISE, m)
            targets[b, n + 1 :: 2] = items[asked - 1]
            where[b, n + 1 :: 2] = asked
        else:
            ids[b, n:] = items[asked]
            targets[b, n:] = items[asked - 1]
            where[b, n:] = asked
    ids, targets, where = (torch.from_numpy(a) for a in (ids, targets, where))
    return ids, targets, where >= 0, where


def _query_batch(rng: np.random.Generator, B: int) -> Batch:
    return _lookup(rng, B, query=True)[:3]


def _value_batch(rng: np.random.Generator, B: int) -> Batch:
    return _lookup(rng, B, query=False)[:3]


def _query_pairs(rng: np.random.Generator, P: int) -> Pairs:
    """The last token asked changed to a list token not asked before (and not the first of the list): only the query
    at the final filler — what the previous-token head moves there — tells the two apart; the list is the same."""
    x, y, _, _ = _lookup(rng, P, query=True)
    corrupted = x.clone()
    wrong = []
    for p in range(P):
        items = x[p, :LIST_N].tolist()
        asked = set(x[p, LIST_N::2].tolist())
        i = int(rng.choice([i for i in range(1, LIST_N) if items[i] not in asked]))
        corrupted[p, -2] = items[i]
        wrong.append(items[i - 1])
    return x, corrupted, y[:, -1].tolist(), wrong


def _value_pairs(rng: np.random.Generator, P: int) -> Pairs:
    """The list token before the last token's copy changed to a token absent from the sequence: only what the
    previous-token head writes at that copy — the lookup heads' value there — tells the two apart."""
    x, y, _, where = _lookup(rng, P, query=False)
    corrupted = x.clone()
    wrong = []
    for p in range(P):
        at = int(where[p, -1]) - 1
        new = int(rng.choice(sorted(set(range(ITEMS)) - set(x[p].tolist()))))
        corrupted[p, at] = new
        wrong.append(new)
    return x, corrupted, y[:, -1].tolist(), wrong


def _query_probe(rng: np.random.Generator, B: int):
    x, _, _, where = _lookup(rng, B, query=True)
    return x, {"prev": (torch.arange(x.shape[1]) - 1).expand(B, -1), "lookup": where}


def _value_probe(rng: np.random.Generator, B: int):
    x, _, _, where = _lookup(rng, B, query=False)
    return x, {"prev": (torch.arange(x.shape[1]) - 1).expand(B, -1), "lookup": where}


def _config(vocab: int, length: int, layers: int, heads: int = 4, width: int = 64) -> LMConfig:
    return LMConfig(vocab, length, width, layers, heads, d_ff=None, positional="rope")


#: the suite's tasks by name, each with its known circuit written down before any training
TASKS: dict[str, CircuitTask] = {
    "offset": CircuitTask(
        name="offset",
        description=f"random tokens; the target at t is the token at t − {OFFSET}; one layer",
        mechanism="a positional head copies the token 3 back through its values (no composition)",
        model=_config(OFFSET_V, OFFSET_L, 1),
        steps=400, batch_size=32, lr=3e-3, warmup=50,
        known=("embed->L0.KV{copy}.v", "L0.H{copy}->logits"),
        roles={"copy": (0, f"attention on t − {OFFSET}")},
        batch=_offset_batch, pairs=_offset_pairs, probe=_offset_probe,
    ),
    "retrieve": CircuitTask(
        name="retrieve",
        description="random plain tokens and one marked token at a random place; the target after it is the "
        "marked token; one layer",
        mechanism="a content-addressed head finds the marked token by its key and copies it through its values",
        model=_config(RET_V, RET_L, 1),
        steps=400, batch_size=32, lr=3e-3, warmup=50,
        known=("embed->L0.KV{find}.v", "L0.H{find}->logits"),
        roles={"find": (0, "attention on the marked token")},
        batch=_retrieve_batch, pairs=_retrieve_pairs, probe=_retrieve_probe,
    ),
    "induction": CircuitTask(
        name="induction",
        description="the lab's induction data (docs/lab.md); pairs swap the tokens before two continuations",
        mechanism="K-composition: the previous-token head writes into the induction heads' keys",
        model=_config(IND_V, IND_L, 2),
        steps=1500, batch_size=32, lr=3e-3, warmup=200,
        known=("embed->L0.KV{prev}.v", "L0.H{prev}->L1.KV{ind}.k", "L1.H{ind}->logits"),
        roles={"prev": (0, "attention on t − 1"), "ind": (1, "attention on the token after an earlier copy")},
        batch=_induction_batch, pairs=_induction_pairs, probe=_induction_probe,
    ),
    "query": CircuitTask(
        name="query",
        description="a list of 12 distinct tokens, then 6 of them asked, each followed by a filler; the target at "
        "the filler is the token before the asked one's copy in the list",
        mechanism="Q-composition: the previous-token head moves the token asked into the lookup heads' query",
        model=_config(LOOKUP_V, LIST_N + 2 * ASKED, 2),
        steps=1500, batch_size=32, lr=3e-3, warmup=100,
        known=("embed->L0.KV{prev}.v", "L0.H{prev}->L1.H{lookup}.q", "L1.H{lookup}->logits"),
        roles={"prev": (0, "attention on t − 1"), "lookup": (1, "at a filler: attention on the copy asked")},
        batch=_query_batch, pairs=_query_pairs, probe=_query_probe,
    ),
    "value": CircuitTask(
        name="value",
        description="a list of 12 distinct tokens, then 6 of them asked; the target at an asked token is the token "
        "before its copy in the list",
        mechanism="V-composition: the previous-token head writes the answer into the lookup heads' values",
        model=_config(LOOKUP_V, LIST_N + ASKED, 2),
        steps=1000, batch_size=32, lr=3e-3, warmup=100,
        known=("embed->L0.KV{prev}.v", "L0.H{prev}->L1.KV{lookup}.v", "L1.H{lookup}->logits"),
        roles={"prev": (0, "attention on t − 1"), "lookup": (1, "attention on the copy of the token asked")},
        batch=_value_batch, pairs=_value_pairs, probe=_value_probe,
    ),
}  # fmt: skip

#: the tasks run by default: ``query`` is left out — its model did not learn the lookup within 6,000 steps (held-out
#: accuracy at chance, seed 0), so its known circuit cannot be confirmed; ``--tasks query`` runs it and says so
DEFAULT_TASKS = ("offset", "retrieve", "induction", "value")
