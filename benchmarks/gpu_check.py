"""The GPU check: greedy tokens CPU vs GPU, speed per offload, bus bytes vs the plan.

Run by benchmarks/gpu_check.sh on a machine with an NVIDIA GPU (after
`make cuda` and the C core's build). For each model (real files where present,
else models shaped like them, written here with tests/synth.py):

1. greedy tokens: all on the CPU, all on the GPU (-ngl all) and half the
   layers (-ngl n/2) must give the same tokens; logits' relative RMS
   difference on the prompt, CPU vs GPU;
2. speed: pp512 and tg128 tokens/s for ngl = 0, half, all, auto, with the
   plan's prediction beside each, and all without CUDA graphs;
3. the bus: bytes per decode token counted by the device (and by the CUDA
   library itself) against the plan's prediction, split at half the layers;
4. the measured host<->device copy rates and latency, the device's memory
   rate and the kernels' matmul rate and launch cost.

Prints tables and writes a JSON report (--out).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))


def log(*a):
    print(*a, flush=True)


def find_models(tmp: Path) -> list[tuple[str, str, str]]:
    """[(label, path, kind)] kind: real | cut | synthetic"""
    from pyllm import registry
    out = []
    smol = registry.local_path("smollm2-135m")
    cut = sorted((ROOT / "build" / "gpucheck" / "models").glob("smollm2-135m-*layers.gguf"))
    if smol.is_file():
        out.append(("SmolLM2-135M", str(smol), "real"))
    elif cut:
        out.append((f"SmolLM2-135M ({cut[-1].stem.split('-')[-1]})", str(cut[-1]), "cut"))
    else:
        import synth
        from gguf.constants import GGMLQuantizationType as QT
        p = tmp / "smollm2-shaped.gguf"
        if not p.is_file():
            synth.write_llama(p, QT.Q4_1, n_embd=576, n_layer=30, n_head=9, n_head_kv=3, n_ff=1536, n_vocab=49152,
                              embd_type=QT.Q8_0, tied=True)
        out.append(("SmolLM2-shaped", str(p), "synthetic"))
    gemma = registry.local_path("gemma3-270m")
    if gemma.is_file():
        out.append(("Gemma-3-270M", str(gemma), "real"))
    else:
        import synth
        from gguf.constants import GGMLQuantizationType as QT
        p = tmp / "gemma3-shaped.gguf"
        if not p.is_file():   # the 270M's layers (Q5_0 for its 640-wide rows), a 32k vocabulary instead of 262k
            synth.write_gemma3(p, QT.Q5_0, window=512, n_embd=640, n_layer=18, n_head=4, n_head_kv=1, head_dim=256,
                               n_ff=2048, n_vocab=32768, embd_type=QT.Q8_0)
        out.append(("Gemma-3-shaped", str(p), "synthetic"))
    return out


def prompt_ids(m, kind: str) -> list[int]:
    if kind != "synthetic":
        return m.tokenize("The three primary colors are")
    return [int(t) for t in np.random.default_rng(0).integers(2, m.n_vocab, 12)]


def greedy(path, kind, n_tokens, ngl, device):
    from pyllm import Model
    with Model(path, n_ctx=1024, n_gpu_layers=ngl, device=device) as m:
        ids = prompt_ids(m, kind)
        logits = m.logits(ids)
        toks = m.generate(ids, max_tokens=n_tokens, temperature=0).tokens
        return toks, logits, m.arch.hp.n_layer


def forced(path, kind, toks, ngl, device):
    """Logits at each of the greedy steps, fed the CPU's tokens (one prefill)."""
    from pyllm import Model
    with Model(path, n_ctx=1024, n_gpu_layers=ngl, device=device) as m:
        ids = prompt_ids(m, kind)
        return m.logits(ids + list(toks[:-1]))[len(ids) - 1:]


