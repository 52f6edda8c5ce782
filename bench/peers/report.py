"""The comparison (ours / peer, pair by pair and best against best) and the report's tables."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.context import measured
from bench.markdown import table as markdown_table
from bench.peers.evaluation import SELECT_BY
from bench.peers.plan import PAIRS

HEADLINE = {"loo": ("ndcg@10", "hr@10"), "comirec": ("recall@50", "hitrate@50")}
"""Per protocol, the metrics a pair is compared on (the first picks the best model)."""


def time_to_reach(ours: Mapping[str, Any], peer: Mapping[str, Any]) -> dict[str, Any]:
    """Training time each side needs to reach the peer's best validation metric (NDCG@10 under
    ``loo``, Recall@50 under ``comirec``: :data:`SELECT_BY`).

    Returns:
        ``{"target", "peer_epoch", "peer_seconds", "ours_epoch", "ours_seconds", "ratio"}``;
        ``ours_epoch`` and the ratio are ``None`` when ours never reached it.
    """
    peer_curve, ours_curve = list(peer["validation_curve"]), list(ours["validation_curve"])
    target = max(peer_curve)
    peer_epoch = 1 + peer_curve.index(target)
    peer_seconds = peer["speed"]["cumulative_seconds"][peer_epoch - 1]
    reached = next((e for e, v in enumerate(ours_curve, 1) if v >= target), None)
    ours_seconds = None if reached is None else ours["speed"]["cumulative_seconds"][reached - 1]
    return {
        "target": target,
        "peer_epoch": peer_epoch,
        "peer_seconds": peer_seconds,
        "ours_epoch": reached,
        "ours_seconds": ours_seconds,
        "ratio": None if ours_seconds is None or not peer_seconds else round(ours_seconds / peer_seconds, 4),
    }


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or not b else round(a / b, 4)


def compare(results: Sequence[Mapping[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The one-to-one pairs (:data:`PAIRS`) and, per protocol, our best vs the best peer.

    Every ratio is ours / peer: above 1 is better for quality and throughput, below 1 for
    seconds and memory.
    """
    by = {(r["protocol"], r["side"], r["model"]): r for r in results}
    pairs = []
    for protocol, tower, peer_side, peer_model in PAIRS:
        ours, peer = by.get((protocol, "ours", tower)), by.get((protocol, peer_side, peer_model))
        if ours is None or peer is None:
            continue
        pairs.append(_pair(protocol, ours, peer))
    best = []
    for protocol, (key, _) in HEADLINE.items():
        ours_runs = [r for r in results if r["protocol"] == protocol and r["side"] == "ours"]
        peer_runs = [r for r in results if r["protocol"] == protocol and r["side"] != "ours"]
        if ours_runs and peer_runs:
            top_ours = max(ours_runs, key=lambda r: r["test"][key])
            top_peer = max(peer_runs, key=lambda r: r["test"][key])
            best.append(_pair(protocol, top_ours, top_peer))
    return pairs, best


def _pair(protocol: str, ours: Mapping[str, Any], peer: Mapping[str, Any]) -> dict[str, Any]:
    """Ratios ours / peer of one pair."""
    quality = {k: _ratio(ours["test"][k], peer["test"][k]) for k in HEADLINE[protocol]}
    return {
        "protocol": protocol,
        "ours": ours["run"],
        "peer": peer["run"],
        "quality": {k: (ours["test"][k], peer["test"][k]) for k in HEADLINE[protocol]},
        "quality_ratio": quality,
        "epoch_seconds_ratio": _ratio(
            ours["speed"]["median_epoch_seconds"], peer["speed"]["median_epoch_seconds"]
        ),
        "events_per_second_ratio": _ratio(
            ours["speed"]["events_per_second"], peer["speed"]["events_per_second"]
        ),
        "time_to_peer_best": time_to_reach(ours, peer),
        "peak_rss_ratio": _ratio(ours["process"]["peak_rss_mb"], peer["process"]["peak_rss_mb"]),
    }


def _f(value: Any, digits: int = 4) -> str:
    """A table cell."""
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


COLUMNS = {
    "loo": ("hr@10", "ndcg@10", "hr@20", "ndcg@20", "hr@50", "ndcg@50"),
    "comirec": ("recall@20", "hitrate@20", "recall@50", "hitrate@50", "ndcg@50"),
}
"""Per protocol, the test metrics of its table of runs."""
TITLES = {"loo": "Leave-one-out, full ranking", "comirec": "ComiRec protocol (users 8:1:1, 80% history)"}


def markdown(
    meta: Mapping[str, Any],
    results: Sequence[Mapping[str, Any]],
    pairs: Sequence[Mapping[str, Any]],
    best: Sequence[Mapping[str, Any]],
) -> str:
    """The report: the context, one table of runs per protocol, the pairs and the best of each side."""
    lines = _context(meta)
    for protocol in COLUMNS:
        rows = [r for r in results if r["protocol"] == protocol]
        if rows:
            lines += ["", f"### {TITLES[protocol]}", "", *_runs_table(rows, COLUMNS[protocol])]
    if pairs or best:
        lines += ["", "### Ours / peer", "", *_pairs_table(pairs, best)]
    checks = _checks(results)
    if checks:
        lines += ["", "Checks:", "", *checks]
    return "\n".join(lines) + "\n"


