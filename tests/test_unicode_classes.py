"""The Unicode 15.1 class table (pyllm/tokenizer/unicode.py) that both the BPE
pre-tokenizer and WordPiece use, checked against the running Python's own
Unicode database, and the pre-tokenizer's stand-ins for code points newer than
15.1 (llama.cpp's tables are 15.1; the `regex` package follows new versions)."""
from __future__ import annotations

import unicodedata

from pyllm.tokenizer import pretokenize, unicode, wpm

WHITE_SPACE = {*range(0x09, 0x0E), 0x20, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B),
               0x2028, 0x2029, 0x202F, 0x205F, 0x3000}

# code points first assigned in Unicode 15.0 (4,489) and 15.1 (627)
ADDED_SINCE = {"14.0.0": 4489 + 627, "15.0.0": 627, "15.1.0": 0}


def python_class(cp: int) -> str:
    if cp in WHITE_SPACE:
        return unicode.WHITESPACE
    category = unicodedata.category(chr(cp))
    return unicode.UNASSIGNED if category == "Cn" else category[0]


def test_table_agrees_with_python_unicodedata():
    """Every code point assigned in both agrees; the ones only the table
    assigns are exactly the additions since Python's Unicode version, or none
    are missing when Python's is 15.1 or newer."""
    only_table, only_python, differ = 0, [], []
    for cp in range(0x110000):
        ours, theirs = unicode.code_point_class(cp), python_class(cp)
        if ours == theirs:
            continue
        if theirs == unicode.UNASSIGNED:
            only_table += 1
        elif ours == unicode.UNASSIGNED:
            only_python.append(cp)
        else:
            differ.append(cp)
    assert differ == []
    version = unicodedata.unidata_version
    if version in ADDED_SINCE:
        assert only_python == []
        assert only_table == ADDED_SINCE[version]
    else:  # a newer Python: it knows every 15.1 code point, and more
        assert only_table == 0 and len(only_python) > 0


def test_classes_of_known_code_points():
    c = unicode.code_point_class
    assert [c(ord(ch)) for ch in " a1.+\u0301\x00\ue000"] == ["W", "L", "N", "P", "S", "M", "C", "C"]
    assert c(0x3000) == c(0x85) == c(0x2028) == unicode.WHITESPACE
    assert c(0x200B) == unicode.CONTROL  # zero width space is Cf, not White_Space
    assert c(0xD800) == unicode.CONTROL  # surrogate
    assert c(0x31350) == c(0x2EBF0) == c(0x11F04) == unicode.LETTER  # 15.0, 15.1, 15.0
    # 16.0 (Garay letter, an emoji), 17.0 (riyal sign), 18.0 (Armenian, CJK)
    for cp in (0x10D50, 0x1FAE9, 0x20C1, 0x0558, 0x3D000, 0x10FFFF):
        assert c(cp) == unicode.UNASSIGNED and not unicode.is_assigned(cp)


def test_collapse_uses_unicode_15_1():
    collapse = pretokenize.collapse
    assert collapse("a\u00e9\u0661\u00bf\u0301\u20ac\u3000\x85") == "a\xd2\xd1\xd3\xd4\xd5\x0b\x0b"
    assert collapse("\U00031350\U0002EBF0") == "\xd2\xd2"           # letters llama.cpp knows
    newer = "\U00010D50\U0001FAE9\u20c1\u0558\u20c2\U0003D000\U00012550"
    assert collapse(newer) == "\xd0" * len(newer)                   # unassigned for llama.cpp


def test_wordpiece_classes_follow_the_table():
    assert wpm.code_point_class(0x20) == wpm.code_point_class(0x3000) == wpm._WHITESPACE
    assert wpm.code_point_class(0x200B) == wpm.code_point_class(0xE000) == wpm._CONTROL
    assert wpm.code_point_class(0x11F00) == wpm._MARK          # Kawi sign (15.0)
    assert wpm.code_point_class(0x11B00) == wpm._PUNCT         # Devanagari head mark (15.0)
    assert wpm.code_point_class(0x20C1) == wpm._OTHER          # 17.0: unassigned
    assert wpm.simple_lower(0x0558) == 0x0558 and wpm.nfd_first(0x0558) == 0x0558
