"""``bench.ingest``: the synthetic log it writes, and one measured read by each reader."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from bench.ingest import READERS, main, measure, write_log


def test_the_log_has_the_rows_users_items_and_ordered_times_it_says(tmp_path: Path) -> None:
    path = tmp_path / "log.csv"
    write_log(path, 2000)
    with path.open(newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["uid", "product_id", "ts"]
    users, items, times = zip(*rows[1:], strict=True)
    assert len(times) == 2000
    assert all(u.startswith("c") and int(u[1:]) < 100 for u in users)  # 2000 // 20 users
    assert all(i.startswith("p") and int(i[1:]) < 400 for i in items)  # 2000 // 5 items
    assert [int(t) for t in times] == sorted(int(t) for t in times)


def test_each_reader_reads_every_row_in_a_child_and_reports_its_memory(tmp_path: Path) -> None:
    path = tmp_path / "log.csv"
    write_log(path, 3000)
    for reader in READERS:
        result = measure(reader, path)
        assert result["rows"] == 3000
        assert 0 < result["seconds"] < 60
        assert 0 < result["before_mib"] <= result["peak_mib"]


def test_a_failing_reader_is_an_error_not_a_number(tmp_path: Path) -> None:
    path = tmp_path / "log.csv"
    path.write_text("uid,product_id\nc1,p1\n")  # no ts column: load_interactions refuses it
    with pytest.raises(RuntimeError, match="load_interactions failed"):
        measure("load_interactions", path)


def test_the_report_is_a_table_of_both_readers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    main(["--rows", "1000", "--repeats", "1", "--dir", str(tmp_path)])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| 1,000 |")]
    assert [row.split(" | ")[2] for row in rows] == [f"`{reader}`" for reader in READERS]
    assert rows[0].split(" | ")[4] == "1.0"  # read_csv against itself
    assert list(tmp_path.iterdir()) == []  # the file is removed
