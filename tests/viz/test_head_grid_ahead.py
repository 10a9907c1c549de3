"""``heads.png`` started ahead (:func:`headwise.viz.report.start_head_grid`) while the rest is printed and written:
the files are byte for byte those of the sequential call; a process that exits before the join (an error) stops the
child and leaves neither its temporary nor a running child behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from headwise import analysis as A
from headwise.viz.report import OUTPUTS, start_head_grid, write_heads_outputs

TOKENS = ["<s>", "the", "cat", "sat", "on", "the", "mat", "."]

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the child is forked (Linux)")


def _sentence(seed: int):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(3, 2, len(TOKENS), len(TOKENS))) * 3
    maps = np.exp(x - x.max(-1, keepdims=True))
    maps /= maps.sum(-1, keepdims=True)
    stats = A.HeadStats(3, 2, max_length=16)
    stats.update([m[None] for m in maps], A.token_info([TOKENS]))
    return A.SentenceHeads(stats.result(), list(TOKENS), maps.astype(np.float32))


@pytest.mark.parametrize("layer", [None, pytest.param(1, marks=pytest.mark.slow)])
def test_started_ahead_writes_what_the_sequential_call_writes(tmp_path, layer):
    s = _sentence(3)
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    write_heads_outputs(s, s.report, one, layer=layer, title="t")
    grid = start_head_grid(s, two, report=s.report, layer=layer, title="t")
    assert grid.pid is not None and grid.path == two / "heads.png"
    paths = write_heads_outputs(s, s.report, two, layer=layer, title="t", grid=grid)
    assert list(paths) == list(OUTPUTS) and grid.pid is None  # joined
    for name in OUTPUTS:
        assert (one / name).read_bytes() == (two / name).read_bytes(), name
    assert sorted(p.name for p in two.iterdir()) == sorted(OUTPUTS)


EXITS = """
import sys, time
from pathlib import Path
import headwise.viz.heads as heads_module
from headwise.viz.report import start_head_grid
sys.path.insert(0, sys.argv[2])
from test_head_grid_ahead import _sentence
from headwise._io import atomic_write

def sleeps_mid_write(attentions, tokens, path, **k):
    with atomic_write(path, "wb"):
        time.sleep(60)  # stopped long before

heads_module.plot_head_grid = sleeps_mid_write
out = Path(sys.argv[1])
grid = start_head_grid(_sentence(4), out, title="t")
print(grid.pid, flush=True)
deadline = time.monotonic() + 20
while not any(out.iterdir()) and time.monotonic() < deadline:  # the child's temporary
    time.sleep(0.01)
raise RuntimeError("the command failed before writing its outputs")
"""


@pytest.mark.slow  # the fast suite keeps a lighter test of the same path
def test_an_exit_before_the_join_stops_the_child_and_leaves_nothing(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", EXITS, str(tmp_path), str(Path(__file__).parent)],
        capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )  # fmt: skip
    assert proc.returncode == 1 and "failed before writing" in proc.stderr, proc.stderr
    pid = json.loads(proc.stdout.strip().splitlines()[0])
    assert list(tmp_path.iterdir()) == []  # the child's temporary removed
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # the child is gone (stopped and reaped, not left drawing)


def test_the_pictures_modules_are_imported_ahead_in_one_background_thread():
    """``prefetch_pictures`` imports matplotlib and the picture modules in one daemon thread (a second call starts
    none); the pictures joined after it are the ones drawn without it (fresh interpreter: nothing imported before)."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent(
        """
        import sys, threading
        import headwise.viz.report as report
        assert "matplotlib.figure" not in sys.modules
        report.prefetch_pictures()
        report.prefetch_pictures()
        threads = [t for t in threading.enumerate() if t.name == "headwise-prefetch-pictures"]
        assert len(threads) <= 1 and all(t.daemon for t in threads), threads
        report._prefetched()
        assert {"matplotlib.figure", "headwise.viz.heads", "headwise.viz.roles"} <= set(sys.modules)
        print("ok")
        """
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr
