"""The fake engine's adapter latency report (tests/fake_engine/fake_engine.py): every adapter call both
engines made, by kind, as p50, p99 and the maximum; the run fails when the p99 of all calls
exceeds P99_LIMIT_S (a check of the run, not a unit test: it depends on the machine)."""

from __future__ import annotations

from typing import Any

P99_LIMIT_S = 0.005


def _q(xs: list[float], q: float) -> float:
    """The q-quantile (nearest rank) of sorted ``xs``."""
    return xs[min(len(xs) - 1, max(0, int(round(q * len(xs) + 0.5)) - 1))] if xs else 0.0


def summarize(results: dict[str, Any]) -> dict[str, dict[str, float]]:
    """{kind: {n, p50, p99, max}} over every phase and side, plus "all" and "all prefill",
    "all decode"."""
    by: dict[str, list[float]] = {}
    sides: dict[str, list[float]] = {}
    for ph in results.values():
        for side in ("prefill", "decode"):
            for kind, xs in ph.get(side, {}).get("calls", {}).items():
                by.setdefault(kind, []).extend(xs)
                sides.setdefault(f"all {side}", []).extend(xs)
    by["all"] = [x for xs in list(by.values()) for x in xs]
    by.update(sides)
    out = {}
    for kind, xs in by.items():
        xs = sorted(xs)
        out[kind] = {"n": len(xs), "p50": _q(xs, 0.5), "p99": _q(xs, 0.99),
                     "max": xs[-1] if xs else 0.0}
    return out


def latency_lines(lat: dict[str, dict[str, float]], limit_ms: float) -> list[str]:
    limit = f"the p99 of all calls <= {limit_ms:g} ms" if limit_ms > 0 else "none (--ci)"
    lines = [f"adapter call latency, ms (limit: {limit}):"]
    for kind in sorted(lat, key=lambda k: (k.startswith("all"), k != "all", -lat[k]["n"])):
        s = lat[kind]
        lines.append(f"  {kind:<26} n={s['n']:<7} p50 {s['p50'] * 1e3:7.3f}  p99 "
                     f"{s['p99'] * 1e3:7.3f}  max {s['max'] * 1e3:8.3f}")
    return lines
