"""A memory budget for opening a model: what it is given as (``"1.5GB"``), what the machine has, and the route it picks.

A model opens whole in float32 when that fits the budget (the usual route), else layer by layer
(:mod:`headwise.models.streamed`: each layer's weights read from the file and turned to float32 when that layer runs,
then released). The budget is for the process's peak resident memory (``ru_maxrss``): what the process holds already
(the interpreter, torch), the weights held at once, and :data:`WORKING` bytes for the activations.

- :func:`parse_size` — ``"1.5GB"``, ``"400MB"``, ``"2GiB"``, ``"1500000000"`` → bytes.
- :func:`default_budget` — what the machine has free (``MemAvailable``), less a margin.
- :func:`plan_memory` — the route for a model of given sizes under a budget, or one line naming the smallest budget
  that works (:class:`MemoryBudgetError`).
"""

from __future__ import annotations

import os
import re
import resource
from dataclasses import dataclass

from headwise._machine import free_memory

__all__ = [
    "HELD_SLACK",
    "WORKING",
    "FREE_SHARE",
    "MemoryBudgetError",
    "MemoryPlan",
    "available_memory",
    "default_budget",
    "format_size",
    "parse_size",
    "MIN_WORKING",
    "OPTION",
    "map_large_allocations",
    "named_size",
    "peak_rss",
    "plan_memory",
    "return_freed",
    "whole_refused",
]

#: Bytes set aside for the activations, the statistics' blocks of rows and the allocator's slack (256 MiB: the
#: streaming pass's blocks stay under 200 MB, :mod:`headwise.analysis.streaming`).
WORKING = 256 * 2**20
#: The least left for the activations when the budget is tight (64 MiB: the streaming pass's smallest blocks, 50 MB,
#: and a short batch's hidden states); a budget between this and :data:`WORKING` above the weights is taken as given.
MIN_WORKING = 64 * 2**20
#: What a budget named as the smallest that works adds to the need weighed (4 MiB): what the process holds when the
#: need is weighed moves by about 1 MB from run to run (its imports' allocations), so that a run given exactly the
#: budget a refusal named is not refused again by that much.
HELD_SLACK = 4 * 2**20
#: The share of the machine's available memory a default budget takes (the rest is the margin).
FREE_SHARE = 0.8
#: the default budget is never below this share of the machine's memory: on a busy machine a model that small takes
#: the route a quiet one gives it (the route, not the answer, depends on the budget)
FLOOR_SHARE = 0.25

_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
    "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
}  # fmt: skip
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-zA-Z]*)\s*$")
EXPECTED = "a size such as 1.5GB, 400MB or 2GiB"


#: How the library's memory errors name the budget: :func:`headwise.models.open_model`'s keyword. A caller with an
#: option of its own (the command line's ``--max-memory``) words the same error with it (:meth:`MemoryBudgetError.
#: worded`).
OPTION = "max_memory"


class MemoryBudgetError(ValueError):
    """A memory budget that does not do: not a size, smaller than the smallest that opens the model, or too small
    for a tool on a model opened layer by layer. One line; ``str(e)`` names the budget as :data:`OPTION`,
    :meth:`worded` as the caller's own option.

    Args:
        message: the line, with ``{option}`` wherever the budget's name goes.
    Attributes:
        smallest: the smallest budget in bytes that works (None where not known).
        given: whether the budget was the caller's (else the default: the model is what does not fit).
        budget: the budget in bytes (None: not a size); need: the bytes needed (the smallest budget that opens the
            model, or what the tool needs); route: ``"whole"`` or ``"layers"``, the route the budget was weighed
            for (None where it was not a size).
    """

    def __init__(
        self,
        message: str,
        smallest: int | None = None,
        *,
        given: bool = True,
        budget: int | None = None,
        need: int | None = None,
        route: str | None = None,
    ):
        super().__init__(message.replace("{option}", OPTION))
        self.template = message
        self.smallest, self.given = smallest, given
        self.budget, self.need, self.route = budget, need, route

    def worded(self, option: str) -> str:
        """The line with ``option`` naming the budget (``e.worded("--max-memory")`` on the command line)."""
        return self.template.replace("{option}", option)


def format_size(n: float) -> str:
    """Bytes as the command line takes them back: ``1_500_000_000`` → ``"1.50 GB"`` (powers of 1000)."""
    for scale, unit in ((10**12, "TB"), (10**9, "GB"), (10**6, "MB"), (10**3, "kB")):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} B"


