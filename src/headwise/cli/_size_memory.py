"""``headwise size --memory``: the planning table of a run layer by layer (:mod:`headwise.sizing.layers`)."""

from __future__ import annotations

#: The models planned when no NAME is given: Llama-shaped, 8 B and 70 B parameters.
DEFAULT_MODELS = ("llama-3-8b", "llama-3-70b")


def print_memory_plan(console, archs, *, tokens: int, batches: int) -> None:
    """Measure this machine's rates (about a second) and print one row per architecture: its float32 per layer, the
    peak and the time of one pass on one machine, and B passes across 2, 4 and 8 machines."""
    from rich.table import Table

    from headwise.sizing.layers import measure_costs, plan_layers
    from headwise.sizing.units import format_count

    costs = measure_costs()
    table = Table(title=f"layer by layer: a pass of {tokens} tokens (reading + computing); {batches} passes on 1 and "
                  "N machines (memory per machine)", header_style="bold")  # fmt: skip
    heads = ["model", "params", "f32/layer", "peak", "1 pass", f"{batches} passes", "N=2", "N=4", "N=8"]
    for name in heads:
        justify = "left" if name == "model" else "right"
        table.add_column(name, justify=justify)
    for arch in archs:
        plan = plan_layers(arch, costs, tokens=tokens, batches=batches)
        cells = []
        for k in (1, 2, 4, 8):
            held, seconds, resident = plan.machines[k]
            cells.append(
                f"{_time(seconds)}" + (f" ({held / 1e9:.1f} GB{' kept' if resident else ''})" if k > 1 else "")
            )
        from headwise.sizing import total_params

        table.add_row(arch.name, format_count(total_params(arch)), f"{plan.layer_bytes / 1e9:.2f} GB",
                      f"{plan.peak / 1e9:.2f} GB",
                      f"{_time(plan.pass_seconds)} ({_time(plan.read_seconds)} + {_time(plan.compute_seconds)})",
                      *cells)  # fmt: skip
    console.print(table)
    console.print(
        f"measured here: {costs.where}; bf16 → float32 {costs.convert_rate / 1e9:.2f} GB/s, float32 matmul "
        f"{costs.flops / 1e9:.1f} GFLOP/s. Weights bfloat16, files in the page cache; N machines: layer shards as "
        "pipeline stages, a shard that fits a machine's memory (this one's) kept there (\"kept\"); the activations "
        "sent between stages left out."
    )


def _time(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"
