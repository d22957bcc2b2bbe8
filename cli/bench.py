"""`pyllm bench`: llama-bench style speed table, bandwidth, profile."""
from __future__ import annotations

import json
import os
import sys
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from pyllm.errors import InvalidArgumentError

from .common import handle_errors, model_path
from .options import MlockOpt, NoMmapOpt
from .options import CacheTypeK, CacheTypeV, LoraOpt, LoraScaledOpt, lora_specs


def _ints(text: str, flag: str) -> list[int]:
    """A comma-separated list of counts >= 0 (the flag's value)."""
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        values = [-1]
    if any(v < 0 for v in values):
        raise InvalidArgumentError(f"{flag} takes numbers >= 0 separated by commas (e.g. 128,512), not {text!r}")
    return values


def bench(
    model: Optional[str] = typer.Option(None, "-m", "--model", help="registry name or .gguf path"),
    no_mmap: NoMmapOpt = False,
    mlock: MlockOpt = False,
    n_prompt: str = typer.Option("512", "-p", "--n-prompt", help="prompt lengths to prefill (list: 128,512)"),
    n_gen: str = typer.Option("128", "-n", "--n-gen", help="tokens to decode (list allowed)"),
    threads: str = typer.Option("", "-t", "--threads", help="thread counts (list: 1,2); default physical cores"),
    depth: str = typer.Option("0", "-d", "--n-depth",
                              help="tokens already in the context before each test (list: 0,2048), as llama-bench"),
    reps: int = typer.Option(3, "-r", "--repetitions"),
    as_json: bool = typer.Option(False, "--json", help="print JSON instead of a table"),
    membw: bool = typer.Option(False, "--membw", help="also measure the machine's memory read bandwidth"),
    profile: bool = typer.Option(False, "--profile", help="also print where the time goes"),
    ttft_prompt: int = typer.Option(512, "--ttft-prompt", help="prompt length for TTFT/TPOT"),
    cache_type_k: CacheTypeK = "f16",
    cache_type_v: CacheTypeV = "f16",
    lora: LoraOpt = [],
    lora_scaled: LoraScaledOpt = [],
) -> None:
    """Measure prompt processing (pp) and decode (tg) tokens/s, TTFT, TPOT, bandwidth."""
    from pyllm import Model, bench as B
    from pyllm.backend.cpu import kernel_level, physical_cores

    with handle_errors():
        path = model_path(model)
        _generates(path)
        thread_list = _ints(threads, "--threads") or [physical_cores()]
        if 0 in thread_list:
            raise InvalidArgumentError("--threads takes thread counts of 1 or more")
        tests = [("pp", n) for n in _ints(n_prompt, "--n-prompt") if n > 0] + \
                [("tg", n) for n in _ints(n_gen, "--n-gen") if n > 0]
        depths = _ints(depth, "--n-depth") or [0]
        n_ctx = max(depths) + max([n for _, n in tests] + [ttft_prompt + 64, 512]) + 16
        rows, extra = [], {}
        for nt in thread_list:
            with Model(path, n_ctx=n_ctx, n_threads=nt, cache_type_k=cache_type_k, cache_type_v=cache_type_v,
                       use_mmap=not no_mmap, use_mlock=mlock,
                       lora=lora_specs(lora, lora_scaled)) as m:
                info = {"model": m.path.name, "size_mb": round(m.file.weight_bytes / 1e6, 1),
                        "params_m": round(m.file.n_params / 1e6, 1), "types": m.file.type_histogram(),
                        "kernels": kernel_level(),
                        "kv_bytes_per_token": B.decode_bytes_per_token(m, 1) - B.decode_bytes_per_token(m, 0)}
                from_empty = {}  # (kind, n) -> result, the runs from an empty context
                for d in depths:
                    got = B.bench(m, tests, reps, depth=d)
                    rows += got
                    if d == 0:
                        from_empty = dict(zip(tests, got))
                ttft, tpot = B.ttft_tpot(m, ttft_prompt, 32)
                tg_n, tg = next(((n, r) for (kind, n), r in from_empty.items() if kind == "tg"), (0, None))
                # a tg N run attends over N/2 positions on average
                bytes_tok = B.decode_bytes_per_token(m, tg_n // 2)
                extra[nt] = {"ttft_s": ttft, "tpot_s": tpot, "decode_bytes_per_token": bytes_tok,
                             "decode_gb_s": bytes_tok * tg.mean / 1e9 if tg else None}
                if profile:
                    pre, dec = B.profile(m, "The quick brown fox jumps over the lazy dog. " * 20, 64)
                    extra[nt]["profile"] = {"prefill": pre.as_dict(), "decode": dec.as_dict()}
                    extra[nt]["profile_objects"] = (pre, dec)
        machine_bw = {nt: B.memory_bandwidth(nt) for nt in thread_list} if membw else {}
        info["peak_rss_mb"] = round(B.peak_rss_mb(), 1)

        if as_json:
            json.dump({"model": info, "results": [r.as_dict() for r in rows],
                       "per_threads": {str(k): {n: x for n, x in v.items() if n != "profile_objects"}
                                       for k, v in extra.items()},
                       "machine_bandwidth_gb_s": {str(k): v for k, v in machine_bw.items()}},
                      sys.stdout, indent=1, default=float)
            print()
            return
        out = Console(highlight=False)
        types = ", ".join(f"{k}:{v}" for k, v in info["types"].items())
        # the lines around the table are soft-wrapped: a narrow or piped console
        # (80 columns) must not break a figure in two
        out.print(f"{info['model']}  {info['size_mb']} MB  {info['params_m']} M params  [{types}]  "
                  f"kernels {info['kernels']}", soft_wrap=True)
        t = Table()
        for col in ("threads", "test", "tokens/s"):
            t.add_column(col, justify="right")
        for r in rows:
            t.add_row(str(r.threads), r.test, f"{r.mean:.2f} ± {r.sd:.2f}")
        out.print(t)
        for nt, e in extra.items():
            line = f"threads {nt}: TTFT({ttft_prompt}) {e['ttft_s'] * 1e3:.1f} ms, TPOT {e['tpot_s'] * 1e3:.2f} ms"
            if e["decode_gb_s"] is not None:
                line += f", decode reads {e['decode_bytes_per_token'] / 1e6:.1f} MB/token = {e['decode_gb_s']:.1f} GB/s"
                if nt in machine_bw:
                    line += f" ({e['decode_gb_s'] / machine_bw[nt]:.0%} of the measured {machine_bw[nt]:.1f} GB/s)"
            out.print(line, soft_wrap=True)
            for p in e.get("profile_objects", ()):
                for line in B.format_profile(p):
                    out.print("  " + line, soft_wrap=True)
        if machine_bw and not extra:
            out.print(machine_bw)
        out.print(f"peak RSS {info['peak_rss_mb']} MB", style="dim", soft_wrap=True)


def _generates(path: str) -> None:
    """InvalidArgumentError for an embedding model: pp and tg are generation's measures."""
    from pyllm.arch import load_architecture
    from pyllm.model_file import ModelFile
    with ModelFile(path) as mf:
        if not load_architecture(mf).causal:
            raise InvalidArgumentError(f"{os.path.basename(path)} is an embedding model ({mf.architecture}): pyllm bench "
                                       f"measures generation; time embeddings with benchmarks/compare_embeddings.py")
