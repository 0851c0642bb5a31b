"""Shared pytest setup: run from the repo root, CPU only.

    python -m pytest -q tests                     # everything (CI)
    python -m pytest -q -m "not slow" tests       # the inner loop: all but the multi-second tests
"""
import os
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from fgrpo_utils.cli import data_dir  # noqa: E402


@pytest.fixture(scope="session")
def data():
    """The reference data folder ($FGRPO_DATA or ../shared/data); skip when it is missing."""
    d = data_dir()
    if not d.is_dir():
        pytest.skip(f"reference data not found at {d}; set FGRPO_DATA")
    return d


# The files that take longest, first: pytest-xdist hands whole files to its processes in collection order
# (pytest.ini: --no-loadscope-reorder), so with these first the two processes finish together. Longest
# first as measured on a fresh clone on 2 cores; the others follow in their usual order.
LONGEST_FIRST = ["test_assignments.py", "test_train.py", "test_memory.py", "test_vllm.py", "test_resume.py",
                 "test_plan_vs_measured.py", "test_logp_memory.py", "test_train_scale.py", "test_reward.py"]


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


def pytest_configure(config):
    # Each of pytest-xdist's processes gets its share of the cores: torch's default of one thread per core
    # in every process oversubscribes them, and a parallel region then waits for a descheduled thread.
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        threads = max(1, (os.cpu_count() or 1) // workers)
        torch.set_num_threads(threads)
        os.environ["OMP_NUM_THREADS"] = str(threads)          # and the processes the tests start
    config.addinivalue_line("markers", "slow: takes seconds to minutes (trainer runs, vLLM, process "
                                       "pools, timeouts); left out of the fast tier, -m \"not slow\"")
