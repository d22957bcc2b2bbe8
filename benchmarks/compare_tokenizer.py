#!/usr/bin/env python3
"""Compare pyllm's tokenizers with llama.cpp's, and write the expected ids the
tests hard-code (tests/data/tokenizer_cases.json).

Dev tool only. llama.cpp (through llama-cpp-python) runs in a separate
process from its own virtual environment; pyllm never imports it.

    python3 benchmarks/compare_tokenizer.py                  # compare, print
    python3 benchmarks/compare_tokenizer.py --write          # ... and write the cases
    python3 benchmarks/compare_tokenizer.py --fuzz 3000      # more random strings

What is compared, per model configuration (real files, and the SmolLM2 /
Gemma 3 vocabularies with tokenizer.ggml.pre or add_space_prefix overridden,
the MiniLM (BERT, WordPiece) one with its normalizer switches overridden,
which llama.cpp applies through kv_overrides and we apply to the metadata):
ids for curated tricky strings and seeded random strings (with and without
BOS, parse_special on and off), llama_detokenize of those ids (all four flag
combinations), token_to_piece of every token (special on and off), the EOG
set, BOS/EOS ids and add_bos.

--write replaces the configurations that ran in the cases file and keeps the
others (those left out by --only, or whose model file is missing).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "tokenizer_cases.json"

# llama-cpp-python does not report the llama.cpp commit it vendors; this is the
# one its 0.3.36 build tree had (recorded by hand when the data was generated)
VENDORED_LLAMA_CPP = {"0.3.36": "0c1e57098bba43ac29e6e3b677cdceebdd22334f"}

SMOL = "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA = "gemma-3-270m-q4_k_m.gguf"
MINILM = "all-MiniLM-L6-v2.F16.gguf"

# name -> (file, kv overrides)
CONFIGS: dict[str, tuple[str, dict]] = {
    "smollm2": (SMOL, {}),
    "gemma3": (GEMMA, {}),
    "gemma3+space_prefix": (GEMMA, {"tokenizer.ggml.add_space_prefix": True}),
}
# other BPE pre-tokenizers, run over SmolLM2's vocabulary and merges
PRE_OVERRIDES = ["default", "gpt-2", "llama-bpe", "qwen2", "qwen35", "deepseek-llm", "deepseek-coder",
                 "deepseek-v3", "starcoder", "falcon", "phi-2", "stablelm2", "tekken", "gpt-4o",
                 "dbrx", "poro-chat", "bloom", "viking", "jais-2", "chameleon", "bailingmoe",
                 "seed-coder", "exaone-moe", "minicpm5", "command-r", "chatglm-bpe", "laguna",
                 "ufakzeka", "spark2_5", "youtu", "gemma4"]
for _pre in PRE_OVERRIDES:
    CONFIGS[f"smollm2+pre={_pre}"] = (SMOL, {"tokenizer.ggml.pre": _pre})
# both must refuse these
CONFIGS["smollm2+pre=gpt2 (unknown)"] = (SMOL, {"tokenizer.ggml.pre": "gpt2"})
# vocabularies made from a file's by a function of tests/synth.py (no kv_override can add
# merges: llama.cpp reads a metadata-only copy written with them)
DERIVED: dict[str, str] = {"gemma3+model=gemma4": "gemma4_vocab"}
CONFIGS["gemma3+model=gemma4"] = (GEMMA, {})
# BERT's WordPiece (uncased vocabulary: lowercase, and strip_accents following it, are on)
_LOWER = "tokenizer.ggml.normalizer.lowercase"
_STRIP = "tokenizer.ggml.normalizer.strip_accents"
CONFIGS["minilm"] = (MINILM, {})
CONFIGS["minilm+lowercase=false"] = (MINILM, {_LOWER: False})   # strip_accents follows: off
CONFIGS["minilm+strip_accents=false"] = (MINILM, {_STRIP: False})
CONFIGS["minilm+lowercase=false+strip_accents=true"] = (MINILM, {_LOWER: False, _STRIP: True})

# The strings every configuration is checked on (and that the tests hard-code
# for the real models).
CURATED = [
    "",
    "Hello world",
    " Hello world",
    "  leading two spaces",
    "double  spaces  here",
    "trailing spaces   ",
    " ",
    "   ",
    "1234567890",
    "3.14159",
    "1,000,000 and 12.5% of 7/8",
    "café naïve Ŧ",
    "e\u0301 combining acute, Ǆ digraph",
    "你好，世界",
    "日本語のテキスト",
    "한국어 텍스트",
    "नमस्ते दुनिया",
    "مرحبا بالعالم",
    "Привет, мир!",
    "👋🏽 🤖 🧑‍💻",
    "a\n\nb\tc\r\n",
    "\n",
    "\n\n\n",
    "\t\tindented\n    four spaces\n",
    "def f(x):\n    return x ** 2  # square\n",
    "for (int i = 0; i < n; ++i) { sum += a[i]; }",
    "<html><body><table><tr><td>x</td></tr></table></body></html>",
    "I'm sure we'll see THEY'RE 'quoted' and don't",
    "Hello, world!!! What?? ... ok .",
    "mixed English, français, Deutsch, 中文, русский 123",
    "∑∫√∞ ≠ ≤ ≥ → ← ©®™ $€£¥",
    "non\u00a0breaking\u3000ideographic\u2009thin\u200bzero-width",
    "ctrl\x00\x01\x1f\x7f chars\x0b\x0c\x85",
    "\ufeffbom and \ue000 private use",
    " " * 40 + "x",
    "\t" * 40 + "x",
    "\n" * 40 + "x",
    "<|im_start|>user\nhi<|im_end|>",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|><|im_start|>",
    "<|im_start",
    "<start_of_turn>user\nhi<end_of_turn>",
    "<start_of_turn>model\nHello!<end_of_turn>\n<start_of_turn>user\n",
    "<bos><eos><pad><unk><mask>",
    "<s></s> and <0x41> <unused0> [multimodal]",
    "<start_of_image><end_of_image>",
    "The quick brown fox jumps over the lazy dog. " * 3,
    # code points llama.cpp's Unicode 15.1 knows (15.0: Kawi, CJK Ext H; 15.1:
    # Ext I) and newer ones it treats as unassigned (16.0: Garay, emoji; 17.0:
    # the riyal sign, Ext J; 18.0, which regex 2026.11 knows: Armenian, a
    # currency sign, CJK), next to ASCII letters, digits and punctuation
    "ab\U00011F04\U00011F05cd \U00031350\U00031351x \U0002EBF0y 12\U00011F5034",
    "ab\U00010D50\U00010D51cd x\U0001FAE9\U0001FAEAy 5\u20c1 \u20c1\u20c1! z\U000323B0\U000323B1.",
    "ab\u0558cd 7\u20c2 \u20c2\u20c3? x\U0003D000\U0003D001y \U00012550\U0001255112",
]

# More strings for WordPiece ('bert') vocabularies: normalisation, word
# splitting, greedy matching, [UNK] and BERT's special tokens.
WPM_CURATED = [
    "Café naïve Ångström résumé CRÈME BRÛLÉE",
    "Ａｍｅｌｉｅ ﬁne ℌ ﬀ Ω Å K",
    "İstanbul ΣΊΣΥΦΟΣ straße",
    "HeLLo WoRLD, MiXeD CaSe",
    "wait... what?!?! (yes) [no] {maybe} -- end.",
    "$100 50% x^2 ~home `code` a+b=c <tag> a|b #1 @me \\path",
    "€5 © 2024 ® ™ ° ± × ÷ ¶ §",
    "中文字符和日本語の文字, 한국어 텍스트",
    "👋🏽 hi 🤖🧑‍💻 ok",
    "tab\tnew\nline\r\nvt\x0bff\x0c fs\x1cgs\x1d us\x1f end",
    "nul\x00in\x00word and \ufffd replaced\ufffdhere",
    "zero\u200bwidth\ufeffbom\u00adsoft\ue000private",
    "non\u00a0breaking\u2009thin\u3000wide\u0085next\u2028line",
    "e\u0301 a\u0308 n\u0303 combining",
    "pneumonoultramicroscopicsilicovolcanoconiosis supercalifragilisticexpialidocious",
    "a" * 60 + " " + "ab" * 40,
    "unaffable playing tokenization retokenized",
    "ᚠᛇᚻ᛫ᛒᛦᚦ helloᚠworld ꙮ 𓀀 qwxz",
    "[CLS] hello [SEP] world [MASK] [PAD] [UNK]",
    "the [MASK] is[MASK]here and [mask] [SEP][SEP]",
    "[MASK",
    "1,234.56 3.14e-10 0x1F",
    "don't won't it's I'm you're we've",
    "\u2581 lower one eighth block",
]


def wide_strings(n: int, seed: int = 99) -> list[str]:
    """Random code points from all of Unicode (no surrogates), mixed with ASCII:
    probes the Unicode class tables."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        chars = []
        for _ in range(rng.randint(1, 30)):
            r = rng.random()
            if r < 0.3:
                chars.append(rng.choice("ab 1'\n\t."))
            elif r < 0.7:
                chars.append(chr(rng.randint(0x80, 0x2FFF)))
            else:
                cp = rng.randint(0x3000, 0x10FFFF)
                chars.append(chr(cp) if not 0xD800 <= cp < 0xE000 else "x")
        out.append("".join(chars))
    return out


