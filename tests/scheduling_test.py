"""The test files that the suite's scheduler (conftest.py) names exist: a renamed or moved file would otherwise
leave the heavy unit or the light files that start first, without a word."""

from __future__ import annotations

from pathlib import Path

from conftest import FIRST_LIGHT_FILES, HEAVY_TEST_FILES

ROOT = Path(__file__).resolve().parents[1]


def test_the_files_conftest_schedules_exist_and_are_named_once() -> None:
    named = [*HEAVY_TEST_FILES, *FIRST_LIGHT_FILES]
    assert [path for path in named if not (ROOT / path).is_file()] == []
    assert len(set(named)) == len(named)
