"""BPE pre-tokenization: split text into words the way llama.cpp does.

llama.cpp picks a list of regexes from `tokenizer.ggml.pre` and applies them
one after another: each regex splits every fragment produced so far into its
matches *and* the gaps between matches (both kept as fragments). Each final
fragment is a "word" that BPE then merges on its own.

llama.cpp does not run these regexes over the real text. It replaces every
non-ASCII code point with one stand-in byte for its Unicode class (letter,
number, punctuation, mark, symbol, whitespace, other) and rewrites each
`\\p{..}` in the regex into a class of that stand-in plus the ASCII members
(its "collapsed" text; see unicode_regex_split in llama.cpp's unicode.cpp).
Regexes without `\\p{..}` run over the real code points with non-ASCII
whitespace replaced by U+000B. For the most common regexes (gpt2, llama3,
qwen2) llama.cpp uses hand-written splitters that implement the same regex
over the same classes.

We do the same with the `regex` package in ASCII mode over the same collapsed
text, so that the classes behave exactly as llama.cpp's do: e.g. `\\s` is the
Unicode White_Space set, non-ASCII letters have no case (which matters for the
tekken / gpt-4o patterns), and `\\p{Lu}` means any letter.

The classes come from llama.cpp's Unicode version, 15.1 (pyllm.tokenizer.unicode),
not from the `regex` package's tables, which follow newer versions; regex only
runs in ASCII mode here. benchmarks/compare_tokenizer.py --unicode checks
every code point against llama.cpp's own classifier.
"""
from __future__ import annotations

from dataclasses import dataclass

import regex

from ..errors import UnsupportedModelError
from . import unicode

# --- Unicode classes --------------------------------------------------------

_WS_STANDIN = 0x0B          # any non-ASCII whitespace (as llama.cpp)
_OTHER_STANDIN = 0xD0       # separators that are not whitespace, controls, unassigned
# keyed by class letter (pyllm.tokenizer.unicode's NUMBER, LETTER, ...)
_STANDIN = {unicode.NUMBER: 0xD1, unicode.LETTER: 0xD2, unicode.PUNCTUATION: 0xD3,
            unicode.MARK: 0xD4, unicode.SYMBOL: 0xD5}

# ASCII members of each category, as llama.cpp's k_ucat_map (regex class syntax)
_ASCII_MEMBERS = {
    "N": "0-9",
    "L": "A-Za-z",
    "P": r"!-#%-*,-/:-;?-@\[-\]_\{\}",
    "M": "",
    "S": r"\$\+<->^`\|\~",
}
# the \p{..} names llama.cpp understands, and the category each collapses to
_UCAT = {"\\p{N}": "N", "\\p{L}": "L", "\\p{P}": "P", "\\p{M}": "M", "\\p{S}": "S",
         "\\p{Lu}": "L", "\\p{Ll}": "L", "\\p{Lt}": "L", "\\p{Lm}": "L", "\\p{Lo}": "L"}

_CLASS_STANDIN = {unicode.WHITESPACE: _WS_STANDIN, **_STANDIN}


class _CollapseTable(dict):
    """str.translate table: code point -> its class stand-in (ASCII kept)."""

    def __missing__(self, cp: int) -> int:
        value = cp if cp < 128 else _CLASS_STANDIN.get(unicode.code_point_class(cp), _OTHER_STANDIN)
        self[cp] = value
        return value


class _WhitespaceTable(dict):
    """str.translate table: non-ASCII whitespace -> U+000B, the rest kept."""

    def __missing__(self, cp: int) -> int:
        value = _WS_STANDIN if cp >= 128 and unicode.code_point_class(cp) == unicode.WHITESPACE else cp
        self[cp] = value
        return value


_COLLAPSE = _CollapseTable()
_WHITESPACE = _WhitespaceTable()


def collapse(text: str) -> str:
    """The text with every non-ASCII code point replaced by its class stand-in."""
    return text.translate(_COLLAPSE)


def _uses_categories(expr: str) -> bool:
    return any(name in expr for name in _UCAT)


