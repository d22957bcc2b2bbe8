"""Sizes, rates and times as people write them: 4GiB, 16GB/s, 10us."""
from __future__ import annotations

import re

from .errors import InvalidArgumentError

_BYTES = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "m": 1e6, "mb": 1e6, "g": 1e9, "gb": 1e9, "t": 1e12, "tb": 1e12,
          "kib": 2 ** 10, "mib": 2 ** 20, "gib": 2 ** 30, "tib": 2 ** 40}
_TIME = {"": 1.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
_NUM = r"\s*([0-9]*\.?[0-9]+(?:e[-+]?[0-9]+)?)\s*"


def parse_bytes(text: str | int | float) -> int:
    """'4GiB' -> 4294967296, '512MB' -> 512000000, a plain number is bytes."""
    if isinstance(text, (int, float)):
        return int(text)
    m = re.fullmatch(_NUM + r"([a-z]*)\s*", text.strip().lower())
    if not m or m.group(2) not in _BYTES:
        raise InvalidArgumentError(f"cannot read {text!r} as a size (examples: 4GiB, 512MB, 1e9)")
    return int(float(m.group(1)) * _BYTES[m.group(2)])


def parse_rate(text: str | int | float) -> float:
    """'16GB/s' -> 16e9 bytes per second; a plain number is GB/s."""
    if isinstance(text, (int, float)):
        return float(text) * 1e9
    t = text.strip().lower().replace("ps", "/s")
    if t.endswith("/s"):
        return float(parse_bytes(t[:-2]))
    try:
        return float(t) * 1e9
    except ValueError:
        raise InvalidArgumentError(f"cannot read {text!r} as a bandwidth (examples: 16GB/s, 25GB/s, 900MB/s)") from None


def parse_time(text: str | int | float) -> float:
    """'10us' -> 1e-5 seconds; a plain number is seconds."""
    if isinstance(text, (int, float)):
        return float(text)
    m = re.fullmatch(_NUM + r"([a-zµ]*)\s*", text.strip().lower())
    if not m or m.group(2) not in _TIME:
        raise InvalidArgumentError(f"cannot read {text!r} as a time (examples: 10us, 2ms)")
    return float(m.group(1)) * _TIME[m.group(2)]


def parse_flops(text: str | int | float) -> float:
    """'20T' or '20TFLOPS' -> 2e13; a plain number is TFLOP/s."""
    if isinstance(text, (int, float)):
        return float(text) * 1e12
    t = text.strip().lower().replace("flop/s", "").replace("flops", "").replace("/s", "")
    m = re.fullmatch(_NUM + r"([kmgt]?)\s*", t)
    if not m:
        raise InvalidArgumentError(f"cannot read {text!r} as an arithmetic rate (examples: 20T, 500G)")
    scale = {"": 1e12, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}[m.group(2)]
    return float(m.group(1)) * scale


def fmt_bytes(n: float) -> str:
    n = float(n)
    for unit, size in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"


def fmt_rate(bps: float) -> str:
    return f"{bps / 1e9:.1f} GB/s" if bps >= 1e9 else f"{bps / 1e6:.0f} MB/s"


def fmt_layers(xs: list[int]) -> str:
    """[0, 1, 2, 4] -> '0-2,4' (layer numbers as ranges)."""
    out, start = [], None
    for i, x in enumerate(xs):
        if start is None:
            start = x
        if i + 1 == len(xs) or xs[i + 1] != x + 1:
            out.append(str(start) if start == x else f"{start}-{x}")
            start = None
    return ",".join(out)
