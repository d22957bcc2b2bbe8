"""Options that several commands share: the model, the context, sampling."""
from __future__ import annotations

import json
import math
import re
from typing import Annotated, Any, Optional

import typer

from pyllm.errors import InvalidArgumentError

SAMPLING = "Sampling (llama.cpp's defaults)"

ModelOpt = Annotated[Optional[str], typer.Option(
    "-m", "--model", help="a registry name (see `pyllm list`) or a path to a .gguf file; default: the default model")]
Threads = Annotated[Optional[int], typer.Option("-t", "--threads", help="CPU threads (default: physical cores)")]
CtxSize = Annotated[Optional[int], typer.Option("-c", "--ctx-size", help="context length in tokens (default: 4096 "
                                                "or the model's own, if smaller)")]
NGpuLayers = Annotated[str, typer.Option("-ngl", "--n-gpu-layers", help="layers on the GPU: auto (the planner "
                                         "places them; the CPU alone when there is no GPU), all, or a number")]
CacheTypeK = Annotated[str, typer.Option("-ctk", "--cache-type-k", help="the KV cache's keys: f16, q8_0 (about "
                                         "half the memory) or q4_0 (a quarter), less exact; CPU only")]
CacheTypeV = Annotated[str, typer.Option("-ctv", "--cache-type-v", help="the KV cache's values: f16, q8_0 or q4_0")]
SPECULATIVE = "Speculative decoding (the same text; faster where the guesses hold)"
SpecType = Annotated[Optional[str], typer.Option(
    "--spec-type", help="none; ngram-simple: guess from the prompt's and reply's own repeats (editing code, "
    "quoting, summarizing); draft: a draft model guesses (-md; the default with -md)",
    rich_help_panel=SPECULATIVE)]
ModelDraft = Annotated[Optional[str], typer.Option(
    "-md", "--model-draft", help="a small model with the same vocabulary that guesses the next tokens (a "
    "registry name or a .gguf path)", rich_help_panel=SPECULATIVE)]
SpecDraftMax = Annotated[int, typer.Option("--spec-draft-n-max", "--draft-max", help="tokens guessed per step "
                                           "at most (1..31)", rich_help_panel=SPECULATIVE)]
SpecDraftMin = Annotated[int, typer.Option("--spec-draft-n-min", "--draft-min", help="shorter guesses are not "
                                           "run", rich_help_panel=SPECULATIVE)]
SpecNgramSize = Annotated[int, typer.Option("--spec-ngram-size-n", "--spec-ngram-simple-size-n",
                                            help="ngram-simple: how many of the last tokens must match",
                                            rich_help_panel=SPECULATIVE)]
SpecPMin = Annotated[float, typer.Option("--spec-draft-p-min", "--draft-p-min", help="a draft model stops "
                                         "guessing where its best token is less likely than this",
                                         rich_help_panel=SPECULATIVE)]


def speculative_kwargs(spec_type: Optional[str], model_draft: Optional[str], draft_max: int, draft_min: int,
                       ngram_size: int, p_min: float) -> dict[str, Any]:
    """Model's speculative decoding keywords from the flags."""
    from .common import model_path
    return dict(spec_type=spec_type, draft_model=None if model_draft is None else model_path(model_draft),
                spec_draft_max=draft_max, spec_draft_min=draft_min, spec_ngram_size=ngram_size, spec_p_min=p_min)


ADAPTERS = "LoRA adapters"
LoraOpt = Annotated[list[str], typer.Option(
    "--lora", help="apply this LoRA adapter (a GGUF file from llama.cpp's convert_lora_to_gguf.py); "
    "repeatable, or comma-separated", rich_help_panel=ADAPTERS)]
LoraScaledOpt = Annotated[list[str], typer.Option(
    "--lora-scaled", help="FILE:SCALE, an adapter at that scale (0.5: half its effect); repeatable, or "
    "comma-separated", rich_help_panel=ADAPTERS)]


