"""Running ``headwise.cli.main`` in-process: exit status, stdout and stderr."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from headwise.cli import main


@dataclass
class Outcome:
    code: int
    out: str
    err: str


@pytest.fixture
def run_cli(capsys):
    """``run_cli("pe", "--out", "x.png")`` -> :class:`Outcome` (main always ends in SystemExit)."""

    def run(*argv: str) -> Outcome:
        capsys.readouterr()
        with pytest.raises(SystemExit) as stop:
            main(list(argv))
        captured = capsys.readouterr()
        code = stop.value.code
        return Outcome(0 if code is None else int(code), captured.out, captured.err)

    return run
