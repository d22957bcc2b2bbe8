"""`pyllm chat`: a conversation in the terminal.

Input is read with input() and readline (line editing, history with the
arrow keys): no extra dependency, and it behaves in any terminal or pipe.
Replies stream as they are generated. Each turn reuses the KV cache of the
conversation so far, so only the new message is computed.
"""
from __future__ import annotations

import contextlib
import os
import signal
import sys
from pathlib import Path
from typing import Annotated, Iterator, Optional

import typer
from rich.console import Console
from rich.text import Text

from pyllm.errors import InvalidArgumentError, PyllmError
from pyllm.reasoning import ANSWER, THINKING

from .common import created_messages, err, handle_errors, image_file, images_in, media_file, model_path
from .options import ImageMaxTokensOpt, ImageMinTokensOpt, MlockOpt, MmprojOpt, NoMmapOpt, NoRepackOpt
from .options import OverrideKvOpt, file_kwargs
from .options import RopeFreqBaseOpt, RopeFreqScaleOpt, RopeScaleOpt, RopeScalingOpt, YarnOrigCtxOpt
from .options import TemplateKwargsOpt, template_kwargs
from .options import (CtxSize, FreqPenalty, LogitBias, MinP, ModelOpt, PresPenalty, RepeatLastN, RepeatPenalty,
                      Seed, TemplateOpt, Temp, Think, Threads, TopK, TopP, TypicalP, sampling_kwargs,
                      template_arg, thinking_note)
from .options import (CacheTypeK, CacheTypeV, MirostatEnt, MirostatLr, MirostatOpt, NGpuLayers, TopNSigma,
                      XtcProbability, XtcThreshold)
from .options import FormatOpt, GrammarFile, GrammarOpt, JsonSchema, JsonSchemaFile, constraint_kwargs
from .options import IgnoreEos, SamplersOpt, SamplingSeqOpt, samplers_of
from .options import DryAllowedLength, DryBase, DryMultiplier, DryPenaltyLastN, DrySequenceBreaker, dry_breakers
from .options import (ControlLayerRangeOpt, ControlVectorOpt, ControlVectorScaledOpt, LoraOpt, LoraScaledOpt,
                      control_kwargs, lora_specs)
from .options import (ModelDraft, SpecDraftMax, SpecDraftMin, SpecNgramSize, SpecPMin, SpecType,
                      speculative_kwargs)

HELP = """\
Type a message and press Enter. A line ending in \\ continues on the next line;
a line starting with \"\"\" begins a block that ends at a line ending with \"\"\".
Ctrl-C stops a reply (or clears the line); Ctrl-D or /exit leaves.

  /help          this help
  /reset         forget the conversation (the system prompt stays)
  /system TEXT   set the system prompt (/system alone shows it; /system - clears it)
  /set parameter NAME VALUE   a sampling setting from the next reply, by ollama's names
                 (temperature, top_k, top_p, min_p, repeat_penalty, seed, num_predict, ...)
  /set system TEXT, /set think, /set nothink, /set verbose, /set quiet,
  /set format json, /set noformat   (ollama's: the system prompt, thinking on/off, the stats
                 line after each reply or not, replies held to JSON or free)
  /show parameters            the settings that differ from the defaults
  /show info, /show system, /show template, /show license   the model's facts, the system
                 prompt, the chat template's source, the file's license
  /save FILE     save the conversation as JSON
  /load FILE     load a saved conversation
  /stats         token counts, KV-cache reuse and speed
  /think on|off  a reasoning model thinks before answering, or not (/think alone shows it)
  /image FILE    show the model a picture with the next message (needs --mmproj)
  /audio FILE    let the model hear a sound (WAV, MP3, FLAC) with the next message (needs --mmproj)
  /exit          leave (also /quit, /bye)

Start a message with // to send text that begins with /."""

PROMPT, MORE = ">>> ", "... "

HISTORY_LINES = 1000   # input lines kept between chat sessions


