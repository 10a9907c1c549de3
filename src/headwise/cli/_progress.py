"""The command line's progress bar: a rich bar on stderr, fed by the library's progress callbacks."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from headwise.models import HeadModel


@contextmanager
def corpus_progress(
    total: int | None, *, label: str = "corpus", command: str = "heads"
) -> Iterator[Callable[[int, int], None]]:
    """A rich progress bar on stderr; yields the ``progress(texts, tokens)`` callback that moves it.

    Args:
        total: the number of texts (None: unknown, the bar only counts).
        label: the task's name on the bar; command: the command that names it.
    Yields:
        ``progress(texts, tokens)``: the texts and real tokens done so far, as
        :func:`headwise.analysis.analyze_texts` reports them.
    """
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    columns = (
        SpinnerColumn(),
        TextColumn(f"[bold cyan]{command}[/] {{task.description}}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("sentences · {task.fields[tokens]:,} tokens"),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=Console(stderr=True), transient=False) as bar:
        task = bar.add_task(label, total=total, tokens=0)

        def progress(texts: int, tokens: int) -> None:
            bar.update(task, completed=texts, tokens=tokens)

        yield progress


@contextmanager
def stage_progress(command: str = "heads") -> Iterator[Callable[[str, int, int], None]]:
    """A rich progress bar on stderr for work in named stages of ``command``; yields ``progress(stage, done, total)``
    (the callback of :func:`headwise.analysis.importance.head_importance`): one bar per stage."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    columns = (
        TextColumn(f"[bold cyan]{command}[/] {{task.description}}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=Console(stderr=True), transient=False) as bar:
        tasks: dict[str, int] = {}

        def progress(stage: str, done: int, total: int) -> None:
            if stage not in tasks:
                tasks[stage] = bar.add_task(stage, total=total)
            bar.update(tasks[stage], completed=done, total=total)

        yield progress


@contextmanager
def row_progress(hm: HeadModel, n: int) -> Iterator[Callable[[int, int, int], None] | None]:
    """A bar over layers × rows for a long example (≥ 2,048 tokens) of ``hm``; yields ``rows(layer, done, length)``
    (the streaming pass's ``row_progress``), or None for a shorter one."""
    if n < 2048:
        yield None
        return
    with stage_progress() as stage:
        total = hm.num_layers * n

        def rows(layer: int, done: int, length: int) -> None:
            stage(f"rows of {hm.num_layers} layers", min(total, layer * length + done), hm.num_layers * length)

        yield rows


class StepBar:
    """A rich progress bar on stderr: ``step`` is the trainer's callback (loss, tokens/s); ``advance`` counts runs."""

    def __init__(self, description: str, total: int, *, unit: str = "steps"):
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn(unit + "  {task.fields[loss]}  {task.fields[speed]}"),
            TimeElapsedColumn(),
            console=Console(stderr=True),
            transient=False,
        )
        self.task = self.progress.add_task(description, total=total, loss="", speed="")

    def __enter__(self):
        self.progress.__enter__()
        return self

    def __exit__(self, *exc):
        return self.progress.__exit__(*exc)

    def step(self, p) -> None:
        speed = f"{p.tokens_per_s / 1000:.1f}k tok/s"
        self.progress.update(self.task, advance=1, loss=f"loss {p.loss:.3f}", speed=speed)

    def advance(self, note: str) -> None:
        self.progress.update(self.task, advance=1, loss=note)


#: Seconds between two lines of :func:`layer_progress` (a pass that takes less says nothing).
LAYER_EVERY = 5.0


@contextmanager
def layer_progress(hm: HeadModel, command: str | None = None) -> Iterator[None]:
    """While ``hm`` (opened layer by layer: ``hm.stream``) runs, one line on stderr at most every :data:`LAYER_EVERY`
    seconds: the pass, the layer it reached and the time left in that pass, from the seconds its layers took so far
    (reading and computing); nothing for a model opened whole, or for passes quicker than that. ``command`` given: a
    run that ends without an error is recorded (:func:`headwise.models.runs.record_run`, what ``size --memory``
    states)."""
    stream = getattr(hm, "stream", None)
    if stream is None:
        yield
        return
    import sys
    import time

    from headwise.models.streamed import layer_list

    prefix, blocks = layer_list(stream.model)
    index = {f"{prefix}.{k}": k for k in range(len(blocks))}
    n = len(blocks)
    state = {"pass": 0, "start": 0.0, "last": time.perf_counter(), "read": 0.0, "back": False}

    def on_unit(unit: str, _position: int, _units: int) -> None:
        k = index.get(unit)
        if k is None:
            return
        now = time.perf_counter()
        back = stream.direction == "backward"  # a layer walk's backward pass brings the layers in reverse
        if k == (n - 1 if back else 0) or back != state["back"]:
            state.update({"pass": state["pass"] + 1, "start": now, "read": stream.seconds, "back": back})
            return
        done = n - 1 - k if back else k
        if now - state["last"] < LAYER_EVERY or done <= 0:
            return
        state["last"] = now
        per_layer = (now - state["start"]) / done
        reading = (stream.seconds - state["read"]) / (now - state["start"])
        left = per_layer * (n - done)
        kind = " (backward)" if back else ""
        line = (f"headwise: layer by layer: pass {state['pass']}{kind}, layer {k + 1}/{n}, {left:.0f} s left in this "
                f"pass ({per_layer:.2f} s a layer, {reading:.0%} of it reading weights)")  # fmt: skip
        print(line, file=sys.stderr)

    saved, stream.on_unit = stream.on_unit, on_unit
    began = time.perf_counter()
    try:
        yield
    finally:
        stream.on_unit = saved
    if command is not None:
        try:  # a record that cannot be made never fails a run that succeeded
            from headwise.models.runs import record_run

            record_run(hm, command, time.perf_counter() - began)
        except Exception as e:  # noqa: BLE001
            print(f"headwise: the run was not recorded for size --memory ({type(e).__name__}: {e})", file=sys.stderr)
