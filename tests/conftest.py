"""Shared fixtures: the real models, fetched from PyPI into models/ when absent."""
from __future__ import annotations

import signal

import pytest

from pyllm import registry

# A run started in the background by a non-interactive shell (`make test &`) inherits Ctrl-C
# ignored, and so would every command the tests start (Python then never raises
# KeyboardInterrupt): the Ctrl-C tests need it delivered, so the tests' children get it back.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


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
def minilm_path() -> str:
    """all-MiniLM-L6-v2, a real BERT sentence encoder, converted from its wheel's safetensors."""
    return ensure_model("all-minilm-l6-v2")


@pytest.fixture(scope="session")
def model_path():
    """model_path(file_name) -> the path of that registry model's file, fetched if absent."""
    by_file = {m.file: name for name, m in registry.MODELS.items()}

    def get(file_name: str) -> str:
        return ensure_model(by_file[file_name])
    return get


@pytest.fixture(autouse=True)
def _pyllm_logger_restored():
    """A CLI command run in-process points the pyllm logger at stderr and stops
    it propagating; put it back so later tests' caplog sees pyllm's messages."""
    import logging
    log = logging.getLogger("pyllm")
    handlers, propagate, level = list(log.handlers), log.propagate, log.level
    yield
    log.handlers[:], log.propagate, log.level = handlers, propagate, level