def _items(values: list[str]) -> list[str]:
    return [item for value in values for item in value.split(",") if item]


def lora_specs(lora: list[str], lora_scaled: list[str]) -> list[tuple[str, float]]:
    """Model's lora= from --lora and --lora-scaled (each repeatable or comma-separated, as llama.cpp's)."""
    from pyllm.lora import parse_scaled
    return [(path, 1.0) for path in _items(lora)] + [parse_scaled(spec) for spec in _items(lora_scaled)]


VISION = "Images and sounds (a multimodal model)"
MmprojOpt = Annotated[Optional[str], typer.Option(
    "--mmproj", help="the model's multimodal projector (llama.cpp's mmproj .gguf): lets prompts hold images or "
    "sounds",
    rich_help_panel=VISION)]
ImageMinTokensOpt = Annotated[Optional[int], typer.Option(
    "--image-min-tokens", help="the fewest rows (tokens) an image becomes, where the projector sizes images itself "
    "(Qwen VL, Gemma 4, Pixtral, LFM2; llama.cpp suggests 1024 for Qwen VL's grounding)", rich_help_panel=VISION)]
ImageMaxTokensOpt = Annotated[Optional[int], typer.Option(
    "--image-max-tokens", help="the most rows (tokens) an image becomes, where the projector sizes images itself",
    rich_help_panel=VISION)]
ImageOpt = Annotated[list[str], typer.Option(
    "--image", help="an image file for the prompt (PNG, JPEG, WebP ...; needs --mmproj); repeatable; placed at "
    "each <__media__> in the prompt, else before it", rich_help_panel=VISION)]
AudioOpt = Annotated[list[str], typer.Option(
    "--audio", help="a sound file for the prompt (WAV, MP3 or FLAC; needs --mmproj with an audio encoder); "
    "repeatable; placed after the images, at each <__media__> in the prompt, else before it", rich_help_panel=VISION)]


NoMmapOpt = Annotated[bool, typer.Option("--no-mmap", help="read the model into memory instead of mapping "
                                         "the file (llama.cpp's)")]
NoRepackOpt = Annotated[bool, typer.Option("--no-repack", help="keep the weights in the file's order: no copy into "
                                           "the order decode reads fastest (llama.cpp's --no-repack)")]
MlockOpt = Annotated[bool, typer.Option("--mlock", help="keep the model in RAM, never paged out (needs the "
                                        "memory-lock limit, ulimit -l)")]
OverrideKvOpt = Annotated[list[str], typer.Option(
    "--override-kv", help="KEY=TYPE:VALUE (TYPE int, float, bool or str): use this instead of the file's metadata, "
    "e.g. tokenizer.ggml.add_bos_token=bool:false; repeatable")]


def overrides_of(specs: list[str]) -> dict[str, Any]:
    """Model's override_kv from --override-kv (repeatable)."""
    from pyllm.model_file import parse_override
    return dict(parse_override(spec) for spec in specs)


ROPE = "RoPE (longer contexts)"
RopeScalingOpt = Annotated[Optional[str], typer.Option(
    "--rope-scaling", help="none, linear or yarn: how positions past the training context are stretched "
    "(default: as the file says)", rich_help_panel=ROPE)]
RopeScaleOpt = Annotated[Optional[float], typer.Option(
    "--rope-scale", help="stretch the context by this factor (rope.scaling.factor)", rich_help_panel=ROPE)]
RopeFreqBaseOpt = Annotated[Optional[float], typer.Option(
    "--rope-freq-base", help="RoPE base frequency (default: the file's)", rich_help_panel=ROPE)]
RopeFreqScaleOpt = Annotated[Optional[float], typer.Option(
    "--rope-freq-scale", help="RoPE frequency scale: 1/N stretches the context N times", rich_help_panel=ROPE)]
YarnOrigCtxOpt = Annotated[Optional[int], typer.Option(
    "--yarn-orig-ctx", help="YaRN: the context the model was trained on (default: the file's)",
    rich_help_panel=ROPE)]


