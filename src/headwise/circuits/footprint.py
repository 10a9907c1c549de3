"""What a circuit run keeps of the activations, in bytes — the estimate a model opened layer by layer is weighed
by before the run (:func:`headwise.models.layer_walk.check_walk`), besides one layer's weights, and the batch of
jobs that fits a budget (:func:`fitted_batch`).

Shape legend: P prompt pairs, L length, D model width, NL layers, H query heads, J jobs.

A run (:func:`headwise.circuits.find_circuit`) keeps, in float32, at its three peaks:

- scoring: the clean and corrupted runs' recorded writes (every head's and MLP's ``(P, L, D)``, the heads' outputs,
  the embeddings: ``W`` bytes a run) until the senders' changes are taken from them group by group, the residual
  stream at every layer boundary twice (a layer walk's checkpoints and the receivers' taps) — 3·W counted, measured
  2.7·W on SmolLM2; for ``atp*`` also each layer's records, the changes concatenated and each layer's query and key
  changes of them — 5·W counted, measured 4.7·W;
- the exact check: the base run's writes and a batch of J jobs' edited inputs of one layer, ``(J·P, H, L, D)``;
- the faithfulness curves: a batch of J circuits, each run's writes recorded (``J·W``: every downstream receiver
  reads them), the ablated writes (``W``) and the edited inputs of one layer;

and the scores ``(P, S, R)`` over senders and receivers throughout.
"""

from __future__ import annotations

__all__ = ["EXACT_JOBS", "FAITHFULNESS_JOBS", "circuit_activations", "fitted_batch"]

#: :func:`headwise.circuits.find_circuit`'s jobs per pass where none is given: the exact check's, the curves'.
EXACT_JOBS, FAITHFULNESS_JOBS = 16, 8


def circuit_activations(hm, pairs: int, length: int, *, method: str, batch_size: int | None) -> int:
    """Bytes of activations a circuit run keeps on ``hm`` for ``pairs`` prompt pairs of ``length`` tokens with
    ``method`` (``"eap"``, ``"eap-ig"``, ``"atp*"``, ``"exact"``) and ``batch_size`` jobs per patched pass (None:
    the run's defaults, :data:`EXACT_JOBS` and :data:`FAITHFULNESS_JOBS`) — the largest of its three peaks (see the
    module's notes)."""
    D = hm.width
    row = 4 * pairs * length * D  # one (P, L, D) float32
    H = list(hm.heads_per_layer)
    NL = len(H)
    writes = row * (sum(H) + 2 * NL + 1)  # every head's and MLP's write, the heads' outputs, the embeddings: a run
    senders, receivers = sum(H) + NL + 1, 3 * sum(H) + NL + 1
    scores = 4 * pairs * senders * receivers
    if method == "atp*":  # the changes concatenated once more, and each layer's query and key changes of them
        scoring = 5 * writes + 6 * NL * row
    else:
        scoring = 3 * writes + 2 * NL * row
    exact_jobs, curve_jobs = (batch_size, batch_size) if batch_size else (EXACT_JOBS, FAITHFULNESS_JOBS)
    exact = writes + 2 * exact_jobs * max(H) * row
    curves = (curve_jobs + 1) * writes + 2 * curve_jobs * max(H) * row
    return scores + max(scoring, exact, curves)


def fitted_batch(hm, pairs: int, length: int, *, method: str, budget: int, need) -> int | None:
    """The most jobs per patched pass, up to :data:`FAITHFULNESS_JOBS`, whose run ``need(activations)`` (bytes of
    peak resident memory given the activations, :func:`headwise.models.layer_walk.walk_need`) fits ``budget``; None
    where one job does not."""
    for jobs in range(FAITHFULNESS_JOBS, 0, -1):
        if need(circuit_activations(hm, pairs, length, method=method, batch_size=jobs)) <= budget:
            return jobs
    return None
