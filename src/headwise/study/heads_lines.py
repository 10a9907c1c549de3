"""What ``headwise heads`` prints about a study, as text: the layer × head table's columns and rows, the one-line
summaries (roles, the probe, the positional test, composition, importance and its sweep), the command a pooled head
view offers, and what the pictures show — computed from the results, printed by the command line.

Shape legend: NL layers, H heads, n tokens of the example, Q query bins of a pooled view.
"""

from __future__ import annotations

import numpy as np

from headwise.study.options import HeadsOptions

__all__ = [
    "COLUMNS",
    "COMMAND_TEXT_UP_TO",
    "DECODER_COLUMNS",
    "composition_line",
    "drawn",
    "head_row",
    "importance_line",
    "ordinal",
    "positional_line",
    "probe_line",
    "roles_line",
    "search_words",
    "sweep_note",
    "view_command",
    "view_note",
]

#: Columns of the printed table: (metric, header, format).
COLUMNS = (
    ("cls", "[CLS]", "{:.2f}"),
    ("sep", "[SEP]", "{:.2f}"),
    ("punct", ". ,", "{:.2f}"),
    ("self", "self", "{:.2f}"),
    ("prev", "prev", "{:.2f}"),
    ("next", "next", "{:.2f}"),
    ("entropy", "H nats", "{:.2f}"),
    ("entropy_cls", "H[CLS]", "{:.2f}"),
    ("entropy_ratio", "H/ln n", "{:.2f}"),
    ("distance", "dist", "{:.1f}"),
    ("confidence", "conf", "{:.2f}"),
)


#: Decoder table columns: (metric, header, format).
DECODER_COLUMNS = (
    ("prev", "prev", "{:.2f}"),
    ("first", "first", "{:.2f}"),
    ("duplicate_probe", "dup·p", "{:.2f}"),
    ("induction_probe", "ind·p", "{:.2f}"),
    ("induction", "ind", "{:.2f}"),
    ("self", "self", "{:.2f}"),
    ("entropy", "H nats", "{:.2f}"),
    ("entropy_ratio_causal", "H/ln m", "{:.2f}"),
    ("distance", "dist", "{:.1f}"),
    ("confidence", "conf", "{:.2f}"),
)


def head_row(report, layer: int, head: int, columns=COLUMNS) -> tuple[str, list[str]]:
    """One row of the layer × head table: ``(role, [each column's cell, then the positional cell])`` ("–": NaN)."""
    cells = []
    for metric, _, fmt in columns:
        v = float(report.metrics[metric][layer, head])
        cells.append("–" if v != v else fmt.format(v))
    share = float(report.metrics["positional_share"][layer, head])
    offset = int(report.metrics["positional_offset"][layer, head])
    pos = f"{offset:+d}" if report.positional[layer, head] else ("–" if share != share else f"({share:.0%})")
    return str(report.roles[layer, head]), [*cells, pos]


def roles_line(report) -> str:
    """``roles: broad 12, previous-token 3, …``, the most frequent first."""
    counts: dict[str, int] = {}
    for r in report.roles.ravel():
        counts[str(r)] = counts.get(str(r), 0) + 1
    return "roles: " + ", ".join(f"{r} {k}" for r, k in sorted(counts.items(), key=lambda x: -x[1]))


#: Most heads whose rows ``headwise heads`` prints as a table; above it, :func:`role_summary` (every row in the files).
SCREEN_ROWS = 48
#: The metric that measures each role, whose strongest heads :func:`role_summary` names.
ROLE_SCORES = {
    "induction": "induction_probe", "duplicate-token": "duplicate_probe", "previous-token": "prev",
    "first-token sink": "first", "broad": "entropy_ratio_causal", "next-token": "next", "self": "self",
    "[CLS] sink": "cls", "[SEP] sink": "sep", "punctuation sink": "punct",
}  # fmt: skip