class _Interrupt:
    """While active, Ctrl-C cancels the reply instead of raising, so it stops
    between steps (also in the middle of a long prompt) and the KV cache
    stays consistent."""

    def __init__(self):
        self.hit = False

    @contextlib.contextmanager
    def catching(self, cancel) -> Iterator["_Interrupt"]:
        self.hit = False

        def handler(signum, frame):
            self.hit = True
            cancel()

        try:
            old = signal.signal(signal.SIGINT, handler)
        except ValueError:          # not the main thread: no signal handling
            yield self
            return
        try:
            yield self
        finally:
            signal.signal(signal.SIGINT, old)


class ChatRepl:
    def __init__(self, session, out: Console, verbose: bool, interactive: bool):
        self.session, self.out, self.verbose, self.interactive = session, out, verbose, interactive
        self.interrupt = _Interrupt()
        color = out.is_terminal and not out.no_color and interactive
        # \001 \002 tell readline the escape codes take no room on the line
        self.prompt = "\001\033[1;32m\002>>> \001\033[0m\002" if color else PROMPT
        self.more = "\001\033[2m\002... \001\033[0m\002" if color else MORE
        self.images: list[bytes] = []    # /image, /audio: pictures and sounds for the next message

    # -- input ---------------------------------------------------------------------------
    def _input(self, prompt: str) -> str:
        if self.interactive:
            return input(prompt)
        line = sys.stdin.readline()
        if not line:
            raise EOFError
        return line.rstrip("\n")

    def read_message(self) -> str:
        """One message; raises EOFError at the end of input."""
        line = self._input(self.prompt)
        if line.lstrip().startswith('"""'):
            first = line.lstrip()[3:]
            if first.rstrip().endswith('"""'):
                return first.rstrip()[:-3]
            lines = [first] if first else []
            while True:
                line = self._input(self.more)
                if line.rstrip().endswith('"""'):
                    lines.append(line.rstrip()[:-3])
                    return "\n".join(lines)
                lines.append(line)
        lines = []
        while line.endswith("\\"):
            lines.append(line[:-1])
            line = self._input(self.more)
        lines.append(line)
        return "\n".join(lines)

    # -- output --------------------------------------------------------------------------
    def status(self, text: str, style: str = "dim") -> None:
        err.print(Text(text, style=style), soft_wrap=True)

    def stats_line(self, c) -> str:
        m = c.metrics
        return (f"prompt {m.prompt_tokens} tok (reused {m.reused_tokens}, computed "
                f"{m.prompt_tokens - m.reused_tokens}) · TTFT {m.ttft_s:.3f} s · {m.generated_tokens} tok at "
                f"{m.decode_tokens_per_s:.1f} tok/s · " + (
                    f"guesses kept {m.accepted_tokens}/{m.draft_tokens} · " if m.draft_tokens else "") +
                f"{c.finish_reason}")

    # -- commands ------------------------------------------------------------------------
    def command(self, line: str) -> bool:
        """Runs a /command; returns False to leave."""
        name, _, arg = line.strip().partition(" ")
        arg = arg.strip()
        s = self.session
        if name in ("/exit", "/quit", "/bye"):
            return False
        if name in ("/help", "/?"):
            self.out.print(HELP, markup=False, highlight=False)
        elif name in ("/reset", "/clear"):
            s.reset()
            self.status("conversation cleared")
        elif name == "/system":
            if not arg:
                self.status(f"system prompt: {s.system!r}" if s.system else
                            "no system prompt (the chat template's default applies, if it has one)")
            else:
                s.system = None if arg == "-" else arg
                self.status("system prompt cleared" if arg == "-" else "system prompt set")
        elif name == "/set":
            self.set(arg)
        elif name == "/show" and arg in ("info", "system", "template", "license"):
            self.show(arg)
        elif name == "/show":
            if arg != "parameters":
                raise InvalidArgumentError("/show takes parameters, info, system, template or license")
            import dataclasses

            from pyllm.sampling import SamplingParams
            defaults = dataclasses.asdict(SamplingParams())
            shown = {k: v for k, v in s.sampling.items() if k in defaults and v != defaults[k]}
            if s.max_tokens is not None:
                shown["num_predict"] = s.max_tokens
            self.status("  ".join(f"{k} {v}" for k, v in shown.items()) or "all at their defaults", style="")
        elif name == "/save":
            if not arg:
                raise InvalidArgumentError("/save needs a file name")
            s.save(os.path.expanduser(arg))
            self.status(f"saved {len(s.messages)} messages to {arg}")
        elif name == "/load":
            if not arg:
                raise InvalidArgumentError("/load needs a file name")
            s.load(os.path.expanduser(arg))
            self.status(f"loaded {len(s.messages)} messages from {arg}")
        elif name == "/think":
            m = s.model
            if arg in ("on", "off"):
                m.think = arg == "on"
                self.status(thinking_note(m, m.think, f"/think {arg}") or f"thinking {arg} from the next reply")
            elif arg:
                raise InvalidArgumentError("/think takes on or off")
            else:
                self.status("thinking: as the chat template decides" if m.think is None else
                            f"thinking {'on' if m.think else 'off'}" + ("" if m.chat_template.has_thinking_switch
                                                                      else " (the template has no switch)"))
        elif name == "/image":
            if s.model.vision is None:
                raise InvalidArgumentError("/image needs the model's vision projector: start the chat with "
                                           "--mmproj FILE")
            if not arg:
                raise InvalidArgumentError("/image needs an image file")
            from pyllm.vision import load_image
            path = os.path.expanduser(arg.strip("'\""))
            data = image_file(path)
            load_image(data)   # a file that is no image fails now, not with the next message
            self.images.append(data)
            self.status(f"{path}: attached to the next message ({len(self.images)} image"
                        f"{'s' if len(self.images) > 1 else ''})")
        elif name == "/audio":
            if s.model.audio is None:
                raise InvalidArgumentError("/audio needs the model's audio projector: start the chat with "
                                           "--mmproj FILE (one with an audio encoder)")
            if not arg:
                raise InvalidArgumentError("/audio needs a sound file (WAV, MP3 or FLAC)")
            from pyllm.audio import load_audio
            path = os.path.expanduser(arg.strip("'\""))
            data = media_file(path, "sound")
            seconds = len(load_audio(data)) / 16000    # a file that is no sound fails now, not with the next message
            self.images.append(data)
            self.status(f"{path}: {seconds:.1f} s, attached to the next message")
        elif name == "/stats":
            st, m = s.stats, s.model
            used = len(m._seq)
            pct = 100.0 * st.reused_tokens / st.prompt_tokens if st.prompt_tokens else 0.0
            self.status(f"turns {st.turns} · context {used}/{m.n_ctx} tokens · prompt tokens {st.prompt_tokens}, "
                        f"reused {st.reused_tokens} ({pct:.0f}%) · generated {st.generated_tokens} · "
                        f"dropped turns {st.dropped_turns}", style="")
            if st.last is not None:
                last = st.last
                self.status(f"last reply: prompt {last.prompt_tokens} (reused {last.reused_tokens}) · "
                            f"TTFT {last.ttft_s:.3f} s · prefill {last.prefill_tokens_per_s:.1f} tok/s · "
                            f"decode {last.decode_tokens_per_s:.1f} tok/s", style="")
        else:
            raise InvalidArgumentError(f"unknown command {name}; /help lists them")
        return True

    def show(self, what: str) -> None:
        """/show info | system | template | license (ollama's)."""
        s, m = self.session, self.session.model
        if what == "info":
            from pyllm.info import model_info
            self.out.print(model_info(str(m.path), n_ctx=m.n_ctx).format(), markup=False, highlight=False,
                           soft_wrap=True)
        elif what == "system":
            self.status(s.system if s.system else "no system prompt (the chat template's default applies, if it "
                        "has one)", style="")
        elif what == "template":
            t = m.chat_template
            self.out.print(t.source or f"(the built-in {t.name} template)", markup=False, highlight=False,
                           soft_wrap=True)
        else:
            license_text = m.file.metadata.get("general.license")
            self.status(str(license_text) if license_text else "the file names no license", style="")

    def set(self, arg: str) -> None:
        """/set parameter NAME VALUE (ollama's names), /set system TEXT, and ollama's switches:
        think, nothink, verbose, quiet, format json, noformat."""
        from pyllm.created import PARAMETERS, SAMPLING_PARAMETERS, parameter_value
        what, _, rest = arg.partition(" ")
        s = self.session
        if what == "system" and rest.strip():
            s.system = rest.strip()
            self.status("system prompt set")
            return
        if what in ("think", "nothink") and not rest.strip():
            self.command(f"/think {'on' if what == 'think' else 'off'}")
            return
        if what in ("verbose", "quiet") and not rest.strip():
            self.verbose = what == "verbose"
            self.status("a stats line after each reply" if self.verbose else "no stats line after the replies")
            return
        if (what, rest.strip()) in (("format", "json"), ("noformat", "")):
            from pyllm.grammar import constraint_for
            s.format = "json" if what == "format" else None
            if s.format is not None:
                constraint_for(s.model.tokenizer, s.format, s.grammar)   # with a --grammar: refused here
            self.status("replies held to JSON" if s.format else "replies free")
            return
        key, _, value = rest.strip().partition(" ")
        if what != "parameter" or not key or not value.strip():
            raise InvalidArgumentError("/set takes parameter NAME VALUE (e.g. /set parameter temperature 0.2), "
                                       "system TEXT, think, nothink, verbose, quiet, format json or noformat")
        if key in PARAMETERS and key not in SAMPLING_PARAMETERS and key != "num_predict":
            raise InvalidArgumentError(f"{key} is set when the chat starts ({'--stop' if key == 'stop' else 'a flag'} "
                                       f"of pyllm chat), not during it")
        parsed = parameter_value(key, value.strip(), "/set parameter")
        if key == "num_predict":
            s.max_tokens = None if parsed < 0 else parsed
        else:
            sampling = {**s.sampling, key: parsed}
            s.model._sampler(sampling)                  # a bad value fails here, the session unchanged
            s.sampling = sampling
        self.status(f"{key} set to {parsed}")

    # -- a turn --------------------------------------------------------------------------
    def reply(self, text: str) -> None:
        if self.session.model.vision is not None:   # ollama's: an image file's path in the message shows it
            text, shown = images_in(text)
            self.images += shown
            if shown:
                self.status(f"[{len(shown)} image{'s' if len(shown) > 1 else ''} from the message]")
        turn = self.session.send(text, images=self.images)
        self.images = []
        if turn.dropped:
            self.status(f"[context full: dropped the {turn.dropped} oldest "
                        f"turn{'s' if turn.dropped > 1 else ''} to make room]", style="yellow")
        wrote, kind = "", ANSWER
        with self.interrupt.catching(turn.cancel) as stop:
            try:
                for kind_now, piece in turn.parts():   # thinking dimmed, then the answer
                    if kind_now != kind and wrote:   # the thinking ends its line, then a blank line
                        if not wrote.endswith("\n"):
                            self.out.print()
                        if kind_now == ANSWER:
                            self.out.print()
                    kind = kind_now
                    self.out.print(piece, end="", style="dim" if kind == THINKING else None, markup=False,
                                   highlight=False, soft_wrap=True)
                    self.out.file.flush()
                    wrote = piece
                    if stop.hit:
                        break
            finally:
                turn.close()
        if not wrote.endswith("\n"):
            self.out.print()
        c = turn.completion
        if c is None:
            return
        if c.finish_reason == "interrupted":
            self.status("[stopped]")
        elif c.finish_reason == "context":
            self.status("[context full: the reply was cut; the oldest turns will be dropped next time]",
                        style="yellow")
        elif c.finish_reason == "length":
            self.status(f"[reply cut at {c.metrics.generated_tokens} tokens (-n)]")
        if self.verbose:
            self.status(self.stats_line(c))

    def loop(self) -> None:
        while True:
            try:
                text = self.read_message()
            except EOFError:
                if self.interactive:
                    self.out.print()
                return
            except KeyboardInterrupt:
                self.out.print("^C" if self.interactive else "")
                continue
            if not text.strip():
                continue
            try:
                if text.startswith("/") and not text.startswith("//"):
                    if not self.command(text):
                        return
                    continue
                if text.startswith("//"):
                    text = text[1:]
                self.reply(text)
            except PyllmError as e:
                err.print(Text.assemble(("error: ", "red"), str(e)), soft_wrap=True)
            except KeyboardInterrupt:
                # Ctrl-C outside a reply (e.g. while the prompt was being prepared)
                self.out.print()
                self.status("[stopped]")


