"""`pyllm bench`: llama-bench style speed table, bandwidth, profile."""
from __future__ import annotations

import csv
import json
import os
import sys

import typer
from rich.console import Console
from rich.table import Table

from pyllm.errors import InvalidArgumentError

from .common import handle_errors, model_path
from .options import MlockOpt, NoMmapOpt, NoRepackOpt, file_kwargs
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


def _pairs(values: list[str]) -> list[tuple[int, int]]:
    """-pg's PP,TG pairs (repeatable)."""
    out = []
    for v in values:
        pair = _ints(v, "-pg")
        if len(pair) != 2 or 0 in pair:
            raise InvalidArgumentError(f"-pg takes a prompt length and a generation length, e.g. 512,128, not {v!r}")
        out.append((pair[0], pair[1]))
    return out


OUTPUTS = ("table", "md", "csv", "json", "jsonl")
# llama-bench's field names for the machine-readable outputs
FIELDS = ("model_filename", "model_size", "model_n_params", "backend", "cpu_kernels", "n_threads", "type_k", "type_v",
          "n_prompt", "n_gen", "n_depth", "test", "avg_ts", "stddev_ts", "samples_ts")


def bench(
    model: list[str] = typer.Option([], "-m", "--model", help="registry name or .gguf path; repeatable (each "
                                    "model measured in turn)"),
    no_mmap: NoMmapOpt = False,
    mlock: MlockOpt = False,
    no_repack: NoRepackOpt = False,
    n_prompt: str = typer.Option("512", "-p", "--n-prompt", help="prompt lengths to prefill (list: 128,512)"),
    n_gen: str = typer.Option("128", "-n", "--n-gen", help="tokens to decode (list allowed)"),
    prompt_gen: list[str] = typer.Option([], "-pg", help="PP,TG: prefill PP tokens then decode TG, tokens/s over "
                                         "both (llama-bench's; repeatable)"),
    threads: str = typer.Option("", "-t", "--threads", help="thread counts (list: 1,2); default physical cores"),
    depth: str = typer.Option("0", "-d", "--n-depth",
                              help="tokens already in the context before each test (list: 0,2048), as llama-bench"),
    reps: int = typer.Option(3, "-r", "--repetitions"),
    output: str = typer.Option("table", "-o", "--output", help="table, md (llama-bench's markdown), csv, json or "
                               "jsonl (one object per test, llama-bench's fields)"),
    as_json: bool = typer.Option(False, "--json", help="-o json"),
    membw: bool = typer.Option(False, "--membw", help="also measure the machine's memory read bandwidth"),
    profile: bool = typer.Option(False, "--profile", help="also print where the time goes"),
    ttft_prompt: int = typer.Option(512, "--ttft-prompt", help="prompt length for TTFT/TPOT"),
    cache_type_k: CacheTypeK = "f16",
    cache_type_v: CacheTypeV = "f16",
    lora: LoraOpt = [],
    lora_scaled: LoraScaledOpt = [],
) -> None:
    """Measure prompt processing (pp) and decode (tg) tokens/s, TTFT, TPOT, bandwidth."""
    from pyllm.backend.cpu import physical_cores

    with handle_errors():
        output = "json" if as_json else output
        if output not in OUTPUTS:
            raise InvalidArgumentError(f"-o takes {', '.join(OUTPUTS)}, not {output!r}")
        paths = [model_path(m) for m in model or [None]]
        for path in paths:
            _generates(path)
        thread_list = _ints(threads, "--threads") or [physical_cores()]
        if 0 in thread_list:
            raise InvalidArgumentError("--threads takes thread counts of 1 or more")
        tests = [("pp", n) for n in _ints(n_prompt, "--n-prompt") if n > 0] + \
                [("tg", n) for n in _ints(n_gen, "--n-gen") if n > 0] + [("pg", pg) for pg in _pairs(prompt_gen)]
        depths = _ints(depth, "--n-depth") or [0]
        measured = [measure(path, tests, depths, thread_list, reps, ttft_prompt, profile, no_mmap, mlock, no_repack,
                            cache_type_k, cache_type_v, lora_specs(lora, lora_scaled)) for path in paths]
        from pyllm import bench as B
        machine_bw = {nt: B.memory_bandwidth(nt) for nt in thread_list} if membw else {}
        peak_rss = round(B.peak_rss_mb(), 1)
        if output == "json":
            objects = [{"model": {**info, "peak_rss_mb": peak_rss}, "results": [r.as_dict() for r in rows],
                        "per_threads": {str(k): {n: x for n, x in v.items() if n != "profile_objects"}
                                        for k, v in extra.items()},
                        "machine_bandwidth_gb_s": {str(k): v for k, v in machine_bw.items()}}
                       for info, rows, extra in measured]
            json.dump(objects[0] if len(objects) == 1 else objects, sys.stdout, indent=1, default=float)
            print()
        elif output in ("md", "csv", "jsonl"):
            records = [record(info, r, cache_type_k, cache_type_v) for info, rows, _ in measured for r in rows]
            write_records(records, output)
        else:
            for info, rows, extra in measured:
                print_table(info, rows, extra, machine_bw, ttft_prompt)
            Console(highlight=False).print(f"peak RSS {peak_rss} MB", style="dim", soft_wrap=True)


