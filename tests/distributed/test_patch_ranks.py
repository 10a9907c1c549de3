"""Activation patching across ranks (:func:`headwise.study.patch_across_ranks`, ``torchrun … -m headwise patch``):
the shards are the one-process batches, a world of one gloo rank and a world of two equal the one-process sweep
(whole tensors), the shards resume and a manifest of another run is refused; the command under torchrun writes the
one-process files; bad input is one line per rank, exit 2, nothing written."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from _corpus import free_port, max_difference  # noqa: E402
from _pairs import PAIRS, pairs_decoder  # noqa: E402
from headwise import study  # noqa: E402
from headwise.patching import logit_difference, patch_heads, patch_positions  # noqa: E402

#: The files under torchrun against the one-process run's: equal to this (the shards are the one-process batches,
#: so the values come from the same computation; measured 0).
TOL = 1e-6
WAIT_S = 300


pytestmark = pytest.mark.usefixtures("one_thread")  # the references at the ranks' thread count


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    return pairs_decoder(tmp_path_factory.mktemp("patch_ranks"))


@pytest.fixture
def world_of_one():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


def _same(a: torch.Tensor, b: torch.Tensor, tol: float = 0.0) -> None:
    assert a.shape == b.shape
    assert torch.equal(a.isnan(), b.isnan())
    assert float((a - b).nan_to_num().abs().max()) <= tol


# -- the shards ------------------------------------------------------------------------------------------------


def test_plan_sweep_cuts_the_one_process_batches(setup):
    _, hm, _, _, _, _ = setup
    shards = study.plan_sweep(hm, 10, [(1, 2), (0, 3)], 3)
    heads = [(layer, head, None) for layer in range(2) for head in range(4)]
    positions = [(layer, head, t) for layer, head in [(1, 2), (0, 3)] for t in range(10)]
    assert [s.jobs for s in shards] == [tuple(heads[a : a + 3]) for a in range(0, 8, 3)] + [
        tuple(positions[a : a + 3]) for a in range(0, 20, 3)
    ]
    assert [s.kind for s in shards] == ["heads"] * 3 + ["positions"] * 7
    assert [s.index for s in shards] == list(range(10))
    # the work of a batch: jobs × the layers above its lowest (prefix reuse starts a batch of layer 1 there)
    assert [s.cost for s in shards[:3]] == [3 * 2, 3 * 2, 2 * 1]


def test_patch_heads_on_a_subset_of_heads(setup):
    """The head-subset entry: the chosen heads' values are the full sweep's (in batches of the subset: float32
    rounding of rows in other batches, 1e-5), every other head NaN, the passes those of the subset's batches."""
    _, hm, c, x, answer, wrong = setup
    metric = logit_difference(answer, wrong)
    full = patch_heads(hm, c, x, metric, batch_size=3)
    part = patch_heads(hm, c, x, metric, batch_size=2, heads=[(1, 3), (0, 1), (1, 0)])
    chosen = torch.zeros(2, 4, dtype=torch.bool)
    chosen[1, 3] = chosen[0, 1] = chosen[1, 0] = True
    assert bool(part.patched[:, ~chosen].isnan().all()) and not bool(part.patched[:, chosen].isnan().any())
    torch.testing.assert_close(part.patched[:, chosen], full.patched[:, chosen], rtol=0, atol=1e-5)
    assert part.passes == 2 + 2 and part.rows == 2 * 3 + 3 * 3
    same = patch_heads(hm, c, x, metric, batch_size=3, heads={0: [0, 1, 2]})  # the full sweep's first batch
    _same(same.patched[:, 0, :3], full.patched[:, 0, :3])
    with pytest.raises(ValueError, match="head"):
        patch_heads(hm, c, x, metric, heads=[(0, 4)])


