"""Prepares build/gpucheck/ (git-ignored) for benchmarks/gpu_check.sh on a lent GPU machine.

The device machine has no network and takes at most 64 MiB of working tree
per call, carried paths included. What it lacks, this puts in build/gpucheck/:

  wheels/   cffi, pycparser and gguf for CPython 3.12 (the machine's python3),
            fetched with `pip download` (the image has numpy, pyyaml, tqdm,
            requests, typer, rich, jinja2, regex, sentencepiece)
  lib/      the CUDA library and the C core built here (`make cuda`, `make build`;
            the core is a stripped copy of pyllm/_native.abi3.so, which any
            CPython 3 takes): building them there would cost device minutes;
            gpu_check.sh builds them there only where these do not load
  models/   SmolLM2-135M cut to its first --layers layers (real weights and
            vocabulary: the full 98 MB file does not fit in a call; Gemma 3
            270M's 178 MB embedding alone does not either, so gpu_check.py
            writes a Gemma-3-shaped model on the machine instead)

Run here, from the repository root:
    python3 benchmarks/gpu_pack.py [--layers 8] [--no-wheels]
then call the device with carry=["build/gpucheck"] and the command
    bash benchmarks/gpu_check.sh

The real models whole (issue 6 asks for SmolLM2 and Gemma 3 themselves):
`--full` also cuts both files into parts of at most --part-mib, one folder
per part (build/gpucheck-p1, -p2, ...), with their sizes and sha256 in
build/gpucheck/full.json. A call carries at most 64 MiB, but what a call
left on a warm machine stays there for the next one (a machine goes back
after 30 s idle): so carry one folder per call, one call right after the
other: the first runs the tests with build/gpucheck, the parts follow with
`true` as the command, and the last part's call runs the check, which joins
the parts into models/ (`--join`, checking each file's sha256) first. About
7 calls for 351 MB: the transfers cost device time, so do this only with
minutes to spare.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import shutil
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


def copy_libraries(dest: Path) -> None:
    """The CUDA library (and its host-test twin) and a stripped C core, where built here."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("libpyllm_cuda.so", "libpyllm_cuda_hosttest.so"):
        src = ROOT / "build" / name
        if src.is_file():
            shutil.copy2(src, dest / name)
        else:
            print(f"no {src} (make cuda): gpu_check.sh will build it on the machine", file=sys.stderr)
    core = ROOT / "pyllm" / "_native.abi3.so"
    if core.is_file():
        subprocess.run(["strip", "--strip-debug", "-o", str(dest / core.name), str(core)], check=True)
    else:
        print(f"no {core} (make build): gpu_check.sh will build it on the machine", file=sys.stderr)


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def split_models(files: list[Path], out: Path, part_bytes: int) -> list[Path]:
    """Cuts the files, one after the other as one stream, into parts of
    part_bytes (the last one shorter), one folder a part (out-p1, out-p2,
    ...); writes the files' names, sizes and sha256 and the parts in order
    to out/full.json; returns the folders."""
    folders, parts = [], []
    buf = bytearray()

    def flush():
        folder = out.parent / f"{out.name}-p{len(folders) + 1}"
        folder.mkdir(parents=True, exist_ok=True)
        part = folder / f"models.{len(folders):02d}"
        part.write_bytes(bytes(buf[:part_bytes]))
        del buf[:part_bytes]
        folders.append(folder)
        parts.append(str(part.relative_to(ROOT)))

    for src in files:
        with open(src, "rb") as f:
            for block in iter(lambda: f.read(1 << 24), b""):
                buf += block
                while len(buf) >= part_bytes:
                    flush()
    if buf:
        flush()
    out.mkdir(parents=True, exist_ok=True)
    listing = {"files": [{"name": p.name, "size": p.stat().st_size, "sha256": sha256(p)} for p in files],
               "parts": parts}
    (out / "full.json").write_text(json.dumps(listing, indent=1))
    return folders


def join_models(out: Path, models: Path) -> int:
    """On the device: joins the parts listed in out/full.json and cuts the
    stream back into the files, in models/; returns how many files came out
    whole (with a part missing nothing is joined; a file whose sha256
    differs is removed; both are said)."""
    listing = out / "full.json"
    if not listing.is_file():
        return 0
    m = json.loads(listing.read_text())
    missing = [p for p in m["parts"] if not (ROOT / p).is_file()]
    if missing:
        print(f"{len(missing)} of {len(m['parts'])} parts missing ({', '.join(missing)}): the whole models are not here")
        return 0
    models.mkdir(parents=True, exist_ok=True)
    stream = (open(ROOT / p, "rb") for p in m["parts"])
    cur, joined = next(stream), 0
    for f in m["files"]:
        dst, left = models / f["name"], f["size"]
        with open(dst, "wb") as w:
            while left:
                block = cur.read(min(left, 1 << 24))
                if not block:
                    cur.close()
                    cur = next(stream)
                    continue
                w.write(block)
                left -= len(block)
        if sha256(dst) != f["sha256"]:
            print(f"{dst}: differs from the original (sha256): removed")
            dst.unlink()
            continue
        print(f"{dst}: joined, sha256 ok")
        joined += 1
    cur.close()
    return joined


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=8, help="SmolLM2 layers to keep (8: ~48 MiB)")
    ap.add_argument("--no-wheels", action="store_true")
    ap.add_argument("--out", default=str(ROOT / "build" / "gpucheck"))
    ap.add_argument("--full", action="store_true", help="also cut the whole real models into parts (see above)")
    ap.add_argument("--part-mib", type=int, default=58, help="with --full: the size of a part")
    ap.add_argument("--join", action="store_true", help="on the device: join the parts into --models")
    ap.add_argument("--models", default=str(ROOT / "models"))
    a = ap.parse_args()
    out = Path(a.out)
    if a.join:
        join_models(out, Path(a.models))
        return
    if not a.no_wheels:
        fetch_wheels(out / "wheels")
    copy_libraries(out / "lib")
    from pyllm import registry
    src = registry.local_path("smollm2-135m")
    if a.full:   # the whole file goes instead of the cut one
        for old in (out / "models").glob("*.gguf"):
            old.unlink()
    elif src.is_file():
        (out / "models").mkdir(parents=True, exist_ok=True)
        dst = out / "models" / f"smollm2-135m-{a.layers}layers.gguf"
        cut_model(src, dst, a.layers)
        print(f"{dst}: {dst.stat().st_size / 2**20:.1f} MiB")
    else:
        print(f"no {src}: set PYLLM_MODELS; gpu_check.py will use a SmolLM2-shaped synthetic model", file=sys.stderr)
    total = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(f"{out}: {total / 2**20:.1f} MiB to carry (the working tree travels too: keep the sum under 64 MiB)")
    if a.full:
        files = [p for p in (registry.local_path("smollm2-135m"), registry.local_path("gemma3-270m")) if p.is_file()]
        folders = split_models(files, out, a.part_mib << 20)
        print(f"{len(folders)} parts; the calls, back to back (a machine goes back after 30 s idle):")
        print(f"  run(command='bash benchmarks/gpu_check.sh tests', carry={[str(out.relative_to(ROOT))]}, timeout_s=300)")
        for i, f in enumerate(folders):
            last = i == len(folders) - 1
            print(f"  run(command='{'bash benchmarks/gpu_check.sh check' if last else 'true'}', "
                  f"carry={[str(f.relative_to(ROOT))]}{', timeout_s=600' if last else ''})")


if __name__ == "__main__":
    main()
