"""Shared test set-up: hypothesis profiles, determinism, offline Hugging Face."""

import os

import torch
from hypothesis import HealthCheck, settings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("MPLBACKEND", "Agg")

settings.register_profile("ci", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("deep", max_examples=10_000, deadline=None, suppress_health_check=list(HealthCheck))
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# Tests run tiny shapes, where OpenMP's thread barriers cost more than they save — and on a loaded
# 2-core machine a second thread made a 0.3 ms forward take 70 ms. One thread unless asked otherwise.
torch.set_num_threads(int(os.environ.get("HEADWISE_TEST_THREADS", "1")))