def fuzz_strings(n: int, seed: int = 1234, extra_words: tuple[str, ...] = ()) -> list[str]:
    rng = random.Random(seed)
    pools = [
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ",
        "0123456789",
        " " * 6 + "\n\t\r",
        "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~",
        "éèàüöñçßøåÆŒŦǄĳ",
        "\u0301\u0308\u0327",
        "你好世界日本語中文字",
        "ひらがなカタカナ",
        "한국어",
        "абвгдЖЗИ",
        "αβγΔΩ",
        "مرحبا",
        "नमस्ते",
        "👋🏽🤖🧑\u200d💻😀🎉",
        "\u00a0\u3000\u2009\u200b\u0085\ufeff",
        "½²³₂∑√∞€",
    ]
    words = ["'s", "'LL", "'re", "<|im_start|>", "<|im_end|>", "<start_of_turn>", "<end_of_turn>",
             "<bos>", "</s>", "<s>", "<0x41>", "  ", "\n\n", "\t\t", "hello", " the", "123456",
             "<table>", "<|endoftext|>", "<unk>", *extra_words]
    out = []
    for _ in range(n):
        k = rng.randint(1, 40)
        parts = []
        for _ in range(k):
            if rng.random() < 0.1:
                parts.append(rng.choice(words))
            else:
                parts.append(rng.choice(rng.choice(pools)))
        out.append("".join(parts))
    return out


