"""The induction experiment: a 2-layer attention-only model learns in-context copying in a few minutes.

Olsson et al. 2022 ("In-context Learning and Induction Heads") describe the circuit: a previous-token
head in layer 1 writes "the token before me was A" into each position; an induction head in layer 2,
at a later A, looks for the position whose previous token was A and copies what it holds (B) —
"[A][B] … [A] → [B]". It forms suddenly, a phase change visible as a drop of the loss on repeated
tokens, together with a rise of the heads' induction scores.

The set-up and why (the measurements are in ``docs/lab.md``):

- **Data** (:func:`headwise.lab.tasks.repeated_segments`): random tokens with 2–4 copies of a random
  segment of 4–32 tokens at random places. No distance or period is shared between sequences, so no
  positional shortcut fits; repeats are a quarter to half of the tokens, a strong enough signal.
- **Model**: attention-only (Elhage et al. 2021), 2 layers × 4 heads, width 64, vocabulary 256,
  context 64, pre-LN, RoPE in every attention. With rotary positions a score depends on the offset
  i − j only, so "attend one back" is one pattern for every position — the previous-token path is
  there to be found, rather than learnt 64 times over with absolute positions.
- **Schedule**: AdamW at 3e-3 after 200 warmup steps, cosine decay to 3e-4, batch 32, clipping at 1.

Judged on held-out sequences from another random stream: random tokens in which one segment of 8–24
tokens appears twice at random places; the loss on the second copy (its tokens 2 … n, which the first
copy predicts) must be at most 0.3 · ln V.

Shape legend: B batch, L sequence length, V vocabulary size, N layers, H heads.
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.nn.functional as F

from headwise import checks
from headwise.lab.scores import head_scores
from headwise.lab.tasks import induction_probe, repeated_segments
from headwise.lab.trainer import TrainConfig, lm_batches, train
from headwise.models.transformer_lm import LMConfig, TransformerLM

__all__ = [
    "InductionSetup",
    "InductionRun",
    "BOUND",
    "run_induction",
    "run_induction_seeds",
    "evaluate_induction",
    "probe_stream",
    "SEED_COLUMNS",
    "seed_rows",
    "summary_lines",
    "circuit_pairs",
]

#: the target: loss on the second copy at most BOUND · ln V
BOUND = 0.3
#: a head is called previous-token / induction when its score is at least this
HEAD_THRESHOLD = 0.4


@dataclass(frozen=True)
class InductionSetup:
    """The experiment's sizes and schedule (defaults: the measured set-up of ``docs/lab.md``)."""

    steps: int = 2000
    batch_size: int = 32
    lr: float = 3e-3
    warmup: int = 200
    vocab_size: int = 256
    context_length: int = 64
    d_model: int = 64
    num_layers: int = 2
    num_heads: int = 4
    min_segment: int = 4
    max_segment: int = 32
    max_copies: int = 4
    eval_every: int = 100
    probe_size: int = 256
    final_probe_size: int = 2048

    def __post_init__(self):
        for name in ("steps", "batch_size", "eval_every", "probe_size", "final_probe_size"):
            checks.positive_int(name, getattr(self, name))
        if self.context_length < 48:
            raise ValueError(
                f"context_length: expected at least 48 (two copies of a 24-token segment), got {self.context_length}"
            )

    def model_config(self) -> LMConfig:
        return LMConfig(
            vocab_size=self.vocab_size,
            context_length=self.context_length,
            d_model=self.d_model,
            num_layers=self.num_layers,
            num_heads=self.num_heads,
            d_ff=None,
            positional="rope",
        )

    def train_config(self, seed: int) -> TrainConfig:
        return TrainConfig(
            steps=self.steps,
            lr=self.lr,
            warmup=min(self.warmup, self.steps // 2),
            seed=seed,
            eval_every=self.eval_every,
        )


@dataclass
class InductionRun:
    """The trained model, its training record and its summary (what ``summary.json`` holds)."""

    model: TransformerLM
    history: list[dict]
    summary: dict


def probe_stream(seed: int, which: int) -> np.random.Generator:
    """The held-out random stream ``which`` of a seed — never the training stream ``default_rng(seed)``."""
    return np.random.default_rng([seed, 1 + which])


def _losses(model: TransformerLM, ids, copy, first) -> dict[str, float]:
    """Mean NLL (nats) on the predictable second-copy tokens, on its first token, on the whole second copy
    (first token included, each sequence's copy averaged over its tokens, then over sequences), and on
    unrepeated tokens."""
    logits = model(ids)[:, :-1]  # (B, L−1, V): position t predicts token t + 1
    nll = -F.log_softmax(logits.float(), dim=-1).gather(-1, ids[:, 1:, None])[..., 0]  # (B, L−1)
    copy, first = copy[:, 1:], first[:, 1:]
    other = ~(copy | first)
    whole = copy | first
    return {
        "loss_repeated": float(nll[copy].mean()),
        "loss_first_of_copy": float(nll[first].mean()),
        "loss_whole_copy": float(((nll * whole).sum(1) / whole.sum(1)).mean()),
        "loss_unrepeated": float(nll[other].mean()),
    }


def evaluate_induction(model: TransformerLM, probe, *, score_size: int = 128) -> dict:
    """Losses on a probe (:func:`headwise.lab.tasks.induction_probe`'s output) and every head's scores.

    Returns:
        ``loss_repeated``, ``loss_first_of_copy``, ``loss_unrepeated`` (nats), ``repeated_over_ln_v``,
        ``scores`` (``{"prev": [[…H] …N], "induction": …}`` on the first ``score_size`` sequences).
    """
    ids, copy, first = probe
    out = _losses(model, ids, copy, first)
    out["repeated_over_ln_v"] = out["loss_repeated"] / math.log(model.vocab_size)
    _, weights = model(ids[:score_size], need_weights=True)  # [(B, H, L, L)] * N
    out["scores"] = head_scores(weights, ids[:score_size])
    return out


def _heads_over(scores: list[list[float]], threshold: float) -> list[str]:
    return [f"L{n}H{h}" for n, row in enumerate(scores) for h, s in enumerate(row) if s >= threshold]


def run_induction(
    setup: InductionSetup = InductionSetup(), *, seed: int = 0, callback=None, num_threads: int | None = 1
) -> InductionRun:
    """Train the induction model for ``seed`` and judge it on held-out probes.

    Args:
        setup: sizes and schedule.
        seed: seeds the initialisation, the training data and (as other streams) the probes.
        callback: receives a :class:`headwise.lab.trainer.Progress` after every step.
        num_threads: torch threads while training (None: as set).
    Returns:
        An :class:`InductionRun`; ``summary["passed"]`` says whether the final held-out loss on the
        second copy is at most ``0.3 · ln V``.
    """
    checks.non_negative_int("seed", seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = TransformerLM(setup.model_config())
    sizes = {"length": setup.context_length, "vocab_size": setup.vocab_size}
    probe = induction_probe(probe_stream(seed, 0), setup.probe_size, **sizes)
    data = functools.partial(
        repeated_segments,
        batch=setup.batch_size,
        min_segment=setup.min_segment,
        max_segment=setup.max_segment,
        max_copies=setup.max_copies,
        **sizes,
    )
    config = setup.train_config(seed)
    result = train(
        model,
        lm_batches(data),
        config,
        evaluate=lambda m: evaluate_induction(m, probe),
        callback=callback,
        num_threads=num_threads,
    )
    final_probe = induction_probe(probe_stream(seed, 1), setup.final_probe_size, **sizes)
    with torch.no_grad():
        final = evaluate_induction(model, final_probe)
    ln_v = math.log(setup.vocab_size)
    phase = next((h["step"] for h in result.history if h["loss_repeated"] <= 0.5 * ln_v), None)
    summary = {
        "experiment": "induction",
        "seed": seed,
        "setup": asdict(setup),
        "model": setup.model_config().to_dict(),
        "parameters": model.num_parameters(),
        "train": config.to_dict(),
        "seconds": result.seconds,
        "tokens_per_s": result.tokens / max(result.seconds, 1e-9),
        "threads": torch.get_num_threads() if num_threads is None else num_threads,
        "ln_v": ln_v,
        "bound": BOUND,
        "bound_nats": BOUND * ln_v,
        "final": {k: v for k, v in final.items() if k != "scores"},
        "passed": final["loss_repeated"] <= BOUND * ln_v,
        "phase_change_step": phase,
        "scores": final["scores"],
        "previous_token_heads": _heads_over(final["scores"]["prev"], HEAD_THRESHOLD),
        "induction_heads": _heads_over(final["scores"]["induction"], HEAD_THRESHOLD),
        "head_threshold": HEAD_THRESHOLD,
        "history": result.history,
    }
    return InductionRun(model=model, history=result.history, summary=summary)


def run_induction_seeds(
    setup: InductionSetup = InductionSetup(), seeds=(0,), *, num_threads: int | None = 1, on_run=None
) -> list[dict]:
    """:func:`run_induction` for several seeds: serially, or — inside an initialised ``torch.distributed`` group
    (``torchrun``: one process a rank) — the seeds dealt across the ranks
    (:meth:`headwise.distributed.ranks.Ranks.map`), every rank returning every seed's summary (one all-gather of their
    JSON).

    Args:
        seeds: the seeds (each ≥ 0), in the order of the result.
        on_run: called with each summary this process trained, as it finishes.
    Returns:
        the runs' ``summary`` dicts, in ``seeds`` order (equal to one process's: each run is seeded on its own).
    """
    seeds = [checks.non_negative_int("seeds", s) for s in seeds]
    if not seeds:
        raise ValueError("seeds: expected at least one seed, got none")
    from headwise.distributed.ranks import ranks

    def one(seed: int) -> dict:
        summary = run_induction(setup, seed=seed, num_threads=num_threads).summary
        if on_run is not None:
            on_run(summary)
        return summary

    with ranks(alone=True) as r:  # an initialised group: the seeds dealt (each the same cost); else this process
        return r.map(seeds, lambda seed: 1.0, one)


#: The columns of ``induction_seeds.csv``.
SEED_COLUMNS = [
    "seed", "passed", "loss_repeated", "repeated_over_ln_v", "phase_change_step", "previous_token_heads",
    "induction_heads", "seconds",
]  # fmt: skip


def seed_rows(runs: list[dict]) -> list[dict]:
    """One flat row per seed's summary (:func:`run_induction_seeds`), the columns of :data:`SEED_COLUMNS`."""
    return [
        {**{k: s[k] for k in ("seed", "passed", "phase_change_step", "seconds")},
         "loss_repeated": s["final"]["loss_repeated"], "repeated_over_ln_v": s["final"]["repeated_over_ln_v"],
         "previous_token_heads": " ".join(s["previous_token_heads"]), "induction_heads": " ".join(s["induction_heads"])}
        for s in runs
    ]  # fmt: skip


def summary_lines(s: dict) -> list[str]:
    """What one run's summary (:func:`run_induction`) says, for the terminal: the held-out losses against the target,
    and the heads found."""
    final = s["final"]
    return [
        f"held-out loss on the second copy (tokens 2…n): {final['loss_repeated']:.3f} nats "
        f"= {final['repeated_over_ln_v']:.3f} · ln V "
        f"(target ≤ {s['bound']} · ln V = {s['bound_nats']:.3f}): {'pass' if s['passed'] else 'FAIL'}; "
        f"whole copy with its unpredictable first token {final['loss_whole_copy']:.3f}; "
        f"unrepeated tokens {final['loss_unrepeated']:.3f} (ln V = {s['ln_v']:.3f})",
        f"previous-token heads: {', '.join(s['previous_token_heads']) or 'none'}; "
        f"induction heads: {', '.join(s['induction_heads']) or 'none'} (score ≥ {s['head_threshold']}); "
        f"phase change by step {s['phase_change_step']}",
    ]


def circuit_pairs(vocab: int, P: int = 8, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, list[int], list[int]]:
    """Prompt pairs for the induction circuit: ``(clean (P, 34), corrupted (P, 34), answer ids, wrong ids)`` —
    ``noise A noise A[:6]`` against ``noise B noise B[:6]`` with 12-token segments A, B (the 8-token noises shared,
    A[:7] and B[:7] disjoint), so the clean run copies A[6] and the corrupted B[6] (docs/circuits.md)."""
    rng = np.random.default_rng(seed)
    clean, corrupted, answer, wrong = [], [], [], []
    for _ in range(P):
        n1, n2 = rng.integers(0, vocab, 8), rng.integers(0, vocab, 8)
        a, b = rng.choice(vocab, 12, replace=False), rng.choice(vocab, 12, replace=False)
        while set(a[:7]) & set(b[:7]):
            b = rng.choice(vocab, 12, replace=False)
        clean.append(np.concatenate([n1, a, n2, a[:6]]))
        corrupted.append(np.concatenate([n1, b, n2, b[:6]]))
        answer.append(int(a[6]))
        wrong.append(int(b[6]))
    return torch.tensor(np.array(clean)), torch.tensor(np.array(corrupted)), answer, wrong
