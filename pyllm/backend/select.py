"""Choosing the backend for a model: the CPU alone, or a split between the
CPU and a GPU (a CUDA device, or the sim device for tests), as placed by
the planner.

    device:       None/"auto" (a CUDA GPU if one is present), "cuda", "sim", "cpu"
                  (default: $PYLLM_DEVICE, else auto)
    n_gpu_layers: "auto" (default), "all", or a number of layers

With no GPU, "auto" runs on the CPU (said in a debug line of the "pyllm"
logger); asking for GPU layers without one is a BackendError.

The CUDA emulator (build/libpyllm_cuda_emu.so, for tests) is never chosen
automatically: $PYLLM_CUDA_LIB pointing at it is used only with device=cuda
and an explicit number of GPU layers.
"""
from __future__ import annotations

import logging
import os
from typing import Any, Optional

from ..errors import BackendError, InvalidArgumentError
from .base import Backend, Device, Shape
from .cpu import CpuBackend, HostDevice

log = logging.getLogger("pyllm")

DEVICES = ("auto", "cuda", "sim", "cpu")


def gpu_device(kind: Optional[str], host: HostDevice) -> tuple[Optional[Device], str]:
    """(the GPU device to use or None, why)"""
    kind = (kind or os.environ.get("PYLLM_DEVICE") or "auto").strip().lower()
    if kind not in DEVICES:
        raise InvalidArgumentError(f"device must be one of {', '.join(DEVICES)}, not {kind!r}")
    if kind == "cpu":
        return None, "the CPU was asked for (device=cpu)"
    if kind == "sim":
        from .sim import SimDevice
        dev = SimDevice.from_env(host)
        return dev, f"the sim device: {dev.name}"
    from . import cuda
    ok, why = cuda.available()
    if ok and kind == "auto" and cuda.is_emulator(cuda.library_path()):
        return None, f"{why}; device=auto never picks it"
    if ok:
        return cuda.CudaDevice(0), why
    if kind == "cuda":
        raise BackendError(f"device=cuda, but {why}")
    return None, why


def make_backend(graph, n_threads: int, shape: Shape, n_gpu_layers: Any = "auto", device: Optional[str] = None,
                 hardware=None, embed_on_host: bool = False, repack: bool = True) -> tuple[Backend, Optional[object]]:
    """(backend, plan or None). `hardware` (a placement.Hardware) skips measuring; embed_on_host:
    the token embedding stays on the host (prompts with image rows); repack: the host's weights
    in the ROWS4 layout (HostDevice)."""
    from .placement import Planner, detect, parse_n_gpu_layers
    from .split import SplitBackend

    ngl = parse_n_gpu_layers(n_gpu_layers)
    host = HostDevice(n_threads, repack)
    gpu = None
    try:
        if ngl == 0:
            log.debug("n_gpu_layers=0: running on the CPU")
            return _cpu(graph, host, shape), None
        gpu, why = gpu_device(device, host)
        if gpu is None:
            if ngl != "auto":
                raise BackendError(f"n_gpu_layers={ngl} asks for a GPU, but {why}; use n_gpu_layers 0 or auto "
                                   f"(or PYLLM_DEVICE=sim to try split execution on a simulated device)")
            log.debug("no GPU (%s): running on the CPU", why)
            return _cpu(graph, host, shape), None
        if ngl == "auto" and getattr(gpu, "emulated", False):
            gpu.close()
            gpu = None
            log.debug("n_gpu_layers=auto places nothing on the CUDA emulator: running on the CPU")
            return _cpu(graph, host, shape), None
        if (shape.k_type, shape.v_type) != (1, 1) and getattr(gpu, "f16_kv_only", False):
            gpu.close()
            gpu = None
            if ngl != "auto":
                raise BackendError("the GPU keeps f16 KV caches only: use the f16 cache types with GPU layers, "
                                   "or n_gpu_layers 0")
            log.info("a quantized KV cache runs on the CPU only: no layers on the GPU")
            return _cpu(graph, host, shape), None
        hw = hardware if hardware is not None else detect(host, gpu)
        plan = Planner(graph, hw, shape, embed_on_host=embed_on_host).plan(ngl)
        log.debug("placement (%s): %s", plan.reason, plan.layer_ranges())
        if not plan.uses_gpu:
            gpu.close()
            return _cpu(graph, host, shape), plan
        backend = SplitBackend(graph, {"cpu": host, "gpu": gpu}, plan.schedules(graph), shape,
                               plan.stream_min_batch, own_devices=True)
        backend.plan = plan
        return backend, plan
    except BaseException:
        if gpu is not None:
            gpu.close()
        host.close()
        raise


def _cpu(graph, host: HostDevice, shape: Shape) -> CpuBackend:
    be = CpuBackend(graph, host.n_threads, shape.n_batch, shape.n_out_max, shape.n_blocks, shape.block_size,
                    device=host, k_type=shape.k_type, v_type=shape.v_type)
    be._own_device = True
    return be