def history_file() -> Optional[Path]:
    """Where the chat keeps the lines typed, between sessions (ollama's ~/.ollama/history):
    $PYLLM_HISTORY (empty: nowhere), else pyllm's cache folder."""
    env = os.environ.get("PYLLM_HISTORY")
    if env is not None:
        return Path(env).expanduser() if env else None
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pyllm" / "chat_history"


@contextlib.contextmanager
def kept_history(interactive: bool) -> Iterator[None]:
    """At a terminal: readline's line editing for input(), with the arrow keys reaching the lines
    of earlier sessions too (the last HISTORY_LINES, written back at the end)."""
    try:
        import readline
    except ImportError:
        readline = None
    path = history_file() if interactive and readline is not None else None
    if path is not None:
        readline.set_history_length(HISTORY_LINES)
        with contextlib.suppress(OSError):
            readline.read_history_file(path)
    try:
        yield
    finally:
        if path is not None:
            with contextlib.suppress(OSError):   # a read-only home loses the history, not the chat
                path.parent.mkdir(parents=True, exist_ok=True)
                readline.write_history_file(path)


def chat(
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
    system: Annotated[Optional[str], typer.Option("--system", help="system prompt")] = None,
    n_predict: Annotated[int, typer.Option("-n", "--n-predict", help="tokens per reply at most "
                                           "(-1 = until the reply ends)")] = -1,
    chat_template: TemplateOpt = None,
    chat_template_kwargs: TemplateKwargsOpt = None,
    think: Think = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="a stats line after each reply: prompt "
                                          "tokens, reused tokens, TTFT, tokens/s")] = False,
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
    """Chat with a model in the terminal (/help inside for commands)."""
    with handle_errors():
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
        template = template_arg(chat_template)
        from pyllm import Model
        from pyllm.chat import ChatSession

        path = model_path(model)
        with Model(path, n_ctx=ctx_size, n_threads=threads, chat_template=template,
                   chat_template_kwargs=template_kwargs(chat_template_kwargs),
                   **file_kwargs(no_mmap, mlock, override_kv, rope_scaling, rope_scale, rope_freq_base,
                                 rope_freq_scale, yarn_orig_ctx, no_repack),
                   n_gpu_layers=n_gpu_layers, cache_type_k=cache_type_k,
                   cache_type_v=cache_type_v, think=think, lora=lora_specs(lora, lora_scaled), mmproj=mmproj,
                   image_min_tokens=image_min_tokens, image_max_tokens=image_max_tokens,
                   **control_kwargs(control_vector, control_vector_scaled, control_vector_layer_range),
                   **speculative_kwargs(spec_type, model_draft, spec_draft_max, spec_draft_min, spec_ngram_size, spec_p_min)) as m:
            m.require_generation()       # an embedding model cannot chat: say so before any input
            t = m.chat_template          # checked now: a bad template stops here, before any input
            note = thinking_note(m, think)
            if note:
                err.print(Text.assemble(("warning: ", "yellow"), note), soft_wrap=True)
            session = ChatSession(m, system=system, max_tokens=None if n_predict < 0 else n_predict, **sampling)
            session.messages = created_messages()     # a created model's MESSAGE lines: the chat so far
            interactive = sys.stdin.isatty()
            if hasattr(sys.stdin, "reconfigure"):  # bytes that are not UTF-8 reach the tokenizer (-> U+FFFD)
                sys.stdin.reconfigure(errors="surrogateescape")
            out = Console(highlight=False)
            name = m.file.metadata.get("general.name") or m.path.name
            err.print(Text(f"pyllm chat · {name} · {m.arch.name}, context {m.n_ctx} tokens, "
                           f"template {t.name} · /help for help, Ctrl-D to leave", style="dim"), soft_wrap=True)
            with kept_history(interactive):
                ChatRepl(session, out, verbose, interactive).loop()
