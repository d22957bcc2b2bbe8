"""Prepares build/gpucheck/ (git-ignored) for benchmarks/gpu_check.sh on a lent GPU machine.

The device machine has no network and takes at most 64 MiB of working tree
per call, carried paths included. What it lacks, this puts in build/gpucheck/:

  wheels/   cffi, pycparser and gguf for CPython 3.12 (the machine's python3),
            fetched with `pip download` (the image has numpy, pyyaml, tqdm,
            requests, typer, rich, jinja2, regex, sentencepiece)
  models/   SmolLM2-135M cut to its first --layers layers (real weights and
            vocabulary: the full 98 MB file does not fit in a call; Gemma 3
            270M's 178 MB embedding alone does not either, so gpu_check.py
            writes a Gemma-3-shaped model on the machine instead)

Run here, from the repository root:
    python3 benchmarks/gpu_pack.py [--layers 8] [--no-wheels]
then call the device with carry=["build/gpucheck"] and the command
    bash benchmarks/gpu_check.sh
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

WHEELS = ["cffi==2.0.0", "pycparser==3.0", "gguf==0.19.0"]
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"]


def fetch_wheels(dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version", "3.12",
           "--implementation", "cp", "-d", str(dest), "-q"]
    for p in PLATFORMS:
        cmd += ["--platform", p]
    subprocess.run(cmd + WHEELS, check=True)


def cut_model(src: Path, dst: Path, layers: int) -> None:
    """A copy of a llama-layout GGUF keeping only blocks 0..layers-1."""
    import gguf
    import numpy as np
    r = gguf.GGUFReader(str(src))
    arch = str(bytes(r.fields["general.architecture"].parts[-1]), "utf-8")
    w = gguf.GGUFWriter(str(dst), arch)
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        if name == f"{arch}.block_count":
            w.add_uint32(name, layers)
            continue
        vtype = f.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            sub = f.types[-1]
            vals = [f.parts[i] for i in f.data]
            if sub == gguf.GGUFValueType.STRING:
                w.add_array(name, [bytes(v).decode("utf-8", errors="surrogateescape") for v in vals])
            else:
                w.add_array(name, [v.tolist()[0] for v in vals])
        elif vtype == gguf.GGUFValueType.STRING:
            w.add_string(name, bytes(f.parts[-1]).decode("utf-8"))
        else:
            w.add_key_value(name, f.parts[-1].tolist()[0], vtype)
    for t in r.tensors:
        if t.name.startswith("blk.") and int(t.name.split(".")[1]) >= layers:
            continue
        w.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)   # bytes as they are
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=8, help="SmolLM2 layers to keep (8: ~48 MiB)")
    ap.add_argument("--no-wheels", action="store_true")
    ap.add_argument("--out", default=str(ROOT / "build" / "gpucheck"))
    a = ap.parse_args()
    out = Path(a.out)
    if not a.no_wheels:
        fetch_wheels(out / "wheels")
    from pyllm import registry
    src = registry.local_path("smollm2-135m")
    if src.is_file():
        (out / "models").mkdir(parents=True, exist_ok=True)
        dst = out / "models" / f"smollm2-135m-{a.layers}layers.gguf"
        cut_model(src, dst, a.layers)
        print(f"{dst}: {dst.stat().st_size / 2**20:.1f} MiB")
    else:
        print(f"no {src}: set PYLLM_MODELS; gpu_check.py will use a SmolLM2-shaped synthetic model", file=sys.stderr)
    total = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(f"{out}: {total / 2**20:.1f} MiB to carry (the working tree travels too: keep the sum under 64 MiB)")


if __name__ == "__main__":
    main()
