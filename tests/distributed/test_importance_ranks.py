"""``--importance`` across ranks: :func:`headwise.analysis.head_importance`'s ``reduce`` seam (two "ranks" as two
threads, each with its own copy of the model and its share of the batches, their sums added at a barrier) against
the one-process call, whole arrays; and ``torchrun … heads --importance`` at 2 gloo ranks against one process
(heads.json, heads.csv, pruning.csv)."""

from __future__ import annotations

import csv
import json
import threading

import numpy as np
import pytest

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from _corpus import make_corpus, make_model  # noqa: E402

#: One process against its batches split over ranks: the float64 sums added in another order, the float32 forwards
#: of each batch the same.
TOL = 1e-9
FIELDS = ("importance", "importance_norm", "ablation", "random_curves")


class ThreadRanks:
    """``world`` threads standing in for ranks: ``reduce(rank)`` is an all-reduce (sum) of float64 vectors at a
    barrier, every thread getting the same sum, added in rank order."""

    def __init__(self, world: int):
        self.world, self.barrier = world, threading.Barrier(world, timeout=120)
        self.parts: list = [None] * world
        self.calls = 0

    def reduce(self, rank: int):
        def add(values: np.ndarray) -> np.ndarray:
            self.parts[rank] = np.array(values, dtype=np.float64)
            self.barrier.wait()
            total = sum(self.parts[1:], self.parts[0].copy())
            self.barrier.wait()  # every thread has read the parts before the next call writes them
            if rank == 0:
                self.calls += 1
            return total

        return add

    def run(self, work) -> list:
        """``work(rank)`` in one thread per rank; the results in rank order. An error in one thread aborts the
        barrier (the others stop waiting) and fails the test with every error."""
        results: list = [None] * self.world
        errors: list = []

        def one(rank: int) -> None:
            try:
                results[rank] = work(rank)
            except Exception as e:  # noqa: BLE001 - reported in the test's thread
                errors.append(e)
                self.barrier.abort()

        threads = [threading.Thread(target=one, args=(r,)) for r in range(self.world)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        return results


def _open(folder):
    from headwise.models import open_model

    return open_model(folder)


@pytest.fixture(scope="module")
def decoder(tmp_path_factory, one_thread):  # two "ranks" on a shared machine, one thread each
    root = tmp_path_factory.mktemp("imp")
    model, corpus = make_model(root / "model"), make_corpus(root / "corpus.txt", lines=12, seed=3)
    return model, [line for line in corpus.read_text(errors="replace").splitlines() if line.strip()][:12]


def _batches(hm, lines, size):
    from headwise.study import text_batches

    return list(text_batches(hm, lines, size, lambda m: None))


def _assert_same(got, want, tol=TOL):
    for name in FIELDS:
        np.testing.assert_allclose(getattr(got, name), getattr(want, name), rtol=0, atol=tol, err_msg=name)
    assert abs(got.base_loss - want.base_loss) <= tol
    assert (got.num_sequences, got.num_tokens) == (want.num_sequences, want.num_tokens)
    np.testing.assert_array_equal(got.order, want.order)
    np.testing.assert_array_equal(got.removed, want.removed)
    for name in want.curves:
        np.testing.assert_allclose(got.curves[name], want.curves[name], rtol=0, atol=tol, err_msg=name)


@pytest.mark.parametrize("split", [[[0, 2], [1]], [[1], [0, 2]]])
def test_reduce_seam_over_two_thread_ranks_equals_one_process(decoder, split):
    """Each "rank" runs head_importance on its batches with the seam; every rank's result equals the one-process
    call on all of them, whichever way the batches are dealt."""
    from headwise.analysis import head_importance

    folder, lines = decoder
    one_hm = _open(folder)
    batches = _batches(one_hm, lines, 4)  # 3 batches of 4 lines
    want = head_importance(one_hm, batches, seed=2, random_orders=2, points=9, copies=4)
    ranks = ThreadRanks(2)
    # a rank's own model (the gates' and ablations' hooks are the module's), opened here: loading a model patches
    # torch and transformers globals for its duration, which two threads loading at once would leave patched
    models = [_open(folder) for _ in range(2)]

    def run(rank):
        mine = [batches[i] for i in split[rank]]
        return head_importance(
            models[rank], mine, seed=2, random_orders=2, points=9, copies=4, reduce=ranks.reduce(rank)
        )

    got = ranks.run(run)
    assert ranks.calls == 3  # the importance and objective, the single-head ablations, the pruning sets
    for rank in range(2):
        _assert_same(got[rank], want)


def test_reduce_identity_is_the_one_process_call(decoder):
    """A reduce that returns its input changes nothing on one process (the seam divides the same sums)."""
    from headwise.analysis import head_importance

    folder, lines = decoder
    hm = _open(folder)
    batches = _batches(hm, lines, 6)
    want = head_importance(hm, batches, seed=0, random_orders=1, points=5, copies=3)
    seen = []
    got = head_importance(
        hm, batches, seed=0, random_orders=1, points=5, copies=3, reduce=lambda v: seen.append(v.shape) or v
    )
    _assert_same(got, want, tol=1e-12)
    n = hm.num_layers * hm.num_heads
    assert seen[:2] == [(n + 3,), (n,)] and len(seen) == 3


def test_a_rank_left_out_changes_the_result(decoder):
    """The comparison can fail: a reduce that drops the other rank's share gives that share's numbers alone."""
    from headwise.analysis import head_importance

    folder, lines = decoder
    hm = _open(folder)
    batches = _batches(hm, lines, 4)
    full = head_importance(hm, batches, seed=0, random_orders=1, points=5, copies=4)
    part = head_importance(hm, batches[:1], seed=0, random_orders=1, points=5, copies=4, reduce=lambda v: v)
    with pytest.raises(AssertionError):
        _assert_same(part, full)


def _rows(path):
    return list(csv.reader(path.open()))


def _same_table(a, b, tol):
    assert a[0] == b[0] and len(a) == len(b)
    for x_row, y_row in zip(a[1:], b[1:]):
        for x, y in zip(x_row, y_row):
            try:
                assert abs(float(x) - float(y)) <= tol or x == y, (x, y)
            except ValueError:
                assert x == y


@pytest.mark.slow
@pytest.mark.parametrize("route", [[], ["--exact"]], ids=["estimate", "exact"])
def test_torchrun_importance_equals_one_process(tmp_path, route):
    """``torchrun --nproc-per-node 2 -m headwise heads --corpus … --importance`` (the estimate route, and ``--exact``):
    heads.json (the sweep's work and seconds aside: they count each run's own passes), heads.csv and pruning.csv equal
    the one-process run's."""
    import subprocess
    import sys
    from pathlib import Path

    from _corpus import free_port, max_difference

    sys.path.insert(0, str(Path(__file__).parent))
    from test_corpus_launch import TORCHRUN, _env, _heads_args

    from headwise.cli import main

    model, corpus = make_model(tmp_path / "model"), make_corpus(tmp_path / "corpus.txt", lines=16, seed=5)
    args = [*_heads_args(model, corpus, tmp_path / "one", batch_size=4), "--importance", "--importance-sentences", "12",
            *route]  # fmt: skip
    with pytest.raises(SystemExit) as stop:
        main(args[2:])
    assert stop.value.code in (0, None)
    out = tmp_path / "two"
    ranked = [*_heads_args(model, corpus, out, batch_size=4), "--importance", "--importance-sentences", "12", *route]
    run = subprocess.run(
        [*TORCHRUN, "--nproc-per-node", "2", "--master-port", str(free_port()), *ranked],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "importance across 2 ranks" in run.stdout
    one, two = (json.loads((d / "heads.json").read_text()) for d in (tmp_path / "one", out))
    factors = []  # ratios of an exact effect to a score: compared relatively (a small score magnifies rounding)
    for data in (one, two):
        data["importance"].pop("sweep")
        factors.append(data["importance"].get("exact_heads", {}).pop("factors", None))
    assert max_difference(two, one) <= 1e-6
    assert factors[1] == (None if factors[0] is None else pytest.approx(factors[0], rel=1e-5))
    for name in ("heads.csv", "pruning.csv"):
        _same_table(_rows(out / name), _rows(tmp_path / "one" / name), 1e-6)