def measure(path: str, tests, depths: list[int], thread_list: list[int], reps: int, ttft_prompt: int, profile: bool,
            no_mmap: bool, mlock: bool, no_repack: bool, cache_type_k: str, cache_type_v: str, lora) -> tuple[dict, list, dict]:
    """(the model's facts, a Result per test, depth and thread count, the per-thread-count extras)."""
    from pyllm import Model, bench as B
    from pyllm.backend.cpu import kernel_level
    longest = max([n[0] + n[1] if kind == "pg" else n for kind, n in tests] + [ttft_prompt + 64, 512])
    n_ctx = max(depths) + longest + 16
    rows, extra, info = [], {}, {}
    for nt in thread_list:
        with Model(path, n_ctx=n_ctx, n_threads=nt, cache_type_k=cache_type_k, cache_type_v=cache_type_v,
                   **file_kwargs(no_mmap, mlock, no_repack=no_repack), lora=lora) as m:
            info = {"model": m.path.name, "size_mb": round(m.file.weight_bytes / 1e6, 1),
                    "params_m": round(m.file.n_params / 1e6, 1), "types": m.file.type_histogram(),
                    "kernels": kernel_level(), "backend": "CPU" if m.plan is None else "GPU+CPU",
                    "size_bytes": m.file.weight_bytes, "n_params": m.file.n_params,
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
    return info, rows, extra


def record(info: dict, r, type_k: str, type_v: str) -> dict:
    """One test as llama-bench's csv / jsonl record."""
    return {"model_filename": info["model"], "model_size": info["size_bytes"], "model_n_params": info["n_params"],
            "backend": info["backend"], "cpu_kernels": info["kernels"], "n_threads": r.threads, "type_k": type_k,
            "type_v": type_v, "n_prompt": r.n_prompt, "n_gen": r.n_gen, "n_depth": r.n_depth, "test": r.test,
            "avg_ts": round(r.mean, 6), "stddev_ts": round(r.sd, 6),
            "samples_ts": [round(x, 6) for x in r.tokens_per_s]}


def write_records(records: list[dict], output: str) -> None:
    if output == "jsonl":
        for rec in records:
            sys.stdout.write(json.dumps(rec) + "\n")
    elif output == "csv":
        w = csv.writer(sys.stdout, lineterminator="\n")
        w.writerow(FIELDS)
        for rec in records:
            w.writerow([" ".join(map(str, v)) if isinstance(v, list) else v for v in (rec[f] for f in FIELDS)])
    else:   # llama-bench's markdown table
        sys.stdout.write("| model | size | params | backend | threads | test | t/s |\n"
                         "| --- | ---: | ---: | --- | ---: | ---: | ---: |\n")
        for rec in records:
            sys.stdout.write(f"| {rec['model_filename']} | {rec['model_size'] / 2 ** 20:.2f} MiB | "
                             f"{rec['model_n_params'] / 1e6:.2f} M | {rec['backend']} {rec['cpu_kernels']} | "
                             f"{rec['n_threads']} | {rec['test']} | {rec['avg_ts']:.2f} ± {rec['stddev_ts']:.2f} |\n")


def print_table(info: dict, rows, extra: dict, machine_bw: dict, ttft_prompt: int) -> None:
    from pyllm import bench as B
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


def _generates(path: str) -> None:
    """InvalidArgumentError for an embedding model: pp and tg are generation's measures."""
    from pyllm.arch import load_architecture
    from pyllm.model_file import ModelFile
    with ModelFile(path) as mf:
        if not load_architecture(mf).causal:
            raise InvalidArgumentError(f"{os.path.basename(path)} is an embedding model ({mf.architecture}): pyllm bench "
                                       f"measures generation; time embeddings with benchmarks/compare_embeddings.py")
