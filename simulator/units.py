"""SI units inside, human units at the edges.

Everything inside clusterplan is SI: seconds, bytes, bytes/s, FLOP/s. Specs may write quantities
as plain numbers (already SI) or as strings with a unit, which :func:`parse_quantity` converts:

>>> parse_bandwidth("200 Gb/s")          # bits, as NICs are sold
25000000000.0
>>> parse_bandwidth("600 GB/s")
600000000000.0
>>> parse_bytes("1GiB")
1073741824
>>> parse_time("1.5 us")
1.5e-06

Decimal prefixes are powers of 1000 and binary prefixes (Ki, Mi, Gi, Ti) powers of 1024, for
bytes and bandwidths alike; ``b`` is a bit and ``B`` a byte.
"""

from __future__ import annotations

import math
import re

from simulator.errors import SpecError

__all__ = [
    "KiB", "MiB", "GiB", "TiB", "KB", "MB", "GB", "TB",
    "parse_bytes", "parse_bandwidth", "parse_time", "parse_flops", "parse_quantity",
    "format_bytes", "format_time", "format_bandwidth",
]

KiB, MiB, GiB, TiB = 1024, 1024**2, 1024**3, 1024**4
KB, MB, GB, TB = 10**3, 10**6, 10**9, 10**12

_PREFIX = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
           "Ki": 1024.0, "Mi": 1024.0**2, "Gi": 1024.0**3, "Ti": 1024.0**4, "Pi": 1024.0**5}
_TIME = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9, "min": 60.0, "h": 3600.0,
         "d": 86400.0}
_NUM = r"\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*"
_RE = re.compile(_NUM + r"([A-Za-zµ/]*)\s*$")

_KIND_HELP = {
    "bytes": "a byte count such as 1073741824, '1GiB' or '64 MB'",
    "bandwidth": "a bandwidth in bytes/s such as 25e9, '200 Gb/s' or '600 GB/s'",
    "time": "a time in seconds such as 2e-6, '2 us' or '1.5ms'",
    "flops": "a rate in FLOP/s such as 312e12 or '312 TFLOP/s'",
}


def _split(value: object, kind: str, field: str | None) -> tuple[float, str]:
    if isinstance(value, bool):
        raise SpecError(f"expected {_KIND_HELP[kind]}, got {value!r}", field=field,
                        fix=f"write {_KIND_HELP[kind]}")
    if isinstance(value, (int, float)):
        return float(value), ""
    if isinstance(value, str):
        m = _RE.match(value)
        if m:
            return float(m.group(1)), m.group(2)
    raise SpecError(f"expected {_KIND_HELP[kind]}, got {value!r}", field=field,
                    fix=f"write {_KIND_HELP[kind]}")


def _bad_unit(value: object, kind: str, field: str | None) -> SpecError:
    return SpecError(f"unknown unit in {value!r}", field=field, fix=f"write {_KIND_HELP[kind]}")


def _check(x: float, value: object, kind: str, field: str | None, *, allow_zero: bool) -> float:
    if not math.isfinite(x) or x < 0 or (x == 0 and not allow_zero):
        need = "non-negative" if allow_zero else "positive"
        raise SpecError(f"{kind} must be {need} and finite, got {value!r}", field=field,
                        fix=f"write {_KIND_HELP[kind]}")
    return x


def parse_bytes(value: object, *, field: str | None = None, allow_zero: bool = True) -> int:
    """Bytes from a number or a string like ``'1GiB'``, ``'64 MB'``, ``'8 Gb'`` (bits)."""
    x, unit = _split(value, "bytes", field)
    if unit:
        m = re.fullmatch(r"(Ki|Mi|Gi|Ti|Pi|k|K|M|G|T|P|)([Bb])", unit)
        if not m:
            raise _bad_unit(value, "bytes", field)
        x *= _PREFIX[m.group(1)] / (8.0 if m.group(2) == "b" else 1.0)
    n = int(round(_check(x, value, "bytes", field, allow_zero=allow_zero)))
    if n == 0 and x > 0:
        raise SpecError(f"{value!r} is less than one byte", field=field,
                        fix="give a size of at least 1 byte, e.g. 4096 or 64KiB")
    return n


def parse_bandwidth(value: object, *, field: str | None = None, allow_zero: bool = False) -> float:
    """Bytes/s from a number (bytes/s) or ``'200 Gb/s'``, ``'200Gbps'``, ``'600 GB/s'``."""
    x, unit = _split(value, "bandwidth", field)
    if unit:
        m = re.fullmatch(r"(Ki|Mi|Gi|Ti|Pi|k|K|M|G|T|P|)(B/s|b/s|bps|Bps)", unit)
        if not m:
            raise _bad_unit(value, "bandwidth", field)
        bits = m.group(2) in ("b/s", "bps")
        x *= _PREFIX[m.group(1)] / (8.0 if bits else 1.0)
    return _check(x, value, "bandwidth", field, allow_zero=allow_zero)


def parse_time(value: object, *, field: str | None = None) -> float:
    """Seconds from a number (seconds) or ``'2 us'``, ``'1.5ms'``, ``'30 ns'``."""
    x, unit = _split(value, "time", field)
    if unit:
        if unit not in _TIME:
            raise _bad_unit(value, "time", field)
        x *= _TIME[unit]
    return _check(x, value, "time", field, allow_zero=True)


def parse_flops(value: object, *, field: str | None = None) -> float:
    """FLOP/s from a number or ``'312 TFLOP/s'`` / ``'312 TFLOPS'``."""
    x, unit = _split(value, "flops", field)
    if unit:
        m = re.fullmatch(r"(k|K|M|G|T|P|E|)(FLOP/s|FLOPS|flop/s|flops)", unit)
        if not m:
            raise _bad_unit(value, "flops", field)
        x *= _PREFIX[m.group(1)]
    return _check(x, value, "flops", field, allow_zero=False)


def parse_quantity(value: object, kind: str, *, field: str | None = None) -> float:
    """Dispatch on ``kind`` in {bytes, bandwidth, time, flops}."""
    return {"bytes": parse_bytes, "bandwidth": parse_bandwidth, "time": parse_time,
            "flops": parse_flops}[kind](value, field=field)


def format_bytes(n: float) -> str:
    """``1073741824`` → ``'1.00 GiB'`` (binary prefixes)."""
    for unit, scale in (("TiB", TiB), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def format_time(t: float) -> str:
    """Seconds in the most readable unit: ``0.00123`` → ``'1.230 ms'``, ``7200`` → ``'2.0 h'``."""
    a = abs(t)
    if a >= 2 * 86400:
        return f"{t / 86400:.1f} d"
    if a >= 2 * 3600:
        return f"{t / 3600:.1f} h"
    if a >= 600:
        return f"{t / 60:.1f} min"
    if a >= 1 or a == 0:
        return f"{t:.3f} s"
    if a >= 1e-3:
        return f"{t * 1e3:.3f} ms"
    if a >= 1e-6:
        return f"{t * 1e6:.3f} µs"
    return f"{t * 1e9:.1f} ns"


def format_bandwidth(bps: float) -> str:
    """Bytes/s as decimal GB/s (the unit nccl-tests prints)."""
    return f"{bps / 1e9:.2f} GB/s"