WPM_FUZZ_WORDS = ("[MASK]", "[SEP]", "[CLS]", "[UNK]", "[PAD]", "[mask]", "ing", "Ångström", "CAFÉ",
                  "\x00", "\ufffd", "\u200b", "$", "^", "`", "~", "€", "©", "ᚠ", "x" * 30)


# --------------------------------------------------------------------------
# the peer: a worker process in the peer's venv, talking JSON lines

PEER_WORKER = r'''
import ctypes, hashlib, json, sys
import llama_cpp

def main():
    models = {}
    for line in sys.stdin:
        req = json.loads(line)
        key = json.dumps([req["path"], req["overrides"]], sort_keys=True)
        if key not in models:
            try:
                models[key] = llama_cpp.Llama(model_path=req["path"], vocab_only=True, verbose=False,
                                              kv_overrides=req["overrides"] or None)
            except Exception as e:
                models[key] = str(e) or type(e).__name__
        m = models[key]
        if isinstance(m, str):
            sys.stdout.write(json.dumps({"error": m}) + "\n")
            sys.stdout.flush()
            continue
        vocab = llama_cpp.llama_model_get_vocab(m.model)
        op = req["op"]
        if op == "info":
            n = llama_cpp.llama_vocab_n_tokens(vocab)
            res = {"n_vocab": n, "bos": llama_cpp.llama_vocab_bos(vocab),
                   "eos": llama_cpp.llama_vocab_eos(vocab),
                   "add_bos": bool(llama_cpp.llama_vocab_get_add_bos(vocab)),
                   "add_eos": bool(llama_cpp.llama_vocab_get_add_eos(vocab)),
                   "eog": [i for i in range(n) if llama_cpp.llama_vocab_is_eog(vocab, i)],
                   "attrs": [int(llama_cpp.llama_vocab_get_attr(vocab, i)) for i in range(n)]}
            buf = ctypes.create_string_buffer(4096)
            for special in (True, False):
                pieces = []
                for i in range(n):
                    k = llama_cpp.llama_token_to_piece(vocab, i, buf, 4096, 0, special)
                    pieces.append(buf.raw[:k].hex())
                res["pieces_special" if special else "pieces"] = pieces
        elif op == "tokenize":
            res = []
            for text, add_special, parse_special in req["items"]:
                b = text.encode("utf-8")
                cap = len(b) + 8
                arr = (llama_cpp.llama_token * cap)()
                k = llama_cpp.llama_tokenize(vocab, b, len(b), arr, cap, add_special, parse_special)
                res.append(list(arr[:k]))
        elif op == "unicode_flags":
            # llama.cpp's own classifier (exported by libllama), every code point
            f = llama_cpp.llama_cpp._lib._Z26unicode_cpt_flags_from_cptj
            f.restype, f.argtypes = ctypes.c_uint16, [ctypes.c_uint32]
            import array
            res = array.array("H", (f(cp) for cp in range(0x110000))).tobytes().hex()
        elif op == "unicode_lower":
            f = llama_cpp.llama_cpp._lib._Z15unicode_tolowerj
            f.restype, f.argtypes = ctypes.c_uint32, [ctypes.c_uint32]
            import array
            res = array.array("I", (f(cp) for cp in range(0x110000))).tobytes().hex()
        elif op == "detokenize":
            res = []
            for ids, remove_special, unparse_special in req["items"]:
                arr = (llama_cpp.llama_token * max(1, len(ids)))(*ids)
                cap = 256 + 64 * len(ids)
                out = ctypes.create_string_buffer(cap)
                k = llama_cpp.llama_detokenize(vocab, arr, len(ids), out, cap, remove_special, unparse_special)
                res.append(out.raw[:k].hex())
        else:
            res = None
        sys.stdout.write(json.dumps(res) + "\n")
        sys.stdout.flush()

main()
'''


