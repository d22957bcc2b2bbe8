#!/usr/bin/env bash
# The GPU check, in one device call (well under 10 minutes on an H200):
#   builds `make cuda` and the C core, runs the GPU tests, then
#   benchmarks/gpu_check.py: greedy tokens CPU vs full and half offload,
#   pp512/tg128 for ngl = 0, half, all, auto against the plan, bus bytes per
#   token against the plan, measured copy rates.
#
# Before the call, here:   python3 benchmarks/gpu_pack.py      (wheels + a cut SmolLM2 in build/gpucheck;
#                          --full: the whole models too, in parts carried by earlier calls: see gpu_pack.py)
# The call:                run(command="bash benchmarks/gpu_check.sh", carry=["build/gpucheck"], timeout_s=600)
# What comes back:         $OUT/gpu_check.log, $OUT/gpu_check.json, $OUT/pytest.log
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpucheck-out}
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu_check.log") 2>&1
export PYTHONUNBUFFERED=1
CARRY=build/gpucheck
t0=$(date +%s)
step() { echo; echo "== $* ($(( $(date +%s) - t0 )) s)"; }

step "python packages"
if ls $CARRY/wheels/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        $CARRY/wheels/*.whl && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
python3 -c "import cffi, gguf, numpy; print('cffi', cffi.__version__, 'numpy', numpy.__version__)" || {
    echo "cffi or gguf missing: run benchmarks/gpu_pack.py here and carry build/gpucheck"; exit 2; }
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,clocks.sm --format=csv || true
nproc

step "whole models carried in parts (gpu_pack.py --full), if any"
python3 benchmarks/gpu_pack.py --join

step "make cuda"
make cuda -j"$(nproc)" || exit 3
ls -la build/libpyllm_cuda.so || exit 3

step "C core"
python3 setup.py -q build_ext --inplace 2>&1 | grep -v -i warning | tail -5
python3 -c "import pyllm._native" || exit 4

step "GPU tests"
export PYLLM_MODELS=${PYLLM_MODELS:-$PWD/models}
export PYLLM_CACHE=/tmp/pyllm-cache
# the [emu] variants (the CUDA emulator) run on every machine: here only the GPU's
timeout 240 python3 -m pytest -q -rs tests/test_cuda.py -k "not emu" 2>&1 | tee "$OUT/pytest.log" | tail -40
timeout 120 python3 -m pytest -q tests/test_split.py tests/test_placement.py -k "not smollm2" 2>&1 | tail -3

step "comparisons and speed"
timeout 300 python3 benchmarks/gpu_check.py --out "$OUT/gpu_check.json"
rc=$?
step "done (rc $rc)"
exit $rc
