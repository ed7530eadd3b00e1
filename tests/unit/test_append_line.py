"""``append_line``: whole lines appended in order, the folder made when it is missing (once:
later lines open the file directly)."""

from __future__ import annotations

from pathlib import Path

import pytest

from difftest.records.atomic import append_line


def test_lines_are_appended_in_order_and_missing_folders_are_made(tmp_path: Path) -> None:
    log = tmp_path / "a" / "b" / "log.jsonl"
    append_line(log, '{"n":1}')
    append_line(log, '{"n":2}', durable=True)
    append_line(log, "third")
    assert log.read_text() == '{"n":1}\n{"n":2}\nthird\n'


def test_a_folder_removed_between_lines_is_made_again(tmp_path: Path) -> None:
    log = tmp_path / "run" / "log.jsonl"
    append_line(log, "one")
    log.unlink()
    log.parent.rmdir()
    append_line(log, "two")
    assert log.read_text() == "two\n"


def test_a_line_with_a_newline_is_refused(tmp_path: Path) -> None:
    with pytest.raises(AssertionError):
        append_line(tmp_path / "log", "two\nlines")
