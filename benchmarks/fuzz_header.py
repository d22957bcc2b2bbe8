#!/usr/bin/env python3
"""Corrupt a real GGUF file's header at random and check that pyllm fails cleanly.

Each run flips 1-4 random bytes of a copy of the file, mostly in the tensor
infos (names, shapes, types, offsets), otherwise in the magic, version and
counts or the metadata, then loads the copy and generates a few tokens in a
fresh Python process. Every run must end in success or a PyllmError (exit
code 3 here); a crash, a hang or any other exception is reported with the
bytes that caused it. Slow (a process per run), so it is a tool, not a test.

Usage: python benchmarks/fuzz_header.py -m models/SmolLM2-135M-Instruct.Q4_1.gguf [-n 100] [--seed 1]
Exit status 1 when any run failed badly.
"""
from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CHILD = r'''
import sys
from pyllm import Model
from pyllm.errors import PyllmError
try:
    Model(sys.argv[1], n_ctx=64).generate("Hello there", max_tokens=3)
except PyllmError:
    sys.exit(3)
'''


def header_regions(path: str) -> tuple[int, int]:
    """(where the tensor infos start, where the tensor data starts)"""
    from pyllm.model_file import ModelFile
    with ModelFile(path) as mf:
        data_offset = mf.data_offset
        names = list(mf.tensors)[:3]
    with open(path, "rb") as f:
        head = f.read(data_offset)
    infos = min(head.find(n.encode()) for n in names) - 8  # the name's length precedes it
    return infos, data_offset


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("-n", "--runs", type=int, default=100)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=120, help="seconds a run may take before it counts as a hang")
    a = ap.parse_args()

    infos, data = header_regions(a.model)
    rng = random.Random(a.seed)
    counts = {"ok": 0, "PyllmError": 0, "bad": 0}
    with tempfile.TemporaryDirectory() as tmp:
        copy = os.path.join(tmp, "fuzz.gguf")
        shutil.copy(a.model, copy)
        for run in range(a.runs):
            u = rng.random()
            lo, hi = (infos, data) if u < 0.6 else (0, 64) if u < 0.8 else (0, infos)
            patches = []
            with open(copy, "r+b") as f:
                for _ in range(rng.choice([1, 1, 2, 4])):
                    off = rng.randrange(lo, hi)
                    f.seek(off)
                    old = f.read(1)
                    new = rng.choice([bytes([rng.randrange(256)]), b"\xff", b"\x00",
                                      bytes([old[0] ^ (1 << rng.randrange(8))])])
                    f.seek(off)
                    f.write(new)
                    patches.append((off, old, new))
            try:
                p = subprocess.run([sys.executable, "-c", CHILD, copy], capture_output=True, text=True,
                                   timeout=a.timeout, cwd=str(ROOT))
                kind = {0: "ok", 3: "PyllmError"}.get(p.returncode, "bad")
                why = f"exit code {p.returncode}: {p.stderr.strip()[-600:]}"
            except subprocess.TimeoutExpired:
                kind, why = "bad", f"no end after {a.timeout:.0f} s"
            counts[kind] += 1
            if kind == "bad":
                print(f"run {run}: {why}\n  bytes (offset, old, new): {patches}", flush=True)
            with open(copy, "r+b") as f:  # undo, for the next run
                for off, old, _ in reversed(patches):
                    f.seek(off)
                    f.write(old)
    print(f"{a.runs} runs: {counts['ok']} ran, {counts['PyllmError']} refused with a PyllmError, "
          f"{counts['bad']} failed badly")
    return 1 if counts["bad"] else 0


if __name__ == "__main__":
    sys.exit(main())
