"""What every tokenizer shares: the vocabulary, token attributes, special and
end-of-generation tokens, splitting out special tokens, and detokenization.

Behaviour follows llama.cpp (src/llama-vocab.cpp, llama_vocab::impl): which
tokens count as special, which end generation, how special tokens written in
the text are recognised, how pieces are rendered. The subclasses
(`BPETokenizer`, `SPMTokenizer`) only turn plain text fragments into ids.
"""
from __future__ import annotations

import codecs
import enum
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import InvalidArgumentError, ModelFileError

log = logging.getLogger(__name__)

K_TOKENS = "tokenizer.ggml.tokens"
K_TYPES = "tokenizer.ggml.token_type"
K_SCORES = "tokenizer.ggml.scores"


def _surrogates_to_bytes(err: UnicodeEncodeError) -> tuple[bytes, int]:
    """encoding: an escaped byte (U+DC80..U+DCFF) back to itself; any other
    lone surrogate to U+FFFD"""
    out = bytearray()
    for ch in err.object[err.start:err.end]:
        o = ord(ch)
        out += bytes([o - 0xDC00]) if 0xDC80 <= o <= 0xDCFF else "\ufffd".encode()
    return bytes(out), err.end


def _bytes_replaced(err: UnicodeDecodeError) -> tuple[str, int]:
    """decoding: one U+FFFD per invalid byte, as llama.cpp"""
    return "\ufffd" * (err.end - err.start), err.end


codecs.register_error("pyllm-surrogates-to-bytes", _surrogates_to_bytes)
codecs.register_error("pyllm-replace-bytes", _bytes_replaced)


def unicode_text(text: str) -> str:
    """text with every invalid UTF-8 byte replaced by U+FFFD, one per byte, as
    llama.cpp's UTF-8 decoder does. Such bytes reach a str as the lone
    surrogates U+DC80..U+DCFF (Python's 'surrogateescape': argv, stdin, files
    read with it); other lone surrogates become U+FFFD too."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        pass
    fixed = text.encode("utf-8", "pyllm-surrogates-to-bytes").decode("utf-8", "pyllm-replace-bytes")
    n = fixed.count("\ufffd") - text.count("\ufffd")
    log.warning(f"the text is not valid UTF-8: {n} invalid byte{'s' if n != 1 else ''} became U+FFFD")
    return fixed


class TokenAttr(enum.IntFlag):
    """llama.cpp's llama_token_attr bits."""
    UNDEFINED = 0
    UNKNOWN = 1 << 0
    UNUSED = 1 << 1
    NORMAL = 1 << 2
    CONTROL = 1 << 3
    USER_DEFINED = 1 << 4
    BYTE = 1 << 5
    NORMALIZED = 1 << 6
    LSTRIP = 1 << 7
    RSTRIP = 1 << 8
    SINGLE_WORD = 1 << 9


# GGUF tokenizer.ggml.token_type values -> attributes
_TYPE_TO_ATTR = np.zeros(8, dtype=np.int32)
_TYPE_TO_ATTR[0] = TokenAttr.UNDEFINED
_TYPE_TO_ATTR[1] = TokenAttr.NORMAL
_TYPE_TO_ATTR[2] = TokenAttr.UNKNOWN
_TYPE_TO_ATTR[3] = TokenAttr.CONTROL
_TYPE_TO_ATTR[4] = TokenAttr.USER_DEFINED
_TYPE_TO_ATTR[5] = TokenAttr.UNUSED
_TYPE_TO_ATTR[6] = TokenAttr.BYTE

# plain ints: IntFlag arithmetic is slow in hot loops
_CONTROL_OR_UNKNOWN = int(TokenAttr.CONTROL | TokenAttr.UNKNOWN)
_SPECIAL_CACHE = int(TokenAttr.CONTROL | TokenAttr.USER_DEFINED | TokenAttr.UNKNOWN)
_USER_DEFINED = int(TokenAttr.USER_DEFINED)
_NORMAL = int(TokenAttr.NORMAL)
_BYTE = int(TokenAttr.BYTE)
_LSTRIP = int(TokenAttr.LSTRIP)
_RSTRIP = int(TokenAttr.RSTRIP)
_C_SPACE = " \t\n\v\f\r"  # C isspace() in the "C" locale

# Texts llama.cpp uses to find special tokens the GGUF does not name.
_EOT_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
              "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>",
              "<end_of_utterance>")
_EOM_TEXTS = ("<|eom_id|>",)
_FIM_PRE_TEXTS = ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>",
                  "▁<PRE>", "<|code_prefix|>", "<|prefix|>")
