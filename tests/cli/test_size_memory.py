"""``headwise size --memory``: the planning table of a run layer by layer, for 8B and 70B or a named model."""

from __future__ import annotations

import pytest


def test_size_memory_prints_the_planning_table(run_cli):
    out = run_cli("size", "--memory")
    assert out.code == 0, out.err
    for words in ("Llama-3-8B", "Llama-3-70B", "peak", "N=8", "measured here:", "GFLOP/s"):
        assert words in out.out
    one = run_cli("size", "llama-2-7b", "--memory", "--seq-len", "128", "--batch", "4")
    assert one.code == 0 and "Llama-2-7B" in one.out and "a pass of 128 tokens" in one.out
    assert run_cli("size", "--all", "--memory").code == 2


@pytest.mark.slow  # a run layer by layer and the planning table: 2 s
def test_a_run_layer_by_layer_is_recorded_and_size_memory_states_it(tmp_path, run_cli, monkeypatch):
    """A command run layer by layer appends its record (the whole process's peak, its seconds, the budget); ``size
    --memory`` marks the rows of a model of that size "run here" with its last run of each command, the others
    "extrapolated"; lines that are not a record are skipped; a model opened whole records nothing."""
    import json

    from _decoders import save_decoder
    from headwise.models.runs import recorded_runs, runs_path
    from headwise.sizing import get_arch
    from headwise.sizing.count import total_params

    folder = save_decoder(tmp_path / "llama", "llama")
    path = runs_path()
    before = path.read_text().splitlines() if path.exists() else []
    out = run_cli("heads", "the cat sat on the mat", "--model", str(folder), "--out", str(tmp_path / "whole"))
    assert out.code == 0, out.err
    assert (path.read_text().splitlines() if path.exists() else []) == before  # whole: nothing recorded
    from headwise.models import open_model

    hm = open_model(folder, by_layer=True)
    from headwise.models.runs import record_run

    record = record_run(hm, "heads", 12.3)
    assert (
        record is not None
        and record["peak"] > 0
        and record["parameters"] == sum(p.numel() for p in open_model(folder, by_layer=False).model.parameters())
    )
    assert recorded_runs(record["parameters"])[-1] == record
    # an 8 B row "run here" once a run of that size is recorded (a line written as a run of 8 B would be)
    eight = total_params(get_arch("llama-3-8b"))
    with open(path, "a", encoding="utf-8") as fh:
        fh.write("not a record\n")
        fh.write(json.dumps({**record, "parameters": eight, "command": "patch", "peak": 3.5e9}) + "\n")
    table = run_cli("size", "--memory")
    assert table.code == 0, table.err
    assert "(run here)" in table.out and "(extrapolated)" in table.out  # 8 B run, 70 B not
    assert "patch" in table.out and "3.50 GB" in table.out
