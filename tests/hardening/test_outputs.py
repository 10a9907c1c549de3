"""Outputs and long work: every file under ``--out`` appears whole or not at all — also on Ctrl-C — and
``headwise heads --corpus`` streams (its memory does not grow with the corpus).

- SIGINT to a running ``headwise heads --corpus BIG --out DIR`` (a subprocess, the console script):
  exit status 130, one line ``headwise: interrupted``, no traceback, and DIR holds exactly what it held
  before (nothing, or the whole files of an earlier run, byte for byte) — no partial or temporary file.
- Ctrl-C (``KeyboardInterrupt``) at every file write of ``heads``, ``demo`` and ``pe``, injected just
  before the rename and in the middle of a picture: the earlier version or the whole new file, never a
  temporary one.
- The child is started with SIGINT at its default even when this run inherited it ignored; started with
  SIGINT ignored, the command honours that and finishes.
- A sweep of SIGINTs at spread-out moments of a short run (slow).
- Peak RSS of ``heads --corpus`` on 1,000 vs 10,000 sentences (slow).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from headwise import _io
from headwise.cli import main

HEADWISE = Path(sys.executable).with_name("headwise")
SAMPLE = Path(__file__).parents[2] / "src" / "headwise" / "data" / "corpus" / "web_sentences.txt"
HEADS_FILES = ["heads.csv", "heads.json", "heads.png", "headview.html", "roles.png"]


def corpus(path: Path, n: int, *, first: int = 320) -> Path:
    """``n`` lines cycled from the first ``first`` sentences of the bundled sample (short ones). 320 = 10
    batches of 32: every batch of a longer corpus is one the shorter corpus had already met, so any
    growth of memory with the corpus is a leak, not a new batch shape."""
    lines = SAMPLE.read_text(encoding="utf-8").splitlines()[:first]
    path.write_text("".join(lines[i % len(lines)] + "\n" for i in range(n)), encoding="utf-8")
    return path


def snapshot(folder: Path) -> dict[str, str]:
    """name -> sha256 of every entry of ``folder`` (hidden and temporary ones included)."""
    if not folder.exists():
        return {}
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def temporaries(folder: Path) -> list[str]:
    if not folder.exists():
        return []
    return [p.name for p in folder.iterdir() if p.name.startswith(_io.TEMP_PREFIX) or p.name.endswith(_io.TEMP_SUFFIX)]


def assert_whole(path: Path) -> None:
    """The file is complete: JSON parses, CSV rows have the header's width, pictures decode, HTML closes."""
    data = path.read_bytes()
    if path.suffix == ".json":
        json.loads(data)
    elif path.suffix == ".csv":
        rows = data.decode().splitlines()
        assert data.endswith(b"\n") and len(rows) > 1
        assert {r.count(",") for r in rows} == {rows[0].count(",")}, path  # no quoted commas in heads.csv
    elif path.suffix == ".png":
        import matplotlib.image as mpimg

        assert data[:8] == b"\x89PNG\r\n\x1a\n" and data.endswith(b"IEND\xaeB`\x82")
        mpimg.imread(path)
    elif path.suffix == ".html":
        assert data.rstrip().endswith(b"</html>"), path
    else:
        raise AssertionError(f"unexpected file {path.name}")


def earlier_run(out: Path) -> dict[str, str]:
    """Whole files of a first, quick run in ``out``; their hashes."""
    with pytest.raises(SystemExit) as stop:
        main(["heads", "The cat sat on the mat.", "--model", "untrained", "--out", str(out)])
    assert stop.value.code in (0, None)
    before = snapshot(out)
    assert sorted(before) == HEADS_FILES
    return before