_FIM_SUF_TEXTS = ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>",
                  "▁<SUF>", "<|code_suffix|>", "<|suffix|>")
_FIM_MID_TEXTS = ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>",
                  "▁<MID>", "<|code_middle|>", "<|middle|>")
_FIM_PAD_TEXTS = ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]")
_FIM_REP_TEXTS = ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>")
_FIM_SEP_TEXTS = ("<|file_sep|>",)
_EOG_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>",
              "<|calls|>", "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>",
              "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>", "<end_of_utterance>", "<eos>",
              "<turn|>", "<|tool_response>", "<｜end▁of▁sentence｜>", "[e~[")

# GGUF key -> special-token slot
_SPECIAL_KEYS = (
    ("tokenizer.ggml.bos_token_id", "bos"),
    ("tokenizer.ggml.eos_token_id", "eos"),
    ("tokenizer.ggml.eot_token_id", "eot"),
    ("tokenizer.ggml.eom_token_id", "eom"),
    ("tokenizer.ggml.unknown_token_id", "unk"),
    ("tokenizer.ggml.seperator_token_id", "sep"),
    ("tokenizer.ggml.padding_token_id", "pad"),
    ("tokenizer.ggml.mask_token_id", "mask"),
    ("tokenizer.ggml.fim_pre_token_id", "fim_pre"),
    ("tokenizer.ggml.fim_suf_token_id", "fim_suf"),
    ("tokenizer.ggml.fim_mid_token_id", "fim_mid"),
    ("tokenizer.ggml.fim_pad_token_id", "fim_pad"),
    ("tokenizer.ggml.fim_rep_token_id", "fim_rep"),
    ("tokenizer.ggml.fim_sep_token_id", "fim_sep"),
    # deprecated names
    ("tokenizer.ggml.prefix_token_id", "fim_pre"),
    ("tokenizer.ggml.suffix_token_id", "fim_suf"),
    ("tokenizer.ggml.middle_token_id", "fim_mid"),
)


