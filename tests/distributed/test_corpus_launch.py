"""``torchrun … -m headwise heads --model M --corpus FILE --out DIR`` on gloo: 2 and 4 ranks, two nodes meeting at a
localhost rendezvous, a rank killed by SIGKILL and the restart — each run's heads.json and heads.csv against the
one-process run's, whole; nothing half-written in ``--out`` at any moment; and bad input (more ranks than documents,
ranks with different models, an unreachable rendezvous, a stalled rank) as one line per rank, nothing written."""

from __future__ import annotations

import contextlib
import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from _corpus import free_port, heads_json, make_corpus, make_model, max_difference  # noqa: E402
from headwise.cli import main  # noqa: E402

WORKERS = Path(__file__).parent / "workers"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
#: The distributed files equal the one-process ones to this (measured: ~1e-15, float64 sums in another order).
TOL = 1e-6
WAIT_S = 300


def _env(**extra) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def _heads_args(model, corpus, out, batch_size=4) -> list[str]:
    return ["-m", "headwise", "heads", "--model", str(model), "--corpus", str(corpus), "--out", str(out),
            "--batch-size", str(batch_size)]  # fmt: skip


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The model, the corpus and the one-process run's --out."""
    root = tmp_path_factory.mktemp("launch")
    model, corpus = make_model(root / "model"), make_corpus(root / "corpus.txt")
    with pytest.raises(SystemExit) as stop:
        main(_heads_args(model, corpus, root / "one")[2:])
    assert stop.value.code in (0, None)
    return model, corpus, root / "one"


def _assert_same_outputs(out: Path, reference: Path) -> None:
    assert max_difference(heads_json(out), heads_json(reference)) <= TOL
    rows = [list(csv.reader((d / "heads.csv").open())) for d in (out, reference)]
    assert rows[0][0] == rows[1][0] and len(rows[0]) == len(rows[1])
    for a, b in zip(rows[0][1:], rows[1][1:]):
        for x, y in zip(a, b):
            try:
                assert abs(float(x) - float(y)) <= TOL or (x == y)
            except ValueError:
                assert x == y


def _whole(path: Path) -> bool:
    """Whether a file under --out is whole: a temporary name, or a file its reader accepts."""
    import json

    name = path.name
    if name.startswith(".") and name.endswith(".tmp"):
        return True
    data = path.read_bytes()
    if name.endswith(".json"):
        json.loads(data)
    elif name.endswith(".safetensors"):
        from safetensors.torch import load

        load(data)
    elif name.endswith(".png"):
        return data.startswith(b"\x89PNG") and data.endswith(b"IEND\xaeB`\x82")
    elif name.endswith(".html"):
        return data.rstrip().endswith(b"</html>")
    return True