def file_kwargs(no_mmap: bool, mlock: bool, override_kv: list[str] = (), rope_scaling: Optional[str] = None,
                rope_scale: Optional[float] = None, rope_freq_base: Optional[float] = None,
                rope_freq_scale: Optional[float] = None, yarn_orig_ctx: Optional[int] = None,
                no_repack: bool = False) -> dict[str, Any]:
    """Model's keywords for how the file is read: --no-mmap, --mlock, --no-repack, and the metadata
    overrides of --override-kv and the RoPE flags."""
    return {"use_mmap": not no_mmap, "use_mlock": mlock, "repack": not no_repack, "override_kv": {
        **overrides_of(list(override_kv)),
        **rope_overrides(rope_scaling, rope_scale, rope_freq_base, rope_freq_scale, yarn_orig_ctx)}}


def rope_overrides(scaling: Optional[str], scale: Optional[float], freq_base: Optional[float],
                   freq_scale: Optional[float], yarn_orig_ctx: Optional[int]) -> dict[str, Any]:
    """The metadata overrides llama.cpp's RoPE flags amount to, for the file's family."""
    out: dict[str, Any] = {}
    if scaling is not None:
        if scaling not in ("none", "linear", "yarn"):
            raise InvalidArgumentError(f"--rope-scaling must be none, linear or yarn, not {scaling!r}")
        out["{arch}.rope.scaling.type"] = scaling
    if scale is not None and freq_scale is not None:
        raise InvalidArgumentError("give --rope-scale N or --rope-freq-scale 1/N, not both")
    for flag, value in (("--rope-scale", scale), ("--rope-freq-scale", freq_scale), ("--rope-freq-base", freq_base)):
        if value is not None and not value > 0:
            raise InvalidArgumentError(f"{flag} must be positive, not {value}")
    if scale is not None or freq_scale is not None:
        out["{arch}.rope.scaling.factor"] = float(scale if scale is not None else 1.0 / freq_scale)
    if freq_base is not None:
        out["{arch}.rope.freq_base"] = float(freq_base)
    if yarn_orig_ctx is not None:
        if yarn_orig_ctx < 1:
            raise InvalidArgumentError(f"--yarn-orig-ctx must be positive, not {yarn_orig_ctx}")
        out["{arch}.rope.scaling.original_context_length"] = int(yarn_orig_ctx)
    return out


CONTROL = "Control vectors"
ControlVectorOpt = Annotated[list[str], typer.Option(
    "--control-vector", help="add this control vector (a GGUF file from llama-cvector-generator or repeng) to "
    "the residual stream after each layer, steering the text; repeatable", rich_help_panel=CONTROL)]
ControlVectorScaledOpt = Annotated[list[str], typer.Option(
    "--control-vector-scaled", help="FILE:SCALE, a control vector at that strength (negative: the other way); "
    "repeatable, the vectors add up", rich_help_panel=CONTROL)]
ControlLayerRangeOpt = Annotated[Optional[tuple[int, int]], typer.Option(
    "--control-vector-layer-range", help="START END: only the vectors' layers START..END (from 1) apply",
    rich_help_panel=CONTROL)]


def control_kwargs(vectors: list[str], scaled: list[str], layer_range) -> dict[str, Any]:
    """Model's control vector keywords from --control-vector, --control-vector-scaled and
    --control-vector-layer-range."""
    from pyllm.lora import parse_scaled
    specs = [(path, 1.0) for path in _items(vectors)] + [parse_scaled(spec, "--control-vector-scaled")
                                                           for spec in _items(scaled)]
    if layer_range is not None and None in layer_range:
        layer_range = None
    return dict(control_vectors=specs, control_vector_layer_range=layer_range)


TemplateOpt = Annotated[Optional[str], typer.Option(
    "--chat-template", help="chat template: 'chatml', 'gemma', 'vicuna', a Jinja template, or a file holding one "
    "(default: the model file's own, else a fallback for its architecture)")]