def named_size(n: int) -> int:
    """``n`` bytes rounded up to the figure :func:`format_size` shows (two decimals of its unit), so that a budget
    given as the named figure is never below ``n``."""
    step = next((scale // 100 for scale in (10**12, 10**9, 10**6, 10**3) if n >= scale), 1)
    return -(-int(n) // step) * step


def parse_size(value: str | int | float) -> int:
    """A size in bytes: an int, or a string ``NUMBER[UNIT]`` — ``B``, ``kB``/``MB``/``GB``/``TB`` (powers of 1000),
    ``KiB``/``MiB``/``GiB``/``TiB`` (powers of 1024), ``K``/``M``/``G``/``T`` as the decimal ones; case ignored.

    Raises:
        MemoryBudgetError: naming the budget (:data:`OPTION`), the value and what is expected: not a size, an unknown
            unit, 0 or less.
    """
    if isinstance(value, bool):
        raise MemoryBudgetError(f"{{option}}: expected {EXPECTED}, got {value!r}")
    if isinstance(value, (int, float)):
        size = value
    else:
        match = _SIZE.match(str(value))
        unit = match.group(2).lower() if match else None
        if match is None or unit not in _UNITS:
            raise MemoryBudgetError(f"{{option}}: expected {EXPECTED}, got {value!r}")
        size = float(match.group(1)) * _UNITS[unit]
    if not size >= 1:
        raise MemoryBudgetError(f"{{option}}: expected {EXPECTED} (more than 0), got {value!r}")
    return int(size)


#: Bytes this machine can give a new allocation now: the one reader of free memory,
#: :func:`headwise._machine.free_memory` (the host's ``MemAvailable``, else its free pages).
available_memory = free_memory


def default_budget() -> int:
    """The budget when none is given: what this process holds now plus :data:`FREE_SHARE` of what the machine has
    available (the rest left to others), and at least :data:`FLOOR_SHARE` of the machine's memory."""
    machine = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return current_rss() + max(int(FREE_SHARE * free_memory()), int(FLOOR_SHARE * machine))


def current_rss() -> int:
    """This process's resident memory now (``/proc/self/statm``; else its peak so far)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return peak_rss()


_LIBC = None


def _libc():
    """glibc through ctypes, or False elsewhere (musl, macOS, Windows)."""
    global _LIBC
    if _LIBC is None:
        try:
            import ctypes

            lib = ctypes.CDLL("libc.so.6")
            _LIBC = lib if hasattr(lib, "malloc_trim") and hasattr(lib, "mallopt") else False
        except OSError:
            _LIBC = False
    return _LIBC


def map_large_allocations(threshold: int = 2**20) -> None:
    """Have glibc's malloc map every allocation of ``threshold`` bytes or more on its own (``M_MMAP_THRESHOLD``), so
    that freeing a layer's weights gives their memory back to the system at once. Without it glibc raises the
    threshold after the first large free (up to 32 MiB) and later weights come from its heap, which it keeps: a
    layer-by-layer run's resident memory then creeps up pass after pass."""
    lib = _libc()
    if lib:
        lib.mallopt(-3, int(threshold))  # M_MMAP_THRESHOLD (fixed: no dynamic raise)


def return_freed() -> None:
    """Give what glibc's malloc holds free back to the system (``malloc_trim(0)``); elsewhere nothing."""
    lib = _libc()
    if lib:
        lib.malloc_trim(0)


def peak_rss() -> int:
    """This process's peak resident memory so far, in bytes (``ru_maxrss``, kilobytes on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


@dataclass(frozen=True)
class MemoryPlan:
    """How a model opens under a budget (:func:`plan_memory`).

    Attributes:
        route: ``"whole"`` (every weight in float32 at once) or ``"layers"`` (one layer's weights at a time).
        budget: the budget in bytes; given: whether the caller gave it (else :func:`default_budget`).
        held: bytes the process held when the plan was made.
        whole: bytes the whole route needs beyond ``held`` (float32 weights, what is read to make them,
            :data:`WORKING`).
        layers: bytes the layer route needs at least beyond ``held`` (the largest unit's float32 and stored bytes,
            :data:`MIN_WORKING`); what the budget leaves beyond the weights is the activations'.
        largest: the largest unit's name (``"layers.3"``, ``"embed_tokens"``) and its float32 bytes.
    """

    route: str
    budget: int
    given: bool
    held: int
    whole: int
    layers: int
    largest: tuple[str, int]

    @property
    def smallest(self) -> int:
        """The smallest budget that opens the model (layer by layer where it can, else whole)."""
        return self.held + self.layers

    def left(self) -> int:
        """Bytes the budget leaves beside what the process holds now and :data:`MIN_WORKING` (negative: none)."""
        return self.budget - current_rss() - MIN_WORKING

    def line(self) -> str:
        """One line on the route, for the terminal and heads.json."""
        if self.route == "whole":
            return f"memory: the whole model in float32 ({format_size(self.whole)} within {format_size(self.budget)})"
        return (
            f"memory: layer by layer within {format_size(self.budget)} (the whole model would need "
            f"{format_size(self.held + self.whole)}; the largest part, {self.largest[0]}, "
            f"{format_size(self.largest[1])} in float32)"
        )

    def to_dict(self) -> dict:
        return {
            "route": self.route, "budget_bytes": self.budget, "budget_given": self.given, "held_bytes": self.held,
            "whole_bytes": self.whole, "layer_bytes": self.layers, "largest": list(self.largest),
        }  # fmt: skip


def plan_memory(
    max_memory: str | int | float | None,
    *,
    whole: int,
    units: dict[str, tuple[int, int]] | None,
    subject: str = "this model",
) -> MemoryPlan:
    """The route for a model under ``max_memory``.

    Args:
        max_memory: the budget (:func:`parse_size`), None for :func:`default_budget`.
        whole: bytes the whole route holds at its peak (float32 weights and the stored bytes read to make them).
        units: the parts the layer route loads one at a time: name → ``(float32 bytes, stored bytes)``; None where the
            model cannot go layer by layer. The whole route is taken when its weights and :data:`WORKING` fit; the
            layer route needs the largest unit and at least :data:`MIN_WORKING` for the activations.
        subject: the model, for errors.
    Returns:
        a :class:`MemoryPlan`: ``"whole"`` when it fits the budget, else ``"layers"``.
    Raises:
        MemoryBudgetError: a budget that is not a size, or smaller than the smallest that works — one line naming the
            smallest budget that works; it carries the budget, that smallest budget (``need``) and the route.
    """
    held = current_rss()
    need_whole = whole + WORKING
    if units:
        big = max(units, key=lambda k: sum(units[k]))
        need_layers = sum(units[big]) + MIN_WORKING
        largest = (big, units[big][0])
    else:
        need_layers, largest = need_whole, ("the whole model", whole)
    smallest = held + min(need_layers, need_whole) + HELD_SLACK  # named: a run given it is not refused again
    given = max_memory is not None
    try:
        budget = parse_size(max_memory) if given else default_budget()
    except MemoryBudgetError as e:
        raise MemoryBudgetError(f"{e.template}; the smallest budget that works for {subject} is "
                                f"{format_size(smallest)}", smallest, need=smallest) from None  # fmt: skip
    if held + need_whole <= budget:
        return MemoryPlan("whole", budget, given, held, need_whole, need_layers, largest)
    if units and held + need_layers <= budget:
        return MemoryPlan("layers", budget, given, held, need_whole, need_layers, largest)
    what = f"{largest[0]} ({format_size(largest[1])} in float32)" if units else "the whole model in float32"
    working = MIN_WORKING if units else WORKING
    parts = f"(this process holds {format_size(held)}, {what}, {format_size(working)} for the activations)"
    machine = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    beyond = f", more than this machine's {format_size(machine)} of memory" if smallest > machine else ""
    if given:
        message = (f"{{option}}: {format_size(budget)} is less than the smallest budget that works for {subject}: "
                   f"{format_size(smallest)} {parts}{beyond}")  # fmt: skip
    else:
        message = (f"{subject}: the smallest budget that works is {format_size(smallest)} {parts}, more than the "
                   f"{format_size(budget)} available (80% of what the machine has free, at least a quarter of "
                   f"its memory){beyond}")  # fmt: skip
    route = "layers" if units else "whole"
    raise MemoryBudgetError(message, smallest, given=given, budget=budget, need=smallest, route=route)


def whole_refused(
    name: str, plan: MemoryPlan, what: str, *, reads: str = "every layer's weights at once", need: int | None = None
) -> MemoryBudgetError:
    """The error refusing ``what`` (a tool that reads ``reads``: every layer's weights at once, or every layer's
    attention weights) on a model opened layer by layer under ``plan``, naming the memory it would need (``need``
    bytes; default: the whole model in float32 beside what the process held). Raise it; it carries the budget, the
    need and the route (``"layers"``)."""
    need = plan.held + plan.whole if need is None else need
    message = (
        f"model: {name} was opened layer by layer (budget {format_size(plan.budget)}); {what} reads {reads}, which "
        f"needs about {format_size(need)} (a {{option}} at least that)"
    )
    return MemoryBudgetError(message, given=plan.given, budget=plan.budget, need=need, route="layers")