def speed(path, ngl, device, reps, pp=512, tg=128):
    from pyllm import Model, bench as B
    with Model(path, n_ctx=1024, n_gpu_layers=ngl, device=device) as m:
        res = {r.test: r.mean for r in B.bench(m, [("pp", pp), ("tg", tg)], reps)}
        plan = m.plan
        row = {"ngl": ngl, "pp512": res[f"pp{pp}"], "tg128": res[f"tg{tg}"],
               "decode_gb_per_s": B.decode_bytes_per_token(m, pp) * res[f"tg{tg}"] / 1e9,
               "placement": plan.layer_ranges() if plan else "all on the CPU",
               "predicted_pp512": plan.prefill_tokens_per_s if plan else None,
               "predicted_tg": plan.decode_tokens_per_s if plan else None,
               "stream_min_batch": plan.stream_min_batch if plan else None}
        return row


def log_speed(rows, a):
    log(f"{'ngl':>14} {f'pp{a.pp} t/s':>11} {'(plan)':>9} {f'tg{a.tg} t/s':>10} {'(plan)':>9} {'GB/s':>6}  "
        f"placement   (GB/s: the bytes a decode step reads, weights and KV, times tg)")
    for r in rows:
        pp_p = f"{r['predicted_pp512']:.0f}" if r["predicted_pp512"] else "-"
        tg_p = f"{r['predicted_tg']:.0f}" if r["predicted_tg"] else "-"
        log(f"{str(r['ngl']):>14} {r['pp512']:11.1f} {pp_p:>9} {r['tg128']:10.1f} {tg_p:>9} "
            f"{r['decode_gb_per_s']:6.1f}  {r['placement']}"
            + (f" (streams from {r['stream_min_batch']})" if r["stream_min_batch"] else ""))


