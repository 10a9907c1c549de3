"""What a circuit run keeps of the activations, in bytes — the estimate a model opened layer by layer is weighed
by before the run (:func:`headwise.models.layer_walk.check_walk`), besides one layer's weights.

Shape legend: P prompt pairs, L length, D model width, NL layers, H query heads, Hkv key/value groups, J jobs.

A run (:func:`headwise.circuits.find_circuit`) keeps, in float32:

- the clean and corrupted runs' recorded writes — every head's and MLP's ``(P, L, D)``, the heads' outputs, the
  embeddings — until the senders' changes are taken from them, group by group (the changes stay for the scores);
- in each gradient pass, the residual stream at every layer boundary ``(P, L, D)``, twice (the checkpoint's input
  and the receivers' taps), and for ``atp*`` each layer's queries, keys, values and outputs;
- the scores ``(P, S, R)`` over senders and receivers;
- while patching, a batch of J jobs of P rows, each receiver group's edited input ``(J·P, n, L, D)`` of one layer
  at a time (the largest n: a layer's query heads).
"""

from __future__ import annotations

__all__ = ["circuit_activations"]


def circuit_activations(hm, pairs: int, length: int, *, method: str, batch_size: int | None) -> int:
    """Bytes of activations a circuit run keeps on ``hm`` for ``pairs`` prompt pairs of ``length`` tokens with
    ``method`` (``"eap"``, ``"eap-ig"``, ``"atp*"``, ``"exact"``) and ``batch_size`` jobs per patched pass (None:
    the run's default, 16) — see the module's notes."""
    from headwise.models.anatomy_recording import input_embedding

    D = int(input_embedding(hm.model).weight.shape[-1])
    row = 4 * pairs * length * D  # one (P, L, D) float32
    H = list(hm.heads_per_layer)
    NL = len(H)
    writes = row * (sum(H) + 2 * NL + 1)  # every head's and MLP's write, the heads' outputs, the embeddings: a run
    recorded = 2 * writes  # the two runs (the changes replace their records group by group)
    boundaries = 2 * NL * row
    taps = 4 * NL * row if method == "atp*" else 0
    senders, receivers = sum(H) + NL + 1, 3 * sum(H) + NL + 1
    scores = 4 * pairs * senders * receivers
    jobs = batch_size or 16
    patched = 2 * jobs * max(H) * row
    return recorded + boundaries + taps + scores + patched
