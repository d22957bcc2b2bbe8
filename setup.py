"""Builds the C core (pyllm._native) with cffi.

The portable C files get baseline flags; each per-ISA file gets its own
(-mavx2 ..., -mavx512f ...), so one build runs on any x86-64 CPU and the
kernels are picked at run time (csrc/dispatch.c).
"""
import glob
import os
import platform
import sys

from setuptools import setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import CompileError

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "pyllm"))
from _build_native import COMMON_FLAGS, CSRC, ISA_SOURCES, OPTIONAL_ISA_SOURCES  # noqa: E402


def _machine() -> str:
    m = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(m, m)


class BuildWithIsaFiles(build_ext):
    def build_extension(self, ext):
        objects = []
        for src, flags in ISA_SOURCES.get(_machine(), []):
            try:
                objects += self.compiler.compile(
                    [os.path.relpath(os.path.join(CSRC, src))],
                    output_dir=self.build_temp,
                    include_dirs=[CSRC],
                    extra_postargs=COMMON_FLAGS + ["-fPIC"] + flags,
                )
            except CompileError:
                if src not in OPTIONAL_ISA_SOURCES:
                    raise
                print(f"warning: {src} left out: the compiler does not take {' '.join(flags)}", file=sys.stderr)
        ext.extra_objects = list(ext.extra_objects or []) + objects
        # relink when a per-ISA file or any header changes, not only the core sources
        ext.depends = list(ext.depends or []) + [os.path.relpath(os.path.join(CSRC, s)) for s, _ in
                                                 ISA_SOURCES.get(_machine(), [])]
        ext.depends += [os.path.relpath(p) for p in glob.glob(os.path.join(CSRC, "**", "*.h"), recursive=True)]
        super().build_extension(ext)


setup(
    cffi_modules=["pyllm/_build_native.py:ffibuilder"],
    cmdclass={"build_ext": BuildWithIsaFiles},
)
