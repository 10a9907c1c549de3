"""The command line's progress bar: a rich bar on stderr, fed by the library's progress callbacks."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager


@contextmanager
def corpus_progress(total: int | None, *, label: str = "corpus") -> Iterator[Callable[[int, int], None]]:
    """A rich progress bar on stderr; yields the ``progress(texts, tokens)`` callback that moves it.

    Args:
        total: the number of texts (None: unknown, the bar only counts).
        label: the task's name on the bar.
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
        TextColumn("[bold cyan]heads[/] {task.description}"),
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
def stage_progress() -> Iterator[Callable[[str, int, int], None]]:
    """A rich progress bar on stderr for work in named stages; yields ``progress(stage, done, total)``
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
        TextColumn("[bold cyan]heads[/] {task.description}"),
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
def row_progress(hm, n: int) -> Iterator[Callable[[int, int, int], None] | None]:
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
