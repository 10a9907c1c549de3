"""``headwise size --memory``: the planning table of a run layer by layer, for 8B and 70B or a named model."""

from __future__ import annotations


def test_size_memory_prints_the_planning_table(run_cli):
    out = run_cli("size", "--memory")
    assert out.code == 0, out.err
    for words in ("Llama-3-8B", "Llama-3-70B", "peak", "N=8", "measured here:", "GFLOP/s"):
        assert words in out.out
    one = run_cli("size", "llama-2-7b", "--memory", "--seq-len", "128", "--batch", "4")
    assert one.code == 0 and "Llama-2-7B" in one.out and "a pass of 128 tokens" in one.out
    assert run_cli("size", "--all", "--memory").code == 2