def _to_python(expr: str, collapsed: bool) -> str:
    """Rewrite one of llama.cpp's (ECMAScript) regexes for the `regex` package.

    With `collapsed`, each known \\p{..} becomes a class of its stand-in and its
    ASCII members, as llama.cpp does. An unescaped `$` outside a class becomes
    `\\Z`: ECMAScript's `$` matches only at the very end, Python's also before
    a final newline.
    """
    out: list[str] = []
    inside = False
    i, n = 0, len(expr)
    while i < n:
        c = expr[i]
        if c == "\\" and i + 1 < n:
            if collapsed and expr[i + 1] == "p" and i + 3 < n and expr[i + 2] == "{":
                close = expr.find("}", i + 3)
                if close != -1 and close <= i + 10 and expr[i:close + 1] in _UCAT:
                    cat = _UCAT[expr[i:close + 1]]
                    body = chr(_STANDIN[cat]) + _ASCII_MEMBERS[cat]
                    out.append(body if inside else "[" + body + "]")
                    i = close + 1
                    continue
            if expr[i + 1] == "p":
                raise UnsupportedModelError(f"pre-tokenizer regex uses an unsupported class: {expr!r}")
            out.append(expr[i:i + 2])
            i += 2
            continue
        if c == "[" and not inside:
            inside = True
        elif c == "]" and inside:
            inside = False
        elif c == "$" and not inside:
            out.append(r"\Z")
            i += 1
            continue
        out.append(c)
        i += 1
    return "".join(out)


@dataclass(frozen=True)
class _Step:
    pattern: "regex.Pattern[str]"
    collapsed: bool


def compile_steps(exprs: tuple[str, ...]) -> tuple[_Step, ...]:
    steps = []
    for expr in exprs:
        collapsed = _uses_categories(expr)
        steps.append(_Step(regex.compile(_to_python(expr, collapsed), regex.ASCII | regex.V0),
                           collapsed))
    return tuple(steps)


def split_words(text: str, steps: tuple[_Step, ...]) -> list[str]:
    """Apply the regexes in turn; return the final fragments (matches and gaps)."""
    spans = [(0, len(text))]
    views: dict[bool, str] = {}
    for step in steps:
        view = views.get(step.collapsed)
        if view is None:
            view = collapse(text) if step.collapsed else text.translate(_WHITESPACE)
            views[step.collapsed] = view
        finditer = step.pattern.finditer
        new: list[tuple[int, int]] = []
        add = new.append
        for start, end in spans:
            pos = start
            for m in finditer(view, start, end):
                ms, me = m.span()
                if ms > pos:
                    add((pos, ms))
                add((ms, me))
                pos = me
            if pos < end:
                add((pos, end))
        spans = new
    return [text[s:e] for s, e in spans]


# --- the pre-tokenizer table ------------------------------------------------
# Regexes as in llama.cpp's llm_tokenizer_bpe (src/llama-vocab.cpp); the
# case-insensitive groups are already spelled out there as [sS] etc.

