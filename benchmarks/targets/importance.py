"""``headwise heads --importance`` before and after the batched sweep, side by side in one run, and the plain statistics
at 1,024 tokens beside the sdpa forward.

Each case is a fresh process, timed from interpreter start to every file written; OLD runs the same command from
another source tree (``HEADWISE_OLD_SRC``, a ``src`` folder; default: a detached worktree of :data:`BASELINE`, the
code before the batched sweep, made under the system's temporary folder), NEW this checkout's ``src``. Cases:

- ``smollm2``: ``headwise heads --model smollm2 --corpus sample --importance`` (the default sample: 64 lines; quick:
  ``--importance-sentences 8``). Goal ≤ 180 s (full).
- ``smollm2_1024``: the same on one 1,024-token line, against the forward passes it needs (the sweep's
  forward-equivalents, read from heads.json, plus the gates' forward and backward counted as 3) at the sdpa
  forward's time on those tokens. Goal ≤ 1.2 × (full only: OLD takes about 15 minutes).
- ``minilm``: ``headwise heads --corpus sample --importance`` (the bundled all-MiniLM-L6-v2; quick: 8 sentences).
  Goal ≤ 180 s (full; OLD full only).
- ``stats_1024``: ``headwise heads --model smollm2 TEXT`` on 1,024 tokens ÷ the sdpa forward of those tokens
  (``benchmarks/heads_long.py``). Goal ≤ 4.

Printed per case: OLD and NEW seconds, NEW ÷ OLD, and NEW's sweep (passes, copies a pass, memory budget).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from machine import ROOT, log
from row import Row

from targets.base import Mode, Target, md_row

#: The commit before the batched sweep: what OLD runs when ``HEADWISE_OLD_SRC`` is not set.
BASELINE = "5b40c4c"


def old_src(tmp: Path) -> str:
    """OLD's ``src``: ``HEADWISE_OLD_SRC``, or a detached worktree of :data:`BASELINE` under ``tmp``."""
    given = os.environ.get("HEADWISE_OLD_SRC")
    if given:
        return given
    tree = tmp / "old"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), BASELINE], check=True)
    return str(tree / "src")


def drop_tree(src: str) -> None:
    if not os.environ.get("HEADWISE_OLD_SRC"):
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(Path(src).parent)], check=False)


def timed(src: str, argv: list[str], out: Path) -> dict:
    """``headwise ARGV --out OUT`` with ``PYTHONPATH=src``: wall seconds and heads.json's importance summary."""
    env = {**os.environ, "PYTHONPATH": src, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    start = time.perf_counter()
    p = subprocess.run(
        [sys.executable, "-m", "headwise", *argv, "--out", str(out)], env=env, cwd=ROOT, capture_output=True, text=True
    )
    wall = time.perf_counter() - start
    if p.returncode != 0:
        return {"error": (p.stderr.strip().splitlines() or ["failed"])[-1], "seconds": None}
    summary = json.loads((out / "heads.json").read_text()).get("importance", {})
    return {"seconds": wall, "sweep": summary.get("sweep", {}), "base_loss": summary.get("base_loss")}


def one_line(L: int, tmp: Path) -> Path:
    """A one-line corpus of exactly L SmolLM2 tokens (``benchmarks/heads_long.py``'s text)."""
    import heads_long

    from headwise.models import open_model

    text, _ = heads_long.tokens(open_model("smollm2"), L)
    path = tmp / f"line{L}.txt"
    path.write_text(text.replace("\n", " ") + "\n")
    return path


class Importance(Target):
    name = "importance"
    title = "`headwise heads --importance` before and after the batched sweep; the statistics at 1,024 tokens"

    def measure(self, mode: Mode):
        import heads_long

        data: dict = {}
        rows = []
        sample = [] if mode.full else ["--importance-sentences", "8"]
        with tempfile.TemporaryDirectory() as tmp_name:
            tmp = Path(tmp_name)
            old = old_src(tmp)
            new = str(ROOT / "src")
            try:
                cases = {
                    "smollm2": (["heads", "--model", "smollm2", "--corpus", "sample", "--importance", *sample], True),
                    "minilm": (["heads", "--corpus", "sample", "--importance", *sample], True),
                }
                if mode.full:
                    line = one_line(1024, tmp)
                    cases["smollm2_1024"] = (
                        ["heads", "--model", "smollm2", "--corpus", str(line), "--importance"],
                        True,
                    )
                for case, (argv, with_old) in cases.items():
                    got = {}
                    for label, src in (("new", new), ("old", old)) if with_old else (("new", new),):
                        got[label] = timed(src, argv, tmp / f"{case}_{label}")
                        log(f"importance {case} {label}: {got[label]}")
                    data[case] = got
            finally:
                drop_tree(old)
            data["stats_1024"] = heads_long.measure(1024)
            log(f"importance stats_1024: {data['stats_1024']}")
        goal = 180.0
        for case, label in (("smollm2", "SmolLM2"), ("minilm", "MiniLM")):
            d = data[case]
            new_s, old_s = d["new"]["seconds"], d.get("old", {}).get("seconds")
            note = f"OLD {old_s:.0f} s" if old_s else "OLD not run"
            text = f"heads --importance, {label}, {'64' if mode.full else '8'} lines: seconds"
            rows.append(Row.at_most(text, new_s, goal, note) if mode.full else Row(text, new_s, None, None, note))
        if "smollm2_1024" in data:
            d = data["smollm2_1024"]["new"]
            sdpa = data["stats_1024"]["sdpa_forward_s"]
            passes = (d["sweep"].get("forward_equivalents") or 0) + 3
            rows.append(
                Row.at_most(
                    "heads --importance, SmolLM2, one 1,024-token line: time ÷ (forwards needed × sdpa forward)",
                    d["seconds"] / (passes * sdpa) if d["seconds"] and sdpa else None,
                    1.2,
                    f"{d['seconds']:.0f} s; {passes:.0f} forwards × {sdpa:.2f} s",
                )
            )
        s = data["stats_1024"]
        rows.append(
            Row.at_most(
                "heads --model smollm2, 1,024 tokens: time ÷ the sdpa forward's",
                s["heads_s"] / s["sdpa_forward_s"] if s.get("heads_s") and s.get("sdpa_forward_s") else None,
                4.0,
                f"{s.get('heads_s') or 0:.1f} s vs {s.get('sdpa_forward_s') or 0:.2f} s",
            )
        )
        return self.result(rows, cases=data)

    def render(self, r):
        lines = [
            "Each case a fresh process, from interpreter start to files written; OLD is the code before the batched "
            "sweep, NEW this checkout, run one after the other in one run.",
            "",
            md_row(["case", "OLD", "NEW", "NEW ÷ OLD", "NEW's sweep"]),
            "|---|---|---|---|---|",
        ]
        for case, d in r.data["cases"].items():
            if case == "stats_1024":
                continue
            new, old = d["new"], d.get("old", {})
            sw = new.get("sweep") or {}
            ratio = new["seconds"] / old["seconds"] if new.get("seconds") and old.get("seconds") else None
            lines.append(
                md_row(
                    [
                        case,
                        f"{old['seconds']:.0f} s" if old.get("seconds") else "—",
                        f"{new['seconds']:.0f} s" if new.get("seconds") else new.get("error", "—"),
                        f"{ratio:.2f}" if ratio else "—",
                        f"{sw.get('passes')} passes × ≤ {sw.get('copies')} copies, "
                        f"{sw.get('forward_equivalents', 0):.0f} forward-equivalents"
                        if sw
                        else "—",
                    ]
                )
            )
        return lines + [""]
