"""The README's "Use" section runs: every ```sh and ```python block in it."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.model


def use_blocks() -> list[tuple[str, str]]:
    text = (REPO / "README.md").read_text()
    start, end = text.find("<!-- use:start"), text.find("<!-- use:end -->")
    assert 0 <= start < end, "README.md lost its Use section markers"
    return re.findall(r"```(sh|python)\n(.*?)```", text[start:end], re.S)


def test_the_use_section_has_the_three_uses():
    kinds = [k for k, _ in use_blocks()]
    assert kinds.count("sh") >= 1 and kinds.count("python") >= 2
    text = (REPO / "README.md").read_text()
    assert "pyllm chat" in text and "/reset" in text


@pytest.mark.parametrize("i", range(len(use_blocks())))
def test_readme_block_runs(i, smollm2_path, tmp_path):
    kind, code = use_blocks()[i]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    if kind == "python":
        r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=120)
    else:
        # `pyllm` as installed is `python -m cli.main` in a checkout
        shim = tmp_path / "bin" / "pyllm"
        shim.parent.mkdir()
        shim.write_text(f'#!/bin/sh\ncd "{REPO}" && exec "{sys.executable}" -m cli.main "$@"\n')
        shim.chmod(0o755)
        env["PATH"] = f"{shim.parent}{os.pathsep}{env['PATH']}"
        r = subprocess.run(["bash", "-euo", "pipefail", "-c", code], cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=180)
    assert r.returncode == 0, f"README block {i} ({kind}) failed:\n{code}\n--- stderr:\n{r.stderr}"
    assert r.stdout.strip()