def _watch(procs, out: Path, *, until=None, timeout_s=WAIT_S):
    """Poll ``out`` every few ms while ``procs`` run, asserting every file there is whole; ``until(files)``: called
    at each look, stops the watch early when it returns True. Returns the exit codes (None while running)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        files = [p for p in out.rglob("*") if p.is_file()] if out.exists() else []
        for p in files:
            with contextlib.suppress(FileNotFoundError):  # renamed away between the listing and the read
                assert _whole(p), p
        if until is not None and until(files):
            return [p.poll() for p in procs]
        if all(p.poll() is not None for p in procs):
            return [p.returncode for p in procs]
        time.sleep(0.005)
    for p in procs:
        p.kill()
    pytest.fail(f"still running after {timeout_s} s")


def _torchrun(args: list[str], log: Path, **env) -> subprocess.Popen:
    return subprocess.Popen(
        [*TORCHRUN, *args], env=_env(**env), stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True
    )


@pytest.mark.slow
@pytest.mark.parametrize("ranks", [2, 4])
def test_ranks_equal_one_process(tiny, tmp_path, ranks):
    model, corpus, one = tiny
    out = tmp_path / "out"
    port = free_port()
    args = ["--nproc-per-node", str(ranks), "--master-port", str(port), *_heads_args(model, corpus, out)]
    proc = _torchrun(args, tmp_path / "log")
    codes = _watch([proc], out)
    log = (tmp_path / "log").read_text()
    assert codes == [0], log
    assert f"{ranks} ranks, 30 documents" in log
    _assert_same_outputs(out, one)
    assert sorted(p.name for p in (out / "shards").iterdir()) == ["manifest.json"] + [
        f"shard-{k:06d}.safetensors" for k in range(8)
    ]
    if ranks == 2:  # a second run on another number of ranks resumes every shard: nothing computed, the same files
        stamps = {p.name: p.stat().st_mtime_ns for p in (out / "shards").iterdir()}
        args = ["--nproc-per-node", "3", "--master-port", str(free_port()), *_heads_args(model, corpus, out)]
        again = _torchrun(args, tmp_path / "log3")
        assert _watch([again], out) == [0], (tmp_path / "log3").read_text()
        assert "3 ranks, 30 documents; rank 0: 0 shard(s) computed" in (tmp_path / "log3").read_text()
        assert {p.name: p.stat().st_mtime_ns for p in (out / "shards").iterdir()} == stamps
        _assert_same_outputs(out, one)


@pytest.mark.slow
def test_two_nodes_at_a_localhost_rendezvous(tiny, tmp_path):
    """Two torchrun launches (``--nnodes 2``, one rank each) meet at a c10d rendezvous on localhost."""
    model, corpus, one = tiny
    out, port = tmp_path / "out", free_port()
    nodes = [
        _torchrun(
            ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint",
             f"127.0.0.1:{port}", "--rdzv-id", "two-nodes", *_heads_args(model, corpus, out)],
            tmp_path / f"node{n}.log",
        )
        for n in range(2)
    ]  # fmt: skip
    codes = _watch(nodes, out)
    logs = [(tmp_path / f"node{n}.log").read_text() for n in range(2)]
    assert codes == [0, 0], logs
    assert sum("2 ranks, 30 documents" in log for log in logs) == 1  # rank 0 reports, on one of the nodes
    _assert_same_outputs(out, one)


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        found += [int(c) for c in text]
    return found


@pytest.mark.slow
def test_killed_rank_restarts_without_recomputing_and_equals(tiny, tmp_path):
    """A rank killed by SIGKILL mid-run: torchrun (``--max-restarts 1``) restarts the ranks, which load the shards
    already saved (their files untouched) and compute the rest; the outputs equal the one-process run's."""
    model, _, _ = tiny
    corpus = make_corpus(tmp_path / "long.txt", lines=240, seed=1)
    one = tmp_path / "one"
    with pytest.raises(SystemExit):
        main(_heads_args(model, corpus, one, batch_size=1)[2:])
    out, port = tmp_path / "out", free_port()
    args = ["--nproc-per-node", "2", "--max-restarts", "1", "--monitor-interval", "0.2", "--master-port", str(port),
            *_heads_args(model, corpus, out, batch_size=1)]  # fmt: skip
    proc = _torchrun(args, tmp_path / "log")

    def some_shards(files):
        return sum(p.suffix == ".safetensors" and not p.name.startswith(".") for p in files) >= 4

    assert _watch([proc], out, until=some_shards) == [None], (tmp_path / "log").read_text()
    workers = _children(proc.pid)
    assert len(workers) == 2, workers
    os.kill(workers[1], signal.SIGKILL)
    saved = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in (out / "shards").glob("shard-*")}
    assert 4 <= len(saved) < 240  # killed in the middle
    codes = _watch([proc], out)
    log = (tmp_path / "log").read_text()
    assert codes == [0], log
    assert "SIGKILL" in log or "Signals.SIGKILL" in log or "-9" in log, log
    after = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in (out / "shards").glob("shard-*")}
    assert len(after) == 240 and all(after[name] == saved[name] for name in saved)  # not computed again
    assert "resumed" in log
    _assert_same_outputs(out, one)
    assert not list((out / "shards").glob(".*.tmp"))


# -- bad input: one line per rank, exit 2, nothing written ------------------------------------------------------


def _spawn_ranks(argvs: list[list[str]], tmp_path: Path, *, first_only=False, **env) -> list[tuple[int, str, str]]:
    """Start one process per argv with torchrun's variables for a world of len(argvs); their (exit, stderr, stdout).
    ``first_only``: wait for rank 0 alone, then kill the others (their results: None)."""
    port = free_port()
    procs = []
    for rank, argv in enumerate(argvs):
        e = _env(RANK=rank, WORLD_SIZE=len(argvs), LOCAL_RANK=rank, MASTER_ADDR="127.0.0.1", MASTER_PORT=port, **env)
        procs.append(subprocess.Popen([sys.executable, *argv], env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))  # fmt: skip
    results = []
    for rank, p in enumerate(procs):
        if first_only and rank > 0:
            p.kill()
            p.communicate()
            results.append(None)
            continue
        out, err = p.communicate(timeout=WAIT_S)
        results.append((p.returncode, err, out))
    return results


def _one_line(err: str, *words: str) -> None:
    lines = [line for line in err.strip().splitlines() if not line.startswith("Writing model shards")]
    assert len(lines) == 1 and lines[0].startswith("headwise: error:"), err
    assert "Traceback" not in err
    for w in words:
        assert w in lines[0], (w, lines[0])


def _nothing_in(out: Path) -> None:
    assert not out.exists() or not [p for p in out.rglob("*") if p.is_file()], list(out.rglob("*"))


