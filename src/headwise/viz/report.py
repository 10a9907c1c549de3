"""Every output of ``headwise heads`` in one call: heads.json, heads.csv, heads.png, roles.png, headview.html.

Each file is written to a temporary name in the output folder and renamed into place, so the folder
never holds a half-written file.
"""

from __future__ import annotations

import contextlib
import csv
import glob
import io
import json
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from headwise._io import TEMP_PREFIX, TEMP_SUFFIX, write_text_atomic

__all__ = [
    "OUTPUTS",
    "HeadGrid",
    "report_json",
    "report_csv",
    "prefetch_pictures",
    "start_head_grid",
    "write_head_views",
    "write_heads_outputs",
]

#: The files :func:`write_heads_outputs` writes, in order.
OUTPUTS = ("heads.json", "heads.csv", "heads.png", "roles.png", "headview.html")


def _rows(report, columns: dict | None) -> list[dict]:
    """The report's per-head rows, each with the values of ``columns`` (name → ``(NL, H)``) appended."""
    rows = report.rows()
    for name, values in (columns or {}).items():
        for row in rows:
            v = float(values[row["layer"]][row["head"]])
            row[name] = None if v != v else v
    return rows


def report_json(report, *, extra: dict | None = None, columns: dict | None = None) -> str:
    """The report as JSON text (see :meth:`HeadReport.to_dict`), with ``extra`` fields first and the
    per-head ``columns`` (name → ``(NL, H)`` values, e.g. importance) added to every head's row."""
    data = dict(extra or {})
    data.update(report.to_dict())
    if columns:
        data["heads"] = _rows(report, columns)
    return json.dumps(data, indent=1, ensure_ascii=False, allow_nan=False) + "\n"


def report_csv(report, *, columns: dict | None = None) -> str:
    """One CSV row per head (layer-major), every metric, ``positional``, ``role``, the MDS coordinates
    and the per-head ``columns``."""
    rows = _rows(report, columns)
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: ("" if v is None else v) for k, v in row.items()})
    return buf.getvalue()


@dataclass
class HeadGrid:
    """A picture being drawn in a forked child or to be drawn here: ``heads.png`` of one sentence
    (:func:`start_head_grid`), or ``roles.png`` beside it (:func:`write_head_views`).

    Attributes:
        path: the picture; draw: draws it here and returns ``path``; pid: the forked child drawing it, or None
            (drawn here when joined).
    """

    path: Path
    draw: Callable[[], Path]
    pid: int | None = None

    def _reaped(self) -> None:
        """The child is joined or stopped: nothing is left for the exit to stop."""
        import atexit

        atexit.unregister(self._stop_at_exit)
        self.pid = None

    def _stop_at_exit(self) -> None:
        if self.pid is not None:
            _stop(self.pid, self.path)
            self.pid = None


def _head_grid(sentence, out: Path, report, layer: int | None, title: str) -> HeadGrid:
    """The :class:`HeadGrid` of ``sentence`` in ``out`` (labelled with ``report``'s roles), not started."""
    from headwise.viz.heads import plot_head_grid

    roles = report.roles.tolist()
    layers = None if layer is None else [layer]

    def draw() -> Path:
        return plot_head_grid(
            sentence.attentions,
            sentence.tokens,
            out / "heads.png",
            layers=layers,
            roles=roles,
            title=f"{title} — attention of every head on one sentence".strip(" —"),
        ).path

    return HeadGrid(out / "heads.png", draw)


def start_head_grid(
    sentence, out_dir: str | os.PathLike, *, report=None, layer: int | None = None, title: str = ""
) -> HeadGrid:
    """Start drawing ``heads.png`` now, in a forked child (Linux), so that it is drawn while this process prints,
    writes and draws the rest; :func:`write_heads_outputs` / :func:`write_head_views` given it as ``grid=`` (with
    the same ``out_dir``) join it. Where nothing can be forked it is drawn when joined; the file is the same either
    way. Should this process exit before the join (an error, Ctrl-C), the child is stopped and no temporary of its
    is left (an ``atexit`` hook).

    Args:
        sentence, report, layer, title: as :func:`write_head_views` takes them (``report``: the roles written under
            each panel, default the sentence's own).
    """
    import atexit

    _prefetched()
    grid = _head_grid(sentence, Path(out_dir), report or sentence.report, layer, title)
    grid.pid = _fork(grid.draw)
    if grid.pid is not None:
        atexit.register(grid._stop_at_exit)
    return grid