TemplateKwargsOpt = Annotated[Optional[str], typer.Option(
    "--chat-template-kwargs", help="JSON: variables the chat template renders with (llama.cpp's), e.g. "
    "'{\"enable_thinking\": false}'")]
Stop = Annotated[list[str], typer.Option("--stop", help="stop at this text (repeatable)")]
Think = Annotated[Optional[bool], typer.Option(
    "--think/--no-think", help="a reasoning model thinks before answering, or not (the chat template's "
    "enable_thinking; default: as the template decides)")]


def thinking_note(model, think: Optional[bool], asked: Optional[str] = None) -> Optional[str]:
    """The warning for --think / --no-think (or `asked`, e.g. "/think on") when the chat template
    has no such switch."""
    if think is None or model.chat_template.has_thinking_switch:
        return None
    asked = asked or f"--{'think' if think else 'no-think'}"
    return f"{asked} does nothing: this model's chat template has no enable_thinking switch"

Temp = Annotated[float, typer.Option("--temp", help="temperature; 0 = greedy", rich_help_panel=SAMPLING)]
TopK = Annotated[int, typer.Option("--top-k", help="keep the k most likely tokens (0 = off)",
                                   rich_help_panel=SAMPLING)]
TopP = Annotated[float, typer.Option("--top-p", help="keep the most likely tokens up to this probability mass "
                                     "(1 = off)", rich_help_panel=SAMPLING)]
MinP = Annotated[float, typer.Option("--min-p", help="drop tokens less likely than this times the best one "
                                     "(0 = off)", rich_help_panel=SAMPLING)]
TypicalP = Annotated[float, typer.Option("--typical-p", help="locally typical sampling (1 = off)",
                                         rich_help_panel=SAMPLING)]
RepeatPenalty = Annotated[float, typer.Option("--repeat-penalty", help="penalise repeated tokens (1 = off)",
                                              rich_help_panel=SAMPLING)]
RepeatLastN = Annotated[int, typer.Option("--repeat-last-n", help="tokens the penalties look back over "
                                          "(0 = off, -1 = all)", rich_help_panel=SAMPLING)]
FreqPenalty = Annotated[float, typer.Option("--frequency-penalty", help="subtract this per earlier occurrence",
                                            rich_help_panel=SAMPLING)]
PresPenalty = Annotated[float, typer.Option("--presence-penalty", help="subtract this once a token occurred",
                                            rich_help_panel=SAMPLING)]
LogitBias = Annotated[list[str], typer.Option(
    "-l", "--logit-bias", help="TOKEN_ID+BIAS or TOKEN_ID-BIAS, e.g. 15043+1 or 2-inf (repeatable)",
    rich_help_panel=SAMPLING)]
SamplersOpt = Annotated[Optional[str], typer.Option(
    "--samplers", help="the chain's steps in order, ';'-separated (default penalties;dry;top_n_sigma;top_k;typ_p;"
    "top_p;min_p;xtc;temperature; a step left out is off)", rich_help_panel=SAMPLING)]
SamplingSeqOpt = Annotated[Optional[str], typer.Option(
    "--sampling-seq", "--sampler-seq", help="the same as letters (default edskypmxt)", rich_help_panel=SAMPLING)]
IgnoreEos = Annotated[bool, typer.Option("--ignore-eos", help="never stop at the end-of-text token: write "
                                        "until -n, a stop string or a full context", rich_help_panel=SAMPLING)]
Seed = Annotated[Optional[int], typer.Option("-s", "--seed", help="random seed: same seed, same output "
                                             "(default: random)", rich_help_panel=SAMPLING)]

TopNSigma = Annotated[float, typer.Option(
    "--top-nsigma", help="keep tokens within n standard deviations of the best logit (-1 = off)",
    rich_help_panel=SAMPLING)]
XtcProbability = Annotated[float, typer.Option(
    "--xtc-probability", help="XTC: the chance, each token, of dropping the likeliest choices (0 = off)",
    rich_help_panel=SAMPLING)]