def test_patch_across_one_rank_equals_one_process_and_resumes(setup, tmp_path, world_of_one):
    _, hm, c, x, answer, wrong = setup
    metric = logit_difference(answer, wrong)
    for direction in ("denoise", "noise"):
        reference = patch_heads(hm, c, x, metric, direction=direction, batch_size=3)
        positions = patch_positions(hm, c, x, metric, [(1, 2), (0, 0)], direction=direction, batch_size=3)
        out = tmp_path / direction
        seen = []
        run = study.patch_across_ranks(
            hm, c, x, metric, heads=[(1, 2), (0, 0)], direction=direction, batch_size=3, out=out,
            progress=lambda d, t, seen=seen: seen.append((d, t)),
        )  # fmt: skip
        assert run.rank == 0 and run.world_size == 1 and run.computed == list(range(10)) and seen[-1] == (10, 10)
        _same(run.patching.patched, reference.patched)  # the same batches: bitwise
        _same(run.positions, positions)
        _same(run.patching.metric_clean, reference.metric_clean)
        assert run.patching.passes == reference.passes and run.patching.rows == reference.rows
        assert run.payload_bytes > 0
        # a second run with the same out and options computes nothing; a lost and a damaged shard are recomputed
        (out / "shards" / "shard-000004.safetensors").unlink()
        (out / "shards" / "shard-000001.safetensors").write_bytes(b"\x00" * 12)
        again = study.patch_across_ranks(
            hm, c, x, metric, heads=[(1, 2), (0, 0)], direction=direction, batch_size=3, out=out
        )
        assert again.computed == [1, 4] and again.resumed == [0, 2, 3, 5, 6, 7, 8, 9]
        _same(again.patching.patched, reference.patched)
        _same(again.positions, positions)


def test_patch_across_ranks_refuses_another_runs_shards(setup, tmp_path, world_of_one):
    _, hm, c, x, answer, wrong = setup
    metric = logit_difference(answer, wrong)
    study.patch_across_ranks(hm, c, x, metric, batch_size=3, out=tmp_path)
    before = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "shards").iterdir()}
    with pytest.raises(ValueError, match=r"holds shards of another run .*batch_size 3 there, 2 now"):
        study.patch_across_ranks(hm, c, x, metric, batch_size=2, out=tmp_path)
    with pytest.raises(ValueError, match=r"holds shards of another run .*direction 'denoise' there, 'noise' now"):
        study.patch_across_ranks(hm, c, x, metric, batch_size=3, direction="noise", out=tmp_path)
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / "shards").iterdir()} == before


def test_patch_across_ranks_bad_input(setup, tmp_path, world_of_one):
    _, hm, c, x, answer, wrong = setup
    metric = logit_difference(answer, wrong)
    with pytest.raises(ValueError, match="direction"):
        study.patch_across_ranks(hm, c, x, metric, direction="sideways", out=tmp_path / "a")
    with pytest.raises(ValueError, match="corrupted: expected the clean input's shape"):
        study.patch_across_ranks(hm, c, x[:, :-1], metric, out=tmp_path / "a")
    with pytest.raises(ValueError, match="head"):
        study.patch_across_ranks(hm, c, x, metric, heads=[(0, 9)], out=tmp_path / "a")
    assert not (tmp_path / "a").exists()


def test_patch_across_ranks_outside_a_launch_is_refused(setup, monkeypatch):
    _, hm, c, x, answer, wrong = setup
    for name in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ValueError, match="RANK / WORLD_SIZE: not set"):
        study.patch_across_ranks(hm, c, x, logit_difference(answer, wrong))


# -- two gloo ranks --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def two_ranks(setup, tmp_path_factory, launch_world):
    folder, _, c, x, answer, wrong = setup
    workdir = tmp_path_factory.mktemp("patch_world")
    cases = [
        {"batch_size": 3, "heads": [(1, 2)]},
        {"batch_size": 1, "direction": "noise"},
    ]
    torch.save(
        {"model": str(folder), "clean": c, "corrupted": x, "answer": answer, "wrong": wrong, "patch": cases,
         "circuit": []},
        workdir / "cases.pt",
    )  # fmt: skip
    return cases, launch_world("sweep_worker.py", 2, workdir)


