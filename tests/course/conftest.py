"""Fixtures shared by the course's tests."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="module")
def secret_env(request):
    """``ATTN_COURSE_SECRET`` set to the test module's ``SECRET`` for its tests, then restored.

    The processes the tests start inherit it (a Dask cluster's workers are
    trusted, as the grader is, and need the course's secret).
    """
    old = os.environ.get("ATTN_COURSE_SECRET")
    os.environ["ATTN_COURSE_SECRET"] = request.module.SECRET
    yield
    if old is None:
        del os.environ["ATTN_COURSE_SECRET"]
    else:
        os.environ["ATTN_COURSE_SECRET"] = old