def role_summary(report, *, per_role: int = 3) -> list[str]:
    """What fits a screen of a report of many heads: each role counted (the most frequent first) with its strongest
    heads by the metric that gives the role (:data:`ROLE_SCORES`; ``other``: in order)."""
    from headwise.circuits.graph import head_id

    counts: dict[str, list[tuple[int, int]]] = {}
    roles = report.roles
    for layer in range(roles.shape[0]):
        for head in range(roles.shape[1]):
            counts.setdefault(str(roles[layer, head]), []).append((layer, head))
    width = max(len(r) for r in counts)
    lines = []
    for role, heads in sorted(counts.items(), key=lambda x: (-len(x[1]), x[0])):
        metric = report.metrics.get(ROLE_SCORES.get(role, ""))
        if metric is not None:
            heads = sorted(heads, key=lambda lh: -float(np.nan_to_num(metric[lh], nan=-np.inf)))
        names = ", ".join(head_id(layer, head) for layer, head in heads[:per_role])
        score = f" (by {ROLE_SCORES[role]})" if metric is not None else ""
        lines.append(f"  {role:<{width}}  {len(heads):>4}  {names}{score}")
    return lines


def positional_line(report) -> str:
    """What the encoder table's ``pos`` column and ``ln n`` say, one line."""
    return (
        "pos: Voita's positional test (argmax at one offset for ≥ 90% of tokens: the offset, else the share); "
        f"ln n = {float(report.metrics['uniform_entropy'][0, 0]):.2f} nats on average"
    )


def probe_line(probe) -> str:
    """What the decoder table's probe columns measured, one line."""
    return (
        f"probe: {probe.batch} sequences of {probe.length} random tokens × {probe.repeats} copies"
        f"{' after BOS' if probe.bos is not None else ''}, seed {probe.seed} (·p columns); first: attention "
        "to the first token; H/ln m: entropy over ln of the keys a query may see"
    )


def composition_line(summary: dict) -> str:
    """The strongest K-compositions, one line."""
    best = summary["top"]["k"][:3]
    pairs = ", ".join(
        f"L{t['sender_layer']}H{t['sender_head']}→L{t['layer']}H{t['head']} {t['score']:.2f}" for t in best
    )
    return f"composition (weights): strongest K-composition {pairs}; copying scores in heads.json, composition.png"


#: Longest TEXT written out in the command a pooled head view shows (longer: the placeholder TEXT).
COMMAND_TEXT_UP_TO = 1000


def view_command(opts: HeadsOptions) -> tuple[str, str]:
    """The command line that draws the same example's chosen queries (``--queries-only``; a pooled head view appends
    ``--queries A:B``), and a line saying what a placeholder in it stands for. Only the options that choose the
    example appear."""
    import shlex

    text = opts.text
    args = ["headwise", "heads", "--model", shlex.quote(str(opts.model))]
    note = ""
    if not opts.cache:
        args.append("--no-cache")
    if text is not None and len(text) <= COMMAND_TEXT_UP_TO:
        args.append(shlex.quote(text))
    elif text is not None:
        args.append("TEXT")
        note = f"TEXT: the text this page was drawn from ({len(text):,} characters, not repeated here)."
    elif opts.corpus is not None:  # the example is the corpus's first line
        args += ["--corpus", shlex.quote(opts.corpus)]
    else:  # the example is the probe
        args += [
            "--probe-length", str(opts.probe_length), "--probe-repeats", str(opts.probe_repeats),
            "--seed", str(opts.seed),
        ]  # fmt: skip
    args += ["--queries-only", "--out", shlex.quote(str(opts.out))]  # the chosen rows alone: a bounded pass
    return " ".join(args), note


def drawn(view, tokens: list[str]) -> tuple[list[str], np.ndarray]:
    """The example's tokens and maps as drawn: every token, or one label per bin of the pooled overview."""
    if view.maps is not None:
        return list(tokens), view.maps
    bounds = view.bounds
    labels = [f"{a}–{b - 1}" for a, b in zip(bounds[:-1], bounds[1:])]
    return labels, view.pooled.astype(np.float32)


