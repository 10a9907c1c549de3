"""The commands' flows (:mod:`headwise.commands`): one module per command under one naming rule, each options record
checked in one place with errors naming the option as the command line spells it, before any model is opened."""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from pathlib import Path

import pytest

import headwise.commands

COMMANDS = ("heads", "atlas", "patch", "circuit", "qk", "demo", "lab")


def test_one_module_per_command_under_one_naming_rule():
    """Every public module of commands/ is a command's, with ``run`` and its frozen ``…Options`` and ``…Result``."""
    found = {m.name for m in pkgutil.iter_modules(headwise.commands.__path__) if not m.name.startswith("_")}
    assert found == set(COMMANDS)
    for name in COMMANDS:
        module = importlib.import_module(f"headwise.commands.{name}")
        assert callable(module.run), name
        options = [v for k, v in vars(module).items() if k.endswith("Options") and dataclasses.is_dataclass(v)]
        results = [v for k, v in vars(module).items() if k.endswith("Result") and dataclasses.is_dataclass(v)]
        assert options and results, name
        assert all(o.__dataclass_params__.frozen for o in options), name


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda t: _patch(t, method="nope"), "--method: expected one of exact, attribution, got 'nope'"),
        (lambda t: _patch(t, direction="up"), "--direction: expected one of denoise, noise, got 'up'"),
        (lambda t: _patch(t, out=t / "file"), "--out: '"),
        (lambda t: _circuit(t, fraction=0.0), "--fraction: expected a number in (0, 1], got 0.0"),
        (lambda t: _circuit(t, metric="kl"), "--metric: 'kl' has no gradient on the clean run"),
        (lambda t: _circuit(t, pairs=t / "pairs.jsonl", clean=("a",)), "--pairs: given with --clean"),
        (lambda t: _circuit(t, mib=t / "m", evaluate=t / "e.json"), "given with --evaluate"),
        (lambda t: _qk(t, text="  "), "--text: expected a non-empty text"),
        (lambda t: _demo(t, model="gpt"), "--model: expected one of auto, untrained, minilm, smollm2, got 'gpt'"),
        (lambda t: _lab("InductionOptions", out=t, seeds="1,x"), "--seeds: expected comma-separated"),
        (lambda t: _lab("InductionOptions", out=t, seeds="1,2", seed=3), "--seed: 3 given with --seeds"),
        (lambda t: _lab("HeadsVsOneOptions", out=t, workers=0), "--workers: expected a positive integer, got 0"),
        (lambda t: _lab("CircuitsOptions", out=t, tasks="offset,offset"), "--tasks: expected distinct names"),
        (lambda t: _lab("PruneOptions", model=t, ablation="half"), "--ablation: expected one of zero, mean"),
    ],
    ids=[
        "patch-method", "patch-direction", "patch-out", "circuit-fraction", "circuit-kl", "circuit-pairs",
        "circuit-mib", "qk-text", "demo-model", "lab-seeds", "lab-seed", "lab-workers", "lab-tasks", "lab-ablation",
    ],
)  # fmt: skip
def test_an_options_record_refuses_a_mistake_naming_the_option(tmp_path, build, message):
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError) as e:
        build(tmp_path)
    assert str(e.value).startswith(message) or message in str(e.value)


def test_lab_run_is_chosen_by_the_options_type():
    from headwise.commands import lab

    with pytest.raises(TypeError, match="options: expected one of the lab's options records, got dict"):
        lab.run({})


def _patch(t: Path, **changes):
    from headwise.commands.patch import PatchOptions

    given = dict(model="m", clean="a b", corrupted="a c", answer="b", wrong="c", out=t / "out") | changes
    return PatchOptions(**given)


def _circuit(t: Path, **changes):
    from headwise.commands.circuit import CircuitOptions

    return CircuitOptions(**(dict(model="m", out=t / "out") | changes))


def _qk(t: Path, **changes):
    from headwise.commands.qk import QkOptions

    return QkOptions(**(dict(model="m", text="a b", head="0.0", query=-1, out=t / "out") | changes))


def _demo(t: Path, **changes):
    from headwise.commands.demo import DemoOptions

    return DemoOptions(**(dict(text="a b", out=t / "out") | changes))


def _lab(name: str, **given):
    from headwise.commands import lab

    return getattr(lab, name)(**given)
