"""``python -m headwise`` / the console script end through :func:`headwise.cli.entry`: the command's status, every
line it printed, its ``atexit`` handlers and non-daemon threads all kept although the interpreter's teardown is
skipped."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def _run(code: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args], capture_output=True, text=True, timeout=120
    )


def test_a_command_keeps_its_status_output_and_files(tmp_path):
    out = tmp_path / "pe.png"
    run = subprocess.run([sys.executable, "-m", "headwise", "pe", "--out", str(out)], capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "pe.png" in run.stdout and out.is_file()
    bad = subprocess.run(
        [sys.executable, "-m", "headwise", "pe", "--nope"], capture_output=True, text=True, timeout=120
    )
    assert bad.returncode == 2
    assert len(bad.stderr.strip().splitlines()) == 1 and "--nope" in bad.stderr


def test_exit_handlers_threads_and_buffered_output_survive_the_prompt_exit():
    run = _run(
        """
        import atexit, sys, threading, time
        from headwise.cli import entry
        atexit.register(lambda: print("handler ran"))
        def late():
            time.sleep(0.3)
            print("thread finished")
        threading.Thread(target=late).start()
        sys.stdout.write("buffered, no newline")
        sys.argv = ["headwise", "--help"]
        entry()
        """
    )
    assert run.returncode == 0, run.stderr
    assert "buffered, no newline" in run.stdout
    assert run.stdout.index("thread finished") < run.stdout.index("handler ran")  # threads joined, then handlers


def test_statuses_as_python_gives_them():
    for body, status in (("sys.exit(None)", 0), ("sys.exit(3)", 3), ("sys.exit('gone')", 1)):
        run = _run(
            f"""
            import sys
            import headwise.cli as c
            def main(): {body}
            c.main = main
            c.entry()
            """
        )
        assert run.returncode == status, (body, run.stderr)
    assert "gone" in run.stderr
