"""Numbers as people read them in tables, warnings and reasons: never in scientific notation."""

from __future__ import annotations


def number(x: float, figures: int = 3) -> str:
    """Whole from 100 (thousands separated: 22,260 tokens/s, 1,575 ms), else `figures`
    significant figures (22.75 ms, 0.0417)."""
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.{figures}g}"


def gigabytes(x: float) -> str:
    """GB as `number` says them, a few kilobytes `<0.001` (activations freed by the update)."""
    return "<0.001" if 0 < x < 1e-3 else number(x)


def plural(n: int, thing: str) -> str:
    """`n` `thing`s, in English: 1 micro-batch, 4 micro-batches."""
    return f"{n:,} {thing}" + ("" if n == 1 else "es" if thing.endswith("h") else "s")


def count(n: int) -> str:
    """A count as model cards write it: 6.74B, 416M, 12.3k, 330 (three figures)."""
    for size, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= size * 0.9995:
            return f"{n / size:.3g}{unit}"
    return str(n)


def hours(x: float) -> str:
    """Hours: `number`'s, under 3.6 s <0.001, beyond a thousand years >10,000,000."""
    return ">10,000,000" if x > 1e7 else number(x) if x >= 1e-3 else "<0.001"


def span(lo: float, hi: float, num=number) -> str:
    """A band as `num` writes its ends: 544-708; one end where both read alike (>10,000,000)."""
    a, b = num(lo), num(hi)
    return a if a == b else f"{a}-{b}"


def percent(x: float) -> str:
    """A share: whole percents from 10%, else two figures (a launch-bound step's MFU is 0.34%,
    not 0%)."""
    return f"{x:.0%}" if x >= 0.095 else f"{100 * x:#.2g}%" if x > 0 else "0%"