def write_head_views(
    sentence,
    out_dir: str | os.PathLike,
    *,
    report=None,
    layer: int | None = None,
    title: str = "",
    causal: bool = False,
    overview: dict | None = None,
    links=(),
    concurrent: bool = False,
    grid: HeadGrid | None = None,
) -> dict[str, Path]:
    """Write ``heads.png``, ``roles.png`` and ``headview.html`` for one sentence.

    Args:
        sentence: a :class:`~headwise.analysis.SentenceHeads` (tokens, ``(NL, H, n, n)`` maps, report).
        out_dir: an existing folder.
        report: the report drawn in ``roles.png`` and used for the role labels (default the sentence's
            own; pass a corpus report to show corpus roles).
        layer: draw only this layer in ``heads.png`` (the head view keeps every layer, starting there).
        title: a line naming the model, used in every picture.
        causal: a decoder's maps (the head view's model view shows the causal triangle).
        overview: the sentence's rows are the bins of a pooled overview:
            :func:`headwise.viz.headview.query_overview` (the head view lets the user choose queries).
        links: ``(file name, text)`` of pages beside ``headview.html``, linked from it.
        concurrent: on Linux, draw ``heads.png`` and ``roles.png`` in two forked child processes while this one
            makes the head view (each picture is single-threaded matplotlib work; the children use no torch); a
            child that fails or cannot be forked leaves its drawing to this process, so the files are the same
            either way. The head view is written once ``roles.png`` is whole, ``heads.png`` joined last.
        grid: ``heads.png`` already started by :func:`start_head_grid` (for this ``out_dir``): joined here, not
            drawn again (``roles.png`` then drawn in a second child when that one was forked).
    Returns:
        ``{"heads.png": path, "roles.png": path, "headview.html": path}``.
    """
    _prefetched()
    from headwise.viz.headview import headview_payload, render_headview
    from headwise.viz.roles import plot_role_maps

    out = Path(out_dir)
    report = report or sentence.report
    roles = report.roles.tolist()
    text = " ".join(sentence.tokens)
    scope = f"{report.num_sentences} sentences, {report.num_tokens} tokens"
    title_roles = f"{title} — per-head metrics ({scope})"
    paths = {}
    if grid is None:
        grid = _head_grid(sentence, out, report, layer, title)
        if concurrent:
            grid.pid = _fork(grid.draw)
    role_maps = HeadGrid(out / "roles.png", lambda: plot_role_maps(report, out / "roles.png", title=title_roles).path)
    try:
        if grid.pid is None:
            paths["heads.png"] = grid.draw()
        else:  # heads.png is drawn in a child: roles.png in a second one beside it
            role_maps.pid = _fork(role_maps.draw)
        page = render_headview(  # made here while the children draw, written once roles.png is whole
            headview_payload(
                sentence.attentions,
                sentence.tokens,
                roles=roles,
                title=f"{title} head view".strip(),
                subtitle=text if len(text) <= 600 else text[:600] + " …",
                causal=causal,
                overview=overview,
                links=links,
            )
        )
        paths["roles.png"] = _collected(role_maps)
        paths["headview.html"] = write_text_atomic(out / "headview.html", page)
        if "heads.png" not in paths:
            paths["heads.png"] = _collected(grid)
    except BaseException:  # Ctrl-C or an error here: the children stop too, and no temporary of theirs is left
        for drawing in (grid, role_maps):
            if drawing.pid is not None:
                _stop(drawing.pid, drawing.path)
                drawing._reaped()
        raise
    return {name: paths[name] for name in ("heads.png", "roles.png", "headview.html")}


_prefetch: threading.Thread | None = None  # the import of the pictures' modules, when started ahead


def prefetch_pictures() -> None:
    """Import matplotlib and the picture modules in a background thread now, while this process computes what they
    will draw (torch's kernels leave the interpreter free most of that time): the first picture forked after the
    computation then does not wait the 0.5–0.7 s of those imports. :func:`_fork` waits for the thread first (nothing
    is forked while it imports); an import that fails there fails again, with its error, where it is needed."""
    global _prefetch
    if _prefetch is not None or "headwise.viz.roles" in sys.modules:
        return

    def load() -> None:
        with contextlib.suppress(Exception):
            import matplotlib.figure  # noqa: F401

            import headwise.viz.heads  # noqa: F401
            import headwise.viz.headview  # noqa: F401
            import headwise.viz.roles  # noqa: F401

    _prefetch = threading.Thread(target=load, name="headwise-prefetch-pictures", daemon=True)
    _prefetch.start()


def _prefetched() -> None:
    """Wait for :func:`prefetch_pictures`' thread, if one was started: no import here races it, no fork happens beside
    it."""
    if _prefetch is not None:
        _prefetch.join()


