"""`pyllm plan`: where each layer would run, and the predicted speed, on this
machine or on hardware you describe (--vram 4GiB --pcie 16GB/s ...)."""
from __future__ import annotations

import json
import os
import sys
from typing import Optional

import typer

from .common import err, handle_errors, model_path


def plan(
    model: Optional[str] = typer.Option(None, "-m", "--model", help="registry name or .gguf path"),
    n_gpu_layers: str = typer.Option("auto", "-ngl", "--n-gpu-layers", help="auto, all, or a number of layers"),
    vram: Optional[str] = typer.Option(None, "--vram", help="plan for a GPU with this much free memory (4GiB)"),
    pcie: Optional[str] = typer.Option(None, "--pcie", help="host<->GPU bandwidth, both ways (16GB/s)"),
    h2d: Optional[str] = typer.Option(None, "--h2d", help="host->GPU bandwidth, if it differs"),
    d2h: Optional[str] = typer.Option(None, "--d2h", help="GPU->host bandwidth, if it differs"),
    latency: Optional[str] = typer.Option(None, "--latency", help="per copy over the bus (10us)"),
    gpu_bw: Optional[str] = typer.Option(None, "--gpu-bw", help="GPU memory bandwidth its kernels reach (300GB/s)"),
    gpu_flops: Optional[str] = typer.Option(None, "--gpu-flops", help="GPU matmul rate (20T)"),
    launch: Optional[str] = typer.Option(None, "--launch", help="GPU cost per kernel launch (5us)"),
    cpu_bw: Optional[str] = typer.Option(None, "--cpu-bw", help="CPU memory bandwidth (default: measured)"),
    cpu_flops: Optional[str] = typer.Option(None, "--cpu-flops", help="CPU matmul rate (default: measured)"),
    threads: Optional[int] = typer.Option(None, "-t", "--threads", help="CPU threads (default: physical cores)"),
    ctx_size: Optional[int] = typer.Option(None, "-c", "--ctx-size", help="context the KV cache holds"),
    n_batch: int = typer.Option(512, "-b", "--batch-size", help="prompt tokens per step"),
    n_prompt: int = typer.Option(512, "-p", "--n-prompt", help="prompt length the prefill speed is for"),
    decode_ctx: int = typer.Option(256, "--decode-ctx", help="context the decode speed is for"),
    as_json: bool = typer.Option(False, "--json", help="print the plan as JSON"),
) -> None:
    """Show the placement plan (which layers go to the GPU) and its predicted speed."""
    from pyllm.arch import load_architecture
    from pyllm.backend import placement as P
    from pyllm.backend.base import Shape
    from pyllm.backend.cpu import HostDevice, physical_cores
    from pyllm.backend.select import gpu_device
    from pyllm.defaults import BLOCK_SIZE, DEFAULT_MAX_CTX, N_OUT_MAX
    from pyllm.graph import Graph
    from pyllm.model_file import ModelFile
    from pyllm.units import parse_bytes, parse_flops, parse_rate, parse_time

    with handle_errors():
        path = model_path(model, quiet=as_json)
        mf = ModelFile(path)
        arch = load_architecture(mf)
        n_ctx = ctx_size or min(DEFAULT_MAX_CTX, arch.hp.n_ctx_train)
        arch.n_ctx = n_ctx
        g = Graph()
        arch.build(g)
        shape = Shape(min(n_batch, n_ctx), N_OUT_MAX, -(-n_ctx // BLOCK_SIZE), BLOCK_SIZE)
        nt = threads or physical_cores()

        host = HostDevice(nt)
        try:
            if cpu_bw and cpu_flops:
                cpu, how = P.default_cpu(nt), "given"
            else:
                cpu, how = P.cpu_spec(host)
            if cpu_bw:
                cpu.mem_bw = parse_rate(cpu_bw)
            if cpu_flops:
                cpu.flops = parse_flops(cpu_flops)
            hw = P.Hardware(cpu, source={"cpu": how if not (cpu_bw or cpu_flops) else "given/" + how})
            given = any(v is not None for v in (vram, pcie, h2d, d2h, latency, gpu_bw, gpu_flops, launch))
            if given:
                d = P.DEFAULT_GPU
                hw.gpu = P.DeviceSpec("GPU (as given)", parse_rate(gpu_bw) if gpu_bw else d["mem_bw"],
                                      parse_flops(gpu_flops) if gpu_flops else d["flops"],
                                      parse_time(launch) if launch else d["launch_s"],
                                      memory=parse_bytes(vram) if vram else None,
                                      reserve=P.CUDA_RESERVE if vram else 0)
                both = parse_rate(pcie) if pcie else P.DEFAULT_LINK["h2d"]
                hw.link = P.LinkSpec(parse_rate(h2d) if h2d else both, parse_rate(d2h) if d2h else both,
                                     parse_time(latency) if latency else P.DEFAULT_LINK["latency_s"])
                hw.source["gpu"] = "given: " + ", ".join(n for n, v in (("memory", vram), ("bandwidth", gpu_bw),
                                                                       ("rate", gpu_flops), ("launch", launch))
                                                         if v) + "; rest assumed" if any((vram, gpu_bw, gpu_flops, launch)) \
                    else "assumed"
                hw.source["link"] = "given" if (pcie or h2d or d2h) else "assumed"
            else:
                dev, why = gpu_device(None, host)
                if dev is not None:
                    spec, link, src = dev.planning_figures()
                    hw.gpu, hw.link = spec, link
                    hw.source.update(src)
                    dev.close()
                elif not as_json:
                    err.print(f"no GPU here ({why}); give --vram and --pcie to plan for one")
            p = P.Planner(g, hw, shape, decode_ctx=decode_ctx, prefill_tokens=n_prompt).plan(n_gpu_layers)
        finally:
            host.close()

        if as_json:
            json.dump({"model": str(path), "n_ctx": n_ctx, **p.as_dict()}, sys.stdout, indent=1, default=float)
            print()
            return
        print(f"{os.path.basename(str(path))}: {arch.name}, {arch.hp.n_layer} layers, {mf.weight_bytes / 1e6:.1f} MB of weights, "
              f"context {n_ctx}, batch {shape.n_batch}")
        print(P.describe(p))
