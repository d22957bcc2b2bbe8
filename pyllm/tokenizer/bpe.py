"""Byte-level BPE ('gpt2' tokenizer model), as llama.cpp's llm_tokenizer_bpe.

Text is split into words by the pre-tokenizer regexes (pretokenize.py), each
word's UTF-8 bytes are mapped to printable characters (GPT-2's byte-to-unicode
table), and the characters are merged pair by pair: always the pair with the
lowest merge rank, the leftmost one on ties, re-examining the new neighbours
after every merge (llama.cpp's priority-queue order, which is not always the
same as merging every occurrence of the best pair at once).
"""
from __future__ import annotations

import heapq
import logging
from collections.abc import Mapping
from functools import lru_cache
from typing import Any, Optional

from ..errors import ModelFileError
from . import pretokenize
from .base import Tokenizer

log = logging.getLogger(__name__)


def _bytes_to_unicode() -> list[str]:
    """GPT-2's byte -> printable character table."""
    printable = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table = {b: chr(b) for b in printable}
    n = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + n)
            n += 1
    return [table[b] for b in range(256)]


BYTE_TO_UNICODE: list[str] = _bytes_to_unicode()
UNICODE_TO_BYTE: dict[str, int] = {c: b for b, c in enumerate(BYTE_TO_UNICODE)}
# bytes.decode('latin-1') gives one char per byte; translate maps it
_BYTE_ENCODE = {b: BYTE_TO_UNICODE[b] for b in range(256)}

WORD_CACHE_SIZE = 1 << 16


class BPETokenizer(Tokenizer):
    model = "gpt2"
    _default_ids = {"bos": 11, "eos": 11, "unk": None}
    _default_add_bos = False

    forced_pre: Optional[str] = None   # the pre-tokenizer whatever tokenizer.ggml.pre says

    def __init__(self, md: Mapping[str, Any]):
        pre_name = self.forced_pre or md.get("tokenizer.ggml.pre")
        if not pre_name:
            log.warning("the model names no BPE pre-tokenizer (tokenizer.ggml.pre): using "
                        "'default'; llama.cpp warns that generation quality will suffer")
        self.pre_name: str = str(pre_name or "default")
        self.pre = pre = pretokenize.resolve_pre(pre_name)
        self._steps = pretokenize.steps_for(pre.kind)
        self._default_add_bos = pre.add_bos
        self._clean_spaces = pre.clean_spaces
        self._add_space_prefix = False
        if pre.no_bos:
            self._default_ids = dict(self._default_ids, bos=None)

        self._init_vocab(md)
        if pre.force_add_bos:
            self.add_bos = True

        merges = md.get("tokenizer.ggml.merges")
        if merges is None:
            raise ModelFileError("BPE vocabulary without merges (tokenizer.ggml.merges missing)")
        ranks: dict[tuple[str, str], int] = {}
        for i, merge in enumerate(merges):
            pos = merge.find(" ", 1)
            pair = (merge[:pos], merge[pos + 1:]) if pos != -1 else ("", "")
            if pair not in ranks:  # llama.cpp keeps the first rank of a repeated pair
                ranks[pair] = i
        self._ranks = ranks
        self._bpe_word = lru_cache(maxsize=WORD_CACHE_SIZE)(self._bpe_word_uncached)

    # ---- encoding ----------------------------------------------------------

    def _encode_fragment(self, text: str, out: list[int], prev_special: bool) -> None:
        if self.pre.escape_whitespaces:
            text = text.replace(" ", "\u2581")
        words = pretokenize.split_words(text, self._steps)
        bpe = self._bpe_word
        if self.pre.byte_encode:
            for word in words:
                out.extend(bpe(word.encode("utf-8").decode("latin-1").translate(_BYTE_ENCODE)))
        else:
            for word in words:
                out.extend(bpe(word))

    def _bpe_word_uncached(self, word: str) -> tuple[int, ...]:
        """Ids for one (byte-encoded) word."""
        vocab = self._token_to_id
        if not word:
            return ()
        tid = vocab.get(word)
        if tid is not None and (self.pre.ignore_merges or len(word) == 1 or (
                self.pre.kind == "gemma4" and not word.strip("\n"))):
            return (tid,)
        syms = list(word)
        n = len(syms)
        ranks = self._ranks
        heap = []
        for i in range(n - 1):
            r = ranks.get((syms[i], syms[i + 1]))
            if r is not None:
                heap.append((r, i, i + 1, syms[i] + syms[i + 1]))
        if heap:
            heapq.heapify(heap)
            prev = list(range(-1, n - 1))
            nxt = list(range(1, n + 1))
            nxt[-1] = -1
            pop, push = heapq.heappop, heapq.heappush
            while heap:
                _, left, right, text = pop(heap)
                ls, rs = syms[left], syms[right]
                if not ls or not rs or ls + rs != text:
                    continue  # stale: one side has changed since
                syms[left] = text
                syms[right] = ""
                nr = nxt[right]
                nxt[left] = nr
                if nr >= 0:
                    prev[nr] = left
                pl = prev[left]
                if pl >= 0:
                    r = ranks.get((syms[pl], text))
                    if r is not None:
                        push(heap, (r, pl, left, syms[pl] + text))
                if nr >= 0:
                    r = ranks.get((text, syms[nr]))
                    if r is not None:
                        push(heap, (r, left, nr, text + syms[nr]))
        ids: list[int] = []
        for sym in syms:
            if not sym:
                continue
            tid = vocab.get(sym)
            if tid is not None:
                ids.append(tid)
                continue
            # not a token: llama.cpp falls back to one token per byte of the
            # symbol's UTF-8, looked up as a one-byte string (byte-level BPE)
            # or as <0xXX> (raw UTF-8 BPE); bytes without a token are dropped
            for b in sym.encode("utf-8"):
                if self.pre.byte_encode:
                    tid = vocab.get(chr(b)) if b < 0x80 else None
                else:
                    tid = vocab.get(f"<0x{b:02X}>")
                if tid is not None:
                    ids.append(tid)
        return tuple(ids)

    # ---- decoding ----------------------------------------------------------

    def _normal_piece(self, tid: int) -> bytes:
        text = self._texts[tid]
        if self.pre.escape_whitespaces:
            return text.replace("\u2581", " ").encode("utf-8")
        try:
            return bytes(UNICODE_TO_BYTE[c] for c in text)
        except KeyError:
            pass
        # a character outside the byte table: llama.cpp writes a marker
        out = bytearray()
        for c in text:
            b = UNICODE_TO_BYTE.get(c)
            if b is not None:
                out.append(b)
            else:
                out += b"[UNK_BYTE_0x" + c.encode("utf-8").hex().encode() + text.encode("utf-8") + b"]"
        return bytes(out)


class Gemma4Tokenizer(BPETokenizer):
    """Gemma 4's 'gemma4' tokenizer model: BPE over raw UTF-8 with spaces as U+2581 and
    <0xXX> byte tokens, split only into runs of newlines and of the rest; llama.cpp takes
    the 'gemma4' pre-tokenizer whatever tokenizer.ggml.pre says."""
    model = "gemma4"
    forced_pre = "gemma4"