_CONTRACTIONS = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_GPT2 = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
_LLAMA3 = (_CONTRACTIONS + "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
           "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
_QWEN2 = (_CONTRACTIONS + "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
          "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
_CASED_WORD = ("[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+"
               "|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*")
_CASED_WORD_C = ("[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+" + _CONTRACTIONS
                 + "?|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*"
                 + _CONTRACTIONS + "?")

PRE_REGEXES: dict[str, tuple[str, ...]] = {
    "default": (
        "[\\p{P}\\$\\+<=>\\^~\\|]+",
        _GPT2,
        "\\p{N}+",
        "[0-9][0-9][0-9]",
    ),
    "llama3": (_LLAMA3,),
    "jais2": (_CONTRACTIONS + "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
              "|\\s*[\\r\\n]+|\\s{512}(?!\\S)|\\s{256}(?!\\S)|\\s{128}(?!\\S)|\\s{64}(?!\\S)"
              "|\\s{32}(?!\\S)|\\s{16}(?!\\S)|\\s{8}(?!\\S)|\\s{4}(?!\\S)|\\s{1,2}(?!\\S)|\\s{1}",),
    "dbrx": (_LLAMA3,),
    "deepseek-llm": (
        "[\r\n]",
        "\\s?[A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943]+",
        "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+",
        "\\s+$",
        "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+",
        "\\p{N}+",
    ),
    "deepseek3-llm": (
        "\\p{N}{1,3}",
        "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
        "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
        "| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
    ),
    "deepseek-coder": (
        "[\r\n]",
        "\\s?\\p{L}+",
        "\\s?\\p{P}+",
        "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+",
        "\\p{N}",
    ),
    "falcon": (
        "[\\p{P}\\$\\+<=>\\^~\\|`]+",
        "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
        "[0-9][0-9][0-9]",
    ),
    "starcoder": ("\\p{N}", _GPT2),
    "gpt2": (_GPT2,),
    "qwen2": (_QWEN2,),
    "qwen35": (_CONTRACTIONS + "|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*"
               "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",),
    "poro": (" ?[^(\\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+",),
    "chatglm4": (_CONTRACTIONS + "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
                 "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",),
    "viking": (" ?[^(\\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+", "\\p{N}"),
    "tekken": (_CASED_WORD + "|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",),
    "chameleon": (
        "<sentinel:[0-9]+>",
        "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z",
        "([\\t\\n]|    |  )",
        "\\p{N}",
        "[\\p{P}!-/:-@\\[-`{-~]",
        "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
    ),
    "gpt4o": (_CASED_WORD_C + "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",),
    "bailingmoe": ("'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}"
                   "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+",),
    "seed-coder": (_CONTRACTIONS + "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| ?[^\\s\\p{L}\\p{N}\\r\\n]+"
                   "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",),
    "ufakzeka": ("[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+"
                 "|\\s+(?!\\S)|\\s+",),
    "laguna": ("[^\\n]+|[\\n]+", _QWEN2),
    "exaone-moe": (_CONTRACTIONS + "|[^\\r\\n\\p{L}\\p{N}]?(?:\\p{L}\\p{M}*(?: \\p{L}\\p{M}*)*)+|\\p{N}"
                   "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]?|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+",),
    "minicpm5": ("\\p{N}{1,3}",
                 _CONTRACTIONS + "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}+| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
                 "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"),
    "spark2_5": (
        "\\p{N}{1,3}",
        "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
        "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
        "| ?[\\p{P}\\p{S}]+|[\r\n]|\\s+(?!\\S)|\\s+",
        "\\p{N}",
    ),
    "youtu": (
        "[\uac00-\ud7a3\u3131-\u318e]+|[\uff01\u2026\u201c\u201d\u2018\u2019\u2014\uff1a\uff1b\uff0c\u3001-\u303f\ufe30-\ufe4f]+|[\u3105-\u312f]+|[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
        "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+" + _CONTRACTIONS
        + "?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*" + _CONTRACTIONS
        + "?|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    ),
    # SPM-style BPE (spaces escaped as U+2581, raw UTF-8, <0xXX> byte tokens)
    "gemma4": ("[^\\n]+|[\\n]+",),
}
PRE_REGEXES["granite-docling"] = PRE_REGEXES["gpt2"]


@dataclass(frozen=True)
class PreTokenizer:
    """What `tokenizer.ggml.pre` selects in llama.cpp (for the 'gpt2' model)."""
    kind: str                     # key into PRE_REGEXES
    clean_spaces: bool = True     # detokenize cleans " ." etc. (llama.cpp clean_spaces)
    ignore_merges: bool = False   # a word that is a whole token is taken as is
    add_bos: bool = False         # default add_bos (the GGUF key overrides it)
    byte_encode: bool = True      # GPT-2 byte-to-unicode mapping (False: raw UTF-8)
    escape_whitespaces: bool = False  # spaces -> U+2581 before splitting
    no_bos: bool = False          # llama.cpp sets the BOS id to none
    force_add_bos: bool = False   # add_bos even if the GGUF says false (Gemma 4)


def _p(kind: str, **kw) -> PreTokenizer:
    return PreTokenizer(kind, **kw)


# tokenizer.ggml.pre -> settings, mirroring llama_vocab::impl::load
PRE_TYPES: dict[str, PreTokenizer] = {}
for _names, _pre in [
    (["default"], _p("default")),
    (["minicpm5"], _p("minicpm5", ignore_merges=True)),
    (["llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
      "jina-v5-nano"], _p("llama3", ignore_merges=True, add_bos=True)),
    (["deepseek-llm"], _p("deepseek-llm", clean_spaces=False)),
    (["deepseek-coder"], _p("deepseek-coder", clean_spaces=False)),
    (["deepseek-v3"], _p("deepseek3-llm", clean_spaces=False)),
    (["falcon"], _p("falcon")),
    (["mpt"], _p("gpt2")),
    (["starcoder"], _p("starcoder")),
    (["gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0",
      "mellum", "modern-bert", "jina-v1-en", "jina-v2-code", "roberta-bpe", "exaone4"], _p("gpt2")),
    (["jais-2"], _p("jais2")),
    (["gemma4", "granite-embed-multi-311m"],
     _p("gemma4", byte_encode=False, escape_whitespaces=True, force_add_bos=True)),
    (["sarvam-moe"], _p("gemma4", byte_encode=False, escape_whitespaces=True, clean_spaces=False)),
    (["refact"], _p("starcoder")),
    (["command-r"], _p("starcoder", clean_spaces=False)),
    (["qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2"], _p("qwen2", clean_spaces=False)),
    (["qwen35"], _p("qwen35", clean_spaces=False)),
    (["stablelm2"], _p("qwen2")),
    (["megrez"], _p("qwen2")),
    (["olmo"], _p("gpt2")),
    (["dbrx"], _p("dbrx")),
    (["smaug-bpe"], _p("dbrx")),
    (["poro-chat"], _p("poro", clean_spaces=False)),
    (["chatglm-bpe"], _p("chatglm4", no_bos=True)),
    (["glm4", "glm5"], _p("chatglm4", no_bos=True, ignore_merges=True)),
    (["viking"], _p("viking", clean_spaces=False)),
    (["jais"], _p("gpt2")),
    (["tekken"], _p("tekken", clean_spaces=False, ignore_merges=True, add_bos=True)),
    (["smollm"], _p("starcoder", clean_spaces=False)),
    (["codeshell"], _p("starcoder")),
    (["bloom"], _p("poro")),
    (["gpt3-finnish"], _p("poro")),
    (["exaone"], _p("starcoder")),
    (["exaone-moe"], _p("exaone-moe")),
    (["chameleon"], _p("chameleon", add_bos=True, clean_spaces=False)),
    (["minerva-7b"], _p("starcoder")),
    (["gpt-4o", "llama4", "kanana2", "talkie"], _p("gpt4o", clean_spaces=False)),
    (["minimax-m2"], _p("gpt4o", clean_spaces=False)),
    (["trillion"], _p("gpt2", clean_spaces=False)),
    (["granite-docling"], _p("granite-docling", clean_spaces=False)),
    (["bailingmoe", "bailingmoe2", "llada-moe"], _p("bailingmoe", clean_spaces=False)),
    (["seed-coder"], _p("seed-coder", clean_spaces=False)),
    (["hunyuan"], _p("qwen2", clean_spaces=False)),
    (["solar-open"], _p("qwen2", clean_spaces=False)),
    (["hunyuan-dense", "hy_v4", "joyai-llm"], _p("deepseek3-llm", clean_spaces=False)),
    (["ufakzeka"], _p("ufakzeka", clean_spaces=False)),
    (["grok-2"], _p("qwen2", clean_spaces=False)),
    (["laguna"], _p("laguna", clean_spaces=False)),
    (["mellum2"], _p("starcoder")),
    (["spark2_5"], _p("spark2_5", clean_spaces=False)),
    (["youtu"], _p("youtu", clean_spaces=False, ignore_merges=True)),
]:
    for _name in _names:
        PRE_TYPES[_name] = _pre

# Known to llama.cpp but not implemented here: they need hand-written
# splitters (kimi-k2, afmoe, tiny_aya), a regex with empty matches (superbpe),
# or carry extra normalisation (whitespace, granite-embed-multi-97m ...).
UNIMPLEMENTED_PRE = ("kimi-k2", "afmoe", "tiny_aya", "cohere2moe", "superbpe", "whitespace",
                     "granite-embed-multi-97m")

_STEPS_CACHE: dict[str, tuple[_Step, ...]] = {}


def steps_for(kind: str) -> tuple[_Step, ...]:
    steps = _STEPS_CACHE.get(kind)
    if steps is None:
        steps = _STEPS_CACHE[kind] = compile_steps(PRE_REGEXES[kind])
    return steps


def resolve_pre(name: str | None) -> PreTokenizer:
    """The settings for a `tokenizer.ggml.pre` value, as llama.cpp resolves it.

    Missing or empty -> 'default' (llama.cpp warns that quality will degrade);
    a name llama.cpp does not know -> error, as llama.cpp refuses the file.
    """
    if not name:
        return PRE_TYPES["default"]
    pre = PRE_TYPES.get(name)
    if pre is None:
        if name in UNIMPLEMENTED_PRE:
            raise UnsupportedModelError(
                f"BPE pre-tokenizer {name!r} is not supported by pyllm yet")
        raise UnsupportedModelError(
            f"unknown BPE pre-tokenizer {name!r} (tokenizer.ggml.pre): llama.cpp does not know "
            f"it either; pyllm knows {len(PRE_TYPES)} (pyllm.tokenizer.pretokenize.PRE_TYPES)")
    return pre