class Tokenizer:
    """Text <-> token ids for one GGUF vocabulary, matching llama.cpp.

    Build one with `load_tokenizer(metadata)`. Subclasses implement
    `_encode_fragment`; everything else lives here.
    """

    #: 'gpt2' (BPE) or 'llama' (SentencePiece), from tokenizer.ggml.model
    model: str = ""
    # defaults that subclasses set before calling _init_vocab
    _default_ids: dict[str, int | None] = {}
    _default_add_bos = False
    _add_space_prefix = False
    _clean_spaces = False

    # ---- construction ------------------------------------------------------

    def _init_vocab(self, md: Mapping[str, Any]) -> None:
        tokens = md.get(K_TOKENS)
        if tokens is None:
            raise ModelFileError(f"the model has no vocabulary ({K_TOKENS} missing)")
        tokens = list(tokens)
        n = len(tokens)
        if n == 0:
            raise ModelFileError(f"the model's vocabulary is empty ({K_TOKENS})")
        if "" in tokens:
            for i, t in enumerate(tokens):
                if not t:  # llama.cpp renames empty tokens the same way
                    tokens[i] = f"[EMPTY_{i}]"
        self._texts: list[str] = tokens
        self._token_to_id: dict[str, int] = dict(zip(tokens, range(n)))
        if len(self._token_to_id) != n:
            raise ModelFileError("the model's vocabulary has duplicate tokens "
                                 "(llama.cpp refuses such files too)")
        self.n_vocab = n

        types = md.get(K_TYPES)
        if types is not None:
            types = np.asarray(types)
            if len(types) < n:
                raise ModelFileError(f"{K_TYPES} has {len(types)} entries for {n} tokens")
            types = types[:n].astype(np.int64)
            attrs = np.where((types >= 0) & (types < 7), _TYPE_TO_ATTR[np.clip(types, 0, 7)],
                             int(TokenAttr.UNDEFINED))
        else:
            attrs = np.full(n, int(TokenAttr.NORMAL), dtype=np.int32)
        self._attrs = attrs.astype(np.int32)

        # special ids: model-type defaults, then the GGUF keys
        ids: dict[str, int | None] = {slot: None for _, slot in _SPECIAL_KEYS}
        ids.update(self._default_ids)
        for slot, value in list(ids.items()):
            if value is not None and value >= n:
                ids[slot] = None
        for key, slot in _SPECIAL_KEYS:
            value = md.get(key)
            if value is None:
                continue
            value = int(value)
            if 0 <= value < n:
                ids[slot] = value
            else:
                log.warning("bad special token %s = %d, using default %s", key, value, ids[slot])

        add_bos = md.get("tokenizer.ggml.add_bos_token")
        self.add_bos: bool = self._default_add_bos if add_bos is None else bool(add_bos)
        add_eos = md.get("tokenizer.ggml.add_eos_token")
        self.add_eos: bool = False if add_eos is None else bool(add_eos)
        # a separator between a pair's texts (a reranker's input), llama.cpp's add_sep
        self.add_sep: bool = bool(md.get("tokenizer.ggml.add_sep_token", False))
        self._finish_specials(ids, md)

    def _has(self, text: str) -> int | None:
        return self._token_to_id.get(text)

    def _finish_specials(self, ids: dict[str, int | None], md: Mapping[str, Any]) -> None:
        attrs = self._attrs
        control = int(TokenAttr.CONTROL)

        def mark_control(tid: int) -> None:
            if not attrs[tid] & control:
                attrs[tid] |= control

        # find EOT, EOM and FIM tokens by their text when the GGUF does not
        # name them. llama.cpp walks a hash map, so when several texts match
        # it takes whichever comes first there; we take the lowest id.
        for slot, texts in (("eot", _EOT_TEXTS), ("eom", _EOM_TEXTS), ("fim_pre", _FIM_PRE_TEXTS),
                            ("fim_suf", _FIM_SUF_TEXTS), ("fim_mid", _FIM_MID_TEXTS),
                            ("fim_pad", _FIM_PAD_TEXTS), ("fim_rep", _FIM_REP_TEXTS),
                            ("fim_sep", _FIM_SEP_TEXTS)):
            if ids[slot] is not None:
                continue
            found = sorted(t for t in (self._has(x) for x in texts) if t is not None)
            if found:
                ids[slot] = found[0]
                mark_control(found[0])

        # control tokens named "...unused..." are unused
        for tid in np.nonzero(attrs & control)[0]:
            if "unused" in self._texts[tid]:
                attrs[tid] |= int(TokenAttr.UNUSED)

        eog: set[int] = set()
        for slot in ("fim_pad", "fim_rep", "fim_sep"):
            if ids[slot] is not None:
                eog.add(ids[slot])
        for text in _EOG_TEXTS:
            tid = self._has(text)
            if tid is not None:
                eog.add(tid)
                mark_control(tid)

        # gpt-oss: always render these
        for text in ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"):
            tid = self._has(text)
            if tid is not None:
                attrs[tid] = int(TokenAttr.USER_DEFINED)

        for slot in ("eos", "eot", "eom"):
            if ids[slot] is not None:
                eog.add(ids[slot])

        eog_texts = {self._texts[t]: t for t in eog}
        # o200k_harmony / solar-open: <|end|> does not end generation there
        if "<|end|>" in eog_texts and (
                ("<|return|>" in eog_texts and ("<|call|>" in eog_texts or "<|calls|>" in eog_texts))
                or (("<|call|>" in eog_texts or "<|calls|>" in eog_texts) and "<|flush|>" in eog_texts)):
            end_id = eog_texts["<|end|>"]
            eog.discard(end_id)
            attrs[end_id] = int(TokenAttr.USER_DEFINED)
        # gemma4 and plamo have a normal </s> token
        if "</s>" in eog_texts and ("<|tool_response>" in eog_texts or "<|plamo:eos|>" in eog_texts):
            s_id = eog_texts["</s>"]
            eog.discard(s_id)
            attrs[s_id] = int(TokenAttr.NORMAL)

        # special tokens that may be written in the text: longest first
        # (llama.cpp sorts by byte length with an unstable sort; ties by id here)
        special = np.nonzero(attrs & int(_SPECIAL_CACHE))[0].tolist()
        special.sort(key=lambda t: (-len(self._texts[t].encode("utf-8")), t))
        self._special_order: list[int] = special
        self._special_rank: dict[int, int] = {t: r for r, t in enumerate(special)}

        # per-model strip attributes llama.cpp hard-codes
        name = str(md.get("general.name") or "").lower()
        pre = str(md.get("tokenizer.ggml.pre") or "")
        arch = str(md.get("general.architecture") or "")
        if any(s in pre for s in ("jina-v2-de", "jina-v2-es", "jina-v2-code")) or any(
                s in arch for s in ("nomic-bert-moe", "jina-bert-v3")):
            if self._has("<mask>") is not None:
                attrs[self._has("<mask>")] |= int(TokenAttr.LSTRIP)
        elif "phi-3" in name or "phi3" in name:
            for tid in special:
                attrs[tid] |= int(TokenAttr.RSTRIP)
            if self._has("</s>") is not None:
                attrs[self._has("</s>")] |= int(TokenAttr.RSTRIP)
            for text in ("<unk>", "<s>", "<|endoftext|>"):
                if self._has(text) is not None:
                    attrs[self._has(text)] &= ~int(TokenAttr.RSTRIP)
        elif "modern-bert" in name:
            if self._has("[MASK]") is not None:
                attrs[self._has("[MASK]")] |= int(TokenAttr.LSTRIP)

        self._ids = ids
        self.bos_id: int | None = ids["bos"]
        self.eos_id: int | None = ids["eos"]
        self.eot_id: int | None = ids["eot"]
        self.unk_id: int | None = ids["unk"]
        self.pad_id: int | None = ids["pad"]
        self.eog_ids: frozenset[int] = frozenset(eog)
        self.suppress_ids: frozenset[int] = self._suppressed(md.get("tokenizer.ggml.suppress_tokens"))
        self._attr_list: list[int] = self._attrs.tolist()
        self._piece_cache: dict[int, bytes] = {}
        self._all_pieces: list[bytes] | None = None
        # special tokens to look for in text, keyed by their first two characters,
        # in llama.cpp's order; one table with control/unknown tokens (for
        # parse_special) and one without
        self._special_by_key: dict[bool, dict[str, list[int]]] = {True: {}, False: {}}
        for tid in special:
            key = self._texts[tid][:2]
            self._special_by_key[True].setdefault(key, []).append(tid)
            if not self._attr_list[tid] & _CONTROL_OR_UNKNOWN:
                self._special_by_key[False].setdefault(key, []).append(tid)

    def _suppressed(self, v: Any) -> frozenset[int]:
        """The tokens the model never writes (tokenizer.ggml.suppress_tokens: Gemma 4 Unified's soft
        tokens): ids outside the vocabulary dropped, as llama.cpp drops them."""
        if v is None:
            return frozenset()
        if not isinstance(v, (list, tuple, np.ndarray)) or any(
                isinstance(t, bool) or not isinstance(t, (int, np.integer)) for t in v):
            raise ModelFileError("tokenizer.ggml.suppress_tokens is not a list of token ids; the file is corrupt")
        return frozenset(int(t) for t in v if 0 <= int(t) < self.n_vocab)

    # ---- token facts -------------------------------------------------------

    def _check_id(self, tid: int) -> int:
        if not isinstance(tid, (int, np.integer)) or not 0 <= tid < self.n_vocab:
            raise InvalidArgumentError(f"token id {tid!r} is out of range (vocabulary has "
                                       f"{self.n_vocab} tokens)")
        return int(tid)

    def token_text(self, tid: int) -> str:
        """The token's raw text in the vocabulary (e.g. 'Ġhello', '▁hello', '<0x0A>')."""
        return self._texts[self._check_id(tid)]

    def token_attr(self, tid: int) -> TokenAttr:
        """llama.cpp's attribute bits for the token (after its fix-ups)."""
        return TokenAttr(self._attr_list[self._check_id(tid)])

    def is_special(self, tid: int) -> bool:
        """True for control and unknown tokens: the ones `decode(skip_special=True)`
        leaves out and that `encode` only recognises with parse_special=True."""
        return bool(self._attr_list[self._check_id(tid)] & _CONTROL_OR_UNKNOWN)

    def is_eog(self, tid: int) -> bool:
        return tid in self.eog_ids

    def token_id(self, text: str) -> int | None:
        """The id of the token whose vocabulary text is exactly `text`, if any."""
        return self._token_to_id.get(text)

    @property
    def special_ids(self) -> dict[str, int | None]:
        """Special-token slots (bos, eos, eot, eom, unk, sep, pad, mask, fim_*)."""
        return dict(self._ids)

    # ---- encoding ----------------------------------------------------------

    def _partition(self, text: str, parse_special: bool) -> list[str | int]:
        """Split out special tokens written in the text (llama.cpp's
        tokenizer_st_partition): str items are plain text, int items ids.

        User-defined tokens are always split out; control and unknown tokens
        only with parse_special. Tokens are tried longest first, each one
        splitting every text fragment left so far.
        """
        present = [tids for key, tids in self._special_by_key[parse_special].items() if key in text]
        if not present:
            return [text]
        texts = self._texts
        if len(present) == 1:
            candidates = [t for t in present[0] if texts[t] in text]
        else:
            order = self._special_rank
            candidates = sorted((t for tids in present for t in tids if texts[t] in text),
                                key=order.__getitem__)
        frags: list[str | int] = [text]
        attrs = self._attr_list
        for tid in candidates:
            attr = attrs[tid]
            tok = texts[tid]
            lstrip = attr & _LSTRIP
            rstrip = attr & _RSTRIP
            new: list[str | int] = []
            for frag in frags:
                if type(frag) is int or tok not in frag:
                    new.append(frag)
                    continue
                pos, n = 0, len(frag)
                while True:
                    m = frag.find(tok, pos)
                    if m < 0:
                        new.append(frag[pos:])
                        break
                    left = frag[pos:m]
                    if lstrip:
                        left = left.rstrip(_C_SPACE)
                    if left:
                        new.append(left)
                    new.append(tid)
                    pos = m + len(tok)
                    if rstrip:
                        while pos < n and frag[pos] in _C_SPACE:
                            pos += 1
                    if pos >= n:
                        break
            frags = new
        return frags

    def _encode_fragment(self, text: str, out: list[int], prev_special: bool) -> None:
        """Append the ids of one plain-text fragment (no special tokens in it).
        `prev_special`: the fragment starts the text or follows a special token."""
        raise NotImplementedError

    def encode(self, text: str, add_bos: bool | None = None, parse_special: bool = False,
               add_eos: bool | None = None) -> list[int]:
        """Token ids for `text`, as llama_tokenize.

        add_bos: None uses the file's tokenizer.ggml.add_bos_token (the model
        type's default when absent). add_eos likewise (almost always false).
        parse_special: recognise control tokens written in the text (e.g.
        '<|im_start|>') as single ids; user-defined tokens are always recognised.
        llama_tokenize(add_special=True) is add_bos=None, add_eos=None here;
        add_special=False is add_bos=False, add_eos=False.
        """
        if not isinstance(text, str):
            raise InvalidArgumentError(f"encode() needs a str, not {type(text).__name__}")
        text = unicode_text(text)
        if add_bos is None:
            add_bos = self.add_bos
        if add_eos is None:
            add_eos = self.add_eos
        out: list[int] = []
        if add_bos:
            if self.bos_id is None:
                raise InvalidArgumentError("this model has no BOS token")
            out.append(self.bos_id)
        prev_special = True  # SPM: a space prefix goes on the first fragment
        if text:
            for frag in self._partition(text, parse_special):
                if type(frag) is int:
                    out.append(frag)
                    prev_special = True
                else:
                    self._encode_fragment(frag, out, prev_special)
                    prev_special = False
        if add_eos:
            if self.eos_id is None:
                raise InvalidArgumentError("this model has no EOS token")
            out.append(self.eos_id)
        return out

    # ---- decoding ----------------------------------------------------------

    def _normal_piece(self, tid: int) -> bytes:
        raise NotImplementedError

    def _byte_piece(self, tid: int) -> bytes:
        text = self._texts[tid]
        try:
            return bytes((int(text[3:5], 16),))
        except ValueError:
            return b""

    def _piece(self, tid: int) -> bytes:
        """token_to_piece with special=True, cached (llama.cpp caches this too)."""
        piece = self._piece_cache.get(tid)
        if piece is None:
            attr = self._attr_list[tid]
            if attr & (_CONTROL_OR_UNKNOWN | _USER_DEFINED):
                piece = self._texts[tid].encode("utf-8")
            elif attr & _NORMAL:
                piece = self._normal_piece(tid)
            elif attr & _BYTE:
                piece = self._byte_piece(tid)
            else:  # unused / undefined tokens render as nothing
                piece = b""
            self._piece_cache[tid] = piece
        return piece

    def token_to_piece(self, tid: int, special: bool = True, lstrip: int = 0) -> bytes:
        """The bytes one token stands for, as llama_token_to_piece.

        Byte tokens give their byte, byte-level BPE tokens their raw bytes.
        Control and unknown tokens give their text when `special`, nothing
        otherwise; user-defined tokens always give their text. `lstrip` drops
        up to that many leading spaces.
        """
        tid = self._check_id(tid)
        if not special and self._attr_list[tid] & _CONTROL_OR_UNKNOWN:
            return b""
        piece = self._piece(tid)
        while lstrip > 0 and piece[:1] == b" ":
            piece = piece[1:]
            lstrip -= 1
        return piece

    def all_pieces(self) -> list[bytes]:
        """token_to_piece of every token, in id order (computed once)."""
        if self._all_pieces is None:
            self._all_pieces = [self.token_to_piece(t) for t in range(self.n_vocab)]
        return self._all_pieces

    def detokenize(self, ids: Sequence[int], remove_special: bool = False,
                   unparse_special: bool = False) -> bytes:
        """Bytes for `ids`, exactly as llama_detokenize(remove_special, unparse_special)."""
        ids = [self._check_id(t) for t in ids]
        remove_space = self._add_space_prefix
        if remove_special and self.add_bos and ids and ids[0] == self.bos_id:
            remove_space = False
            ids = ids[1:]
        if remove_special and self.add_eos and ids and ids[-1] == self.eos_id:
            ids = ids[:-1]
        parts = []
        for tid in ids:
            parts.append(self.token_to_piece(tid, unparse_special, lstrip=1 if remove_space else 0))
            remove_space = False
        text = b"".join(parts)
        if self._clean_spaces:
            text = _clean_spaces(text)
        return text

    def decode(self, ids: Sequence[int], skip_special: bool = False) -> str:
        """Text for `ids`.

        skip_special=False renders control tokens as their text (e.g.
        '<|im_end|>'); True leaves them out and drops a leading BOS / trailing
        EOS the tokenizer itself adds (llama_detokenize with remove_special and
        without unparse_special). Bytes that are not valid UTF-8 become U+FFFD.
        """
        return self.detokenize(ids, remove_special=skip_special,
                               unparse_special=not skip_special).decode("utf-8", errors="replace")

    def stream_decoder(self, skip_special: bool = False) -> "StreamDecoder":
        """A decoder for ids that arrive one at a time (see StreamDecoder)."""
        return StreamDecoder(self, skip_special)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} model={self.model!r} n_vocab={self.n_vocab}>"