DECODE_TYPES = ("F16", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K")


def decode_bandwidth(dev, n_in=4096, n_out=14336, n_mat=8) -> dict:
    """GB/s of the decode matmul (one row) per weight type: n_mat different n_out x n_in
    matrices (more than the L2 cache holds) in one program, random blocks."""
    from pyllm.backend.placement import calibration_graph, time_program, weight_bytes
    out = {}
    for name in DECODE_TYPES:
        g = calibration_graph(n_in, n_out, n_mat, name)
        out[name] = weight_bytes(g) / time_program(dev, g, 1, reps=10) / 1e9
    return out


SHAPES = {   # the layers of popular models, random weights (speed only)
    "Llama-3.2-1B-shaped": dict(n_embd=2048, n_layer=16, n_head=32, n_head_kv=8, n_ff=8192, n_vocab=128256),
    "Llama-3-8B-shaped": dict(n_embd=4096, n_layer=32, n_head=32, n_head_kv=8, n_ff=14336, n_vocab=128256),
}


def shaped_speed(tmp: Path, a) -> list:
    """pp512 / tg128 of the SHAPES in Q4_K (embedding and output Q6_K): all on the GPU, half
    of the layers, and the plan's choice."""
    import synth
    from gguf.constants import GGMLQuantizationType as QT
    report = []
    for label, kw in SHAPES.items():
        p = tmp / f"{label}.gguf"
        t0 = time.time()
        if not p.is_file():
            synth.write_llama(p, QT.Q4_K, embd_type=QT.Q6_K, **kw)
        log(f"\n== {label}: {p.stat().st_size / 1e9:.2f} GB (written in {time.time() - t0:.0f} s)")
        rows = [speed(str(p), ngl, a.device, 1, a.pp, a.tg) for ngl in ("all", kw["n_layer"] // 2, "auto")]
        log_speed(rows, a)
        report.append({"label": label, "speed": rows})
    return report


def bus_check(path, ngl, device):
    """Decode 16 tokens split at ngl; bytes counted vs predicted, per token."""
    from pyllm import Model
    with Model(path, n_ctx=1024, n_gpu_layers=ngl, device=device) as m:
        be = m.backend
        gpu = be.devices["gpu"]
        if not hasattr(gpu, "lib_bus_bytes"):   # the sim device: no library to ask
            gpu.lib_bus_bytes = lambda: (gpu.bus.total("h2d"), gpu.bus.total("d2h"))
        seq = m.engine.new_sequence()
        ids = list(range(10, 42))
        seq.reserve(len(ids) + 16)
        be.forward(ids, 0, seq.blocks, 1)
        be.reset_bus()
        lib0 = gpu.lib_bus_bytes()
        predicted: dict = {}
        for i in range(16):
            sched = m.plan.schedules(m.graph)[be.schedule_for(1)]
            for (dev, d, k), v in sched.bus_bytes(1, 1, len(seq.blocks)).items():
                predicted[f"{d}.{k}"] = predicted.get(f"{d}.{k}", 0) + v
            be.forward([100 + i], len(ids) + i, seq.blocks, 1)
        lib1 = gpu.lib_bus_bytes()
        counted = {f"{d}.{k}": v for (d, k), v in gpu.bus.bytes.items()}
        seq.release()
        return {"ngl": ngl, "schedule": be.schedule_for(1), "placement": m.plan.layer_ranges(),
                "counted_per_token": {k: v / 16 for k, v in sorted(counted.items())},
                "predicted_per_token": {k: v / 16 for k, v in sorted(predicted.items())},
                "plan_decode_bus_at_ctx": {f"{d}.{k}": v for (d, k), v in sorted(m.plan.decode_bus.items())},
                "library_counted_per_token": {"h2d": (lib1[0] - lib0[0]) / 16, "d2h": (lib1[1] - lib0[1]) / 16},
                "equal": counted == predicted and (lib1[0] - lib0[0], lib1[1] - lib0[1]) ==
                         (gpu.bus.total("h2d"), gpu.bus.total("d2h"))}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--device", default="cuda", help="cuda; or, to rehearse this script without a GPU, sim, or "
                    "emu (the CUDA emulator, build/libpyllm_cuda_emu.so: the real kernels on the CPU, slowly; "
                    "use it with small --pp/--tg/--tokens)")
    ap.add_argument("--pp", type=int, default=512, help="prompt tokens of the speed test")
    ap.add_argument("--tg", type=int, default=128, help="decoded tokens of the speed test")
    ap.add_argument("--shapes", action="store_true", help="also the speed of 1B- and 8B-shaped random models")
    ap.add_argument("--no-models", action="store_true", help="without the SmolLM2 and Gemma 3 checks")
    ap.add_argument("--skip-bandwidth", action="store_true", help="without the decode matmul's GB/s per type")
    a = ap.parse_args()
    report: dict = {"device": a.device}
    t_start = time.time()
    if a.device == "emu":   # the emulator stands in for the GPU: named by $PYLLM_CUDA_LIB, used as device=cuda
        from pyllm.backend import cuda
        if cuda.emulator_path() is None:
            log("the CUDA emulator is not built (make cuda-emu)")
            return 2
        os.environ["PYLLM_CUDA_LIB"] = str(cuda.emulator_path())
        a.device = "cuda"
    if a.device == "cuda":
        from pyllm.backend import cuda
        ok, why = cuda.available()
        if not ok:
            log(f"no usable GPU: {why}")
            return 2
        report["gpu"] = cuda.device_info(0)
        log(f"GPU: {report['gpu']}")
        dev = cuda.CudaDevice(0)
        t0 = time.time()
        figs = dev.measure()
        dev.close()
        report["measured"] = figs
        log(f"measured in {time.time() - t0:.1f} s: host->device {figs['h2d'] / 1e9:.1f} GB/s pageable, "
            f"{figs['h2d_pinned'] / 1e9:.1f} GB/s pinned; device->host {figs['d2h'] / 1e9:.1f} / "
            f"{figs['d2h_pinned'] / 1e9:.1f} GB/s; latency {figs['latency_s'] * 1e6:.1f} us; device memory "
            f"{figs['mem_bw'] / 1e9:.0f} GB/s (copy), {figs['decode_bw'] / 1e9:.0f} GB/s (Q4_K decode matmul); "
            f"Q4_0 mmq {figs['flops'] / 1e12:.2f} TFLOP/s; launch {figs['launch_s'] * 1e6:.1f} us/op, "
            f"small decode matmul {figs['op_s'] * 1e6:.1f} us/op")

    tmp = Path(os.environ.get("TMPDIR", "/tmp")) / "pyllm-gpucheck"
    tmp.mkdir(parents=True, exist_ok=True)
    if a.device == "cuda" and not a.skip_bandwidth:
        dev = cuda.CudaDevice(0)
        bw = decode_bandwidth(dev)
        dev.close()
        report["decode_matmul_gb_per_s"] = bw
        log("decode matmul (1 row, 8 x 14336 x 4096), GB/s of weights read: "
            + ", ".join(f"{k} {v:.0f}" for k, v in bw.items())
            + (f"   (copy: {report['measured']['mem_bw'] / 1e9:.0f})" if "measured" in report else ""))
    report["models"] = []
    failures = 0
    for label, path, kind in ([] if a.no_models else find_models(tmp)):
        log(f"\n== {label} [{kind}] {path} ({time.time() - t_start:.0f} s)")
        entry: dict = {"label": label, "path": path, "kind": kind}
        cpu_toks, cpu_logits, n_layer = greedy(path, kind, a.tokens, 0, None)
        cpu_forced = forced(path, kind, cpu_toks, 0, None)
        top2 = np.sort(cpu_forced, axis=1)[:, -2:]
        clear = top2[:, 1] - top2[:, 0] > 0.05 * cpu_forced.std(axis=1)   # not a near-tie (tests/test_cuda.py)
        half = n_layer // 2
        entry["greedy"] = {}
        for ngl in ("all", half):
            toks, logits, _ = greedy(path, kind, a.tokens, ngl, a.device)
            same = toks == cpu_toks
            first = next((i for i, (x, y) in enumerate(zip(toks, cpu_toks)) if x != y), None)
            rel = float(np.sqrt(np.mean((logits - cpu_logits) ** 2)) / cpu_logits.std())
            top = forced(path, kind, cpu_toks, ngl, a.device).argmax(1)
            wrong = [int(i) for i in np.flatnonzero((top != np.array(cpu_toks)) & clear)]
            ties = [int(i) for i in np.flatnonzero((top != np.array(cpu_toks)) & ~clear)]
            entry["greedy"][str(ngl)] = {"same_tokens": same, "first_difference": first, "logits_rel_rms": rel,
                                         "clear_steps": int(clear.sum()), "clear_steps_differing": wrong,
                                         "near_tie_steps_differing": ties}
            failures += bool(wrong)
            log(f"greedy {a.tokens} tokens, ngl={ngl}: {'same as the CPU' if same else f'DIFFERS at {first}'}; "
                f"fed the CPU's tokens: top token {'the same' if not wrong else f'DIFFERENT at {wrong}'} at all "
                f"{int(clear.sum())} clear steps (near-ties differing: {ties or 'none'}); "
                f"prompt logits rel RMS vs CPU {rel:.2e}")
        rows = []
        for ngl in (0, half, "all", "auto"):
            rows.append(speed(path, ngl, None if ngl == 0 else a.device, a.reps, a.pp, a.tg))
        os.environ["PYLLM_CUDA_GRAPHS"] = "0"   # the same, every kernel launched by itself
        rows.append(speed(path, "all", a.device, a.reps, a.pp, a.tg))
        rows[-1]["ngl"] = "all, no graphs"
        del os.environ["PYLLM_CUDA_GRAPHS"]
        entry["speed"] = rows
        log_speed(rows, a)
        b = bus_check(path, half, a.device)
        entry["bus"] = b
        failures += not b["equal"]
        log(f"bus per decode token, ngl={half} ({b['schedule']} schedule): counted {b['counted_per_token']} "
            f"predicted {b['predicted_per_token']} library {b['library_counted_per_token']} -> "
            f"{'EQUAL' if b['equal'] else 'DIFFERENT'}")
        report["models"].append(entry)
        report["failures"] = failures
        if a.out:   # after each model: a run stopped at its time limit still reports what it measured
            Path(a.out).write_text(json.dumps(report, indent=1, default=float))
    if a.shapes:
        report["shapes"] = shaped_speed(tmp, a)
        if a.out:
            Path(a.out).write_text(json.dumps(report, indent=1, default=float))
    log(f"\n{failures} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
