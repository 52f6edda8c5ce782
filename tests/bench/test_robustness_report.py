"""The robustness runs' report: a row per case and the exit code."""

from __future__ import annotations

import time

from bench.robustness.deploys import Case, report_cases


def test_a_row_per_case_and_exit_code_1_when_one_failed(capsys) -> None:
    cases = [Case("first", "3 refused", True), Case("second", "1 served", False)]
    assert report_cases(cases, time.monotonic()) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[2:4] == ["| first | 3 refused | yes |", "| second | 1 served | NO |"]
    assert lines[4].startswith("1/2 passed in ")


def test_exit_code_0_when_every_case_passed(capsys) -> None:
    assert report_cases([Case("only", "ok", True)], time.monotonic()) == 0
    assert "1/1 passed" in capsys.readouterr().out
