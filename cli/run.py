"""`pyllm run`: one prompt, one answer; made for shell scripts.

stdout gets only the generated text (or, with --json, one JSON object);
everything else goes to stderr. Exit codes: 0 done, 2 bad input or a model
error (one line on stderr), 130 interrupted.
"""
from __future__ import annotations

import base64
import inspect
import itertools
import json
import os
import sys
import time
from typing import Annotated, Optional

import typer

from pyllm.errors import InvalidArgumentError, PyllmError

from .common import (created_messages, err, handle_errors, image_file, images_in, media_file, model_path,
                     process_escapes, read_input)
from .options import AudioOpt, ImageMaxTokensOpt, ImageMinTokensOpt, ImageOpt, MlockOpt, MmprojOpt, NoMmapOpt, NoRepackOpt
from .options import OverrideKvOpt, file_kwargs
from .options import RopeFreqBaseOpt, RopeFreqScaleOpt, RopeScaleOpt, RopeScalingOpt, YarnOrigCtxOpt
from .options import TemplateKwargsOpt, template_kwargs
from .options import (CtxSize, FormatOpt, FreqPenalty, GrammarFile, GrammarOpt, JsonSchema, JsonSchemaFile,
                      LogitBias, MinP, ModelOpt, PresPenalty, RepeatLastN, RepeatPenalty, Seed, Stop, TemplateOpt,
                      Temp, Think, Threads, TopK, TopP, TypicalP, constraint_kwargs, sampling_kwargs, template_arg,
                      thinking_note)
from .options import (CacheTypeK, CacheTypeV, MirostatEnt, MirostatLr, MirostatOpt, NGpuLayers, TopNSigma,
                      XtcProbability, XtcThreshold)
from .options import IgnoreEos, SamplersOpt, SamplingSeqOpt, samplers_of
from .options import DryAllowedLength, DryBase, DryMultiplier, DryPenaltyLastN, DrySequenceBreaker, dry_breakers
from .options import (ControlLayerRangeOpt, ControlVectorOpt, ControlVectorScaledOpt, LoraOpt, LoraScaledOpt,
                      control_kwargs, lora_specs)
from .options import (ModelDraft, SpecDraftMax, SpecDraftMin, SpecNgramSize, SpecPMin, SpecType,
                      speculative_kwargs)


def read_prompt(prompt: Optional[str], file: Optional[str]) -> str:
    if prompt is not None and file is not None:
        raise InvalidArgumentError("give the prompt with -p or -f, not both")
    if prompt is not None:
        return prompt
    return read_input(file, "prompt file", "no prompt: give -p TEXT, -f FILE, or pipe text into pyllm run")