def _clean_spaces(text: bytes) -> bytes:
    """llama.cpp's three clean-up passes over detokenized bytes (clean_spaces),
    replayed in place on a buffer the way the C code does them."""
    buf = bytearray(text)
    n = len(buf)
    # pass 1: " ?", " !", " .", " ,"  -> drop the space
    total = 1 if n else 0
    for i in range(1, n):
        x = buf[i]
        if buf[i - 1] == 0x20 and x in b"?!.,":
            total -= 1
        buf[total] = x
        total += 1
    # pass 2: " ' " -> "'" (both spaces go)
    n, total, i = total, (1 if total else 0), 1
    while i < n:
        x = buf[i]
        if x == 0x27 and i + 1 < n and buf[i - 1] == 0x20 and buf[i + 1] == 0x20:
            total -= 1
            i += 1
            buf[i] = 0
        buf[total] = x
        total += 1
        i += 1
    # pass 3: " 's", " 'm", " 're", " 've" -> drop the space
    n, total = total, (1 if total else 0)
    for i in range(1, n):
        x = buf[i]
        if buf[i - 1] == 0x20 and x == 0x27 and i + 1 < n:
            x1 = buf[i + 1]
            if x1 in b"sm":
                total -= 1
            elif i + 2 < n and (x1 == 0x72 or x1 == 0x76) and buf[i + 2] == 0x65:
                total -= 1
        buf[total] = x
        total += 1
    return bytes(buf[:total])


class StreamDecoder:
    """Turns ids arriving one by one into text, never splitting a character.

    `push(id)` returns the text that became complete with this token (possibly
    ''); bytes of a character that is not finished yet are held until it is.
    `flush()` returns what is still held (an unfinished character becomes
    U+FFFD) and resets. Concatenating every push and the flush gives
    `decode(ids)` except for llama.cpp's clean-up of spaces before punctuation,
    which only some BPE pre-tokenizers ('gpt2', 'default', ...) enable and
    which a stream cannot apply.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = False):
        self._tok = tokenizer
        self._skip = skip_special
        self.reset()

    def reset(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._first = True

    def push(self, tid: int) -> str:
        tok = self._tok
        tid = tok._check_id(tid)
        lstrip = 0
        if self._first:
            self._first = False
            if self._skip and tok.add_bos and tid == tok.bos_id:
                return ""
            lstrip = 1 if tok._add_space_prefix else 0
        piece = tok.token_to_piece(tid, special=not self._skip, lstrip=lstrip)
        return self._decoder.decode(piece, final=False)

    def flush(self) -> str:
        text = self._decoder.decode(b"", final=True)
        self.reset()
        return text
