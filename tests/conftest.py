"""Fixtures shared by the tests."""

import pytest

from .helpers import TINY, Tiny


@pytest.fixture(params=TINY)
def tiny(request) -> Tiny:
    return Tiny(request.param)