def run(
    model_arg: Annotated[Optional[str], typer.Argument(
        metavar="MODEL", help="the model, ollama's and llama-run's way: `pyllm run NAME [PROMPT]` answers the "
        "prompt as a chat message (--chat implied), or without one at a terminal opens `pyllm chat`")] = None,
    prompt_arg: Annotated[Optional[str], typer.Argument(metavar="PROMPT", help="the prompt, after MODEL")] = None,
    prompt: Annotated[Optional[str], typer.Option("-p", "--prompt", help="the prompt (else -f, else stdin)")] = None,
    file: Annotated[Optional[str], typer.Option("-f", "--file", help="read the prompt from this file")] = None,
    escape: Annotated[bool, typer.Option("--escape/--no-escape", "-e", help="read \\n, \\t, \\\\, \\xNN ... in -p, "
                                         "--system, --suffix and --stop as the characters they stand for "
                                         "(llama.cpp's default; not in a file or stdin)")] = True,
    model: ModelOpt = None,
    no_mmap: NoMmapOpt = False,
    no_repack: NoRepackOpt = False,
    mlock: MlockOpt = False,
    override_kv: OverrideKvOpt = [],
    rope_scaling: RopeScalingOpt = None,
    rope_scale: RopeScaleOpt = None,
    rope_freq_base: RopeFreqBaseOpt = None,
    rope_freq_scale: RopeFreqScaleOpt = None,
    yarn_orig_ctx: YarnOrigCtxOpt = None,
    n_predict: Annotated[int, typer.Option("-n", "--n-predict", help="tokens to generate at most "
                                           "(-1 = until the model stops)")] = 128,
    chat: Annotated[bool, typer.Option("--chat", help="treat the prompt as a user message: apply the model's "
                                       "chat template, stop at the end of the reply")] = False,
    system: Annotated[Optional[str], typer.Option("--system", help="system prompt (with --chat)")] = None,
    suffix: Annotated[Optional[str], typer.Option("--suffix", help="fill in the middle: the text after the gap, "
                                                  "the prompt being the text before it (a code model with FIM "
                                                  "tokens)")] = None,
    chat_template: TemplateOpt = None,
    chat_template_kwargs: TemplateKwargsOpt = None,
    think: Think = None,
    stop: Stop = [],
    prompt_cache: Annotated[Optional[str], typer.Option(
        "--prompt-cache", help="a file keeping the prompt's KV cache: the next run whose prompt starts the same "
        "reads it instead of computing it (llama-cli's)")] = None,
    prompt_cache_all: Annotated[bool, typer.Option("--prompt-cache-all", help="keep the reply in it too")] = False,
    prompt_cache_ro: Annotated[bool, typer.Option("--prompt-cache-ro", help="read the prompt cache, do not "
                                                  "update it")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", help="afterwards, on stderr: ollama's timings (load, "
                                          "prompt and reply tokens, durations, rates)")] = False,
    hide_thinking: Annotated[bool, typer.Option("--hidethinking", help="a reasoning model thinks, but its "
                                                "thinking is not shown (ollama's)")] = False,
    verbose_prompt: Annotated[bool, typer.Option("--verbose-prompt", help="first, on stderr: the prompt as it "
                                                 "goes in and its tokens (llama-cli's)")] = False,
    profile: Annotated[bool, typer.Option("--profile", help="afterwards, on stderr: where the prefill's and "
                                          "the decode's time went (per op, weight type, thread; Python)")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object: text, finish reason, "
                                          "token counts, timings")] = False,
    fmt: FormatOpt = None,
    grammar: GrammarOpt = None,
    grammar_file: GrammarFile = None,
    json_schema: JsonSchema = None,
    json_schema_file: JsonSchemaFile = None,
    threads: Threads = None,
    ctx_size: CtxSize = None,
    n_gpu_layers: NGpuLayers = "auto",
    cache_type_k: CacheTypeK = "f16",
    cache_type_v: CacheTypeV = "f16",
    mmproj: MmprojOpt = None,
    image_min_tokens: ImageMinTokensOpt = None,
    image_max_tokens: ImageMaxTokensOpt = None,
    image: ImageOpt = [],
    audio: AudioOpt = [],
    lora: LoraOpt = [],
    lora_scaled: LoraScaledOpt = [],
    control_vector: ControlVectorOpt = [],
    control_vector_scaled: ControlVectorScaledOpt = [],
    control_vector_layer_range: ControlLayerRangeOpt = None,
    spec_type: SpecType = None,
    model_draft: ModelDraft = None,
    spec_draft_max: SpecDraftMax = 16,
    spec_draft_min: SpecDraftMin = 0,
    spec_ngram_size: SpecNgramSize = 6,
    spec_p_min: SpecPMin = 0.75,
    temp: Temp = 0.8,
    top_k: TopK = 40,
    top_p: TopP = 0.95,
    min_p: MinP = 0.05,
    typical_p: TypicalP = 1.0,
    repeat_penalty: RepeatPenalty = 1.0,
    repeat_last_n: RepeatLastN = 64,
    frequency_penalty: FreqPenalty = 0.0,
    presence_penalty: PresPenalty = 0.0,
    logit_bias: LogitBias = [],
    ignore_eos: IgnoreEos = False,
    samplers: SamplersOpt = None,
    sampling_seq: SamplingSeqOpt = None,
    seed: Seed = None,
    top_n_sigma: TopNSigma = -1.0,
    xtc_probability: XtcProbability = 0.0,
    xtc_threshold: XtcThreshold = 0.1,
    mirostat: MirostatOpt = 0,
    mirostat_lr: MirostatLr = 0.1,
    mirostat_ent: MirostatEnt = 5.0,
    dry_multiplier: DryMultiplier = 0.0,
    dry_base: DryBase = 1.75,
    dry_allowed_length: DryAllowedLength = 2,
    dry_penalty_last_n: DryPenaltyLastN = 64,
    dry_sequence_breaker: DrySequenceBreaker = [],
) -> None:
    """Complete a prompt (raw text, or a chat message with --chat) and print the result."""
    given = dict(locals())
    with handle_errors():
        if model_arg is not None:   # ollama's `run NAME [PROMPT]`: a chat
            if model is not None:
                raise InvalidArgumentError(f"the model twice: {model_arg!r} and -m {model!r}")
            if prompt_arg is not None and (prompt is not None or file is not None):
                raise InvalidArgumentError("the prompt twice: after the model and with -p/-f")
            model, chat = model_arg, True
            prompt = prompt_arg if prompt_arg is not None else prompt
            if prompt is None and file is None and sys.stdin is not None and sys.stdin.isatty():
                chat_instead(given, model)
                return
        if system is not None and not chat:
            raise InvalidArgumentError("--system needs --chat")
        if suffix is not None and chat:
            raise InvalidArgumentError("--suffix fills in the middle of raw text: not with --chat")
        option = "--image" if image else "--audio"
        if (image or audio) and mmproj is None:
            raise InvalidArgumentError(f"{option} needs the model's multimodal projector: --mmproj FILE")
        if (image or audio) and (suffix is not None or prompt_cache is not None):
            raise InvalidArgumentError(f"{option} does not go with --suffix or --prompt-cache")
        sounds = [media_file(f, "sound") for f in audio]
        sampling = sampling_kwargs(temp, top_k, top_p, min_p, typical_p, repeat_penalty, repeat_last_n,
                                   frequency_penalty, presence_penalty, logit_bias, seed,
                                   ignore_eos=ignore_eos, samplers=samplers_of(samplers, sampling_seq),
                                   top_n_sigma=top_n_sigma,
                                   xtc_probability=xtc_probability,
                                   xtc_threshold=xtc_threshold, mirostat=mirostat, mirostat_eta=mirostat_lr,
                                   mirostat_tau=mirostat_ent, dry_multiplier=dry_multiplier, dry_base=dry_base,
                                   dry_allowed_length=dry_allowed_length, dry_penalty_last_n=dry_penalty_last_n,
                                   dry_sequence_breakers=dry_breakers(dry_sequence_breaker))
        sampling.update(constraint_kwargs(fmt, grammar, grammar_file, json_schema, json_schema_file))
        if escape:
            prompt, system, suffix = (None if t is None else process_escapes(t) for t in (prompt, system, suffix))
            stop = [process_escapes(s) for s in stop]
        text = read_prompt(prompt, file)
        if not text.strip() and chat:
            raise InvalidArgumentError("the prompt is empty")
        template = template_arg(chat_template)
        from pyllm import Model

        path = model_path(model)
        t_load = time.perf_counter()
        with Model(path, n_ctx=ctx_size, n_threads=threads, chat_template=template,
                   chat_template_kwargs=template_kwargs(chat_template_kwargs),
                   **file_kwargs(no_mmap, mlock, override_kv, rope_scaling, rope_scale, rope_freq_base,
                                 rope_freq_scale, yarn_orig_ctx, no_repack),
                   n_gpu_layers=n_gpu_layers, cache_type_k=cache_type_k,
                   cache_type_v=cache_type_v, think=think, lora=lora_specs(lora, lora_scaled), mmproj=mmproj,
                   image_min_tokens=image_min_tokens, image_max_tokens=image_max_tokens,
                   **control_kwargs(control_vector, control_vector_scaled, control_vector_layer_range),
                   **speculative_kwargs(spec_type, model_draft, spec_draft_max, spec_draft_min, spec_ngram_size, spec_p_min)) as m:
            load_s = time.perf_counter() - t_load
            max_tokens = None if n_predict < 0 else n_predict
            if prompt_cache is not None and os.path.exists(prompt_cache):
                try:
                    m.load_state(prompt_cache)
                except PyllmError as e:   # another model's, or damaged: computed afresh and overwritten
                    err.print(f"warning: --prompt-cache not used: {e}", style="yellow", highlight=False,
                              soft_wrap=True)

            def save_cache(c) -> None:
                if prompt_cache is not None and not prompt_cache_ro:
                    m.save_state(prompt_cache, None if prompt_cache_all else c.metrics.prompt_tokens)
            if think is not None and not chat:
                raise InvalidArgumentError(f"--{'think' if think else 'no-think'} needs --chat")
            if chat:
                note = thinking_note(m, think)
                if note:
                    err.print(f"warning: {note}", style="yellow", highlight=False, soft_wrap=True)
                pictures = [image_file(f) for f in image]
                if mmproj is not None:   # ollama's: an image file's path in the message shows it
                    text, shown = images_in(text)
                    pictures += shown
                content = [{"type": "image", "image": p} for p in pictures] + \
                          [{"type": "input_audio", "input_audio": {"data": base64.b64encode(s).decode()}}
                           for s in sounds] + [{"type": "text", "text": text}]
                messages = ([{"role": "system", "content": system}] if system else []) + created_messages() + \
                           [{"role": "user", "content": content if pictures or sounds else text}]
                gen = m.chat(messages, max_tokens=max_tokens, stop=stop, stream=True, **sampling)
                seed_used = gen.seed
            elif suffix is not None:   # the code between the prompt and the suffix
                from pyllm.infill import psm_prompt
                gen = m.stream(psm_prompt(m.tokenizer, m.path.name, text, suffix), max_tokens=max_tokens,
                               stop=stop, **sampling)
                seed_used = gen.sampler.seed
            else:
                if not text:
                    raise InvalidArgumentError("the prompt is empty")
                gen = m.stream(text, max_tokens=max_tokens, stop=stop,
                               images=[image_file(f) for f in image] + sounds, **sampling)
                seed_used = gen.sampler.seed
            generation = getattr(gen, "generation", gen)   # a chat stream wraps the engine's generation
            generation.profile = profile
            if verbose_prompt:
                print_prompt(m, generation.prompt)
            if as_json:
                c = gen.run()
                save_cache(c)
                out = {"text": c.text, "finish_reason": c.finish_reason, "model": str(m.path),
                       "seed": seed_used, "chat": chat, **c.metrics.as_dict(), "tokens": c.tokens}
                if chat:   # a reasoning model's thinking apart from its answer
                    out["thinking"], out["answer"] = gen.reasoning()
                if profile:
                    out["profile"] = {p.phase: p.as_dict() for p in generation.profiles}
                sys.stdout.write(json.dumps(out, ensure_ascii=False) + "\n")
                sys.stdout.flush()
                return
            last, thought = "\n", "\n"
            try:   # a reasoning model's thinking goes to stderr (dimmed), the answer to stdout
                for kind, piece in (gen.parts() if chat else (("answer", p) for p in gen)):
                    if kind == "thinking":
                        if not hide_thinking:
                            err.print(piece, end="", style="dim", markup=False, highlight=False, soft_wrap=True)
                            thought = piece
                        continue
                    sys.stdout.write(piece)
                    sys.stdout.flush()
                    last = piece
            finally:
                if not thought.endswith("\n"):
                    err.print()
                if not last.endswith("\n"):
                    sys.stdout.write("\n")
                sys.stdout.flush()
            save_cache(generation.completion)
            print_profile(generation)
            if verbose and generation.completion is not None:
                print_timings(generation.completion.metrics, load_s)