def _fork(draw) -> int | None:
    """Run ``draw()`` in a forked child process (Linux only): its pid, or None when nothing was forked. The child
    exits at once with status 0 when ``draw`` returned, 1 otherwise (it writes through ``atomic_write`` alone).

    SIGTERM stops the child whatever the parent's signal dispositions were (a process started with SIGINT ignored,
    as a ``nohup … &`` job is, hands that on to its children): the child's handler raises, so its atomic write
    removes its temporary file on the way out."""
    if not sys.platform.startswith("linux"):
        return None
    import signal

    _prefetched()  # no fork while another thread imports
    import matplotlib.figure  # noqa: F401  (imported once, before the fork, for both processes)

    # SIGINT held back across the fork: one landing inside os.fork's own callbacks is printed there and lost
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        pid = os.fork()
    except OSError:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        return None
    if pid == 0:  # the child: draw, and leave without running anything of the parent's (no flush, no atexit)
        status = 1
        try:
            signal.signal(signal.SIGTERM, _stopped)
            sys.unraisablehook = _unraisable_in_child
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
            draw()
            status = 0
        finally:
            os._exit(status)
    signal.pthread_sigmask(signal.SIG_SETMASK, blocked)  # a Ctrl-C during the fork arrives here, as KeyboardInterrupt
    return pid


class _Stopped(BaseException):
    """Raised in a drawing child by SIGTERM: unwinds its writes (their temporaries removed), then it exits."""


def _stopped(signum, frame):
    raise _Stopped


def _unraisable_in_child(unraisable) -> None:
    """A drawing child's ``sys.unraisablehook``: :class:`_Stopped` raised where Python cannot raise (a weakref
    callback, a finalizer — matplotlib's transforms have them) is not printed ("Exception ignored in …") but the
    SIGTERM sent again, so that the child unwinds at the next point it can; anything else as Python prints it."""
    if isinstance(unraisable.exc_value, _Stopped):
        import signal

        os.kill(os.getpid(), signal.SIGTERM)
        return
    sys.__unraisablehook__(unraisable)


#: Seconds a stopped child has to unwind after SIGTERM before it is killed.
STOP_GRACE_S = 2.0


def _stop(pid: int, path: Path) -> None:
    """Stop a child of :func:`_fork` that was drawing ``path``, wait for it, and leave no temporary of its behind.

    SIGTERM first (the child unwinds: its atomic write removes its temporary), then SIGKILL after
    :data:`STOP_GRACE_S` seconds; a child killed mid-write leaves its temporary, which is removed here.
    """
    import signal
    import time

    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    try:
        while os.waitpid(pid, os.WNOHANG) == (0, 0):
            if time.monotonic() > deadline:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                break
            time.sleep(0.01)
    except ChildProcessError:  # reaped already
        pass
    _remove_temporaries(path)


def _remove_temporaries(path: Path) -> None:
    """Remove what :func:`~headwise._io.atomic_write` left of ``path`` in a reaped child that was killed mid-write."""
    for tmp in path.parent.glob(f"{TEMP_PREFIX}{glob.escape(path.name)}.{'[0-9a-f]' * 12}{TEMP_SUFFIX}"):
        tmp.unlink(missing_ok=True)


def _joined(pid: int) -> bool:
    """Wait for a child of :func:`_fork`; whether it drew what it was given."""
    _, status = os.waitpid(pid, 0)
    return os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def _collected(drawing: HeadGrid) -> Path:
    """A drawing's file: its child joined (the picture drawn here instead when the child failed, a temporary it may
    have left removed), or drawn here when no child draws it."""
    if drawing.pid is None:
        return drawing.draw()
    drawn = _joined(drawing.pid)
    drawing._reaped()
    if not drawn:
        _remove_temporaries(drawing.path)
        return drawing.draw()
    return drawing.path


def write_heads_outputs(
    sentence,
    report,
    out_dir: str | os.PathLike,
    *,
    layer: int | None = None,
    title: str = "",
    extra: dict | None = None,
    causal: bool = False,
    columns: dict | None = None,
    overview: dict | None = None,
    links=(),
    concurrent: bool = False,
    grid: HeadGrid | None = None,
) -> dict[str, Path]:
    """Write all of :data:`OUTPUTS` to ``out_dir`` (created if needed), each atomically.

    Args:
        sentence: the example sentence's :class:`~headwise.analysis.SentenceHeads` (pictures, head view).
        report: the :class:`~headwise.analysis.HeadReport` to save (the corpus one, or the sentence's).
        out_dir: the output folder.
        layer: restrict ``heads.png`` to one layer.
        title: the model's name for the pictures.
        extra: fields put first in ``heads.json`` (model, corpus, sentence …).
        causal: a decoder's maps.
        columns: more per-head values for ``heads.json`` / ``heads.csv`` (name → ``(NL, H)``).
        overview, links, concurrent, grid: see :func:`write_head_views`.
    Returns:
        file name → path, in the order of :data:`OUTPUTS`.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {
        "heads.json": write_text_atomic(out / "heads.json", report_json(report, extra=extra, columns=columns)),
        "heads.csv": write_text_atomic(out / "heads.csv", report_csv(report, columns=columns)),
    }
    paths.update(
        write_head_views(
            sentence,
            out,
            report=report,
            layer=layer,
            title=title,
            causal=causal,
            overview=overview,
            links=links,
            concurrent=concurrent,
            grid=grid,
        )  # fmt: skip
    )
    return {name: paths[name] for name in OUTPUTS}
