"""cffi builder for pyllm._native (API mode, out of line).

The ABI is csrc/pyllm.h; cffi reads its declarations as they are. The C
sources are listed here; the per-ISA files (csrc/x86/*.c, csrc/arm/*.c) are
compiled by setup.py with their own flags and linked in as extra objects.
"""
import os
import re

from cffi import FFI

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CSRC = os.path.join(ROOT, "csrc")

# portable sources, compiled with the baseline flags of the target
CORE_SOURCES = ["quants.c", "dispatch.c", "matmul.c", "moe.c", "attention.c", "ops.c", "ssm.c",
                "threadpool.c", "program.c", "kernel_api.c", "dense.c"]

# per-ISA sources and the flags each one needs (setup.py compiles them)
ISA_SOURCES = {
    "x86_64": [
        ("x86/avx2.c", ["-mavx2", "-mfma", "-mf16c", "-mbmi2"]),
        ("x86/avx2_vnni.c", ["-mavx2", "-mfma", "-mf16c", "-mbmi2", "-mavxvnni"]),
        ("x86/avx512.c", ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq",
                          "-mavx512vnni", "-mavx2", "-mfma", "-mf16c", "-mbmi2"]),
    ],
    "aarch64": [("arm/neon.c", []), ("arm/neon_dotprod.c", ["-march=armv8.2-a+dotprod"])],
}

# left out, with a warning, where the compiler lacks their flags (GCC < 11 has no
# -mavxvnni); dispatch.c then never picks them
OPTIONAL_ISA_SOURCES = {"x86/avx2_vnni.c", "arm/neon_dotprod.c"}

COMMON_FLAGS = ["-O3", "-std=c11", "-pthread", "-fno-strict-aliasing",
                "-Wall", "-Wno-unused-function"]


def _cdef_text() -> str:
    with open(os.path.join(CSRC, "pyllm.h")) as f:
        text = f.read()
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)        # comments
    text = "\n".join(l for l in text.splitlines() if not l.lstrip().startswith("#"))
    return text


ffibuilder = FFI()
ffibuilder.cdef(_cdef_text())
ffibuilder.set_source(
    "pyllm._native",
    '#include <stdint.h>\n#include <stddef.h>\n#include "pyllm.h"\n',
    sources=[os.path.relpath(os.path.join(CSRC, s), ROOT) for s in CORE_SOURCES],
    include_dirs=[CSRC],
    extra_compile_args=COMMON_FLAGS,
    extra_link_args=["-pthread", "-lm"],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
