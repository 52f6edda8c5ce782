"""A soak's figures: per window of the run and in total, its checks, and its table."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

RSS_GROWTH_LIMIT = 0.05
"""The issue's bound on the server's resident memory growth over a soak (end against start)."""


@dataclass
class SoakTrace:
    """What a paced run saw.

    Attributes:
        calls: one ``(due, sent, latency, status name, model version)`` per request; times in
            seconds from the start of the run, ``due`` when the schedule wanted it sent.
        rss: ``(seconds, KiB)`` samples of the server's resident memory.
        deploy: the reload's start and end times, exit code and output.
        seconds: the run's length.
    """

    calls: list[tuple[float, float, float, str, str]] = field(default_factory=list)
    rss: list[tuple[float, int]] = field(default_factory=list)
    deploy: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0


def _ms(values: np.ndarray, q: float) -> float:
    """The ``q``-th percentile of ``values`` (seconds) in milliseconds; NaN when there are none."""
    return round(float(np.percentile(values, q)) * 1000, 2) if len(values) else float("nan")


def _max_ms(values: np.ndarray) -> float:
    return round(float(values.max()) * 1000, 2) if len(values) else float("nan")


@dataclass(frozen=True)
class _Calls:
    """A trace's calls as columns: float seconds ``[N]`` and per-call lists."""

    due: np.ndarray
    sent: np.ndarray
    latency: np.ndarray
    codes: list[str]
    versions: list[str]

    @classmethod
    def of(cls, trace: SoakTrace) -> _Calls:
        due, sent, latency, codes, versions = zip(*trace.calls, strict=True) if trace.calls else [()] * 5
        seconds = [np.array(c, np.float64) for c in (due, sent, latency)]
        return cls(seconds[0], seconds[1], seconds[2], list(codes), list(versions))


def summarise_soak(
    trace: SoakTrace, old: str, new: str, windows: int, rss_limit: float = RSS_GROWTH_LIMIT
) -> dict[str, Any]:
    """Per-window and whole-run figures of a soak, and its checks.

    Windows split the run by when calls were due; a window's RSS is the last sample in it.
    The swap is the first call answered by ``new``. The rate is held when the calls answered
    within the run are at least 95% of those it scheduled (a server that cannot keep up makes
    the send lag grow instead).
    """
    calls = _Calls.of(trace)
    lag = calls.sent - calls.due
    rows = _windows(trace, calls, windows)
    swap = _swap(calls, old, new)
    rss_start, rss_end = trace.rss[0][1], trace.rss[-1][1]
    errors = Counter(c for c in calls.codes if c != "OK")
    growth = rss_end / rss_start - 1
    answered = float(np.sum(calls.sent + calls.latency < trace.seconds))
    summary = {
        "requests": len(trace.calls),
        "errors": sum(errors.values()),
        "errors_by_status": dict(errors),
        "scheduled_qps": round(len(trace.calls) / trace.seconds, 1),
        "qps": round(answered / trace.seconds, 1),
        "p50_ms": _ms(calls.latency, 50),
        "p99_ms": _ms(calls.latency, 99),
        "max_ms": _max_ms(calls.latency),
        "send_lag_p99_ms": _ms(lag, 99),
        "send_lag_max_ms": _max_ms(lag),
        "old_version": old,
        "new_version": new,
        **swap,
        "rss_start_mb": round(rss_start / 1024, 1),
        "rss_end_mb": round(rss_end / 1024, 1),
        "rss_max_mb": round(max(kb for _, kb in trace.rss) / 1024, 1),
        "rss_growth": round(growth, 4),
        "windows": rows,
    }
    summary["checks"] = {
        "no_errors": not errors,
        "deploy_ok": trace.deploy.get("returncode") == 0,
        "swapped": swap["swap_at_s"] is not None and set(rows[-1]["versions"]) == {new},
        "only_old_before_swap": set(swap["versions_before_swap"]) <= {old},
        "rss_growth_ok": growth < rss_limit,
        "rate_held": answered >= 0.95 * len(trace.calls),
    }
    return summary


