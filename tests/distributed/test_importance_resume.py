"""``--importance`` across ranks, resumable (:func:`headwise.study.importance_across_ranks` with ``out``): a world of
one gloo rank equals the one-process call (whole arrays) and keeps one shard a batch and a phase; a second run loads
every shard and computes nothing (the result bitwise the same); a lost or damaged shard alone is computed again; a
manifest of another run is refused with one line, nothing touched; under ``torchrun --max-restarts 1`` a rank killed
in the middle restarts, its saved shards are loaded, and the result equals the one-process call."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

import torch.distributed as dist  # noqa: E402

from _corpus import free_port, make_corpus, make_model  # noqa: E402
from headwise import study  # noqa: E402
from headwise.analysis import head_importance  # noqa: E402
from headwise.models import open_model  # noqa: E402

#: Against the one-process call: the float64 sums of each batch added, then the batches' (measured ~1e-16).
TOL = 1e-9
OPTIONS = {"seed": 1, "random_orders": 2, "points": 7, "copies": 4}
FIELDS = ("importance", "importance_norm", "ablation", "random_curves")


pytestmark = pytest.mark.usefixtures("one_thread")  # the reference at the ranks' thread count


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("imp_resume")
    model, corpus = make_model(root / "model"), make_corpus(root / "corpus.txt", lines=10, seed=4)
    hm = open_model(model)
    lines = [line for line in corpus.read_text(errors="replace").splitlines() if line.strip()][:10]
    batches = list(study.text_batches(hm, lines, 3, lambda m: None))  # 4 batches (3, 3, 3, 1 lines)
    return model, hm, batches, head_importance(hm, batches, **OPTIONS)


@pytest.fixture
def world_of_one():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


def _same(got, want, tol=TOL) -> None:
    for name in FIELDS:
        np.testing.assert_allclose(getattr(got, name), getattr(want, name), rtol=0, atol=tol, err_msg=name)
    assert abs(got.base_loss - want.base_loss) <= tol
    assert (got.num_sequences, got.num_tokens) == (want.num_sequences, want.num_tokens)
    np.testing.assert_array_equal(got.order, want.order)
    np.testing.assert_array_equal(got.removed, want.removed)
    assert set(got.curves) == set(want.curves)
    for name in want.curves:
        np.testing.assert_allclose(got.curves[name], want.curves[name], rtol=0, atol=tol, err_msg=name)


def test_one_rank_equals_one_process_and_resumes(setup, tmp_path, world_of_one):
    _, hm, batches, want = setup
    run = study.importance_across_ranks(hm, batches, out=tmp_path, **OPTIONS)
    K = len(batches)
    assert run.computed == [(1, k) for k in range(K)] + [(2, k) for k in range(K)] and run.resumed == []
    _same(run.result, want)
    store = tmp_path / "importance-shards"
    [pruning] = [p for p in store.iterdir() if p.is_dir()]
    assert len(list(store.glob("shard-*.safetensors"))) == len(list(pruning.glob("shard-*.safetensors"))) == K
    assert json.loads((pruning / "manifest.json").read_text())["orders_sha256"].startswith(pruning.name[8:])
    assert not list(store.rglob(".*.tmp"))
    # a second run with the same out computes nothing and gives the same numbers, bit for bit
    again = study.importance_across_ranks(hm, batches, out=tmp_path, **OPTIONS)
    assert again.computed == [] and sorted(again.resumed) == sorted(run.computed)
    _same(again.result, run.result, tol=0.0)
    # a lost phase-2 shard and a damaged phase-1 shard are computed again, nothing else
    (pruning / "shard-000002.safetensors").unlink()
    (store / "shard-000001.safetensors").write_bytes(b"\x00" * 12)
    third = study.importance_across_ranks(hm, batches, out=tmp_path, **OPTIONS)
    assert third.computed == [(1, 1), (2, 2)] and len(third.resumed) == 2 * K - 2
    _same(third.result, run.result, tol=0.0)


def test_without_out_nothing_is_kept(setup, tmp_path, world_of_one, monkeypatch):
    _, hm, batches, want = setup
    monkeypatch.chdir(tmp_path)
    run = study.importance_across_ranks(hm, batches, **OPTIONS)
    _same(run.result, want)
    assert len(run.computed) == 2 * len(batches) and list(tmp_path.iterdir()) == []


def test_a_wrong_shard_changes_the_result(setup, tmp_path, world_of_one):
    """The comparison can fail: a phase-1 shard replaced by another batch's sums is loaded and shows."""
    import shutil

    _, hm, batches, want = setup
    study.importance_across_ranks(hm, batches, out=tmp_path, **OPTIONS)
    store = tmp_path / "importance-shards"
    shutil.copy(store / "shard-000000.safetensors", store / "shard-000003.safetensors")
    for folder in [p for p in store.iterdir() if p.is_dir()]:
        shutil.rmtree(folder)
    wrong = study.importance_across_ranks(hm, batches, out=tmp_path, **OPTIONS)
    assert (1, 3) in wrong.resumed
    with pytest.raises(AssertionError):
        _same(wrong.result, want)


