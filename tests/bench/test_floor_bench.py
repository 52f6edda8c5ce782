"""bench/floor.py's accounting: stages are the profiler's cumulative times of their functions,
the FAISS search is taken out of the merge stage, and "other" is what no stage covers."""

from __future__ import annotations

from bench.floor import STAGES, cumulative, stages, table


def test_cumulative_matches_files_functions_and_builtins() -> None:
    stats = {
        ("/x/index/faiss_index.py", 10, "_raw_search"): (1, 1, 0.1, 2.0, {}),
        ("/x/other/faiss_index.py.bak", 10, "_raw_search"): (1, 1, 0.1, 5.0, {}),
        ("~", 0, "<method 'SerializeToString' of 'Message' objects>"): (3, 3, 0.5, 0.5, {}),
        ("~", 0, "<built-in method FromString>"): (1, 1, 0.25, 0.25, {}),
    }
    assert cumulative(stats, "index/faiss_index.py", "_raw_search") == 2.0
    assert cumulative(stats, "~", "SerializeToString") == 0.5
    assert cumulative(stats, "~", "_raw_search") == 0.0


def test_time_outside_every_stage_is_other() -> None:
    def answer(start: int) -> None:
        sum(range(20_000))

    ms = stages(answer, batch=2, requests_=10)
    assert set(ms) == {*STAGES, "other", "total"}
    assert all(ms[s] == 0 for s in STAGES)
    assert ms["other"] == ms["total"] > 0
    rows = [{"batch": 2, "floor_ms": 1.0, "profiled_ms": ms}]
    text = table({"rows": rows})
    assert "| other | " in text and "(100%)" in text and "**1.000**" in text
