"""``torch.compile(fullgraph=True)`` against eager, for headwise and nn.MultiheadAttention (float32).

Inference (``torch.no_grad``) in every run; the training step (forward and backward) in full runs. A
module that does not compile is reported with the first line of its error, not left out.
"""

from __future__ import annotations

import time

import torch
from machine import log
from peers import build
from row import Row
from timing import compare

from targets.base import Mode, Target, contender_table, flops_mha


def _compile(name: str, fn, check):
    """``(compiled fn, {"compile_s", "max_abs_vs_eager"} or {"error"})``: compiled and run once, compared."""
    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True)
    t0 = time.perf_counter()
    try:
        got = check(compiled)
    except Exception as e:  # noqa: BLE001 - any failure to compile is the finding
        lines = [x.strip() for x in str(e).splitlines() if x.strip()]
        # the exception's own first line, and the operator it failed on when Inductor names one
        first = "; ".join(dict.fromkeys([*lines[:1], *[x for x in lines if x.startswith("target:")][:1]]))[:300]
        log(f"  {name}: does not compile: {type(e).__name__}: {first}")
        return None, {"error": f"{type(e).__name__}: {first}", "compile_s": time.perf_counter() - t0}
    info = {"compile_s": time.perf_counter() - t0, "max_abs_vs_eager": float((got - check(fn)).abs().max())}
    log(f"  {name}: compiled in {info['compile_s']:.0f} s, max |compiled − eager| {info['max_abs_vs_eager']:.1e}")
    return compiled, info


class Compiled(Target):
    name = "compiled"
    title = "torch.compile(fullgraph=True) against eager"
    shape = (8, 512, 768, 12)

    def measure(self, mode: Mode):
        B, L, D, H = self.shape
        mods = build(D, H, peers=("torch",))
        hw, tm = mods["headwise"], mods["torch"]
        x = torch.randn(B, L, D)
        eager = {"headwise": lambda x: hw(x)[0], "nn.MHA": lambda x: tm(x, x, x, need_weights=False)[0]}
        rows, info, data = [], {}, {"shape": list(self.shape)}
        with torch.no_grad():
            fns = {}
            for name, f in eager.items():
                fns[f"{name} eager"] = lambda f=f: f(x)
                compiled, info[f"{name} inference"] = _compile(f"{name} inference", f, lambda g: g(x))
                if compiled is not None:
                    fns[f"{name} compiled"] = lambda c=compiled: c(x)
            log(f"compiled {self.shape}: {list(fns)}")
            res = compare(fns, rounds=mode.rounds + 1, target_s=mode.target_s)
        data.update(timing=res.to_json(), table=res.table(["nn.MHA eager"], flops_mha(B, L, D)))
        rows += self._rows(res, info, "inference")
        if mode.full:
            g = torch.randn(B, L, D)
            xg = x.clone().requires_grad_(True)

            def step(f):
                def run():
                    xg.grad = None
                    for p in (*hw.parameters(), *tm.parameters()):
                        p.grad = None
                    (f(xg) * g).sum().backward()
                    return xg.grad

                return run

            hw.train(), tm.train()
            fns = {}
            for name, f in eager.items():
                fns[f"{name} eager"] = step(f)
                compiled, info[f"{name} training"] = _compile(f"{name} training", f, lambda c: step(c)())
                if compiled is not None:
                    fns[f"{name} compiled"] = step(compiled)
            res_t = compare(fns, rounds=mode.rounds, target_s=mode.target_s)
            hw.eval(), tm.eval()
            data.update(timing_train=res_t.to_json(), table_train=res_t.table(["nn.MHA eager"], 3 * flops_mha(B, L, D)))
            rows += self._rows(res_t, info, "training")
        return self.result(rows, compile=info, **data)

    @staticmethod
    def _rows(res, info, kind: str) -> list[Row]:
        hw = info[f"headwise {kind}"]
        rows = [
            Row(
                f"headwise compiles ({kind}, fullgraph)",
                "error" not in hw,
                "compiles",
                "error" not in hw,
                hw.get("error") or f"{hw['compile_s']:.0f} s; max |compiled − eager| {hw['max_abs_vs_eager']:.1e}",
            )
        ]
        for name in ("headwise", "nn.MHA"):
            if f"{name} compiled" in res:
                rows.append(
                    Row(f"{name} {kind}: compiled time ÷ eager time", res.ratio(f"{name} compiled", f"{name} eager"))
                )
        if "headwise compiled" in res and "nn.MHA compiled" in res:
            rows.append(
                Row(f"{kind}: headwise compiled ÷ nn.MHA compiled", res.ratio("headwise compiled", "nn.MHA compiled"))
            )
        return rows

    def render(self, r):
        lines = []
        for kind, key in (
            ("Inference (`torch.no_grad`)", "table"),
            ("Training step (forward + backward)", "table_train"),
        ):
            if key in r.data:
                lines += [f"{kind}:", "", *contender_table(r.data[key]), ""]
        lines += ["| module | compile | compile time | max \\|compiled − eager\\| |", "|---|---|---|---|"]
        for name, i in r.data["compile"].items():
            ok = "fails: " + i["error"] if "error" in i else "works"
            diff = f"{i['max_abs_vs_eager']:.1e}" if "max_abs_vs_eager" in i else "—"
            lines.append(f"| {name} | {ok.replace('|', '/')} | {i['compile_s']:.0f} s | {diff} |")
        return lines + [""]