XtcThreshold = Annotated[float, typer.Option(
    "--xtc-threshold", help="XTC drops the tokens at least this likely but the least of them (> 0.5 = off)",
    rich_help_panel=SAMPLING)]
MirostatOpt = Annotated[int, typer.Option(
    "--mirostat", help="mirostat 1 or 2 (2.0) in place of top-k, top-p, min-p, typical, XTC and the "
    "penalties (0 = off)", rich_help_panel=SAMPLING)]
MirostatLr = Annotated[float, typer.Option("--mirostat-lr", help="mirostat's learning rate, eta",
                                           rich_help_panel=SAMPLING)]
MirostatEnt = Annotated[float, typer.Option("--mirostat-ent", help="mirostat's target surprise, tau (bits)",
                                            rich_help_panel=SAMPLING)]
DryMultiplier = Annotated[float, typer.Option(
    "--dry-multiplier", help="DRY: penalise tokens that would lengthen a repeat of earlier text, this "
    "strongly (0 = off; 0.8 is usual)", rich_help_panel=SAMPLING)]
DryBase = Annotated[float, typer.Option("--dry-base", help="DRY's penalty grows by this factor per repeated "
                                        "token (>= 1)", rich_help_panel=SAMPLING)]
DryAllowedLength = Annotated[int, typer.Option("--dry-allowed-length", help="DRY leaves repeats shorter than "
                                               "this alone", rich_help_panel=SAMPLING)]
DryPenaltyLastN = Annotated[int, typer.Option("--dry-penalty-last-n", help="tokens DRY looks back over "
                                              "(0 = off, -1 = all)", rich_help_panel=SAMPLING)]
DrySequenceBreaker = Annotated[list[str], typer.Option(
    "--dry-sequence-breaker", help="text a repeat may not reach back across, in place of the defaults "
    "(newline, :, \", *); repeatable; 'none' for no breakers", rich_help_panel=SAMPLING)]


def dry_breakers(items: list[str]) -> Optional[tuple[str, ...]]:
    """--dry-sequence-breaker: None (the defaults) when not given; 'none' means no breakers."""
    if not items:
        return None
    return tuple(item for item in items if item != "none")

_BIAS = re.compile(r"^\s*(\d+)\s*([+-=])\s*(inf|[0-9]*\.?[0-9]+(?:[eE][+-]?\d+)?)\s*$")


def parse_logit_bias(items: list[str]) -> dict[int, float]:
    bias: dict[int, float] = {}
    for item in items:
        m = _BIAS.match(item)
        if not m:
            raise InvalidArgumentError(f"--logit-bias {item!r}: expected TOKEN_ID+BIAS or TOKEN_ID-BIAS, "
                                       f"e.g. 15043+1 or 2-inf")
        value = math.inf if m.group(3) == "inf" else float(m.group(3))
        bias[int(m.group(1))] = -value if m.group(2) == "-" else value
    return bias


def samplers_of(samplers: Optional[str], sampling_seq: Optional[str]) -> Optional[str]:
    """--samplers or --sampling-seq (not both): the chain's order, None for the default."""
    if samplers is not None and sampling_seq is not None:
        raise InvalidArgumentError("give --samplers or --sampling-seq, not both")
    if sampling_seq is not None and ";" in sampling_seq:
        raise InvalidArgumentError("--sampling-seq takes letters (such as kpmt); names go to --samplers")
    return samplers if samplers is not None else sampling_seq


def sampling_kwargs(temp: float, top_k: int, top_p: float, min_p: float, typical_p: float,
                    repeat_penalty: float, repeat_last_n: int, frequency_penalty: float,
                    presence_penalty: float, logit_bias: list[str], seed: Optional[int],
                    **more: Any) -> dict[str, Any]:
    """Model sampling keywords from the flags (`more`: the others, named as SamplingParams names them;
    a None among them is left to its default)."""
    return dict(temperature=temp, top_k=top_k, top_p=top_p, min_p=min_p, typical_p=typical_p,
                repeat_penalty=repeat_penalty, repeat_last_n=repeat_last_n,
                frequency_penalty=frequency_penalty, presence_penalty=presence_penalty,
                logit_bias=parse_logit_bias(logit_bias), seed=seed,
                **{k: v for k, v in more.items() if v is not None})


