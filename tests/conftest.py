"""Shared test set-up: hypothesis profiles, determinism, offline Hugging Face."""

import os
import shutil
import tempfile

import torch
from hypothesis import HealthCheck, settings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("MPLBACKEND", "Agg")
# GGUF models de-quantised by a test run go to one folder per run (the bundled SmolLM2 once, ~25 s), not to
# the user's cache; a developer who set HEADWISE_CACHE_DIR keeps theirs.
_OWN_CACHE = None if "HEADWISE_CACHE_DIR" in os.environ else tempfile.mkdtemp(prefix="headwise-test-cache-")
if _OWN_CACHE is not None:
    os.environ["HEADWISE_CACHE_DIR"] = _OWN_CACHE
# the runs a test records (a command run layer by layer, what size --memory states) stay out of the user's state
os.environ["HEADWISE_STATE_DIR"] = os.path.join(_OWN_CACHE or tempfile.mkdtemp(prefix="headwise-test-"), "state")


def pytest_sessionfinish(session, exitstatus):
    """The run's own GGUF cache goes with it (a de-quantised SmolLM2 is 540 MB)."""
    if _OWN_CACHE is not None:
        shutil.rmtree(_OWN_CACHE, ignore_errors=True)


settings.register_profile("ci", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("deep", max_examples=10_000, deadline=None, suppress_health_check=list(HealthCheck))
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# Tests run tiny shapes, where OpenMP's thread barriers cost more than they save — and on a loaded
# 2-core machine a second thread made a 0.3 ms forward take 70 ms. One thread unless asked otherwise.
torch.set_num_threads(int(os.environ.get("HEADWISE_TEST_THREADS", "1")))
# Numba's pool as large as torch's (read when Numba's threading layer starts, after this). Its OpenMP pool (another
# libgomp than torch's) keeps a worker it is not using busy: once a compiled kernel had run on one of two threads,
# torch's work in the same process took up to a hundred times as long (3,000 small matmuls: 0.07-0.2 s before,
# 0.26-10 s after, on a loaded 2-core machine; unchanged with a pool of one), and the suite's later tests with it —
# a tiny model's anatomy tools 0.6 s alone, 9 s after a decode test.
os.environ.setdefault("NUMBA_NUM_THREADS", str(torch.get_num_threads()))
