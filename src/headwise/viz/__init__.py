"""Pictures of attention and positions (matplotlib, Agg; the ``viz`` layer — the core never imports it).

- :func:`headwise.viz.attention.plot_attention_heads` — one heatmap per head, tokens on both axes.
- :func:`headwise.viz.positional.plot_positional_encoding` — a positions × dimensions table
  (the first article's Figure 2).

Every file is written atomically by :func:`headwise._io.atomic_write` (a temporary name in the same
folder, then ``os.replace``).
Import the submodules directly; this package imports no matplotlib, so ``import headwise.viz`` stays
cheap. It names :data:`FORMATS`, the picture formats it writes (by file suffix), for the command line.
"""

from headwise.viz._files import FORMATS

__all__ = ["FORMATS"]
