"""``headwise circuit`` across ranks, resumable by stage (:func:`headwise.study.circuit_across_ranks` with ``out``):
each stage's gathered result (the edges' scores, the exact patches, the faithfulness curve, the circuit) is kept in
``OUT/stages``; a second run loads every stage and runs no pass (no progress at all) and gives the same circuit; a
lost or damaged stage alone is computed again; a manifest of another run is refused with one line; under ``torchrun
--max-restarts 1`` a rank killed in the faithfulness stage restarts, the stages saved before are loaded, and the
circuit equals the one-process run's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from _corpus import free_port, max_difference  # noqa: E402
from _pairs import pairs_decoder  # noqa: E402
from headwise import study  # noqa: E402
from headwise.circuits import find_circuit  # noqa: E402

#: Two ranks against one process: a pair's rows run in a batch of another size round differently in float32
#: (as tests/distributed/test_circuit_ranks.py measures).
TOL = 1e-6
STAGES = ["attribution", "exact", "faithfulness", "circuit", "mib"]
OPTIONS = {"exact_top": 5}


pytestmark = pytest.mark.usefixtures("one_thread")  # the reference at the ranks' thread count


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    folder, hm, c, x, answer, wrong = pairs_decoder(tmp_path_factory.mktemp("circuit_resume"))
    want = find_circuit(hm, c, x, answer=answer, wrong=wrong, **OPTIONS).to_dict()
    return folder, hm, c, x, answer, wrong, want


@pytest.fixture
def world_of_one():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


def _run(setup, out, **options):
    _, hm, c, x, answer, wrong, _ = setup
    seen: list = []
    run = study.circuit_across_ranks(
        hm, c, x, answer=answer, wrong=wrong, out=out, progress=lambda *a: seen.append(a), **(OPTIONS | options)
    )
    return run, seen


def test_stages_are_kept_and_resumed(setup, tmp_path, world_of_one):
    want = setup[-1]
    run, seen = _run(setup, tmp_path)
    assert run.computed == STAGES and run.resumed == [] and seen
    assert max_difference(run.circuit.to_dict(), want) == 0.0
    stages = tmp_path / "stages"
    assert sorted(p.name for p in stages.iterdir()) == ["manifest.json"] + [f"shard-{k:06d}.safetensors" for k in
                                                                             range(5)]  # fmt: skip
    # a second run loads every stage: no pass runs (no progress) and the circuit is the same
    again, seen = _run(setup, tmp_path)
    assert again.computed == [] and again.resumed == STAGES and seen == []
    assert max_difference(again.circuit.to_dict(), want) == 0.0
    # a lost stage and a damaged one are computed again, nothing else
    (stages / "shard-000002.safetensors").unlink()
    (stages / "shard-000000.safetensors").write_bytes(b"\x00" * 12)
    third, seen = _run(setup, tmp_path)
    assert third.computed == ["attribution", "faithfulness"] and third.resumed == ["exact", "circuit", "mib"]
    assert {s for s, _, _ in seen} == {"attribution", "faithfulness"}
    assert max_difference(third.circuit.to_dict(), want) == 0.0


def test_a_wrong_stage_changes_the_circuit(setup, tmp_path, world_of_one):
    """The comparison can fail: scores kept from another run's pairs are loaded and change the circuit."""
    from safetensors.torch import load_file, save_file

    want = setup[-1]
    _run(setup, tmp_path)
    path = tmp_path / "stages" / "shard-000000.safetensors"
    state = load_file(path)
    save_file({"values": -state["values"]}, path)
    wrong, _ = _run(setup, tmp_path)
    assert wrong.resumed[0] == "attribution"
    with pytest.raises(AssertionError):
        assert max_difference(wrong.circuit.to_dict(), want) == 0.0


def test_another_runs_manifest_is_refused(setup, tmp_path, world_of_one):
    _run(setup, tmp_path)
    before = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*")}
    with pytest.raises(ValueError, match=r"^--out: .*stages holds shards of another run \(inputs_sha256"):
        _run(setup, tmp_path, exact_top=3)
    assert {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*")} == before
    with pytest.raises(TypeError, match="'stages' is chosen here"):
        _run(setup, tmp_path, stages=None)


@pytest.mark.slow
def test_a_killed_rank_restarts_from_the_kept_stages_and_equals(setup, tmp_path):
    """Rank 1 kills itself (SIGKILL) in the faithfulness stage; torchrun (``--max-restarts 1``) restarts both
    ranks, which load the attribution and exact stages and compute the rest; the circuit equals the one-process
    run's."""
    folder, _, c, x, answer, wrong, want = setup
    sys.path.insert(0, str(Path(__file__).parent))
    from test_circuit_ranks import _max_relative
    from test_patch_ranks import _env

    torch.save({"clean": c, "corrupted": x, "answer": answer, "wrong": wrong, "options": OPTIONS}, tmp_path / "in.pt")
    out = tmp_path / "out"
    run = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--max-restarts", "1",
         "--monitor-interval", "0.2", "--master-port", str(free_port()),
         str(Path(__file__).parent / "workers" / "circuit_restart_worker.py"), str(folder), str(out),
         str(tmp_path / "in.pt")],
        env=_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    log = run.stdout + run.stderr
    assert run.returncode == 0, log
    assert "attempt 0 rank 1 killed in faithfulness" in log
    for r in (0, 1):
        line = log.split(f"attempt 1 rank {r} computed ")[1].splitlines()[0]
        computed, resumed = (json.loads(part) for part in line.split(" resumed "))
        assert resumed == ["attribution", "exact"] and computed == ["faithfulness", "circuit", "mib"]
    assert _max_relative(json.loads((out / "circuit.json").read_text()), want) <= TOL
    assert not list(out.rglob(".*.tmp"))