def _windows(trace: SoakTrace, calls: _Calls, windows: int) -> list[dict[str, Any]]:
    """One row per window of the run (by when calls were due): requests, errors, latency, send
    lag, the versions that answered, the last RSS sample."""
    width = trace.seconds / windows
    rows: list[dict[str, Any]] = []
    for w in range(windows):
        inside = np.flatnonzero((calls.due >= w * width) & (calls.due < (w + 1) * width))
        rss_in = [kb for t, kb in trace.rss if t < (w + 1) * width]
        ok = [i for i in inside if calls.codes[i] == "OK"]
        rows.append(
            {
                "from_s": round(w * width, 1),
                "to_s": round((w + 1) * width, 1),
                "requests": len(inside),
                "errors": len(inside) - len(ok),
                "p50_ms": _ms(calls.latency[inside], 50),
                "p99_ms": _ms(calls.latency[inside], 99),
                "max_ms": _max_ms(calls.latency[inside]),
                "send_lag_p99_ms": _ms(calls.sent[inside] - calls.due[inside], 99),
                "versions": dict(Counter(calls.versions[i] for i in ok)),
                "rss_mb": round(rss_in[-1] / 1024, 1) if rss_in else None,
            }
        )
    return rows


def _swap(calls: _Calls, old: str, new: str) -> dict[str, Any]:
    """When ``new`` first answered, the last answer of ``old``, and the versions that answered the
    calls sent before and after the swap."""
    answered_new = calls.sent[[v == new for v in calls.versions]]
    swap_s = float(answered_new.min()) if len(answered_new) else None
    before: Counter[str] = Counter()
    after: Counter[str] = Counter()
    for sent, version, code in zip(calls.sent, calls.versions, calls.codes, strict=True):
        if code == "OK":
            (before if swap_s is None or sent < swap_s else after)[version] += 1
    olds = [float(s) for s, v in zip(calls.sent, calls.versions, strict=True) if v == old]
    return {
        "swap_at_s": None if swap_s is None else round(swap_s, 3),
        "last_old_answer_at_s": round(max(olds), 3) if olds else None,
        "versions_before_swap": dict(before),
        "versions_after_swap": dict(after),
    }


def soak_table(result: dict[str, Any]) -> str:
    """The soak's result as Markdown: one row per window, then the totals and checks."""
    lines = [
        f"soak {result['seconds']:.0f} s, {result['engine']} engine, at {result['target_qps']:.0f} QPS "
        f"({result['load_fraction']:.0%} of the {result['probe']['qps']:.0f} QPS measured at concurrency "
        f"{result['probe']['concurrency']}, p99 {result['probe']['p99_ms']} ms); reload at "
        f"{result['deploy'].get('start_s')} s, first answer of the new version at {result['swap_at_s']} s; "
        f"{result['date']}, load average {', '.join(f'{x:.1f}' for x in result['load_average'])}",
        "",
        "| window s | requests | errors | p50 ms | p99 ms | max ms | send lag p99 ms | versions | RSS MB |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    short = {result["old_version"]: "old", result["new_version"]: "new"}
    for r in result["windows"]:
        versions = ", ".join(
            f"{short.get(v, v)} {n}"
            for v, n in sorted(r["versions"].items(), key=lambda x: short.get(x[0], x[0]), reverse=True)
        )
        lines.append(
            f"| {r['from_s']:g}-{r['to_s']:g} | {r['requests']} | {r['errors']} | {r['p50_ms']} | "
            f"{r['p99_ms']} | {r['max_ms']} | {r['send_lag_p99_ms']} | {versions} | {r['rss_mb']} |"
        )
    checks = result["checks"]
    lines += [
        "",
        f"requests {result['requests']:,} ({result['scheduled_qps']:.0f}/s scheduled, "
        f"{result['qps']:.0f}/s answered within the run), errors {result['errors']} "
        f"{result['errors_by_status'] or ''}; p50 {result['p50_ms']} ms, p99 {result['p99_ms']} ms, "
        f"max {result['max_ms']} ms; send lag p99 {result['send_lag_p99_ms']} ms, max "
        f"{result['send_lag_max_ms']} ms",
        f"versions before the swap {result['versions_before_swap']}, after {result['versions_after_swap']} "
        f"(old {result['old_version']}, new {result['new_version']}; last old answer at "
        f"{result['last_old_answer_at_s']} s)",
        f"server RSS {result['rss_start_mb']} MB at start, {result['rss_end_mb']} MB at end "
        f"({result['rss_growth']:+.2%}), max {result['rss_max_mb']} MB",
        "checks: " + ", ".join(f"{k} {'ok' if v else 'FAILED'}" for k, v in checks.items()),
    ]
    return "\n".join(lines)
