"""``headwise verify``: re-run every example of both source articles and compare with what they print.

One table per article — claim, what the article prints, what headwise computes, status — then the
notes (errata explained) and a summary. Exit status 0 when every claim passes or is a known erratum
reproduced as such, 1 when any fails.
"""

from __future__ import annotations

from typing import Annotated

import typer

from headwise.cli._app import app

_STYLE = {"pass": "green", "erratum": "yellow", "FAIL": "bold red"}


def _table(title: str, results, first_number: int):
    from rich.table import Table
    from rich.text import Text

    table = Table(title=title, title_justify="left", show_lines=True, expand=False)
    table.add_column("#", justify="right", no_wrap=True)
    table.add_column("section", max_width=18)
    table.add_column("claim", max_width=28)
    table.add_column("article prints", max_width=36)
    table.add_column("headwise computes", max_width=36)
    table.add_column("status", no_wrap=True)
    for n, r in enumerate(results, first_number):
        c = r.claim
        claim = Text(c.what)
        check = c.rule.describe + (f"; correct: {c.correct}" if c.correct is not None else "")
        if check:
            claim.append(f"\n({check})", style="dim")
        table.add_row(str(n), c.section, claim, Text(c.figure), Text(r.shown), Text(r.status, style=_STYLE[r.status]))
    return table


@app.command()
def verify(
    article: Annotated[
        str | None, typer.Option("--article", help="Only one article: 'part4' or 'techbyte' (default both).")
    ] = None,
    width: Annotated[
        int | None, typer.Option("--width", help="Line width (default: the terminal's; 140 into a file).")
    ] = None,
) -> None:
    """Re-run both articles' examples and check them.

    A table per article: claim, what the article prints, what headwise computes, pass / FAIL /
    erratum. Exit status 1 when any claim fails.
    """
    from rich.console import Console

    from headwise.articles import ARTICLES, FAIL, all_claims, check_all
    from headwise.cli._app import CLIError

    if article is not None and article not in ARTICLES:
        raise CLIError(f"--article: expected one of {', '.join(ARTICLES)}, got {article!r}")
    if width is not None and width < 60:
        raise CLIError(f"--width: expected at least 60 characters, got {width}")
    console = Console(highlight=False)
    console.width = width or (console.width if console.is_terminal else 140)

    results = check_all(all_claims(article))
    number, notes = 1, []
    for key, (title, filename) in ARTICLES.items():
        mine = [r for r in results if r.claim.article == key]
        if not mine:
            continue
        console.print(_table(f"{title}  ({filename})", mine, number))
        for n, r in enumerate(mine, number):
            if r.claim.note:
                notes.append((n, r))
        number += len(mine)
        console.print()
    if notes:
        from rich.table import Table
        from rich.text import Text

        grid = Table.grid(padding=(0, 1))
        grid.add_column(justify="right", no_wrap=True)
        grid.add_column(no_wrap=True)
        grid.add_column()
        for n, r in notes:
            grid.add_row(f"#{n}", Text(r.status, style=_STYLE[r.status]), r.claim.note)
        console.print("Notes:")
        console.print(grid)
        console.print()
    counts = {s: sum(r.status == s for r in results) for s in ("pass", "erratum", FAIL)}
    console.print(
        f"{len(results)} claims: {counts['pass']} pass, {counts['erratum']} erratum "
        f"(the article is wrong, headwise gives the correct value), {counts[FAIL]} FAIL"
    )
    if counts[FAIL]:
        raise typer.Exit(1)