@pytest.mark.slow
def test_two_ranks_equal_one_process(setup, two_ranks):
    _, hm, c, x, answer, wrong = setup
    metric = logit_difference(answer, wrong)
    cases, ranks = two_ranks
    assert [r["world"] for r in ranks] == [2, 2]
    for k, options in enumerate(cases):
        first, second = ranks[0]["patch"][k], ranks[1]["patch"][k]
        assert second["patched"] is None and second["positions"] is None  # rank 0 alone holds the result
        shards = study.plan_sweep(hm, c.shape[1], options.get("heads", []), options["batch_size"])
        assert sorted(first["shards"] + second["shards"]) == list(range(len(shards)))  # each shard once
        assert first["shards"] and second["shards"]
        direction = options.get("direction", "denoise")
        reference = patch_heads(hm, c, x, metric, direction=direction, batch_size=options["batch_size"])
        _same(first["patched"], reference.patched, TOL)
        assert first["passes"] == reference.passes
        if options.get("heads"):
            positions = patch_positions(hm, c, x, metric, options["heads"], batch_size=options["batch_size"])
            _same(first["positions"], positions, TOL)
        assert first["payload_bytes"] == second["payload_bytes"] > 0


@pytest.mark.slow
def test_a_killed_rank_restarts_without_recomputing_and_equals(setup, tmp_path):
    """Rank 1 kills itself (SIGKILL) after its second shard; torchrun (``--max-restarts 1``) restarts both ranks,
    which load every shard saved before the kill (its file untouched) and compute the rest; the result equals the
    one-process sweep."""
    folder, hm, c, x, answer, wrong = setup
    heads = [(1, 2), (0, 1)]
    torch.save({"clean": c, "corrupted": x, "answer": answer, "wrong": wrong, "heads": heads}, tmp_path / "cases.pt")
    out = tmp_path / "out"
    run = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--max-restarts", "1",
         "--monitor-interval", "0.2", "--master-port", str(free_port()),
         str(Path(__file__).parent / "workers" / "patch_restart_worker.py"), str(folder), str(out),
         str(tmp_path / "cases.pt")],
        env=_env(), capture_output=True, text=True, timeout=WAIT_S,
    )  # fmt: skip
    log = run.stdout + run.stderr
    assert run.returncode == 0, log
    saved = json.loads(log.split("attempt 0 rank 1 saved ")[1].splitlines()[0])
    done: dict[int, tuple[list, list]] = {}
    for r in (0, 1):
        line = log.split(f"attempt 1 rank {r} computed ")[1].splitlines()[0]
        computed, resumed = line.split(" resumed ")
        done[r] = (json.loads(computed), json.loads(resumed))
    every = sorted(k for r in done for part in done[r] for k in part)
    assert every == list(range(len(study.plan_sweep(hm, c.shape[1], heads, 1))))  # each shard once
    assert set(saved) <= set(done[0][1] + done[1][1])  # the killed rank's saved shards are resumed, not recomputed
    result = torch.load(out / "result.pt", weights_only=False)
    metric = logit_difference(answer, wrong)
    _same(result["patched"], patch_heads(hm, c, x, metric, batch_size=1).patched, TOL)
    _same(result["positions"], patch_positions(hm, c, x, metric, heads, batch_size=1), TOL)
    assert not list((out / "shards").glob(".*.tmp"))


# -- the command under torchrun ---------------------------------------------------------------------------------


def _env(**extra) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def _patch_args(folder, out, *extra) -> list[str]:
    clean, corrupted, answer, wrong = PAIRS[0]
    return ["-m", "headwise", "patch", "--model", str(folder), "--clean", clean, "--corrupted", corrupted,
            "--answer", answer, "--wrong", wrong, "--out", str(out), *extra]  # fmt: skip


