"""benchmarks/bench_suite.py's CPU time per test (benchmarks/_cpu.py's CpuGroups) counts what a test starts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from attn_course import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
from _cpu import CpuGroups, own_group  # noqa: E402

SPIN = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3:\n    pass\n"


def test_a_tests_group_counts_the_processes_it_started_and_the_process_goes_back(tmp_path):
    home = own_group()
    groups = CpuGroups(str(tmp_path / "cpu"))
    try:
        groups.enter("spins")
        if not groups.groups:
            pytest.skip("no cgroup v1 cpuacct group can be made here")
        moved = own_group()  # (this process is in the test's group now)
        subprocess.run([sys.executable, "-S", "-c", SPIN], check=True)  # 0.3 CPU-s, in the group
        groups.enter("idles")
    finally:
        groups.finish()
    assert moved != home and own_group() == home
    (written,) = (tmp_path / "cpu").glob("*.json")
    seconds = json.loads(written.read_text())
    assert seconds["spins"] >= 0.3 > seconds["idles"], seconds
    assert not any(Path(g).exists() for _, g in groups.groups)  # empty groups are removed
