"""The class llama.cpp gives a code point, from its Unicode 15.1 tables.

Tokenizers must split text where llama.cpp splits it. The installed Python
and `regex` package know other Unicode versions (Python 3.11: 14.0; regex
2026.x: 17.0), so the classes come from a table generated once from Unicode
15.1 (_unicode_15_1.py, by benchmarks/gen_unicode_table.py), not from them.
"""
from __future__ import annotations

import bisect

from ._unicode_15_1 import RUN_CLASSES, RUN_STARTS, UNICODE_VERSION

__all__ = ["UNICODE_VERSION", "WHITESPACE", "NUMBER", "LETTER", "PUNCTUATION", "MARK",
           "SYMBOL", "SEPARATOR", "CONTROL", "UNASSIGNED", "code_point_class", "is_assigned"]

WHITESPACE = "W"    # Unicode's White_Space property, whatever the category
NUMBER = "N"
LETTER = "L"
PUNCTUATION = "P"
MARK = "M"
SYMBOL = "S"
SEPARATOR = "Z"     # separators that are not White_Space (none since Unicode 4.0.1)
CONTROL = "C"       # Cc, Cf, Co and Cs
UNASSIGNED = "U"    # Cn: unassigned in 15.1, including code points newer than it

assert len(RUN_STARTS) == len(RUN_CLASSES) and RUN_STARTS[0] == 0


def code_point_class(cp: int) -> str:
    """One of the class letters above, for a code point in 0..0x10FFFF."""
    return RUN_CLASSES[bisect.bisect_right(RUN_STARTS, cp) - 1]


def is_assigned(cp: int) -> bool:
    return code_point_class(cp) != UNASSIGNED