def _assert_same_files(out: Path, reference: Path) -> None:
    a, b = (json.loads((d / "patching.json").read_text()) for d in (out, reference))
    for report in (a, b):
        report.pop("seconds"), report.pop("forward_seconds")  # wall times
    assert max_difference(a, b) <= TOL
    rows = [list(csv.reader((d / "patching.csv").open())) for d in (out, reference)]
    assert len(rows[0]) == len(rows[1]) and rows[0][0] == rows[1][0]
    for r, s in zip(rows[0][1:], rows[1][1:]):
        for u, v in zip(r, s):
            assert u == v or abs(float(u) - float(v)) <= TOL
    assert (out / "patching.png").read_bytes() == (reference / "patching.png").read_bytes()


@pytest.mark.slow
def test_torchrun_patch_writes_the_one_process_files_and_resumes(setup, tmp_path):
    folder = setup[0]
    one = tmp_path / "one"
    extra = ("--head", "1.2", "--batch-size", "3")
    p = subprocess.run([sys.executable, *_patch_args(folder, one, *extra)], env=_env(), capture_output=True,
                       text=True, timeout=WAIT_S)  # fmt: skip
    assert p.returncode == 0, p.stderr
    out = tmp_path / "out"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    for line in ("rank 0: ", "rank 0: 0 batch(es) computed"):  # the second run resumes every shard
        run = subprocess.run([*torchrun, "--master-port", str(free_port()), *_patch_args(folder, out, *extra)],
                             env=_env(), capture_output=True, text=True, timeout=WAIT_S)  # fmt: skip
        assert run.returncode == 0, run.stdout + run.stderr
        assert "2 ranks; " + line in run.stdout, run.stdout
        _assert_same_files(out, one)
        assert sorted(p.name for p in out.iterdir()) == ["patching.csv", "patching.json", "patching.png", "shards"]
        assert len(list((out / "shards").glob("shard-*.safetensors"))) == 3 + 4  # 8 heads, then 10 positions


def _spawn(argvs: list[list[str]]) -> list[tuple[int, str]]:
    """One process per argv with torchrun's variables for a world of len(argvs); their (exit, stderr)."""
    port = free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=_env(RANK=r, WORLD_SIZE=len(argvs), LOCAL_RANK=r, MASTER_ADDR="127.0.0.1", MASTER_PORT=port),
        )
        for r, argv in enumerate(argvs)
    ]  # fmt: skip
    errs = [p.communicate(timeout=WAIT_S)[1] for p in procs]
    return [(p.returncode, err) for p, err in zip(procs, errs)]


def _one_line(err: str, *words: str) -> None:
    lines = [line for line in err.strip().splitlines() if not line.startswith("Writing model shards")]
    assert len(lines) == 1 and lines[0].startswith("headwise: error:") and "Traceback" not in err, err
    for w in words:
        assert w in lines[0], (w, lines[0])


def _two_heads(folder: Path) -> Path:
    """A one-layer decoder of two query heads (one key/value group) with the tiny word tokenizer."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from _decoders import SPECIALS, WORDS, save_tokenizer

    config = AutoConfig.for_model(
        "llama", architectures=["LlamaForCausalLM"], hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64, vocab_size=len(SPECIALS) + len(WORDS),
        bos_token_id=0, eos_token_id=1, pad_token_id=2, initializer_range=0.5,
    )  # fmt: skip
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, attn_implementation="eager").save_pretrained(folder)
    save_tokenizer(folder)
    return folder


@pytest.mark.slow
def test_torchrun_patch_bad_input_is_one_line_per_rank(setup, tmp_path):
    folder, small = setup[0], _two_heads(tmp_path / "small")
    out = tmp_path / "out"
    for argvs, words in (
        ([_patch_args(small, out)] * 3, "WORLD_SIZE: 3 ranks for 2 heads to patch"),
        ([_patch_args(folder, out, "--batch-size", "5")] * 3, "--batch-size: 2 shard(s) of 5 patches for 3 ranks"),
        ([_patch_args(folder, out), _patch_args(folder, out, "--direction", "noise")], "options (SHA-256): the ranks"),
    ):
        for code, err in _spawn(argvs):
            assert code == 2
            _one_line(err, words)
        assert not out.exists()
