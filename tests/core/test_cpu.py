"""What the CPU can do (``headwise.core.cpu``), and the fast paths asking it before they are taken.

- the reader agrees with torch and oneDNN in this process, and says no bf16 under ``ONEDNN_MAX_CPU_ISA=AVX2``;
- on a CPU whose oneDNN computes no bf16 (a laptop's AVX2, here given by the reader), a bf16 module runs the
  plain torch route — oneDNN's operator is never called — and equals the float64 reference within the bf16
  bound; without oneDNN at all, ``projections.linear`` is ``F.linear`` itself;
- the same under the real emulation, in a fresh interpreter (oneDNN reads its ISA once per process).
"""

import os
import platform
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
import torch
import torch.nn.functional as F

import headwise
from _helpers import assert_bf16_bounded
from headwise.core import cpu, one_query, projections

AVX2 = {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}
LAPTOP = cpu.CPU(aten="AVX2", onednn=True, onednn_bf16=False, onednn_fp16=False)
NO_ONEDNN = cpu.CPU(aten="DEFAULT", onednn=False, onednn_bf16=False, onednn_fp16=False)


def test_the_reader_says_what_torch_and_onednn_say():
    here = cpu.capabilities()
    assert here is cpu.capabilities()  # read once
    assert here.aten == torch.backends.cpu.get_cpu_capability()
    assert here.onednn_bf16 == torch.ops.mkldnn._is_mkldnn_bf16_supported()
    assert here.linear_dtypes == ((torch.float32, torch.bfloat16) if here.onednn_bf16 else (torch.float32,))
    assert one_query.bf16_products() == here.onednn_bf16
    if os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper() == "AVX2":  # make test-avx2, or the subprocess below
        assert not here.onednn_bf16 and not here.bf16_products
        assert here.aten == ("AVX2" if os.environ.get("ATEN_CPU_CAPABILITY") == "avx2" else here.aten)


def test_numba_target_follows_numba_cpu_name():
    pytest.importorskip("numba")
    want = os.environ.get("NUMBA_CPU_NAME")
    assert cpu.numba_target() == (want or __import__("llvmlite.binding").binding.get_host_cpu_name())


def _refuse(*args, **kwargs):
    raise RuntimeError("could not create a primitive descriptor for the inner product forward propagation primitive")


def test_a_bf16_module_without_onednn_bf16_takes_the_plain_route(monkeypatch):
    """The CPU is read as a laptop's (AVX2: no oneDNN bf16), and oneDNN's bf16 linear fails as it does there."""
    monkeypatch.setattr(cpu, "capabilities", lambda: LAPTOP)
    real = torch.ops.mkldnn._linear_pointwise
    calls = []

    def onednn(x, *args):
        calls.append(x.dtype)
        return _refuse() if x.dtype == torch.bfloat16 else real(x, *args)

    with mock.patch.object(torch.ops.mkldnn, "_linear_pointwise", onednn):
        assert_bf16_bounded("bf16-module")
        assert torch.bfloat16 not in calls
        x, w, b = torch.randn(2, 5, 16), torch.randn(8, 16), torch.randn(8)
        with torch.no_grad():
            projections.linear(x, w, b)  # float32 still goes through oneDNN
        assert calls == [torch.float32]
    assert not one_query.bf16_products()


def test_without_onednn_linear_is_f_linear(monkeypatch):
    monkeypatch.setattr(cpu, "capabilities", lambda: NO_ONEDNN)
    torch.manual_seed(0)
    x, w, b = torch.randn(3, 7, 16), torch.randn(8, 16), torch.randn(8)
    with torch.no_grad(), mock.patch.object(torch.ops.mkldnn, "_linear_pointwise", _refuse):
        for dtype in (torch.float32, torch.bfloat16):
            got = projections.linear(x.to(dtype), w.to(dtype), b.to(dtype))
            assert torch.equal(got, F.linear(x.to(dtype), w.to(dtype), b.to(dtype)))
        m = headwise.MultiHeadAttention(16, 2, dtype=torch.bfloat16).eval()
        assert m(x.bfloat16(), x.bfloat16(), x.bfloat16())[0].dtype == torch.bfloat16


#: Run in a fresh interpreter under the emulation: the reader's answer, then the bf16 module against the reference.
EMULATED = """
import sys
sys.path.insert(0, sys.argv[1])
from headwise.core import cpu
from _helpers import assert_bf16_bounded
here = cpu.capabilities()
assert here.aten == "AVX2" and not here.onednn_bf16 and not here.bf16_products, here
assert_bf16_bounded("bf16-module")
"""


@pytest.mark.skipif(os.environ.get("ONEDNN_MAX_CPU_ISA") is not None, reason="the whole run is emulated already")
@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="AVX2 is an x86-64 instruction set")
def test_avx2_emulation_in_a_fresh_interpreter():
    """``ONEDNN_MAX_CPU_ISA=AVX2``: the reader says no bf16 and the bf16 module runs, within the bf16 bound
    (before the reader was asked, oneDNN's bf16 linear raised "could not create a primitive descriptor")."""
    tests = str(Path(__file__).resolve().parent.parent)
    done = subprocess.run(
        [sys.executable, "-c", EMULATED, tests], env={**os.environ, **AVX2}, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]


def test_numba_caches_each_target_apart():
    """Numba's on-disk cache keys an entry by ``(triple, CPU name, CPU features)``: kernels compiled for the host
    (AVX-512) are not loaded back under ``NUMBA_CPU_NAME=generic``, which compiles for any x86-64 (no features)."""
    pytest.importorskip("numba")
    from numba.core.registry import cpu_target

    _, name, features = cpu_target.target_context.codegen().magic_tuple()
    assert name == cpu.numba_target()
    if name == "generic":
        assert features == ""