class Peer:
    def __init__(self, python: str):
        self.proc = subprocess.Popen([python, "-c", PEER_WORKER], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        out = subprocess.run([python, "-c", "import llama_cpp; print(llama_cpp.__version__)"],
                             capture_output=True, text=True, check=True)
        self.version = out.stdout.strip()

    def ask(self, path: str, overrides: dict, op: str, items=None):
        self.proc.stdin.write(json.dumps({"path": path, "overrides": overrides, "op": op,
                                          "items": items}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the llama.cpp worker died (bad override for this vocabulary?)")
        return json.loads(line)

    def close(self):
        self.proc.stdin.close()
        self.proc.wait()


# --------------------------------------------------------------------------

def pieces_digest(pieces_hex: list[str]) -> str:
    h = hashlib.sha256()
    for p in pieces_hex:
        h.update(len(p).to_bytes(4, "little"))
        h.update(bytes.fromhex(p))
    return h.hexdigest()


def compare_unicode(peer: Peer, any_model: str) -> int:
    """Our collapsed class (pretokenize.collapse) vs llama.cpp's flags."""
    import array
    from pyllm.tokenizer import pretokenize
    flags = array.array("H")
    flags.frombytes(bytes.fromhex(peer.ask(any_model, {}, "unicode_flags")))
    standin = {0x02: 0xD1, 0x04: 0xD2, 0x20: 0xD3, 0x10: 0xD4, 0x40: 0xD5}
    bad = []
    for cp in range(128, 0x110000):
        fl = flags[cp]
        theirs = 0x0B if fl & 0x100 else standin.get(fl & 0xFF, 0xD0)
        if pretokenize.collapse(chr(cp)) != chr(theirs):
            bad.append(cp)
    for cp in bad[:20]:
        print(f"  U+{cp:04X}: ours {ord(pretokenize.collapse(chr(cp))):02X} llama.cpp flags {flags[cp]:04X}")
    return len(bad)


def write_every_code_point_vocab(path: str) -> str:
    """A metadata-only 'bert' GGUF whose vocabulary has every code point but NUL
    twice: '▁' + it (a word's start) and it alone (a continuation). (llama.cpp
    reads token texts as C strings: a NUL would cut '▁' + NUL down to '▁'.)"""
    import gguf
    tokens = ["[PAD]"] + [f"[unused{i}]" for i in range(99)] + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    types = [3] + [1] * 99 + [3] * 4
    for cp in range(1, 0x110000):
        if not 0xD800 <= cp < 0xE000:
            tokens += ["\u2581" + chr(cp), chr(cp)]
    types += [1] * (len(tokens) - len(types))
    w = gguf.GGUFWriter(path, "bert")
    w.add_tokenizer_model("bert")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    return path


def compare_wpm_unicode(peer: Peer, any_model: str, flags) -> int:
    """WordPiece's code point handling vs llama.cpp's, every code point: the
    classes (pyllm.tokenizer.wpm.code_point_class) and the lowercase mapping
    against llama.cpp's own functions, then end to end ('NFD' included):
    'a' + the code point + 'a' tokenized over a vocabulary holding every code
    point, under each setting of lowercase and strip_accents. Returns the
    number of differences."""
    import array
    from pyllm.tokenizer import load_tokenizer, wpm
    low = array.array("I")
    low.frombytes(bytes.fromhex(peer.ask(any_model, {}, "unicode_lower")))
    bad = 0
    for cp in range(0x110000):
        if 0xD800 <= cp < 0xE000:
            continue
        fl = flags[cp]
        theirs = (wpm._WHITESPACE if fl & 0x100 else wpm._CONTROL if fl & 0x80 else
                  wpm._MARK if fl & 0x10 else wpm._PUNCT if fl & 0x20 else
                  wpm._SYMBOL if fl & 0x40 and cp < 0x7F else wpm._OTHER)
        ours = wpm.code_point_class(cp)
        if ours == wpm._SYMBOL and cp >= 0x7F:  # only ASCII symbols count
            ours = wpm._OTHER
        if ours != theirs or wpm.simple_lower(cp) != low[cp]:
            if bad < 20:
                print(f"  U+{cp:04X}: class ours {ours} llama.cpp {theirs} (flags {fl:04X}); "
                      f"lowercase ours U+{wpm.simple_lower(cp):04X} llama.cpp U+{low[cp]:04X}")
            bad += 1
    print(f"wordpiece unicode classes and lowercase: {bad} code points differ")

    path = write_every_code_point_vocab(os.path.join(tempfile.gettempdir(), "pyllm-every-code-point.gguf"))
    from pyllm.model_file import ModelFile
    with ModelFile(path) as mf:
        md = dict(mf.metadata)
    cps = [cp for cp in range(1, 0x110000) if not 0xD800 <= cp < 0xE000]
    chunks = [cps[i:i + 8192] for i in range(0, len(cps), 8192)]
    texts = [" ".join(f"a{chr(cp)}a" for cp in chunk) for chunk in chunks]
    for lowercase in (True, False):
        for strip in (True, False):
            overrides = {_LOWER: lowercase, _STRIP: strip}
            tok = load_tokenizer({**md, **overrides})
            expected = peer.ask(path, overrides, "tokenize", [(t, False, False) for t in texts])
            n_bad = 0
            for chunk, text, theirs in zip(chunks, texts, expected):
                if tok.encode(text, add_bos=False, add_eos=False) == theirs:
                    continue
                words = [f"a{chr(cp)}a" for cp in chunk]
                per_word = peer.ask(path, overrides, "tokenize", [(w, False, False) for w in words])
                for cp, word, ids in zip(chunk, words, per_word):
                    ours = tok.encode(word, add_bos=False, add_eos=False)
                    if ours != ids:
                        if n_bad < 10:
                            print(f"  U+{cp:04X} lowercase={lowercase} strip_accents={strip}: "
                                  f"ours {[tok.token_text(i) for i in ours]} "
                                  f"llama.cpp {[tok.token_text(i) for i in ids]}")
                        n_bad += 1
            print(f"wordpiece every code point, lowercase={lowercase} strip_accents={strip}: "
                  f"{n_bad} differ")
            bad += n_bad
    return bad


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=os.environ.get("PYLLM_MODELS", "/tmp/models"))
    ap.add_argument("--peer-python", default="/tmp/peer-venv/bin/python")
    ap.add_argument("--fuzz", type=int, default=1000, help="random strings per configuration")
    ap.add_argument("--only", help="only configurations whose name contains this")
    ap.add_argument("--wide", type=int, default=0,
                    help="random strings of code points from all of Unicode")
    ap.add_argument("--unicode", action="store_true",
                    help="compare the Unicode class of every code point with llama.cpp's")
    ap.add_argument("--files", nargs="*", default=[],
                    help="also compare on the whole contents of these text files")
    ap.add_argument("--write", action="store_true", help=f"write {DATA.relative_to(ROOT)}")
    ap.add_argument("--show", type=int, default=5, help="mismatches to print per configuration")
    args = ap.parse_args()

    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "tests"))
    import synth   # the derived vocabularies (DERIVED)
    from pyllm.model_file import ModelFile
    from pyllm.errors import UnsupportedModelError
    from pyllm.tokenizer import load_tokenizer

    peer = Peer(args.peer_python)
    print(f"peer: llama-cpp-python {peer.version}")
    if args.unicode:
        total_bad_unicode = compare_unicode(peer, os.path.join(args.models, SMOL))
        if total_bad_unicode:
            print(f"unicode: {total_bad_unicode} code points classified differently")
        else:
            print("unicode: every code point is classified as llama.cpp does")
        import array
        flags = array.array("H")
        flags.frombytes(bytes.fromhex(peer.ask(os.path.join(args.models, SMOL), {}, "unicode_flags")))
        wpm_bad = compare_wpm_unicode(peer, os.path.join(args.models, SMOL), flags)
        print("wordpiece unicode: " + (f"{wpm_bad} differences" if wpm_bad else
                                       "every code point is handled as llama.cpp does"))
    fuzz = fuzz_strings(args.fuzz) + wide_strings(args.wide)
    wpm_fuzz = fuzz_strings(args.fuzz, extra_words=WPM_FUZZ_WORDS) + wide_strings(args.wide)
    for f in args.files:
        fuzz.append(Path(f).read_text(encoding="utf-8", errors="replace"))
        wpm_fuzz.append(fuzz[-1])
    flags = [(True, False), (False, False), (True, True), (False, True)]  # (add_special, parse_special)

    metadata_cache: dict[str, dict] = {}
    data = {
        "source": (f"llama.cpp {VENDORED_LLAMA_CPP.get(peer.version, '(commit unknown)')} "
                   f"via llama-cpp-python {peer.version}"),
        "generated_by": "benchmarks/compare_tokenizer.py --write",
        "note": ("do not edit by hand. cases: [text, add_special, parse_special, ids from "
                 "llama_tokenize]; detokenize: [ids, remove_special, unparse_special, "
                 "hex of llama_detokenize]; *_sha256: see pieces_digest() in the script"),
        "configs": {},
    }
    total_bad = 0
    for name, (fname, overrides) in CONFIGS.items():
        if args.only and args.only not in name:
            continue
        path = os.path.join(args.models, fname)
        if not os.path.exists(path):
            print(f"{name}: {path} missing, skipped")
            continue
        if fname not in metadata_cache:
            metadata_cache[fname] = dict(ModelFile(path).metadata)
        md = dict(metadata_cache[fname])
        md.update(overrides)
        derive = DERIVED.get(name)
        if derive:
            md = getattr(synth, derive)(md)
            path = synth.write_metadata_only(path, os.path.join(tempfile.gettempdir(), f"{derive}.gguf"), md)
        info = peer.ask(path, overrides, "info")
        t0 = time.perf_counter()
        try:
            tok = load_tokenizer(md)
        except UnsupportedModelError as e:
            if isinstance(info, dict) and "error" in info:
                print(f"{name}: refused by both (llama.cpp: {info['error']}; pyllm: {e})")
            else:
                print(f"{name}: pyllm refuses it ({e}); llama.cpp loads it")
                total_bad += 1
            continue
        t_load = time.perf_counter() - t0
        if "error" in info:
            print(f"{name}: llama.cpp refuses it ({info['error']}); pyllm loads it")
            total_bad += 1
            continue

        problems: list[str] = []
        if info["n_vocab"] != tok.n_vocab:
            problems.append(f"n_vocab {tok.n_vocab} != {info['n_vocab']}")
        for k, ours in (("bos", tok.bos_id), ("eos", tok.eos_id), ("add_bos", tok.add_bos),
                        ("add_eos", tok.add_eos)):
            theirs = info[k]
            if k in ("bos", "eos") and theirs == -1:
                theirs = None
            if ours != theirs:
                problems.append(f"{k}: ours {ours} llama.cpp {theirs}")
        if sorted(tok.eog_ids) != info["eog"]:
            problems.append(f"eog: ours {sorted(tok.eog_ids)} llama.cpp {info['eog']}")
        bad_attr = [i for i in range(tok.n_vocab) if int(tok.token_attr(i)) != info["attrs"][i]]
        if bad_attr:
            problems.append(f"{len(bad_attr)} token attributes differ, e.g. {bad_attr[:5]}")
        for special, key in ((True, "pieces_special"), (False, "pieces")):
            bad = [i for i in range(tok.n_vocab)
                   if tok.token_to_piece(i, special=special).hex() != info[key][i]]
            if bad:
                i = bad[0]
                problems.append(f"{len(bad)} pieces (special={special}) differ, e.g. {i}: "
                                f"ours {tok.token_to_piece(i, special=special)!r} "
                                f"llama.cpp {bytes.fromhex(info[key][i])!r}")

        wordpiece = md.get("tokenizer.ggml.model") == "bert"
        curated = CURATED + WPM_CURATED if wordpiece else CURATED
        texts = curated + (wpm_fuzz if wordpiece else fuzz)
        items = [(t, a, p) for t in texts for a, p in flags]
        expected = peer.ask(path, overrides, "tokenize", items)
        n_ok = 0
        t0 = time.perf_counter()
        ours_all = [tok.encode(t, add_bos=None if a else False, add_eos=None if a else False,
                               parse_special=p) for t, a, p in items]
        t_enc = time.perf_counter() - t0
        for (t, a, p), ours, theirs in zip(items, ours_all, expected):
            if ours == theirs:
                n_ok += 1
            else:
                problems.append(f"encode({t!r}, add_special={a}, parse_special={p}):\n"
                                f"    ours     {ours}\n    llama.cpp {theirs}")

        det_items = [(ids, rs, us) for ids in expected for rs in (False, True) for us in (False, True)]
        det_expected = peer.ask(path, overrides, "detokenize", det_items)
        det_ok = 0
        for (ids, rs, us), theirs in zip(det_items, det_expected):
            ours = tok.detokenize(ids, remove_special=rs, unparse_special=us).hex()
            if ours == theirs:
                det_ok += 1
            else:
                problems.append(f"detokenize({ids}, remove_special={rs}, unparse_special={us}): "
                                f"ours {bytes.fromhex(ours)!r} llama.cpp {bytes.fromhex(theirs)!r}")

        status = "OK" if not problems else f"{len(problems)} PROBLEMS"
        print(f"{name}: encode {n_ok}/{len(items)}, detokenize {det_ok}/{len(det_items)}, "
              f"pieces+attrs+eog checked; load {t_load:.2f}s, encode {len(items)} strings "
              f"{t_enc:.2f}s  -> {status}")
        for line in problems[:args.show]:
            print("   ", line)
        total_bad += len(problems)

        # what the tests hard-code: the curated strings. Real files (and Gemma
        # with add_space_prefix): every flag combination and detokenization;
        # vocabularies with an overridden pre-tokenizer: BOS as the file says,
        # parse_special off (the special token split does not depend on the
        # pre-tokenizer).
        real = "tokenizer.ggml.pre" not in overrides   # derived vocabularies count as real
        n_curated = len(curated) * len(flags)  # items start with the curated strings
        cases = [[t, a, p, ids] for (t, a, p), ids in zip(items[:n_curated], expected[:n_curated])
                 if real or (a and not p)]
        det_cases = []
        if real or name.endswith("pre=gpt-2"):
            for k, ((ids, rs, us), theirs) in enumerate(zip(det_items, det_expected)):
                if k // 4 < n_curated and rs != us:
                    det_cases.append([ids, rs, us, theirs])
        data["configs"][name] = {
            "file": fname,
            "overrides": overrides,
            "derive": derive,
            "n_vocab": info["n_vocab"],
            "bos": None if info["bos"] == -1 else info["bos"],
            "eos": None if info["eos"] == -1 else info["eos"],
            "add_bos": info["add_bos"],
            "eog": info["eog"],
            "pieces_special_sha256": pieces_digest(info["pieces_special"]),
            "pieces_sha256": pieces_digest(info["pieces"]),
            "attrs_sha256": hashlib.sha256(json.dumps(info["attrs"]).encode()).hexdigest(),
            "cases": cases,
            "detokenize": det_cases,
        }
    peer.close()
    if args.write:
        # keep the configurations that did not run (--only, missing files)
        if DATA.exists():
            old = json.loads(DATA.read_text(encoding="utf-8"))["configs"]
            kept = [name for name in old if name not in data["configs"]]
            if kept:
                print(f"kept from {DATA.name} as they were: {', '.join(kept)}")
            data["configs"] = {**old, **data["configs"]}
        DATA.parent.mkdir(parents=True, exist_ok=True)
        with open(DATA, "w", encoding="utf-8") as f:
            json.dump(data, f, ensure_ascii=False, indent=None, separators=(",", ":"))
            f.write("\n")
        print(f"wrote {DATA} ({DATA.stat().st_size // 1024} KiB)")
    print("all match" if total_bad == 0 else f"{total_bad} problems in total")
    return 1 if total_bad else 0


if __name__ == "__main__":
    sys.exit(main())
