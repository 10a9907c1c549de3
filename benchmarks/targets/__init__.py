"""The benchmark targets, one concern each, in the order the report shows them.

Each is a :class:`targets.base.Target`: it measures itself (``measure(mode) -> Result``) and renders its
own section of ``docs/performance.md`` (``render(result)``, ``notes(result, results)``).
"""

from targets.base import Mode, Target
from targets.bf16 import BF16
from targets.blocked import Blocked
from targets.circuits import Circuits
from targets.compiled import Compiled
from targets.decode import Decode
from targets.forward import Forward
from targets.generate import Generate
from targets.gpu import GPU
from targets.heads_long import HeadsLong
from targets.importance import Importance
from targets.lab import Lab
from targets.limits import Limits
from targets.long import Long
from targets.qk import QK
from targets.train import Train
from targets.weights import Weights

ALL: dict[str, Target] = {
    t.name: t
    for t in (
        Limits(),
        Forward(),
        Compiled(),
        BF16(),
        Decode(),
        Generate(),
        Train(),
        Lab(),
        Weights(),
        Long(),
        HeadsLong(),
        Circuits(),
        QK(),
        Importance(),
        Blocked(),
        GPU(),
    )
}
CPU = [name for name in ALL if name != "gpu"]  # what run.py measures; the GPU target runs with run.py --gpu

__all__ = ["ALL", "CPU", "Mode", "Target"]
