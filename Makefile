# pyllm: `make install` sets up .venv with pyllm (C core built) and the default
# model; `make test` runs the tests; `make run PROMPT="..."` answers a prompt.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PROMPT ?= The three primary colors are
CSRC := $(wildcard csrc/*.c csrc/*.h csrc/x86/*.c csrc/arm/*.c)

.PHONY: install models test run build bench clean cuda cuda-emu cuda-emu-asan

install: $(VENV)/.installed models

$(VENV)/.installed: pyproject.toml setup.py pyllm/_build_native.py $(CSRC)
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check --upgrade pip 'setuptools>=77'
	$(BIN)/python -m pip install -q --disable-pip-version-check -e '.[test]'
	touch $@

# rebuild the C core in place (faster than reinstalling while working on csrc/)
build: $(VENV)/.installed
	$(BIN)/python setup.py -q build_ext --inplace

models: $(VENV)/.installed
	$(BIN)/pyllm pull smollm2-135m

test: install cuda-emu
	$(BIN)/python -m pytest -q

run: install
	$(BIN)/pyllm run --chat -p "$(PROMPT)" -n 64

bench: install
	$(BIN)/pyllm bench

# the CUDA library (csrc/cuda/ -> build/libpyllm_cuda.so), only where nvcc exists; nothing
# else needs it, and pyllm loads it at run time only when a GPU is present
NVCC ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
CUDA_ARCH ?= -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
             -gencode arch=compute_90,code=compute_90
CUDA_FLAGS ?= -O3 -std=c++17 -lineinfo
CUDA_SRC := $(wildcard csrc/cuda/*.cu)
CUDA_OBJ := $(patsubst csrc/cuda/%.cu,build/cuda/%.o,$(CUDA_SRC))
CUDA_HDR := $(wildcard csrc/cuda/*.cuh csrc/cuda/*.h) csrc/pyllm.h csrc/quants.h csrc/iq_grids.h
CUDA_LIB := build/libpyllm_cuda.so
CUDA_HOSTTEST := build/libpyllm_cuda_hosttest.so

cuda:
	@if [ -n "$(NVCC)" ]; then $(MAKE) --no-print-directory $(CUDA_LIB) $(CUDA_HOSTTEST); \
	else echo "nvcc not found: the CUDA library is not built (the CPU build and the tests do not need it)"; fi

build/cuda/%.o: csrc/cuda/%.cu $(CUDA_HDR)
	@mkdir -p build/cuda
	$(NVCC) $(CUDA_FLAGS) $(CUDA_ARCH) -Xcompiler -fPIC -Xcompiler -Wall -Xcompiler -Wno-unknown-pragmas -Icsrc -Icsrc/cuda -c $< -o $@

$(CUDA_LIB): $(CUDA_OBJ)
	$(NVCC) $(CUDA_ARCH) -shared -o $@ $(CUDA_OBJ)

# the kernels' readings of the weight formats compiled for the host, for tests without a GPU
$(CUDA_HOSTTEST): csrc/cuda/tests/hosttest.cu $(CUDA_HDR)
	@mkdir -p build
	$(NVCC) -O2 -std=c++17 -Xcompiler -fPIC -Xcompiler -ffp-contract=off -Icsrc -Icsrc/cuda -shared $< -o $@

# the same CUDA sources compiled by g++ against the CUDA emulator (csrc/cuda/emu/): no GPU and
# no nvcc needed; tests/test_cuda.py runs the kernels on it (and skips them, saying why, without g++)
EMU_CXX ?= $(shell command -v g++ 2>/dev/null)
EMU_FLAGS ?= -O2 -std=c++17 -fPIC -ffp-contract=off -Wall -Wno-unknown-pragmas
EMU_OBJ := $(patsubst csrc/cuda/%.cu,build/cuda-emu/%.o,$(CUDA_SRC)) build/cuda-emu/cuda_emu.o \
           build/cuda-emu/selftest.o
EMU_HDR := $(CUDA_HDR) $(wildcard csrc/cuda/emu/*.h)
EMU_LIB := build/libpyllm_cuda_emu.so

cuda-emu:
	@if [ -n "$(EMU_CXX)" ]; then $(MAKE) --no-print-directory $(EMU_LIB); \
	else echo "g++ not found: the CUDA emulator is not built (tests/test_cuda.py skips the kernel tests)"; fi

build/cuda-emu/%.o: csrc/cuda/%.cu $(EMU_HDR)
	@mkdir -p build/cuda-emu
	$(EMU_CXX) -x c++ $(EMU_FLAGS) -DPYLLM_CUDA_EMU -Icsrc -Icsrc/cuda -c $< -o $@

build/cuda-emu/%.o: csrc/cuda/emu/%.cpp $(EMU_HDR)
	@mkdir -p build/cuda-emu
	$(EMU_CXX) $(EMU_FLAGS) -DPYLLM_CUDA_EMU -Icsrc -Icsrc/cuda -c $< -o $@

build/cuda-emu/%.o: csrc/cuda/emu/%.cu $(EMU_HDR)
	@mkdir -p build/cuda-emu
	$(EMU_CXX) -x c++ $(EMU_FLAGS) -DPYLLM_CUDA_EMU -Icsrc -Icsrc/cuda -c $< -o $@

$(EMU_LIB): $(EMU_OBJ)
	$(EMU_CXX) -shared -o $@ $(EMU_OBJ)

# the emulator under AddressSanitizer and UBSan: a kernel reading or writing outside an
# allocation, or misaligned, stops with a report. Run the emulator's tests on it with
#   ASAN_OPTIONS=detect_leaks=0 LD_PRELOAD="$$(g++ -print-file-name=libasan.so) $$(g++ -print-file-name=libubsan.so)" \
#   PYLLM_CUDA_EMU_LIB=build/libpyllm_cuda_emu_asan.so $(BIN)/python -m pytest tests/test_cuda.py -k "emu or emulator"
EMU_ASAN_FLAGS := -O1 -g -fno-omit-frame-pointer -std=c++17 -fPIC -ffp-contract=off -Wall -Wno-unknown-pragmas \
                  -fsanitize=address,undefined,alignment -fno-sanitize-recover=all
EMU_ASAN_SRC := $(CUDA_SRC) csrc/cuda/emu/selftest.cu

cuda-emu-asan: build/libpyllm_cuda_emu_asan.so

build/libpyllm_cuda_emu_asan.so: $(EMU_ASAN_SRC) csrc/cuda/emu/cuda_emu.cpp $(EMU_HDR)
	@mkdir -p build
	$(EMU_CXX) $(EMU_ASAN_FLAGS) -DPYLLM_CUDA_EMU -Icsrc -Icsrc/cuda -shared -o $@ \
		-x c++ $(EMU_ASAN_SRC) -x none csrc/cuda/emu/cuda_emu.cpp

clean:
	rm -rf build pyllm/_native*.so pyllm/_native.c *.egg-info