def chat_instead(given: dict, model: str) -> None:
    """`pyllm run NAME` at a terminal: `pyllm chat -m NAME` with the options run was given
    that chat has too (the others, and those left at run's defaults, take chat's)."""
    from .chat import chat as chat_command
    defaults = {k: p.default for k, p in inspect.signature(run).parameters.items()}
    wanted = inspect.signature(chat_command).parameters
    chat_command(model=model, **{k: v for k, v in given.items()
                                 if k in wanted and k != "model" and v != defaults.get(k)})


def print_prompt(m, tokens: list[int]) -> None:
    """llama-cli's --verbose-prompt: the prompt text, its token count, each token and its piece."""
    runs = itertools.groupby(tokens, key=lambda t: t < 0)   # text, and an image's or a sound's rows (ids < 0)
    text = "".join(f"<media: {len(ids)} rows>" if image else m.detokenize(ids)
                   for image, ids in ((image, list(ids)) for image, ids in runs))
    err.print(f"prompt: {text!r}", markup=False, highlight=False, soft_wrap=True)
    err.print(f"number of tokens in prompt = {len(tokens)}", highlight=False)
    for t in tokens:
        piece = "<media row>" if t < 0 else m.tokenizer.token_to_piece(t).decode("utf-8", "replace")
        err.print(f"{t:6d} -> {piece!r}", markup=False, highlight=False, soft_wrap=True)
    err.print()


