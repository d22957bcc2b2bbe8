"""The RWKV World tokenizer ('rwkv' tokenizer model: RWKV-6 World, RWKV-7 World), as llama.cpp's
llm_tokenizer_rwkv.

Every token stands for a string of bytes. The GGUF writes it escaped, the way Python prints a
bytes literal without its b'...': '\\n', '\\t', '\\r', '\\xNN' (lower-case hex), a backslash
before any other character standing for that character ('\\\\' is a backslash, "\\'" a quote),
every other character its UTF-8 bytes. In the real vocabularies token 0 is '<s>' (a control
token the converter names BOS and EOS), then the 256 single bytes, then longer strings.

Encoding a text fragment (special tokens are split out before, as for every tokenizer) is
greedy longest match over its UTF-8 bytes: at each position take the longest token whose bytes
start there, and go on after it. No normalisation, no pre-tokenizer, no merges, no scores.
Instead of llama.cpp's byte trie, a table of every token's byte prefixes says, for the bytes
from the position on, whether some token still begins with them and which token they are.
Every token takes part, control and unused ones included ('<s>' written in the text is token 0
even without parse_special). Where two tokens unescape to the same bytes the later id wins, as
in llama.cpp's trie.

A byte that no token starts with becomes the unknown token (tokenizer.ggml.unknown_token_id;
llama.cpp sets none for 'rwkv', and then writes the invalid id -1, which we leave out).
The real vocabularies have all 256 single bytes, so this never happens with them. Nor does the
case llama.cpp gets wrong: bytes that begin longer tokens but are no token themselves, when no
token matches there (llama.cpp then starts again from the fragment's start and never ends); we
treat that byte as one no token starts with.

Decoding: a token gives its unescaped bytes, whatever its type (control tokens only when
special tokens are rendered), so a character may be split across tokens.
"""
from __future__ import annotations

import codecs
import re
from collections.abc import Mapping
from typing import Any

from .base import Tokenizer

_PREFIX = -1   # in the prefix table: the bytes begin some token but are none
# texts whose escapes Python's bytes-literal decoder reads as llama.cpp does (lower-case hex)
_PLAIN_ESCAPES = re.compile(r"(?:[^\\]|\\[ntr\\'\"]|\\x[0-9a-f]{2})*", re.S)


def unescape(text: str) -> bytes:
    """A token's bytes from its escaped GGUF text, as llama_unescape_rwkv_token.

    Like llama.cpp, this reads the text's UTF-8 bytes as C chars: a hex digit is taken as
    lower case ('A' is not 10), the arithmetic wraps at 256, and a backslash or '\\x' escape
    cut short at the end gives nothing."""
    if "\\" not in text:
        return text.encode("utf-8")
    if _PLAIN_ESCAPES.fullmatch(text):   # the usual case: as the converter writes them
        return codecs.escape_decode(text.encode("utf-8"))[0]
    out = bytearray()
    escaping = False
    hex_left = hex_acc = 0
    for b in text.encode("utf-8"):
        if hex_left:
            c = b - 256 if b >= 0x80 else b   # a signed char
            digit = c - 0x61 + 10 if c >= 0x61 else c - 0x30
            hex_acc = ((hex_acc << 4) + digit) & 0xFF
            hex_left -= 1
            if not hex_left:
                out.append(hex_acc)
                hex_acc = 0
        elif escaping:
            escaping = False
            if b == 0x74:       # t
                out.append(0x09)
            elif b == 0x6E:     # n
                out.append(0x0A)
            elif b == 0x72:     # r
                out.append(0x0D)
            elif b == 0x78:     # x
                hex_left = 2
            else:
                out.append(b)
        elif b == 0x5C:         # backslash
            escaping = True
        else:
            out.append(b)
    return bytes(out)


class RWKVTokenizer(Tokenizer):
    model = "rwkv"
    # llama.cpp: no BOS, EOS, unknown, separator or padding token unless the file names them
    _default_ids = {"bos": None, "eos": None, "unk": None, "sep": None, "pad": None}
    _default_add_bos = False

    def __init__(self, md: Mapping[str, Any]):
        prefix = md.get("tokenizer.ggml.add_space_prefix")   # only strips a space when decoding
        self._add_space_prefix = False if prefix is None else bool(prefix)
        self._init_vocab(md)
        self.pre_name = "default"
        self._bytes: list[bytes] = [unescape(t) for t in self._texts]
        # every non-empty prefix of every token's bytes -> the token with exactly those
        # bytes (the highest id), or _PREFIX where there is none. A key's prefixes are all keys.
        table: dict[bytes, int] = {}
        for tid, data in enumerate(self._bytes):
            if not data:
                continue   # llama.cpp puts it at the trie's root, where no walk looks
            table[data] = tid
            for k in range(len(data) - 1, 0, -1):   # shortest last: stop at one already there
                head = data[:k]
                if head in table:
                    break
                table[head] = _PREFIX
        self._table = table

    def _encode_fragment(self, text: str, out: list[int], prev_special: bool) -> None:
        data = text.encode("utf-8")
        get = self._table.get
        unk = self.unk_id
        n = len(data)
        pos = 0
        while pos < n:
            best = _PREFIX
            end = j = pos + 1
            while j <= n:
                tid = get(data[pos:j])
                if tid is None:
                    break
                if tid != _PREFIX:
                    best, end = tid, j
                j += 1
            if best == _PREFIX:   # no token starts here
                if unk is not None:
                    out.append(unk)
                pos += 1
            else:
                out.append(best)
                pos = end

    def _piece(self, tid: int) -> bytes:
        # token_to_piece with special=True: the unescaped bytes, whatever the token's type
        return self._bytes[tid]
