"""The ``headwise`` command line (typer). One subcommand per file in this package.

``main()`` turns a user's mistake — a bad option, a ``CLIError``, or a ValueError / TypeError raised
by the library's input checks — into one line on stderr and exit status 2, never a traceback. ``entry()`` is the
console script and ``python -m headwise``: ``main()``, then a prompt exit (see its docstring).
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import os
import pkgutil
import signal
import sys
import threading

import click
import typer

from headwise.cli._app import CLIError, app

try:  # typer >= 0.29 carries its own copy of click, whose exceptions are not click's
    from typer._click import exceptions as _typer_click
except ImportError:  # pragma: no cover - older typer uses click itself
    _typer_click = click.exceptions


def _both(name: str) -> tuple[type[BaseException], ...]:
    return tuple({getattr(m, name) for m in (click.exceptions, _typer_click) if hasattr(m, name)})


_NO_ARGS, _USAGE, _ABORT, _CLICK, _EXIT = (
    _both(n) for n in ("NoArgsIsHelpError", "UsageError", "Abort", "ClickException", "Exit")
)

__all__ = ["app", "main", "entry", "CLIError"]

for _mod in pkgutil.iter_modules(__path__):
    if not _mod.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_mod.name}")


_INTERRUPTED = 130  # 128 + SIGINT, the shell's convention


def _fail(message: str) -> None:
    message = " ".join(str(message).split())  # one line, whatever the exception held
    print(f"headwise: error: {message}", file=sys.stderr)
    sys.exit(2)


def _from_ctrl_c(e: BaseException | None) -> bool:
    """Whether ``e`` came of a Ctrl-C: a KeyboardInterrupt in its chain of causes and contexts (an import, a callback
    or a library that turned the interrupt into an error of its own — ``ImportError: initialization failed`` from an
    extension module interrupted while it loaded)."""
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, KeyboardInterrupt):
            return True
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return False


def _said(e: Exception) -> str:
    """A user's mistake as one line: a memory error worded with ``--max-memory`` (the library names the budget by its
    keyword), anything else as it says itself (:func:`headwise.commands.said`)."""
    from headwise.commands import said

    return said(e)


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``headwise`` console script and of ``python -m headwise``."""
    command = typer.main.get_command(app)
    try:
        rc = command.main(args=argv, prog_name="headwise", standalone_mode=False)
    except _NO_ARGS as e:  # `headwise` alone: the help, exit 0
        print(e.ctx.get_help() if e.ctx else str(e))
        sys.exit(0)
    except _USAGE as e:
        hint = f" (see 'headwise {e.ctx.info_name} --help')" if e.ctx and e.ctx.parent else ""
        _fail(f"{e.format_message()}{hint}")
    except (*_ABORT, KeyboardInterrupt):
        rc = _INTERRUPTED
    except _EXIT as e:
        rc = e.exit_code
    except _CLICK as e:
        _fail(e.format_message())
    except (CLIError, ValueError, TypeError, FileNotFoundError, IsADirectoryError, PermissionError) as e:
        if not _from_ctrl_c(e):
            _fail(_said(e))
        rc = _INTERRUPTED
    except Exception as e:  # a bug's traceback, unless the error came of a Ctrl-C
        if not _from_ctrl_c(e):
            raise
        rc = _INTERRUPTED
    rc = rc if isinstance(rc, int) else 0
    if rc == _INTERRUPTED:  # typer turns Ctrl-C inside a command into exit status 130, silently
        print("headwise: interrupted", file=sys.stderr)
    sys.exit(rc)


def entry() -> None:
    """The ``headwise`` console script and ``python -m headwise``: :func:`main`, then the process ends as soon as
    the command is done.

    A command that opened a model leaves torch and transformers imported, and the interpreter's own shutdown tears
    every one of their modules down: 1.1 s after importing them alone, 1.5–1.6 s after ``headwise heads --model
    smollm2`` (measured on this project's 2-core machine) — time in which every file is already written. So once
    :func:`main` has returned or exited, non-daemon threads are joined, the ``atexit`` handlers run (CPython's
    ``atexit._run_exitfuncs``, as ``multiprocessing`` runs them in a forked child before ``os._exit``:
    multiprocessing's children are reaped there, temporary files removed), the streams are flushed, and the
    process leaves with ``os._exit`` and the command's status (a Ctrl-C in that time ends the process by SIGINT,
    nothing printed, as one during the interpreter's own exit did). An exception that escaped :func:`main` (a bug, not a
    user's mistake) takes Python's normal exit with its traceback. Library callers and tests call :func:`main`,
    which raises SystemExit as before.
    """
    try:
        main()
        code = 0
    except SystemExit as e:
        code = e.code
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # the command is done: a Ctrl-C from here on
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # ends the process by the signal, nothing printed (as at exit)
    if code is None:
        code = 0
    elif not isinstance(code, int):  # SystemExit("message"): Python prints it and exits 1
        print(code, file=sys.stderr)
        code = 1
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a reader that went away, a closed stream: nothing to say
            stream.flush()
    os._exit(code)
