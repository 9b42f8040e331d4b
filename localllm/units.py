"""Units for people: sizes in binary units, parameter counts."""

from __future__ import annotations


def format_params(n: int) -> str:
    """135_000_000 -> '135M'."""
    for unit, size in (("T", 10**12), ("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if n >= size:
            value = n / size
            return f"{value:.1f}{unit}" if value < 10 else f"{value:.0f}{unit}"
    return str(n)


def format_bytes(n: int) -> str:
    """Bytes in binary units, one decimal: 98.4 MiB."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"
