"""Every installed distribution is the one requirements.lock pins (the suite runs on what the lock says)."""

from __future__ import annotations

import os
import re
from importlib import metadata
from pathlib import Path

import pytest

LOCK = Path(__file__).resolve().parents[1] / "requirements.lock"


def _name(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _pins() -> dict[str, str]:
    pins = {}
    for line in LOCK.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, sep, version = line.partition("==")
            assert sep, f"requirements.lock: {line!r} is not pinned with =="
            pins[_name(name)] = version
    return pins


def test_the_lock_pins_torch_cpu_and_every_line_exactly():
    pins = _pins()
    assert pins["torch"] == "2.13.0"
    assert "headwise" not in pins


@pytest.mark.skipif(bool(os.environ.get("HEADWISE_UNLOCKED")), reason="make test-latest: the newest allowed versions")
def test_every_installed_distribution_is_pinned_by_the_lock():
    pins = _pins()
    off = []
    for dist in metadata.distributions():
        name = _name(dist.metadata["Name"] or "")
        if not name or name == "headwise":
            continue
        version = dist.version.split("+", 1)[0]
        if pins.get(name) != version:
            off.append(f"{name} {version} (lock: {pins.get(name, 'absent')})")
    assert not off, "installed but not as the lock pins: " + ", ".join(sorted(off))