def _open_files(pid: int) -> list[str]:
    try:
        return [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
    except OSError:  # the process is gone, or a descriptor closed while we looked
        return []


#: Sets SIGINT's disposition (argv[1]: SIG_DFL or SIG_IGN), then becomes argv[2:] (same process, so
#: the disposition is what the program starts with). A suite started without job control (``nohup
#: make test &``, a CI runner) inherits SIGINT ignored, and Python keeps an inherited ignore: a child
#: that is to be interrupted must be given the default back.
_WITH_SIGINT = (
    "import os, signal, sys; signal.signal(signal.SIGINT, getattr(signal, sys.argv[1])); "
    "os.execv(sys.argv[2], sys.argv[2:])"
)


def start_heads(big: Path, out: Path, *, sigint: str = "SIG_DFL") -> subprocess.Popen:
    """``headwise heads --corpus BIG --out OUT`` (the console script) with SIGINT at ``sigint``."""
    argv = [str(HEADWISE), "heads", "--corpus", str(big), "--model", "untrained", "--out", str(out)]
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    return subprocess.Popen(
        [sys.executable, "-c", _WITH_SIGINT, sigint, *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
    )


def interrupt(proc: subprocess.Popen, after_s: float) -> tuple[int, str, str]:
    time.sleep(after_s)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    return proc.returncode, out, err


def wait_until_reading(proc: subprocess.Popen, big: Path, timeout_s: float = 60) -> None:
    """Block until the process has the corpus open (it is inside the command, past imports and checks)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if str(big) in _open_files(proc.pid):
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    proc.kill()
    raise AssertionError("headwise heads never opened the corpus")


def assert_interrupted(code: int, err: str) -> None:
    """Exit 130, no traceback; besides the progress bar's last frame, exactly the one line
    ``headwise: interrupted``."""
    assert code == 130, (code, err)
    assert "Traceback" not in err, err
    lines = [line for line in err.strip().splitlines() if "heads corpus" not in line]  # the progress bar
    assert lines == ["headwise: interrupted"], err


def test_ctrl_c_prints_one_line(tmp_path, monkeypatch, capsys):
    from headwise import analysis

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(analysis, "analyze_texts", interrupted)
    with pytest.raises(SystemExit) as stop:
        main(["heads", "--corpus", str(corpus(tmp_path / "c.txt", 5)), "--model", "untrained", "--out", str(tmp_path)])
    assert stop.value.code == 130
    assert capsys.readouterr().err.strip().splitlines()[-1:] == ["headwise: interrupted"]


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc to see when the corpus is open")
@pytest.mark.parametrize(
    "earlier",
    [pytest.param(False, marks=pytest.mark.slow), pytest.param(True, marks=pytest.mark.slow)],
    ids=["empty-out", "over-earlier-output"],  # the fast suite: the Ctrl-C tests at every file write
)
def test_sigint_mid_corpus_leaves_the_folder_as_it_was(tmp_path, earlier):
    big = corpus(tmp_path / "big.txt", 20_000)  # minutes of work: the signal lands mid-corpus
    out = tmp_path / "out"
    before = earlier_run(out) if earlier else {}
    proc = start_heads(big, out)
    wait_until_reading(proc, big)
    code, _, err = interrupt(proc, 1.0)
    assert_interrupted(code, err)
    assert temporaries(out) == []
    assert snapshot(out) == before  # nothing new, nothing half-written, the earlier files untouched


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc to see when the corpus is open")
def test_an_inherited_sigint_ignore_is_honoured(tmp_path):
    """Started with SIGINT ignored (``nohup``), the command ignores it as asked and finishes its work."""
    small = corpus(tmp_path / "small.txt", 100)
    out = tmp_path / "out"
    proc = start_heads(small, out, sigint="SIG_IGN")
    wait_until_reading(proc, small)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err
    assert "interrupted" not in err and "Traceback" not in err, err
    assert temporaries(out) == [] and sorted(snapshot(out)) == HEADS_FILES
    for name in HEADS_FILES:
        assert_whole(out / name)


class _Stop(BaseException):
    pass


def _interrupting_replace(at: int):
    """``os.replace`` that raises KeyboardInterrupt on its ``at``-th call (the temporary file complete)."""
    real, calls = os.replace, {"n": 0}

    def replace(src, dst):
        calls["n"] += 1
        if calls["n"] == at:
            raise KeyboardInterrupt
        return real(src, dst)

    return replace, calls


COMMANDS = {
    "heads": (["heads", "A dog barked at the cat.", "--model", "untrained"], HEADS_FILES, None),
    "demo": (
        ["demo", "--model", "untrained", "--text", "the cat sat"],
        ["attention.png", "positional_encoding.png"],
        None,
    ),
    "pe": (["pe", "--max-len", "20", "--d-model", "16"], ["pe.png"], "pe.png"),
}


def _argv(command: str, out: Path) -> list[str]:
    argv, _, file_name = COMMANDS[command]
    return [*argv, "--out", str(out / file_name if file_name else out)]


@pytest.mark.parametrize("command", [c if c == "pe" else pytest.param(c, marks=pytest.mark.slow) for c in COMMANDS])
def test_ctrl_c_at_every_file_write_leaves_earlier_or_whole_files(command, tmp_path, monkeypatch, capsys):
    """KeyboardInterrupt just before the k-th rename, for every k: exit 130, no temporary file, every
    file present is either the earlier version (byte for byte) or a whole new one. Pictures are drawn in this
    process (a forked child would count its renames apart; a failed child is tested in tests/viz)."""
    import headwise.viz.report

    monkeypatch.setattr(headwise.viz.report, "_fork", lambda draw: None)
    real_replace = os.replace
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(SystemExit):
        main(_argv(command, out))
    files = COMMANDS[command][1]
    before = snapshot(out)
    assert sorted(before) == sorted(files)
    for k in range(1, len(files) + 1):
        replace, calls = _interrupting_replace(k)
        monkeypatch.setattr(_io.os, "replace", replace)
        with pytest.raises(SystemExit) as stop:
            main(_argv(command, out))
        monkeypatch.setattr(_io.os, "replace", real_replace)
        assert stop.value.code == 130 and calls["n"] == k, (k, stop.value.code, calls)
        err = capsys.readouterr().err
        assert "Traceback" not in err and err.strip().splitlines()[-1] == "headwise: interrupted", err
        assert temporaries(out) == [], (k, temporaries(out))
        now = snapshot(out)
        assert sorted(now) == sorted(files)
        for name in files:
            if now[name] != before[name]:
                assert_whole(out / name)
        renamed = sum(now[n] != before[n] for n in files)
        assert renamed <= k - 1  # the k-th file and later ones still hold the earlier version


def test_ctrl_c_in_the_middle_of_a_picture_leaves_the_earlier_one(tmp_path, monkeypatch):
    """Half a PNG written, then KeyboardInterrupt: the destination keeps the earlier picture."""
    import matplotlib.figure

    out = tmp_path / "pe.png"
    with pytest.raises(SystemExit):
        main(["pe", "--max-len", "10", "--d-model", "8", "--out", str(out)])
    before = out.read_bytes()
    real = matplotlib.figure.Figure.savefig

    def half_then_interrupt(self, fh, **kw):
        real(self, fh, **kw)
        fh.seek(0)
        fh.truncate(fh.tell() // 2 or 10)
        raise KeyboardInterrupt

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", half_then_interrupt)
    with pytest.raises(SystemExit) as stop:
        main(["pe", "--max-len", "30", "--d-model", "16", "--out", str(out)])
    assert stop.value.code == 130
    assert out.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pe.png"]


@pytest.mark.parametrize("kind", [ImportError, ValueError, RuntimeError])
def test_an_error_that_came_of_a_ctrl_c_is_an_interruption(kind, tmp_path, monkeypatch, capsys):
    """Ctrl-C inside an extension module's import surfaces as ``ImportError: initialization failed`` raised from the
    KeyboardInterrupt (matplotlib's ft2font, imported before a picture is forked): exit 130, "interrupted", no
    traceback, the earlier picture kept — as for the KeyboardInterrupt itself; the same error alone is a bug's
    traceback (or, for a ValueError, the one-line error)."""
    import matplotlib.figure

    out = tmp_path / "pe.png"
    with pytest.raises(SystemExit):
        main(["pe", "--max-len", "10", "--d-model", "8", "--out", str(out)])
    before = out.read_bytes()
    capsys.readouterr()

    def interrupted_inside(self, fh, **kw):
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as e:
            raise kind("initialization failed") from e

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", interrupted_inside)
    with pytest.raises(SystemExit) as stop:
        main(["pe", "--max-len", "30", "--d-model", "16", "--out", str(out)])
    err = capsys.readouterr().err
    assert stop.value.code == 130 and err.strip().splitlines()[-1] == "headwise: interrupted", err
    assert "Traceback" not in err and out.read_bytes() == before and temporaries(tmp_path) == []

    def plain_error(self, fh, **kw):
        raise kind("initialization failed")

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", plain_error)
    if kind is ValueError:
        with pytest.raises(SystemExit) as stop:
            main(["pe", "--max-len", "30", "--d-model", "16", "--out", str(out)])
        assert stop.value.code == 2
    else:
        with pytest.raises(kind, match="initialization failed"):
            main(["pe", "--max-len", "30", "--d-model", "16", "--out", str(out)])
    assert out.read_bytes() == before and temporaries(tmp_path) == []


def test_a_stopped_drawing_child_does_not_print_what_python_could_not_raise(monkeypatch, capsys):
    """SIGTERM's ``_Stopped`` raised where Python cannot raise (a finalizer; matplotlib's weakref callbacks) in a
    forked drawing child: nothing printed, the signal sent again so that the child unwinds at the next point it can;
    any other unraisable printed as Python prints it."""
    from headwise.viz import report

    sent = []
    monkeypatch.setattr(report.os, "kill", lambda pid, sig: sent.append((pid, sig)))
    monkeypatch.setattr(sys, "unraisablehook", report._unraisable_in_child)

    class Raises:
        def __init__(self, error):
            self.error = error

        def __del__(self):
            raise self.error

    Raises(report._Stopped())  # dropped at once: its finalizer raises where nothing can catch it
    assert sent == [(os.getpid(), signal.SIGTERM)] and capsys.readouterr().err == ""
    Raises(RuntimeError("boom"))
    assert sent == [(os.getpid(), signal.SIGTERM)] and "RuntimeError: boom" in capsys.readouterr().err


def test_atomic_write_leaves_nothing_on_error_and_replaces_whole(tmp_path):
    target = tmp_path / "a.txt"
    _io.write_text_atomic(target, "old\n")
    with pytest.raises(_Stop), _io.atomic_write(target, "w") as fh:
        fh.write("new, half")
        raise _Stop
    assert target.read_text() == "old\n" and sorted(p.name for p in tmp_path.iterdir()) == ["a.txt"]
    with _io.atomic_write(target, "wb") as fh:
        fh.write(b"new\n")
    assert target.read_bytes() == b"new\n" and temporaries(tmp_path) == []
    with pytest.raises(ValueError, match=r"mode: expected one of \('w', 'wb'\), got 'a'"):
        _io.atomic_write(target, "a").__enter__()
    with pytest.raises(FileNotFoundError):
        _io.write_text_atomic(tmp_path / "missing" / "x.txt", "x")


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc")
def test_sigint_sweep_over_a_whole_run(tmp_path):
    """SIGINT at ten moments spread over a short run — reading, computing, writing, exiting: every time,
    each file of the folder is the earlier version or a whole new one, and no temporary file is left.
    (A signal that lands after ``main`` has returned, while the interpreter exits, ends the process by
    SIGINT, status −2, with nothing printed: accepted.)"""
    small = corpus(tmp_path / "small.txt", 200)
    out = tmp_path / "out"
    before = earlier_run(out)
    proc = start_heads(small, out)
    wait_until_reading(proc, small)
    t0 = time.monotonic()
    proc.communicate(timeout=300)
    assert proc.returncode == 0
    run_s = time.monotonic() - t0  # from the corpus opened to the exit
    earlier_run(out)
    before = snapshot(out)
    outcomes = []
    for i in range(10):
        proc = start_heads(small, out)
        wait_until_reading(proc, small)
        code, _, err = interrupt(proc, i * run_s / 10)
        outcomes.append(code)
        assert code in (0, 130, -signal.SIGINT), (code, err)
        assert "Traceback" not in err, err
        if code == 130:
            assert_interrupted(code, err)
        assert temporaries(out) == []
        now = snapshot(out)
        assert sorted(now) == HEADS_FILES
        for name in HEADS_FILES:
            if now[name] != before[name]:
                assert_whole(out / name)
        earlier_run(out)  # back to the earlier version for the next moment
        before = snapshot(out)
    print(f"\nSIGINT sweep over a {run_s:.1f} s run: exit statuses {outcomes}")
    assert 130 in outcomes, outcomes


def peak_rss_mb(argv: list[str]) -> float:
    """Peak resident memory of ``argv`` run in a fresh child (``RUSAGE_CHILDREN`` of a wrapper)."""
    code = (
        "import resource, subprocess, sys; "
        "rc = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL).returncode; "
        "print(rc, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
    )
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    res = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, env=env, timeout=1800)
    rc, kb = res.stdout.split()
    assert rc == "0", res.stderr
    return int(kb) / 1024 if sys.platform != "darwin" else int(kb) / 2**20


#: Allowed growth of peak RSS from 1,000 to 10,000 sentences. Keeping what the untrained model's
#: attention maps alone occupy for 9,000 more sentences (≈ 4 heads × 20² tokens × 4 bytes each) would
#: add ≈ 58 MB; streaming keeps only running sums, bounded by max_length and the head count.
RSS_GROWTH_BOUND_MB = 20.0


@pytest.mark.slow
def test_heads_corpus_memory_is_flat_from_1k_to_10k_sentences(tmp_path):
    peaks = {}
    for n in (1_000, 10_000):
        big = corpus(tmp_path / f"c{n}.txt", n)
        argv = [str(HEADWISE), "heads", "--corpus", str(big), "--model", "untrained", "--out", str(tmp_path / f"o{n}")]
        peaks[n] = peak_rss_mb(argv)
    print(f"\npeak RSS: 1k sentences {peaks[1_000]:.1f} MB, 10k sentences {peaks[10_000]:.1f} MB")
    (tmp_path.parent / "rss.json").write_text(json.dumps(peaks))
    assert peaks[10_000] - peaks[1_000] <= RSS_GROWTH_BOUND_MB, peaks
    stats = json.loads((tmp_path / "o10000" / "heads.json").read_text())
    assert stats["corpus"]["sentences"] == 10_000


def test_one_mechanism_writes_every_file():
    """No module of the package writes a file other than through headwise._io.atomic_write."""
    src = Path(__file__).parents[2] / "src" / "headwise"
    writers = ("os.replace(", ".write_text(", ".write_bytes(", "shutil.copy", "torch.save(", "np.save(")
    offenders = []
    for path in sorted(src.rglob("*.py")):
        if path.name == "_io.py" or "data" in path.relative_to(src).parts:
            continue
        text = path.read_text(encoding="utf-8")
        offenders += [f"{path.relative_to(src)}: {w}" for w in writers if w in text]
        offenders += [f"{path.relative_to(src)}: {m}" for m in re.findall(r"\bopen\([^)]*[\"'][wxa]b?[\"']", text)]
        if "savefig(" in text and "atomic_write" not in text:
            offenders.append(f"{path.relative_to(src)}: savefig outside atomic_write")
    assert offenders == []