def _context(meta: Mapping[str, Any]) -> list[str]:
    """When, where, the command, and what every side shares."""
    sliced = f" (first {meta['max_users']} users)" if meta["max_users"] else ""
    budget = (
        f"{meta['epochs']} epoch(s)"
        if meta["epochs"] is not None
        else "our tower's epoch budget, its preset's (the pair's epochs column)"
    )
    ours = (
        "each tower starts from its preset for this dataset (`retrieval/training/presets.py`; the "
        "sizes and budget above replace the preset's)"
        if meta.get("presets", True)
        else "the defaults of `retrieval.training.Config` (`--no-presets`)"
    )
    overrides = f", then `--set {' '.join(meta['overrides'])}`." if meta.get("overrides") else "."
    return [
        *measured(meta),
        "",
        f"Data `{meta['data']}`{sliced}; every side: {budget}, batch {meta['batch_size']}, "
        f"d = {meta['dim']}, history {meta['max_len']}; scored at its best validation epoch (NDCG@10 "
        "under leave-one-out, Recall@50 under the ComiRec protocol), by our evaluator (exact full "
        "ranking, history excluded) on the same split. Seconds are training only (validation excluded).",
        "",
        f"Ours: {ours}{overrides}",
    ]


def _runs_table(rows: Sequence[Mapping[str, Any]], cols: Sequence[str]) -> list[str]:
    """One row per run: its test metrics, epochs, speed and memory."""
    head = ["side", "model", *cols, "best / epochs", "s / epoch", "examples / s", "events / s", "peak RSS MB"]
    body = []
    for r in rows:
        sp = r["speed"]
        cells = [r["side"], r["model"], *(_f(r["test"].get(c)) for c in cols)]
        budget = r.get("settings", {}).get("epochs")
        trained = f"{r.get('best_epoch')} / {r.get('epochs_trained')}"
        if budget and r.get("epochs_trained", budget) < budget:
            trained += f" of {budget}"
        cells += [trained, _f(sp["median_epoch_seconds"], 1)]
        cells += [_f(sp["examples_per_second"], 0), _f(sp["events_per_second"], 0)]
        cells.append(_f(r["process"]["peak_rss_mb"], 0))
        body.append(cells)
    return markdown_table(head, body)


def _pairs_table(pairs: Sequence[Mapping[str, Any]], best: Sequence[Mapping[str, Any]]) -> list[str]:
    """One row per pair (:func:`compare`), then the best of each side."""
    head = ["protocol", "ours", "peer", "quality (ours vs peer)", "s / epoch", "events / s",
            "time to peer's best validation metric", "peak RSS"]  # fmt: skip
    body = []
    for label, group in (("", pairs), ("best: ", best)):
        for p in group:
            quality = ", ".join(f"{k} {_f(a)} vs {_f(b)}" for k, (a, b) in p["quality"].items())
            cells = [p["protocol"], label + p["ours"], p["peer"], quality]
            cells += [f"{_f(p['epoch_seconds_ratio'], 2)}×", f"{_f(p['events_per_second_ratio'], 2)}×"]
            cells += [_reached(p), f"{_f(p['peak_rss_ratio'], 2)}×"]
            body.append(cells)
    return markdown_table(head, body)


def _reached(pair: Mapping[str, Any]) -> str:
    """The time-to-the-peer's-best cell: both sides' seconds and their ratio, or not reached."""
    reach = pair["time_to_peer_best"]
    target = f"{SELECT_BY[pair['protocol']]} {_f(reach['target'])}"
    peer_seconds = f"{_f(reach['peer_seconds'], 0)} s"
    if reach["ours_seconds"] is None:
        return f"not reached ({target} at {peer_seconds})"
    ours_seconds = f"{_f(reach['ours_seconds'], 0)} s"
    return f"{target}: {ours_seconds} vs {peer_seconds} = {_f(reach['ratio'], 2)}×"


def _checks(results: Sequence[Mapping[str, Any]]) -> list[str]:
    """RecBole's split against ours, our exported vectors against our training's metrics."""
    checks = [
        f"- `{r['run']}`: RecBole's split {'equals ours' if r['split_check']['equal'] else 'DIFFERS: '}"
        + "; ".join(r["split_check"]["problems"])
        for r in results
        if "split_check" in r
    ]
    checks += [
        f"- `{r['run']}` ({r['protocol']}): exported vectors reproduce training's test metrics "
        f"(max difference {r['check_exported_equals_training']['max_difference']:.2g})"
        for r in results
        if "check_exported_equals_training" in r
    ]
    return checks


def write_report(
    out: Path, meta: dict[str, Any], installs: Mapping[str, Any], results: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """Writes ``results.json`` and ``results.md`` (rewritten after every run)."""
    meta.setdefault("load_end", meta["load_start"])
    pairs, best = compare(results)
    report = {"meta": meta, "installs": dict(installs), "runs": list(results), "pairs": pairs, "best": best}
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(report, indent=2))
    (out / "results.md").write_text(markdown(meta, results, pairs, best))
    return report