@pytest.mark.slow
def test_more_ranks_than_documents(tiny, tmp_path):
    model, _, _ = tiny
    corpus = tmp_path / "two.txt"
    corpus.write_text("the cat sat\nthe dog ran\n")
    out = tmp_path / "out"
    results = _spawn_ranks([_heads_args(model, corpus, out, batch_size=1)] * 3, tmp_path)
    for code, err, _ in results:
        assert code == 2
        _one_line(err, "WORLD_SIZE: 3 ranks for 2 document(s)")
    _nothing_in(out)


@pytest.mark.slow
def test_fewer_shards_than_ranks_names_batch_size(tiny, tmp_path):
    model, corpus, _ = tiny
    out = tmp_path / "out"
    results = _spawn_ranks([_heads_args(model, corpus, out, batch_size=20)] * 3, tmp_path)
    for code, err, _ in results:
        assert code == 2
        _one_line(err, "--batch-size: 2 shard(s) of 20 documents for 3 ranks; expected --batch-size ≤ 10")
    _nothing_in(out)


@pytest.mark.slow
def test_ranks_with_different_models(tiny, tmp_path):
    model, corpus, _ = tiny
    other = make_model(tmp_path / "other", seed=3)
    out = tmp_path / "out"
    results = _spawn_ranks([_heads_args(model, corpus, out), _heads_args(other, corpus, out)], tmp_path)
    for code, err, _ in results:
        assert code == 2
        _one_line(err, "--model (SHA-256 of the weights): the ranks differ", "rank 0:", "rank 1:")
    _nothing_in(out)


@pytest.mark.slow
def test_unreachable_rendezvous(tiny, tmp_path):
    """Rank 1 of 2 whose MASTER_ADDR:MASTER_PORT nobody serves: one line after the timeout."""
    model, corpus, _ = tiny
    out, port = tmp_path / "out", free_port()
    e = _env(RANK=1, WORLD_SIZE=2, LOCAL_RANK=1, MASTER_ADDR="127.0.0.1", MASTER_PORT=port, HEADWISE_DIST_TIMEOUT=3)
    started = time.monotonic()
    p = subprocess.run([sys.executable, *_heads_args(model, corpus, out)], env=e, capture_output=True, text=True,
                       timeout=WAIT_S)  # fmt: skip
    assert p.returncode == 2
    _one_line(p.stderr, "MASTER_ADDR:MASTER_PORT: rank 1 of 2 could not meet the others", f"127.0.0.1:{port}")
    assert time.monotonic() - started < 120
    _nothing_in(out)


@pytest.mark.slow
def test_stalled_rank_is_named_by_the_timeout(tiny, tmp_path):
    model, corpus, _ = tiny
    out = tmp_path / "out"
    argv = [str(WORKERS / "corpus_worker.py"), str(model), str(corpus), str(out), "1", "120", "4"]
    started = time.monotonic()
    results = _spawn_ranks([argv, argv], tmp_path, first_only=True)
    code, _, stdout = results[0]
    assert code == 3 and "error: rank 0: the barrier before the reduction failed" in stdout, results
    assert "Ranks 1 failed to pass monitoredBarrier" in stdout or "Rank 1 failed" in stdout, stdout
    assert time.monotonic() - started < 100, "waited for the stalled rank instead of timing out"
    assert not (out / "heads.json").exists()


@pytest.mark.slow
def test_torchrun_without_batch_size_splits_a_small_corpus(tmp_path):
    """30 documents on 3 ranks without ``--batch-size`` (the default 32 would be one shard): shards of 10, the
    one-process run's statistics; then the same ``--out`` on 2 ranks resumes every shard (none computed)."""
    model, corpus = make_model(tmp_path / "model"), make_corpus(tmp_path / "corpus.txt")
    one = tmp_path / "one"
    with pytest.raises(SystemExit) as stop:
        main(["heads", "--model", str(model), "--corpus", str(corpus), "--out", str(one), "--batch-size", "10"])
    assert stop.value.code in (0, None)
    out = tmp_path / "out"
    heads = ["-m", "headwise", "heads", "--model", str(model), "--corpus", str(corpus), "--out", str(out)]
    for ranks, log, computed in ((3, "log3", 1), (2, "log2", 0)):
        proc = _torchrun(["--nproc-per-node", str(ranks), "--master-port", str(free_port()), *heads], tmp_path / log)
        text = (tmp_path / log).read_text() if _watch([proc], out) == [0] else pytest.fail((tmp_path / log).read_text())
        assert f"{ranks} ranks, 30 documents; rank 0: {computed} shard(s) computed" in text, text
        manifest = json.loads((out / "shards" / "manifest.json").read_text())
        assert manifest["batch_size"] == 10 and manifest["shards"] == 3
        _assert_same_outputs(out, one)
