#!/usr/bin/env python3
"""Compare pyllm's RWKV tokenizer ('rwkv': RWKV-6 / RWKV-7 World) with llama.cpp's, token for token.

No small model with an RWKV vocabulary is at hand, so this makes vocabularies shaped like the
real RWKV World one (rwkv_vocab_v20230424 as convert_hf_to_gguf.py writes it: token 0 '<s>', a
control token named BOS and EOS; the 256 single bytes; longer byte strings, each escaped as
Python prints a bytes literal; '\\n\\n' as EOT), writes each with a tiny random `llama` model
(tests/synth.py) and asks llama.cpp (llama-cpp-python, run in its own environment as a
subprocess; pyllm never imports it) for:

* the ids of ~40 hand-picked texts (ASCII, code, CJK, emoji, newlines, control bytes, quotes
  and backslashes, special-token text) and of random texts, with special tokens parsed and not;
* every token's piece (llama_token_to_piece, special on and off).

Vocabularies: 'world' (all 256 bytes; a user-defined and a control token; an unused [PADn];
escapes the converter never writes, such as "\\x4A", which llama.cpp reads as 'Q' since it only
knows lower-case hex, so it shadows the byte token 'Q'); 'sparse, unk' (some bytes have no token, tokenizer.ggml.unknown_token_id set);
'sparse, no unk' (the same without an unknown token: llama.cpp writes the invalid id -1 for each
such byte, pyllm leaves it out, so llama.cpp's -1s are dropped before comparing, and counted).

    .venv/bin/python benchmarks/compare_rwkv_tokenizer.py --peer-python /tmp/peer-avx512/bin/python

--peer-python defaults to $PYLLM_PEER_PYTHON or /tmp/peer-avx512/bin/python. Dev tool only.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import synth  # noqa: E402

from pyllm.tokenizer import load_tokenizer  # noqa: E402

PEER = r'''
import ctypes, json, sys
import llama_cpp
out = {}
for name, c in json.load(sys.stdin).items():
    m = llama_cpp.Llama(model_path=c["path"], vocab_only=True, verbose=False)
    vocab = llama_cpp.llama_model_get_vocab(m.model)
    ids = {}
    for parse in (False, True):
        ids[str(parse)] = [m.tokenize(t.encode("utf-8", "surrogatepass"), add_bos=False, special=parse)
                           for t in c["texts"]]
    pieces = {}
    buf = ctypes.create_string_buffer(4096)
    for special in (False, True):
        rows = []
        for tid in range(c["n_vocab"]):
            n = llama_cpp.llama_token_to_piece(vocab, tid, buf, len(buf), 0, special)
            rows.append(buf.raw[:n].hex())
        pieces[str(special)] = rows
    add_bos = m.tokenize(b"hi", add_bos=True, special=False)
    out[name] = {"ids": ids, "pieces": pieces, "add_special": add_bos,
                 "eos": llama_cpp.llama_vocab_eos(vocab), "bos": llama_cpp.llama_vocab_bos(vocab),
                 "eot": llama_cpp.llama_vocab_eot(vocab)}
json.dump(out, sys.stdout)
'''

WORDS = ["the", " the", " and", " of", "ing", " tokenizer", "token", "izer", "Hello", " world", "World", ",",
         ". ", "\n\n", "\n", "\n\n\n", "  ", "    ", "        ", "\t", "\t\t", "\r\n", "def ", "return ",
         "    return", "():", "()", "self.", "import ", " = ", "==", "->", "{}", "[]", "\"\"\"", "'s", "it's",
         "\"", "\"x\"", "\\", "\\n", "\\\\", "C:\\", "a", "ab", "abc", "b", "bc", "abcd",
         "你", "你好", "世界", "中文", "日本語", "한국어", "こんにちは", "é", "café", "naïve",
         "😀", "👍", "🎉🎉", "\u200d", "€", "∑", "Привет", " мир", "مرحبا",
         "\x00", "\x00\x00", "\x1b[", "\x7f", "<s", "<|", "|>", "end"]
RAW = [b"\xe4\xbd", b"\xf0\x9f", b"\xbd\xa0\xe5", b"\x80\x80", b"\xff\xfe"]   # pieces of characters
SPECIAL = {"<|endoftext|>": 3, "<|user|>": 4, "<|assistant|>": 4}

TEXTS = ["Hello world", "Hello, world! The tokenizer's job.", "the the the and of", "abcbc", "abcdabcbcab",
         "def f(self):\n    return self.x == 1\n", "\tindented\n\t\tmore\r\nwindows line",
         "import os\nprint(\"x\", 'y')\n\n\n", "path C:\\Users\\me\\n and \\\\ double",
         "你好，世界！中文文本", "日本語のテキスト、こんにちは", "한국어 텍스트", "Привет мир", "مرحبا بالعالم",
         "café naïve résumé", "emoji 😀👍🎉🎉 family 👨\u200d👩\u200d👧", "€100 ∑x²",
         "nul\x00byte and \x01\x02\x03 control", "escape \x1b[31mred\x1b[0m and \x7f del",
         "<s>begin", "text <|endoftext|> more", "<|user|>hi<|assistant|>hello<|endoftext|>",
         "<|endoftext|><|endoftext|>", "<s", "<|unknown|>", "\n", "\n\n", "", " ", "        x",
         "Q and \\x4A and J, q zz \x01", "[PAD999] [PAD9999]", "a" * 50, "\u00a0\u2028\u3000", "\ufeffBOM",
         "x" * 3 + "\U0010FFFF" + "\ue000", "tokenizer" * 20,
         "mixed 中 e😀 \x00 \\ \" ' end"]


def escape(b: bytes) -> str:
    """A byte string as convert_hf_to_gguf.py writes an RWKV token: repr without b'...'."""
    return repr(b)[2:-1]


def vocabulary(kind: str, seed: int = 0) -> dict:
    """A GGUF tokenizer metadata dict shaped like RWKV World's ('world', 'sparse, unk',
    'sparse, no unk')."""
    rng = random.Random(seed)
    sparse = kind != "world"
    missing = set(range(1, 9)) | set(range(0x80, 0xC0, 3)) | {ord("z"), ord("~")} if sparse else set()
    tokens, types, seen = ["<s>"], [3], {b"<s>"}
    for b in range(256):
        if b not in missing:
            tokens.append(escape(bytes([b])))
            types.append(1)
            seen.add(bytes([b]))
    strings = [w.encode() for w in WORDS] + RAW
    # random substrings of the texts: more overlapping prefixes
    for t in TEXTS:
        data = t.encode()
        for _ in range(6):
            if len(data) > 2:
                i = rng.randrange(len(data) - 1)
                strings.append(data[i:i + rng.randint(2, 6)])
    for s in strings:
        # a token starting with a byte that is no token: llama.cpp loops forever on such text
        if s and s not in seen and s[0] not in missing:
            tokens.append(escape(s))
            types.append(1)
            seen.add(s)
    for text, ttype in SPECIAL.items():
        tokens.append(text)
        types.append(ttype)
    if kind == "world":
        # escapes the converter never writes, read llama.cpp's way: '\x4A' is 'Q' (upper-case hex
        # digits are read wrong), '\xg1' is byte 1 (wrapping), '\q' is 'q', a trailing backslash
        # or a cut-short '\xe' gives nothing. Each shadows the earlier token with its bytes.
        for text in ("\\x4A", "\\xg1", "\\q", "zz\\", "\\xe"):
            tokens.append(text)
            types.append(1)
    if kind == "sparse, unk":
        tokens.append("<unk>")
        types.append(2)
    while len(tokens) % 16:
        tokens.append(f"[PAD{len(tokens)}]")
        types.append(5)
    md = {"tokenizer.ggml.model": "rwkv", "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types,
          "tokenizer.ggml.bos_token_id": 0, "tokenizer.ggml.eos_token_id": 0}
    if kind == "sparse, unk":
        md["tokenizer.ggml.unknown_token_id"] = tokens.index("<unk>")
    return md


def random_texts(md: dict, n: int, seed: int) -> list[str]:
    """Texts glued from token strings, special-token texts and random characters."""
    rng = random.Random(seed)
    pool = WORDS + list(SPECIAL) + ["<s>", "Q", "z", "~", "\x05", "\u0101", "\u4e00", "\U0001F600"]
    out = []
    for _ in range(n):
        parts = [rng.choice(pool) if rng.random() < 0.8 else chr(rng.choice([rng.randrange(32, 127),
                 rng.randrange(0x80, 0x800), rng.randrange(0x4e00, 0x9fff), rng.randrange(0x1F300, 0x1F64F)]))
                 for _ in range(rng.randint(1, 12))]
        out.append("".join(parts))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--peer-python", default=os.environ.get("PYLLM_PEER_PYTHON", "/tmp/peer-avx512/bin/python"))
    ap.add_argument("-n", type=int, default=300, help="random texts per vocabulary (default 300)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    kinds = ("world", "sparse, unk", "sparse, no unk")
    cases, mds = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for i, kind in enumerate(kinds):
            md = vocabulary(kind, args.seed)
            path = synth.write_model(Path(tmp) / f"rwkv{i}.gguf", "llama", synth.QT.F32, n_embd=64, n_layer=1,
                                     n_head=2, n_head_kv=1, n_ff=64, tokenizer_from=md)
            mds[kind] = md
            cases[kind] = {"path": str(path), "n_vocab": len(md["tokenizer.ggml.tokens"]),
                           "texts": TEXTS + random_texts(md, args.n, args.seed + i)}
        proc = subprocess.run([args.peer_python, "-c", PEER], input=json.dumps(cases), capture_output=True,
                              text=True)
        if proc.returncode:
            print(proc.stderr[-4000:], file=sys.stderr)
            return 1
        peer = json.loads(proc.stdout)

    failed = False
    for kind in kinds:
        tok = load_tokenizer(mds[kind])
        texts = cases[kind]["texts"]
        theirs = peer[kind]
        print(f"== {kind}: {tok.n_vocab} tokens, {len(texts)} texts ({len(TEXTS)} hand-picked)")
        for parse in (False, True):
            t0 = time.perf_counter()
            ours = [tok.encode(t, add_bos=False, add_eos=False, parse_special=parse) for t in texts]
            dt = time.perf_counter() - t0
            agree_hand = agree = dropped = 0
            shown = 0
            for k, (text, a, b) in enumerate(zip(texts, ours, theirs["ids"][str(parse)])):
                dropped += b.count(-1)
                b = [t for t in b if t != -1]   # llama.cpp's 'no unknown token'; pyllm writes nothing
                if a == b:
                    agree += 1
                    agree_hand += k < len(TEXTS)
                elif shown < 5:
                    shown += 1
                    print(f"  DIFF parse_special={parse} {text!r}\n    pyllm     {a}\n    llama.cpp {b}")
            print(f"  parse_special={parse}: {agree_hand}/{len(TEXTS)} hand-picked, {agree}/{len(texts)} all agree"
                  f" ({dt * 1e3:.1f} ms for pyllm)" + (f"; llama.cpp wrote -1 {dropped} times" if dropped else ""))
            failed |= agree != len(texts)
        for special in (False, True):
            ours_p = [tok.token_to_piece(t, special=special).hex() for t in range(tok.n_vocab)]
            same = sum(a == b for a, b in zip(ours_p, theirs["pieces"][str(special)]))
            print(f"  token_to_piece(special={special}): {same}/{tok.n_vocab} agree")
            failed |= same != tok.n_vocab
        ours_add = tok.encode("hi")
        print(f"  add_special: pyllm {ours_add}, llama.cpp {theirs['add_special']}; "
              f"bos/eos/eot pyllm {tok.bos_id}/{tok.eos_id}/{tok.eot_id}, "
              f"llama.cpp {theirs['bos']}/{theirs['eos']}/{theirs['eot']}")
        failed |= ours_add != theirs["add_special"]
    # speed: a 10 kB text on the world vocabulary
    tok = load_tokenizer(mds["world"])
    text = ("".join(TEXTS) * 20)[:10_000]
    t0 = time.perf_counter()
    n = len(tok.encode(text, add_bos=False))
    print(f"speed: {len(text.encode())} bytes -> {n} tokens in {(time.perf_counter() - t0) * 1e3:.1f} ms")
    print("FAILED" if failed else "all agree")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
