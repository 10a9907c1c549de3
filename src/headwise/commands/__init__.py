"""Every command's flow, one module per command: what ``headwise <command>`` computes, without printing or drawing it.

One naming rule: ``headwise.commands.<command>`` (``heads``, ``patch``, ``circuit``, ``qk``, ``demo``, ``lab``) holds

- ``<Name>Options`` — the command's options as one frozen record, checked in one place when it is built (every error a
  ValueError naming the option as the command line spells it: ``--top-k``, ``TEXT``); the checks that need the model
  run once it is open, before anything is written. ``heads``' is :class:`headwise.study.HeadsOptions`, re-exported;
  ``lab`` has one per subcommand (``InductionOptions``, ``HeadsVsOneOptions``, ``CircuitsOptions``, ``PruneOptions``).
- ``run(options, *, <callbacks>) -> <Name>Result`` — the model opened through the one door, the run on one process or
  across the ranks of a ``torchrun`` launch (None on ranks other than 0: rank 0 prints and writes), progress and
  warnings through the callbacks it is handed (``bars``, ``stages``, ``warn``, …);
- ``<Name>Result`` — everything the command prints and writes: the reports, the files' text, the lines; the command
  line (``headwise.cli.<command>``) writes the files, prints the lines and draws the pictures through
  :mod:`headwise.viz`.

Below the command line and above the tools: a flow may import :mod:`headwise.viz`, :mod:`headwise.lab`,
:mod:`headwise.study` and every layer under them, never :mod:`headwise.cli`; it draws no terminal UI (no ``rich``).
The tools never import a flow. Helpers the flows share are private (``_decoder``: a decoder opened and its texts
encoded; ``_folders``: the output folders checked).
"""

#: The memory budget's option as the command line spells it. The library's memory errors
#: (:class:`headwise.models.memory.MemoryBudgetError`) carry the budget and name it by its keyword (``max_memory``);
#: a flow, and the command line's last word on an error, say them with this name (:func:`said`).
MEMORY = "--max-memory"


def said(e: BaseException) -> str:
    """An error as one line in the command line's words: a memory budget named :data:`MEMORY`, anything else as it
    says itself."""
    worded = getattr(e, "worded", None)  # MemoryBudgetError's (no import of models/ for the name alone)
    return " ".join((worded(MEMORY) if callable(worded) else str(e)).split())
