"""
pytest setup of the grading tests (the helpers they share are in grading.py).

    python assignments/grade.py                         # points per problem (the way to run them)
    python -m pytest -q assignments/tests               # the same tests, plain pytest, from the repo root
"""
import os
from pathlib import Path

import pytest

import advantage


@pytest.fixture(autouse=True, scope="session")
def graded_copy():
    """Under grade.py: fail loudly if Python found another advantage.py than the one being graded."""
    want = os.environ.get("FGRPO_GRADE_DIR")
    if want:
        got = Path(advantage.__file__).resolve().parent
        assert got == Path(want).resolve(), f"imported {advantage.__file__}, but grading {want}"

