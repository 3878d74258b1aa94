"""Which stored result is an archive's (:func:`attn_course.results.own_result`)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from attn_course.results import ArchiveResult, own_result, result_name


def _write(folder: Path, name: str, archive: str, total: float) -> None:
    r = ArchiveResult(archive, "0" * 64, "fp", ["3.1"], scores={"3.1": total})
    (folder / name).write_text(json.dumps(asdict(r)))


def test_a_result_is_an_archives_only_where_it_names_it(tmp_path):
    a, b = Path("s/alice.zip"), Path("s/bob.zip")
    assert result_name(a) != result_name(b) and len(result_name(a)) == len("alice-.json") + 32
    # a file at a's name that says it is b's is not a's
    _write(tmp_path, result_name(a), "bob.zip", 1.0)
    assert own_result(tmp_path, a) is None


def test_results_of_the_earlier_8_digit_names_are_read_and_the_new_name_wins(tmp_path):
    a = Path("s/alice.zip")
    _write(tmp_path, result_name(a, 8), "alice.zip", 1.0)
    assert own_result(tmp_path, a).total == 1.0  # a folder graded before keeps its results
    _write(tmp_path, result_name(a), "alice.zip", 2.0)
    assert own_result(tmp_path, a).total == 2.0  # graded again since: that result