def test_another_runs_manifest_is_refused(setup, tmp_path, world_of_one):
    _, hm, batches, _ = setup
    study.importance_across_ranks(hm, batches, out=tmp_path, **OPTIONS)
    before = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*")}
    with pytest.raises(ValueError, match=r"holds shards of another run .*seed 1 there, 2 now"):
        study.importance_across_ranks(hm, batches, out=tmp_path, **(OPTIONS | {"seed": 2}))
    with pytest.raises(ValueError, match=r"holds shards of another run .*batches_sha256"):
        study.importance_across_ranks(hm, batches[:3], out=tmp_path, **OPTIONS)
    assert {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*")} == before


@pytest.mark.slow
def test_a_killed_rank_restarts_without_recomputing_and_equals(setup, tmp_path):
    """Rank 1 kills itself (SIGKILL) in its second batch's phase 1, after its first batch's shard is saved;
    torchrun (``--max-restarts 1``) restarts both ranks, which load every shard saved before the kill and compute
    the rest; the result equals the one-process call."""
    model, hm, batches, want = setup
    out = tmp_path / "out"
    sys.path.insert(0, str(Path(__file__).parent))
    from test_patch_ranks import _env

    run = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--max-restarts", "1",
         "--monitor-interval", "0.2", "--master-port", str(free_port()),
         str(Path(__file__).parent / "workers" / "importance_restart_worker.py"), str(model), str(out),
         json.dumps(OPTIONS)],
        env=_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    log = run.stdout + run.stderr
    assert run.returncode == 0, log
    saved = json.loads(log.split("attempt 0 rank 1 saved ")[1].splitlines()[0])
    done = {}
    for r in (0, 1):
        line = log.split(f"attempt 1 rank {r} computed ")[1].splitlines()[0]
        computed, resumed = line.split(" resumed ")
        done[r] = ([tuple(x) for x in json.loads(computed)], [tuple(x) for x in json.loads(resumed)])
    every = sorted(k for r in done for part in done[r] for k in part)
    assert every == sorted((p, k) for p in (1, 2) for k in range(len(batches)))  # each shard once
    assert saved and {(1, k) for k in saved} <= set(done[1][1])  # the killed rank's saved shards are resumed
    _same(np.load(out / "result.npy", allow_pickle=True).item(), want)
    assert not list(out.rglob(".*.tmp"))


@pytest.mark.slow
def test_an_encoder_resumes_and_equals_one_process(tmp_path, world_of_one):
    """The bundled MiniLM (the embedding objective: the intact embeddings formed again for each batch's pruning
    sets): one gloo rank equals the one-process call, and a second run computes nothing, bit for bit."""
    hm = open_model(None)
    lines = ["God saw the light.", "And it was good, very good.", "The cat sat.", "A dog ran to the tree and back."]
    batches = [(e.ids, e.mask) for e in (hm.encode(lines[:2]), hm.encode(lines[2:]))]
    options = {"seed": 0, "random_orders": 1, "points": 5}
    want = head_importance(hm, batches, **options)
    run = study.importance_across_ranks(hm, batches, out=tmp_path, **options)
    # the encoder's importance packs each batch's sentences by length: a rank's share packs otherwise, float32
    # rounding of the forward-mode tangents (measured 5.2e-8 on values ≈ 0.05); the tolerance is 1e-6
    _same(run.result, want, tol=1e-6)
    again = study.importance_across_ranks(hm, batches, out=tmp_path, **options)
    assert again.computed == [] and len(again.resumed) == 4
    _same(again.result, run.result, tol=0.0)