def template_kwargs(value: Optional[str]) -> Optional[dict]:
    """--chat-template-kwargs: a JSON object."""
    if value is None:
        return None
    import json
    try:
        out = json.loads(value)
    except ValueError as e:
        raise InvalidArgumentError(f"--chat-template-kwargs takes a JSON object: {e}") from None
    if not isinstance(out, dict):
        raise InvalidArgumentError(f"--chat-template-kwargs takes a JSON object, not {value!r}")
    return out


def template_arg(value: Optional[str]) -> Optional[str]:
    """--chat-template: a built-in name, a Jinja template itself (as llama.cpp's flag
    takes it), or the text of the file it names."""
    from pyllm.chat_template import BUILTIN
    if value is None or value in BUILTIN or "{%" in value or "{{" in value:
        return value
    try:
        with open(value, encoding="utf-8") as f:
            return f.read()
    except OSError as e:
        raise InvalidArgumentError(f"--chat-template {value}: not a built-in template ({', '.join(BUILTIN)}) "
                                   f"and cannot read it as a file: {e.strerror}") from None
    except UnicodeDecodeError:
        raise InvalidArgumentError(f"--chat-template {value}: the file is not UTF-8 text") from None


CONSTRAINED = "Constrained output (one of these)"
FormatOpt = Annotated[Optional[str], typer.Option(
    "--format", help="json: the reply is one JSON object (it ends when the object closes); or a JSON schema",
    rich_help_panel=CONSTRAINED)]
GrammarOpt = Annotated[Optional[str], typer.Option(
    "--grammar", help="a GBNF grammar (llama.cpp's) the reply follows", rich_help_panel=CONSTRAINED)]
GrammarFile = Annotated[Optional[str], typer.Option(
    "--grammar-file", help="read the GBNF grammar from this file", rich_help_panel=CONSTRAINED)]
JsonSchema = Annotated[Optional[str], typer.Option(
    "-j", "--json-schema", help="a JSON schema (JSON text): the reply is one JSON value valid for it",
    rich_help_panel=CONSTRAINED)]
JsonSchemaFile = Annotated[Optional[str], typer.Option(
    "--json-schema-file", help="read the JSON schema from this file", rich_help_panel=CONSTRAINED)]


def constraint_kwargs(fmt: Optional[str], grammar: Optional[str], grammar_file: Optional[str],
                      json_schema: Optional[str], json_schema_file: Optional[str]) -> dict[str, Any]:
    """format= / grammar= for Model.generate and Model.chat, from the command line."""
    from .common import read_input
    given = [name for name, value in (("--format", fmt), ("--grammar", grammar), ("--grammar-file", grammar_file),
                                      ("--json-schema", json_schema), ("--json-schema-file", json_schema_file))
             if value is not None]
    if len(given) > 1:
        raise InvalidArgumentError(f"give one of {' and '.join(given)}, not both")
    if grammar_file is not None:
        return {"grammar": read_input(grammar_file, "grammar file", "")}
    if grammar is not None:
        return {"grammar": grammar}
    if json_schema_file is not None:
        json_schema = read_input(json_schema_file, "JSON schema file", "")
    elif fmt is not None and fmt != "json":
        if not fmt.lstrip().startswith("{"):
            raise InvalidArgumentError(f"--format takes json or a JSON schema, not {fmt!r}")
        json_schema = fmt
    if json_schema is None:
        return {"format": fmt}
    try:
        schema = json.loads(json_schema)
    except json.JSONDecodeError as e:
        raise InvalidArgumentError(f"the JSON schema is not JSON: {e}") from None
    return {"format": schema}
