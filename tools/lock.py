"""The lock: every distribution a venv holds, pinned exactly (``pip freeze``), and what moved against it.

    python tools/lock.py write VENV LOCK     # LOCK := VENV's distributions, ``name==version`` a line, sorted
    python tools/lock.py moved VENV LOCK     # print what VENV has that LOCK pins otherwise (or not at all)

The Makefile's ``make lock`` builds a scratch venv from ``constraints.txt`` alone (the newest versions allowed) and
writes ``requirements.lock`` from it; every other pip call of the Makefile and CI installs through that lock
(``pip -c requirements.lock``), so a fresh clone installs what the suite was run with. ``make test-latest`` builds
the same scratch venv, runs the fast suite on it and prints what moved. A local version label (``+cpu``) is dropped:
``torch==2.13.0`` matches the CPU wheel ``2.13.0+cpu`` that this machine keeps, and the project itself
(editable) is left out.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HEADER = """\
# The lock: every distribution `make test` installs, pinned exactly (pip freeze of a fresh venv).
# Regenerate with `make lock` (newest versions allowed by constraints.txt); `make test-latest` shows what moved.
# Every pip call of the Makefile goes through it (pip -c requirements.lock).
"""


def frozen(venv: str) -> dict[str, str]:
    out = subprocess.run(
        [str(Path(venv) / "bin" / "python"), "-m", "pip", "freeze", "--all", "--exclude-editable"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    pins = {}
    for line in out.splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.split("==", 1)
            pins[name.strip().lower().replace("_", "-")] = version.split("+", 1)[0].strip()
    return pins


def read(lock: str) -> dict[str, str]:
    pins = {}
    for line in Path(lock).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            pins[name.strip().lower().replace("_", "-")] = version.strip()
    return pins


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[0] not in ("write", "moved"):
        print("usage: lock.py write|moved VENV LOCK", file=sys.stderr)
        return 2
    verb, venv, lock = argv
    pins = frozen(venv)
    if verb == "write":
        body = "".join(f"{name}=={version}\n" for name, version in sorted(pins.items()))
        tmp = Path(lock + ".tmp")
        tmp.write_text(HEADER + body)
        tmp.replace(lock)
        print(f"{lock}: {len(pins)} distributions pinned")
        return 0
    old = read(lock)
    moved = [(n, old.get(n), v) for n, v in sorted(pins.items()) if old.get(n) != v]
    gone = [n for n in sorted(old) if n not in pins]
    for name, before, after in moved:
        print(f"  {name}: {before or '(not in the lock)'} -> {after}")
    for name in gone:
        print(f"  {name}: {old[name]} -> (not installed)")
    print(f"{len(moved)} moved, {len(gone)} no longer installed, against {lock}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
