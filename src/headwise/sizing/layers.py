"""Planning a layer-by-layer run: the time and peak memory of a model too big for memory, from per-layer costs
measured on this machine, on one machine and across N.

A run layer by layer (:mod:`headwise.models.streamed`) reads each layer's stored weights, turns them into float32,
runs a batch of T tokens through the layer and releases it; the embedding and unembedding are read by rows. Per layer
and pass it costs

- reading: the layer's stored bytes over the conversion rate (stored → float32, the file in the page cache);
- computing: ``2 · P · T`` multiply-adds of its matrices (P its parameters) and ``4 · T² · H · Dh`` of attention,
  over the float32 rate of this machine's matmuls.

Its peak is what the process holds, the largest layer in float32 and as stored, and the activations of a pass.

Across N machines the layers are split into N contiguous shards (pipeline stages, as ``torch.distributed.pipelining``
or layer shards over ranks split them): a machine whose shard fits its memory keeps it resident (read once), and B
batches pipeline through the stages in ``(B + N − 1)`` steps of one stage's work; a shard that does not fit streams
its layers as one machine does. The time of sending the activations between stages (``T · D · 4`` bytes per batch
and boundary) is left out: at T = 512, D = 8192 it is 17 MB, well under the stages' work.

- :class:`Costs`, :func:`measure_costs` — the rates, measured here in about a second.
- :class:`LayerPlan`, :func:`plan_layers` — one model's plan; :func:`planning_table` — ``headwise size --memory``'s
  table.

Shape legend: NL layers, D model width, F MLP width, H heads, Dh head width, T tokens of a pass, B batches.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from headwise._machine import cpu_name
from headwise.sizing.arch import Architecture
from headwise.sizing.count import param_breakdown

__all__ = [
    "Costs",
    "LayerPlan",
    "measure_costs",
    "plan_layers",
    "planning_table",
    "DEFAULT_MODELS",
    "HELD",
    "MIN_WORKING",
]

#: The models planned when none is named: Llama-shaped, 8 B and 70 B parameters.
DEFAULT_MODELS = ("llama-3-8b", "llama-3-70b")

#: What a process running ``headwise heads`` holds before any weight (interpreter, torch, headwise; measured 0.25 GB).
HELD = 250 * 10**6
#: The least the activations are given (as :data:`headwise.models.memory.MIN_WORKING`).
MIN_WORKING = 64 * 2**20


@dataclass(frozen=True)
class Costs:
    """The rates a plan uses.

    Attributes:
        convert_rate: stored bytes (bfloat16) turned into float32 per second.
        flops: float32 multiply-adds × 2 per second of a layer-sized matmul.
        where: the CPU, threads and load average they were measured at.
    """

    convert_rate: float
    flops: float
    where: str


def measure_costs(*, size: int = 2048, tokens: int = 256, repeats: int = 3) -> Costs:
    """The rates of this machine now: a ``(size, 4·size)`` bfloat16 matrix turned into float32 and a ``(T, size) ×
    (size, 4·size)`` float32 matmul, each timed ``repeats`` times, the best kept (a shared machine's noise is
    slower, never faster)."""
    import torch

    stored = torch.randn(size, 4 * size).to(torch.bfloat16)  # (D, 4D)
    x = torch.randn(tokens, size)  # (T, D)
    w = torch.randn(size, 4 * size)  # (D, 4D)
    best_convert = best_matmul = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        stored.to(torch.float32)
        best_convert = min(best_convert, time.perf_counter() - start)
        start = time.perf_counter()
        x @ w
        best_matmul = min(best_matmul, time.perf_counter() - start)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    where = f"{cpu_name()}, {torch.get_num_threads()} threads, load average {load:.1f}"
    return Costs(stored.numel() * 2 / best_convert, 2 * tokens * size * 4 * size / best_matmul, where)


@dataclass(frozen=True)
class LayerPlan:
    """One model's plan (:func:`plan_layers`).

    Attributes:
        name: the model; layers: NL; layer_params: P of one block; layer_bytes: its float32 bytes.
        peak: bytes one machine holds at its peak, layer by layer.
        read_seconds / compute_seconds: one pass of T tokens through every layer on one machine.
        tokens: T; batches: B, the passes the machines' columns time.
        machines: N → ``(bytes per machine, seconds for B passes, whether the shard stays resident)``.
    """

    name: str
    layers: int
    layer_params: int
    layer_bytes: int
    peak: int
    read_seconds: float
    compute_seconds: float
    tokens: int
    batches: int
    machines: dict[int, tuple[int, float, bool]]

    @property
    def pass_seconds(self) -> float:
        return self.read_seconds + self.compute_seconds


def plan_layers(
    arch: Architecture,
    costs: Costs,
    *,
    tokens: int = 512,
    batches: int = 32,
    stored_bytes: int = 2,
    machines: tuple[int, ...] = (1, 2, 4, 8),
    memory: int | None = None,
) -> LayerPlan:
    """The time and peak memory of running ``arch`` layer by layer.

    Args:
        arch: the architecture (:func:`headwise.sizing.get_arch`); costs: the rates (:func:`measure_costs`).
        tokens: T, the tokens of one pass (one batch); batches: B, the passes the N-machine columns time.
        stored_bytes: bytes a stored parameter takes (2: bfloat16 safetensors; about 0.56 for a Q4_K GGUF file).
        machines: the N to plan for; memory: each machine's memory in bytes (default: this one's).
    Returns:
        a :class:`LayerPlan`.
    Raises:
        ValueError: tokens, batches or a machine count below 1, naming it.
    """
    for name, value in (("tokens", tokens), ("batches", batches), *(("machines", n) for n in machines)):
        if value < 1:
            raise ValueError(f"{name}: expected a positive integer, got {value}")
    if memory is None:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    parts = param_breakdown(arch)
    n = arch.num_layers
    layer = (parts.attention + parts.ffn + parts.layer_norms) // n  # P of one block (experts all counted)
    d, f, h = arch.hidden_size, arch.intermediate_size, arch.num_heads
    working = max(MIN_WORKING, tokens * (6 * d + 3 * f) * 4 + 2 * h * tokens * tokens * 4)  # (T, D) buffers, (H, T, T)
    peak = HELD + layer * (4 + stored_bytes) + working
    read = n * layer * stored_bytes / costs.convert_rate
    compute = n * (2 * layer * tokens + 4 * tokens * tokens * h * arch.head_dim) / costs.flops
    plans: dict[int, tuple[int, float, bool]] = {}
    for k in machines:
        shard = -(-n // k)  # layers of the largest shard
        resident = HELD + shard * layer * 4 + working
        if k == 1:
            plans[k] = (peak, batches * (read + compute), False)
        elif resident <= memory:  # the shard read once, then B batches through k stages
            plans[k] = (resident, read * shard / n + (batches + k - 1) * compute * shard / n, True)
        else:
            plans[k] = (peak, (batches + k - 1) * (read + compute) * shard / n, False)
    return LayerPlan(arch.name, n, layer, 4 * layer, peak, read, compute, tokens, batches, plans)


def _time(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.1f} s"
    return f"{seconds / 60:.1f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def planning_table(archs, *, tokens: int = 512, batches: int = 32, costs: Costs | None = None):
    """``headwise size --memory``'s table: ``(title, headers, rows, note)``, every cell a string. One row per
    architecture: its parameters, float32 per layer, the peak and one pass (reading + computing) on one machine, and
    ``batches`` passes on 1, 2, 4 and 8 machines (memory per machine; "kept": the shard stays resident). ``costs``:
    :func:`measure_costs` when None (about a second)."""
    from headwise.sizing.count import total_params
    from headwise.sizing.units import format_count

    costs = costs or measure_costs()
    headers = ["model", "params", "f32/layer", "peak", "1 pass", f"{batches} passes", "N=2", "N=4", "N=8"]
    rows = []
    for arch in archs:
        plan = plan_layers(arch, costs, tokens=tokens, batches=batches)
        cells = [_time(plan.machines[1][1])]
        for k in (2, 4, 8):
            held, seconds, kept = plan.machines[k]
            cells.append(f"{_time(seconds)} ({held / 1e9:.1f} GB{' kept' if kept else ''})")
        rows.append([arch.name, format_count(total_params(arch)), f"{plan.layer_bytes / 1e9:.2f} GB",
                     f"{plan.peak / 1e9:.2f} GB",
                     f"{_time(plan.pass_seconds)} ({_time(plan.read_seconds)} + {_time(plan.compute_seconds)})",
                     *cells])  # fmt: skip
    title = (f"layer by layer: a pass of {tokens} tokens (reading + computing); {batches} passes on 1 and N machines "
             "(memory per machine)")  # fmt: skip
    note = (f"measured here: {costs.where}; bf16 → float32 {costs.convert_rate / 1e9:.2f} GB/s, float32 matmul "
            f"{costs.flops / 1e9:.1f} GFLOP/s. Weights bfloat16, files in the page cache; N machines: layer shards as "
            "pipeline stages, a shard that fits a machine's memory (this one's) kept there (\"kept\"); the activations "
            "sent between stages left out.")  # fmt: skip
    return title, headers, rows, note
