"""`pyllm perplexity`: how well a model predicts a text, as llama.cpp's
llama-perplexity measures it (same chunks, same BOS rule, same second-half
scoring, same default context of 512), so the numbers compare with published
ones and between quantizations of one model.

stdout: the running estimate after each chunk ([1]12.3456,[2]...), then
"Final estimate: PPL = ... +/- ..."; with --json one object instead.
stderr: what is being measured and how fast it went.

KL divergence, as llama-perplexity: `--kl-divergence-base FILE -f TEXT` with the
base model saves its log-probabilities; `--kl-divergence-base FILE
--kl-divergence` with another model (a quantization of it) compares on the
saved tokens and prints llama-perplexity's table and statistics.

And llama-perplexity's task scores: --hellaswag, --winogrande and
--multiple-choice (-f the task file), each printed as llama.cpp prints it.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from pyllm.errors import InvalidArgumentError

from .common import err, handle_errors, model_path, read_input
from .options import MlockOpt, NoMmapOpt
from .options import OverrideKvOpt, file_kwargs
from .options import RopeFreqBaseOpt, RopeFreqScaleOpt, RopeScaleOpt, RopeScalingOpt, YarnOrigCtxOpt
from .options import (CacheTypeK, CacheTypeV, ControlLayerRangeOpt, ControlVectorOpt, ControlVectorScaledOpt, LoraOpt,
                      LoraScaledOpt, ModelOpt, NGpuLayers, Threads, control_kwargs, lora_specs)


def perplexity(
    file: Annotated[Optional[str], typer.Option("-f", "--file", help="the text to score (else stdin), e.g. "
                                                "wikitext-2's wiki.test.raw")] = None,
    model: ModelOpt = None,
    no_mmap: NoMmapOpt = False,
    mlock: MlockOpt = False,
    override_kv: OverrideKvOpt = [],
    rope_scaling: RopeScalingOpt = None,
    rope_scale: RopeScaleOpt = None,
    rope_freq_base: RopeFreqBaseOpt = None,
    rope_freq_scale: RopeFreqScaleOpt = None,
    yarn_orig_ctx: YarnOrigCtxOpt = None,
    ctx_size: Annotated[Optional[int], typer.Option("-c", "--ctx-size", help="tokens per chunk (the context each "
                                                    "chunk runs in; default 512, llama-perplexity's; with "
                                                    "--kl-divergence the base file's)")] = None,
    chunks: Annotated[int, typer.Option("--chunks", help="score at most this many chunks (-1 = all)")] = -1,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object: ppl, error, tokens, chunks, the "
                                          "running estimates, timing")] = False,
    kl_divergence_base: Annotated[Optional[str], typer.Option(
        "--kl-divergence-base", help="FILE: save every scored token's log-probabilities there (llama-perplexity's "
        "file; large: 2 bytes x vocabulary per token), or with --kl-divergence read them")] = None,
    kl_divergence: Annotated[bool, typer.Option("--kl-divergence", help="compare this model with the base "
                                                "model saved in --kl-divergence-base (KL divergence, change in "
                                                "p of each token, same top token)")] = False,
    hellaswag: Annotated[bool, typer.Option("--hellaswag", help="score HellaSwag instead: -f is llama.cpp's "
                                            "hellaswag_val_full.txt (six lines a task); acc_norm after each task")]
    = False,
    hellaswag_tasks: Annotated[int, typer.Option("--hellaswag-tasks", help="score the file's first N tasks "
                                                 "(-1: all; llama.cpp's default of 400 drawn at random)")] = 400,
    winogrande: Annotated[bool, typer.Option("--winogrande", help="score Winogrande instead: -f is llama.cpp's "
                                             "CSV (index, sentence with a _, two choices, the answer)")] = False,
    winogrande_tasks: Annotated[int, typer.Option("--winogrande-tasks", help="score N tasks drawn as llama.cpp "
                                                  "draws them (0: all)")] = 0,
    multiple_choice: Annotated[bool, typer.Option("--multiple-choice", help="score a multiple-choice set "
                                                  "instead (ARC, MMLU, TruthfulQA...): -f is llama.cpp's binary "
                                                  "file")] = False,
    multiple_choice_tasks: Annotated[int, typer.Option("--multiple-choice-tasks", help="score N tasks drawn as "
                                                       "llama.cpp draws them (0: all)")] = 0,
    threads: Threads = None,
    n_gpu_layers: NGpuLayers = "auto",
    cache_type_k: CacheTypeK = "f16",
    cache_type_v: CacheTypeV = "f16",
    lora: LoraOpt = [],
    lora_scaled: LoraScaledOpt = [],
    control_vector: ControlVectorOpt = [],
    control_vector_scaled: ControlVectorScaledOpt = [],
    control_vector_layer_range: ControlLayerRangeOpt = None,
) -> None:
    """Measure a model's perplexity on a text (llama-perplexity's method)."""
    with handle_errors():
        if chunks == 0 or chunks < -1:
            raise InvalidArgumentError(f"--chunks must be at least 1 (or -1 for all), not {chunks}")
        if kl_divergence and not kl_divergence_base:
            raise InvalidArgumentError("--kl-divergence needs --kl-divergence-base FILE: the log-probabilities a "
                                       "run of the base model with -f TEXT --kl-divergence-base FILE saved")
        if hellaswag + winogrande + multiple_choice + kl_divergence > 1:
            raise InvalidArgumentError("one of --hellaswag, --winogrande, --multiple-choice and --kl-divergence "
                                       "at a time")
        if multiple_choice_tasks < 0:
            raise InvalidArgumentError(f"--multiple-choice-tasks must be 0 (all) or more, not {multiple_choice_tasks}")
        if multiple_choice and file is None:
            raise InvalidArgumentError("--multiple-choice reads its binary file from -f FILE")
        if winogrande_tasks < 0:
            raise InvalidArgumentError(f"--winogrande-tasks must be 0 (all) or more, not {winogrande_tasks}")
        if hellaswag_tasks == 0 or hellaswag_tasks < -1:
            raise InvalidArgumentError(f"--hellaswag-tasks must be at least 1 (or -1 for all), not {hellaswag_tasks}")
        base = None
        if kl_divergence:
            from pyllm.perplexity import BaseLogProbs
            base = BaseLogProbs(kl_divergence_base)
            if file is not None:
                err.print(f"--kl-divergence: the tokens come from {kl_divergence_base}; -f {file} is not read")
            if ctx_size is not None and ctx_size != base.n_ctx:
                err.print(f"--kl-divergence: chunks of {base.n_ctx} tokens, as {kl_divergence_base} was made "
                          f"(-c {ctx_size} ignored)")
            ctx_size = base.n_ctx
        elif multiple_choice:
            try:
                data = Path(file).read_bytes()
            except OSError as e:
                raise InvalidArgumentError(f"cannot read the multiple-choice file {file}: {e.strerror}") from None
            ctx_size = 512 if ctx_size is None else ctx_size
        else:
            text = read_input(file, "file", "no text: give -f FILE or pipe the text in")
            ctx_size = 512 if ctx_size is None else ctx_size
        from pyllm import Model

        path = model_path(model)
        max_chunks = None if chunks < 0 else chunks
        with Model(path, n_ctx=ctx_size, n_threads=threads, n_gpu_layers=n_gpu_layers, cache_type_k=cache_type_k,
                   **file_kwargs(no_mmap, mlock, override_kv, rope_scaling, rope_scale, rope_freq_base,
                                 rope_freq_scale, yarn_orig_ctx),
                   cache_type_v=cache_type_v, lora=lora_specs(lora, lora_scaled),
                   **control_kwargs(control_vector, control_vector_scaled, control_vector_layer_range)) as m:
            m.require_generation()
            if base is not None:
                compare(m, base, max_chunks, as_json)
                return
            if hellaswag:
                score_hellaswag(m, text, None if hellaswag_tasks < 0 else hellaswag_tasks, as_json)
                return
            if winogrande:
                score_winogrande(m, text, winogrande_tasks or None, as_json)
                return
            if multiple_choice:
                score_multiple_choice(m, data, multiple_choice_tasks or None, as_json)
                return
            score_perplexity(m, text, ctx_size, max_chunks, kl_divergence_base, as_json)


def score_perplexity(m, text: str, ctx_size: int, max_chunks: Optional[int], kl_divergence_base: Optional[str],
                     as_json: bool) -> None:
    """The running estimate after each chunk and the final one (llama-perplexity's lines), or one
    JSON object; with kl_divergence_base the log-probabilities saved there too."""
    ids = m.tokenize(text)
    n_chunks = len(ids) // ctx_size if max_chunks is None else min(max_chunks, len(ids) // ctx_size)
    err.print(f"perplexity: {len(ids)} tokens, {n_chunks} chunks of {ctx_size}, the second half of each "
              f"scored", soft_wrap=True)
    if kl_divergence_base:
        from pyllm.perplexity import record_width
        size = 20 + 4 * n_chunks * ctx_size + 2 * n_chunks * (ctx_size - 1 - ctx_size // 2) * record_width(
            m.backend.n_vocab)
        err.print(f"saving log-probabilities to {kl_divergence_base} ({size / 2 ** 20:.0f} MiB)")
    t0 = time.perf_counter()

    def progress(i: int, n: int, running: float) -> None:
        if not as_json:
            sys.stdout.write(f"[{i + 1}]{running:.4f},")
            sys.stdout.flush()
    result = m.perplexity(ids, max_chunks=max_chunks, on_chunk=progress, kl_divergence_base=kl_divergence_base)
    seconds = time.perf_counter() - t0
    if as_json:
        sys.stdout.write(json.dumps({"model": str(m.path), **result.as_dict(), "seconds": seconds}) + "\n")
    else:
        sys.stdout.write(f"\nFinal estimate: PPL = {result.ppl:.4f} +/- {result.error:.5f}\n")
    err.print(f"{result.chunks * ctx_size} tokens in {seconds:.1f} s "
              f"({result.chunks * ctx_size / seconds:.1f} tokens/s)")


def compare(m, base, max_chunks: Optional[int], as_json: bool) -> None:
    """--kl-divergence: llama-perplexity's per-chunk table (running values) and its
    final statistics, or one JSON object."""
    n_chunks = base.n_chunks if max_chunks is None else min(max_chunks, base.n_chunks)
    err.print(f"kl-divergence: {n_chunks} chunks of {base.n_ctx} tokens from {base.path}, the second half of "
              f"each compared", soft_wrap=True)
    t0 = time.perf_counter()
    if not as_json:
        sys.stdout.write("chunk             PPL               ln(PPL(Q)/PPL(base))          KL Divergence"
                         "              Δp RMS            Same top p\n")

    def row(i: int, n: int, so_far) -> None:
        if as_json:
            return
        s = so_far.statistics()
        (ppl, ppl_err), (ln, ln_err), (kld, kld_err) = s["ppl"], s["ln_ppl_ratio"], s["kld"]
        (rms, rms_err), (top, top_err) = s["rms_p_diff"], s["same_top"]
        sys.stdout.write(f"{i + 1:4d}    {ppl:9.4f} ± {ppl_err:9.4f}    {ln:10.5f} ± {ln_err:10.5f}    "
                         f"{kld:10.5f} ± {kld_err:10.5f}    {100 * rms:6.3f} ± {100 * rms_err:6.3f} %    "
                         f"{100 * top:6.3f} ± {100 * top_err:6.3f} %\n")
        sys.stdout.flush()
    result = m.kl_divergence(base, max_chunks=max_chunks, on_chunk=row)
    seconds = time.perf_counter() - t0
    s = result.statistics()
    if as_json:
        sys.stdout.write(json.dumps({"model": str(m.path), "base": str(base.path), **s, "seconds": seconds}) + "\n")
    else:
        sys.stdout.write(statistics_text(s))
    err.print(f"{result.chunks * base.n_ctx} tokens in {seconds:.1f} s "
              f"({result.chunks * base.n_ctx / seconds:.1f} tokens/s)")


def score_hellaswag(m, text: str, max_tasks: Optional[int], as_json: bool) -> None:
    """--hellaswag: llama-perplexity's lines (task, acc_norm, its 95% interval) or one JSON object."""
    from pyllm.hellaswag import read_tasks, wilson
    tasks = read_tasks(text)
    n = len(tasks) if max_tasks is None else min(max_tasks, len(tasks))
    err.print(f"hellaswag: {n} of the file's {len(tasks)} tasks, the first ones", soft_wrap=True)
    t0 = time.perf_counter()
    if not as_json:
        sys.stdout.write("\ntask\tacc_norm\t95% confidence interval\n")

    def line(i: int, so_far) -> None:
        if not as_json:
            lo, hi = wilson(so_far.right, so_far.tasks)
            sys.stdout.write(f"{i + 1}\t{100 * so_far.acc_norm:3.8f}%\t[{100 * lo:3.4f}%, {100 * hi:3.4f}%]\n")
            sys.stdout.flush()
    result = m.hellaswag(text, max_tasks=max_tasks, on_task=line)
    finish(m, result, t0, as_json, "", f"acc_norm {100 * result.acc_norm:.2f}% over ")


def score_winogrande(m, text: str, n_tasks: Optional[int], as_json: bool) -> None:
    """--winogrande: llama-perplexity's line per task (task, score so far, the two choices' scores,
    the answer given and the right one) and its final score, or one JSON object."""
    t0 = time.perf_counter()

    def line(i: int, so_far, scores, task) -> None:
        if not as_json:
            sys.stdout.write(f"{i + 1}\t{100 * so_far.score:.4f}\t{scores[0]:10.6f}  {scores[1]:10.6f}  "
                             f"{so_far.answers[-1]}  {task.answer}\n")
            sys.stdout.flush()
    result = m.winogrande(text, n_tasks=n_tasks, on_task=line)
    finish(m, result, t0, as_json, f"\nFinal Winogrande score({result.tasks} tasks): {100 * result.score:.4f} +/- "
                                   f"{100 * result.error:.4f}\n")


def score_multiple_choice(m, data: bytes, n_tasks: Optional[int], as_json: bool) -> None:
    """--multiple-choice: llama-perplexity's lines (task, score so far) and its final result and
    random chance, or one JSON object."""
    from pyllm.multiple_choice import read_tasks
    n = len(read_tasks(data, n_tasks))        # a damaged file stops here, before any output
    err.print(f"multiple choice: {n} tasks", soft_wrap=True)
    t0 = time.perf_counter()
    if not as_json:
        sys.stdout.write("\ntask\tacc_norm\n")

    def line(i: int, so_far) -> None:
        if not as_json:
            sys.stdout.write(f"{i + 1}\t{100 * so_far.score:.8f}\n")
            sys.stdout.flush()
    result = m.multiple_choice(data, n_tasks=n_tasks, on_task=line)
    score, chance = result.score, result.chance
    finish(m, result, t0, as_json, f"\nFinal result: {100 * score:.4f} +/- {100 * result.error(score):.4f}\n"
                                   f"Random chance: {100 * chance:.4f} +/- {100 * result.error(chance):.4f}\n")


def finish(m, result, t0: float, as_json: bool, final: str, summary: str = "") -> None:
    """A task score's end: one JSON object (with as_json) or llama-perplexity's final lines on
    stdout; the tasks and the time on stderr."""
    seconds = time.perf_counter() - t0
    out = json.dumps({"model": str(m.path), **result.as_dict(), "seconds": seconds}) + "\n" if as_json else final
    sys.stdout.write(out)
    err.print(f"{summary}{result.tasks} tasks in {seconds:.1f} s", soft_wrap=True)


def statistics_text(s: dict) -> str:
    """llama-perplexity --kl-divergence's closing statistics."""
    def pm(key: str, fmt: str = "10.6f", scale: float = 1.0) -> str:
        value, error = s[key]
        return f"{scale * value:{fmt}} ± {scale * error:{fmt}}"
    lines = ["", "====== Perplexity statistics ======",
             f"Mean PPL(Q)                   : {pm('ppl')}",
             f"Mean PPL(base)                : {pm('ppl_base')}",
             f"Cor(ln(PPL(Q)), ln(PPL(base))): {100 * s['cor_ln_ppl']:6.2f}%",
             f"Mean ln(PPL(Q)/PPL(base))     : {pm('ln_ppl_ratio')}",
             f"Mean PPL(Q)/PPL(base)         : {pm('ppl_ratio')}",
             f"Mean PPL(Q)-PPL(base)         : {pm('ppl_diff')}",
             "", "====== KL divergence statistics ======",
             f"Mean    KLD: {pm('kld')}"]
    lines += [f"{name:7} KLD: {value:10.6f}" for name, value in s["kld_percentiles"].items()]
    lines += ["", "====== Token probability statistics ======",
              f"Mean    Δp: {pm('p_diff', '6.3f', 100)} %"]
    lines += [f"{name:7} Δp: {100 * value:6.3f}%" for name, value in s["p_diff_percentiles"].items()]
    lines += [f"RMS Δp    : {pm('rms_p_diff', '6.3f', 100)} %",
              f"Same top p: {pm('same_top', '6.3f', 100)} %", ""]
    return "\n".join(lines)
