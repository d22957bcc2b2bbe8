#!/usr/bin/env bash
# The GPU check on a lent GPU machine, in one call or a few (each well under 10 minutes on an H200).
#   bash benchmarks/gpu_check.sh [tests|check|all]      (all: the default)
# Every stage first sets up: the carried wheels, and the libraries built here (gpu_pack.py puts the
# CUDA library and the C core in build/gpucheck/lib; where they do not load, they are built there).
#   tests: the GPU's kernel and split tests (tests/test_cuda.py and others, their real-GPU cases)
#   check: benchmarks/gpu_check.py: greedy tokens CPU vs full and half offload, pp512/tg128 for
#          ngl = 0, half, all, auto against the plan, bus bytes per token against the plan,
#          measured copy rates; on the whole models when gpu_pack.py --full's parts are there
#          (joined first, for the tests too); $GPU_CHECK_ARGS goes to gpu_check.py (--shapes ...)
#
# Before the calls, here:  python3 benchmarks/gpu_pack.py [--full]   (it prints the calls to make)
# What comes back:         $OUT/gpu_check.log, $OUT/pytest.log, $OUT/gpu_check.json
set -u
cd "$(dirname "$0")/.."
stage=${1:-all}
OUT=${OUT:-/tmp/gpucheck-out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/gpu_check.log") 2>&1
export PYTHONUNBUFFERED=1
CARRY=build/gpucheck
t0=$(date +%s)
step() { echo; echo "== $* ($(( $(date +%s) - t0 )) s)"; }

step "python packages"
if ls $CARRY/wheels/*.whl >/dev/null 2>&1; then
    [ -d /tmp/site/gguf ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site $CARRY/wheels/*.whl
    export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
python3 -c "import cffi, gguf, numpy; print('cffi', cffi.__version__, 'numpy', numpy.__version__)" || {
    echo "cffi or gguf missing: run benchmarks/gpu_pack.py here and carry build/gpucheck"; exit 2; }
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,clocks.sm --format=csv || true
echo "cpus: $(nproc),$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2); $(grep -o -w 'avx512f\|avx512_vnni\|avx_vnni\|amx_int8' /proc/cpuinfo | sort -u | tr '\n' ' ')"

step "libraries"
if [ -f $CARRY/lib/libpyllm_cuda.so ] && [ ! -f build/libpyllm_cuda.so ]; then
    mkdir -p build && cp $CARRY/lib/libpyllm_cuda*.so build/
fi
python3 -c "import ctypes; ctypes.CDLL('build/libpyllm_cuda.so')" 2>/dev/null || {
    echo "the carried CUDA library does not load here: building it"
    rm -f build/libpyllm_cuda*.so; make cuda -j"$(nproc)" || exit 3; }
ls -la build/libpyllm_cuda.so || exit 3
if [ -f $CARRY/lib/_native.abi3.so ] && [ ! -f pyllm/_native.abi3.so ]; then cp $CARRY/lib/_native.abi3.so pyllm/; fi
python3 -c "import pyllm._native" 2>/dev/null || {
    echo "the carried C core does not load here: building it"
    rm -f pyllm/_native*.so; python3 setup.py -q build_ext --inplace 2>&1 | grep -v -i warning | tail -5; }
python3 -c "import pyllm._native" || exit 4

step "whole models carried in parts (gpu_pack.py --full), if any"
python3 benchmarks/gpu_pack.py --join

export PYLLM_MODELS=${PYLLM_MODELS:-$PWD/models}
export PYLLM_CACHE=/tmp/pyllm-cache
rc=0
if [ "$stage" = tests ] || [ "$stage" = all ]; then
    step "GPU tests"
    # the [emu] variants (the CUDA emulator) run on every machine: here only the GPU's
    timeout 200 python3 -m pytest -q -rs --maxfail=5 -p no:cacheprovider tests/test_cuda.py -k "not emu" 2>&1 \
        | tee "$OUT/pytest.log" | tail -40
    rc=${PIPESTATUS[0]}
    timeout 60 python3 -m pytest -q -rs -p no:cacheprovider tests/test_media_rows.py -k gpu 2>&1 \
        | tee -a "$OUT/pytest.log" | tail -5
    [ "${PIPESTATUS[0]}" = 0 ] || rc=1
    # the CPU kernels too: this machine's CPU is not CI's (an H200 machine's Xeon has AVX-VNNI,
    # whose kernel build no other machine of ours has run)
    timeout 120 python3 -m pytest -q -rs -p no:cacheprovider tests/test_kernels.py 2>&1 \
        | tee -a "$OUT/pytest.log" | tail -5
    [ "${PIPESTATUS[0]}" = 0 ] || rc=1
fi
if [ "$stage" = check ] || [ "$stage" = all ]; then
    step "comparisons and speed"
    timeout 480 python3 benchmarks/gpu_check.py --out "$OUT/gpu_check.json" ${GPU_CHECK_ARGS:-}
    c=$?; [ $c = 0 ] || rc=$c
fi
step "done (rc $rc)"
exit $rc
