"""The CUDA device: csrc/cuda/ built into its own library (`make cuda` ->
build/libpyllm_cuda.so), loaded with cffi in ABI mode only when a GPU is
present (libcuda.so.1 loads, cuInit succeeds and a device is found). The
normal build and the tests never need it.

The library runs the same op records as the C core (csrc/pyllm.h), with
device pointers in them: `CudaProgram` allocates a device's share of a graph
on the GPU (weights uploaded once from the mapped file, activation buffers,
quantized buffers, KV pools, a staging area for streamed weights), fills the
records with lowering.fill_record, and runs a range of them per step with
one call. Copies in and out of buffers are counted on the device's Bus,
like the sim device's.
"""
from __future__ import annotations

import ctypes
import os
import re
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from ..errors import BackendError, InvalidArgumentError
from ..graph import Graph, View
from ..model_file import Tensor
from .base import (ACTIVATIONS, CONTROL, D2H, H2D, WEIGHTS, Bus, Device, DeviceMemoryError, Program, Range, Shape,
                   StepData)
from .lowering import fill_record, memory_plan, step_needs

REPO = Path(__file__).resolve().parent.parent.parent
LIB_NAME = "libpyllm_cuda.so"


# -- is there a GPU? ---------------------------------------------------------------------------------

def library_path() -> Optional[Path]:
    """$PYLLM_CUDA_LIB, else build/libpyllm_cuda.so in the checkout, else beside the package."""
    env = os.environ.get("PYLLM_CUDA_LIB")
    candidates = [Path(env)] if env else [REPO / "build" / LIB_NAME, Path(__file__).resolve().parent.parent / LIB_NAME]
    return next((p for p in candidates if p.is_file()), None)


def driver_devices() -> tuple[int, str]:
    """(CUDA devices the driver sees, why none) without loading our library."""
    try:
        cu = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return 0, "no NVIDIA driver (libcuda.so.1 cannot be loaded)"
    try:
        rc = cu.cuInit(0)
        if rc != 0:
            return 0, f"the NVIDIA driver did not start (cuInit error {rc})"
        n = ctypes.c_int(0)
        rc = cu.cuDeviceGetCount(ctypes.byref(n))
        if rc != 0:
            return 0, f"the NVIDIA driver cannot count devices (error {rc})"
        if n.value == 0:
            return 0, "no CUDA device found"
        return n.value, ""
    except AttributeError:
        return 0, "libcuda.so.1 is not a CUDA driver library"


def available() -> tuple[bool, str]:
    """(a CUDA GPU can be used, what was found)"""
    n, why = driver_devices()
    if n == 0:
        return False, why
    lib = library_path()
    if lib is None:
        return False, f"{n} CUDA device(s) found, but {LIB_NAME} is not built (run `make cuda`)"
    return True, f"{n} CUDA device(s); {lib}"