def print_timings(metrics, load_s: float) -> None:
    """ollama run --verbose's lines: durations, token counts and rates."""
    def rate(n: int, s: float) -> str:
        return f"{n / s:.2f} tokens/s" if s > 0 else "-"
    lines = [("total duration", duration(load_s + metrics.total_s)), ("load duration", duration(load_s)),
             ("prompt eval count", f"{metrics.prompt_tokens - metrics.reused_tokens} token(s)"),
             ("prompt eval duration", duration(metrics.prefill_s)),
             ("prompt eval rate", rate(metrics.prompt_tokens - metrics.reused_tokens, metrics.prefill_s)),
             ("eval count", f"{metrics.generated_tokens} token(s)"), ("eval duration", duration(metrics.decode_s)),
             ("eval rate", f"{metrics.decode_tokens_per_s:.2f} tokens/s")]
    for name, value in lines:
        err.print(f"{name + ':':<22}{value}", highlight=False)


def duration(seconds: float) -> str:
    """A duration as Go prints one (ollama's): 1.23456s, 56.7ms, 890µs."""
    if seconds >= 1:
        return f"{seconds:.6g}s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.6g}ms"
    return f"{seconds * 1e6:.6g}µs"


def print_profile(generation) -> None:
    from pyllm.bench import format_profile
    for p in generation.profiles:
        for line in format_profile(p):
            err.print(line, highlight=False, soft_wrap=True)