def view_note(view) -> dict:
    """What the pictures and the head view show, and what the statistics sampled, for heads.json and the terminal."""
    from headwise.analysis.corpus import js_row_budget

    n = view.n
    rows = js_row_budget(n, 32)
    note = (
        f"every metric uses every query row; the Jensen–Shannon map and MDS use {min(rows, n)} evenly spaced "
        f"query rows per sequence (of {n} in the example)"
    )
    data: dict = {"tokens": n, "js_rows_per_sequence": min(rows, n), "pooled": view.pooled is not None}
    if view.pooled is not None:
        bins = len(view.bounds) - 1
        data["bins"] = bins
        note += f"; heads.png and headview.html show the example pooled to {bins} × {bins} bins"
    if view.queries is not None:
        data["queries"] = list(view.queries)
        note += f"; headview_queries.html: queries {view.queries[0]}–{view.queries[1] - 1} at full resolution"
    data["note"] = note
    return data


def importance_line(result) -> str:
    """One line on an importance run: the intact objective, the costliest single head, half the heads removed (the
    estimate route: the costliest measured head and the estimate's agreement with the measured ones)."""
    if getattr(result, "estimate", None) is not None:
        return _estimate_line(result)
    top = np.unravel_index(np.argmax(result.ablation), result.ablation.shape)
    half = result.curves["importance"][len(result.removed) // 2]
    return (
        f"importance ({result.objective}, {result.num_sequences} sequences): intact {result.base_loss:.4f}; "
        f"removing L{top[0]} H{top[1]} alone costs most (+{result.ablation[top]:.4f}); "
        f"{int(result.removed[len(result.removed) // 2])} least important heads removed: {half:.4f}"
        + sweep_note(result.sweep)
    )


def _estimate_line(result) -> str:
    """:func:`importance_line` of the estimate route."""
    h = result.importance.shape[1]
    measured = np.where(np.isnan(result.ablation.ravel()), -np.inf, result.ablation.ravel())
    top = int(np.argmax(measured))
    a = result.agreement
    rho = "–" if a.get("spearman") is None else f"{a['spearman']:.2f}"
    worst = a.get("largest_error", {})
    k = len(result.removed) // 2
    return (
        f"importance ({result.objective}, {result.num_sequences} sequences): intact {result.base_loss:.4f}; every "
        f"head estimated, {len(result.measured)} measured exactly ({search_words(result.search)}): Spearman {rho}, "
        f"top-{result.top_k} overlap "
        f"{a.get('top_k_overlap', 0):.0%}, largest error {abs(worst.get('error', 0.0)):.4f}; removing "
        f"L{top // h} H{top % h} alone costs most (+{measured[top]:.4f}); {int(result.removed[k])} heads removed "
        f"by the estimate: {result.curves['estimate'][k]:.4f}" + sweep_note(result.sweep)
    )


def search_words(search: dict) -> str:
    """Why the heads were measured and how the search ended, in words (:meth:`HeadSearch.summary
    <headwise.study.importance_search.HeadSearch.summary>`)."""
    if "counts" not in search:  # none, or the exact route's
        return ""
    counts = search["counts"]
    words = {"estimate": "by |estimate|", "michel": "more by Michel's importance", "random": "at random",
             "bound": "by their bounds"}  # fmt: skip
    parts = ", ".join(f"{counts[r]} {w}" for r, w in words.items() if counts.get(r))
    kth = f"the {ordinal(search['top_k'])} largest exact effect, {search['threshold']:.4f}"
    if search["stopped"] == "complete":
        end = f"complete: no other head's bound reaches {kth}"
    else:
        end = (f"stopped at --max-exact {search['budget']}: {search['candidates_left']} heads' bounds (up to "
               f"{search['next_bound']:.4f}) still reach {kth}")  # fmt: skip
    return f"{parts}; search {end}"


def ordinal(n: int) -> str:
    """``2`` -> ``"2nd"``, ``32`` -> ``"32nd"``, ``512`` -> ``"512th"``."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def sweep_note(sweep: dict) -> str:
    """What the batched sweep ran, for the summary line (nothing when it did not run)."""
    if not sweep.get("passes"):
        return ""
    budget = f", memory budget {sweep['memory_budget'] / 2**30:.1f} GiB" if sweep.get("memory_budget") else ""
    return (
        f"\n  sweep: {sweep['head_sets']} head sets in {sweep['passes']} passes of up to {sweep['copies']} copies"
        f"{budget}; work of {sweep['forward_equivalents']:.0f} plain forwards; {sweep['seconds']:.1f} s"
    )
