"""The job's seccomp filter (attn_course.seccomp), read instruction by instruction.

A small interpreter of the classic BPF the filter uses runs it on every
call it lists and on calls every job makes, for both architectures (aarch64
is not run here otherwise); the numbers are compared with the kernel's own
headers where this machine has them (Debian's ``linux-libc-dev``).  That
the installed filter refuses them in a real job is
``test_redteam_kernel.py``'s.  Last, the probe that tells the grader whether
this machine's jobs get the filter at all (its warning where they do not).
"""

from __future__ import annotations

import errno
import re
import struct
from pathlib import Path

import pytest

from attn_course import seccomp
from attn_course.seccomp import ARCHES, CALLS, CLONE, CLONE3, NAMESPACE_FLAGS, X32_BIT, program

ALLOW, REFUSE, NOSYS = 0x7FFF0000, 0x00050000 | errno.EPERM, 0x00050000 | errno.ENOSYS
# calls that every job makes (read, write, openat, mmap, clone, futex, exit_group), by architecture
EVERYDAY = {"x86_64": (0, 1, 257, 9, 56, 202, 231), "aarch64": (63, 64, 56, 222, 220, 98, 94)}
HEADERS = {"x86_64": Path("/usr/include/x86_64-linux-gnu/asm/unistd_64.h"),
           "aarch64": Path("/usr/include/asm-generic/unistd.h")}


def run(prog: bytes, arch: int, nr: int, arg0: int = 0) -> int:
    """What the filter answers for call ``nr`` of the convention ``arch`` with first argument
    ``arg0`` (seccomp_data: nr, arch, instruction pointer, args)."""
    data = struct.pack("<iIQQ", nr, arch, 0, arg0) + bytes(40)
    insns = [struct.unpack_from("HBBI", prog, 8 * i) for i in range(len(prog) // 8)]
    pc, acc = 0, 0
    for _ in range(len(insns)):  # every jump is forward: at most one pass
        code, jt, jf, k = insns[pc]
        if code == 0x20:  # ld [k]
            acc = struct.unpack_from("I", data, k)[0]
            pc += 1
        elif code == 0x15:  # jeq #k
            pc += 1 + (jt if acc == k else jf)
        elif code == 0x35:  # jge #k
            pc += 1 + (jt if acc >= k else jf)
        elif code == 0x45:  # jset #k
            pc += 1 + (jt if acc & k else jf)
        elif code == 0x06:  # ret #k
            return k
        else:
            raise AssertionError(f"instruction {code:#x} at {pc}")
    raise AssertionError("the filter ran off its end")


@pytest.mark.parametrize("arch", sorted(ARCHES))
def test_the_listed_calls_are_refused_and_a_jobs_calls_are_not(arch):
    audit, column = ARCHES[arch]
    prog = program(arch)
    for name, numbers in CALLS.items():
        assert run(prog, audit, numbers[column]) == REFUSE, name
    for nr in EVERYDAY[arch]:
        assert run(prog, audit, nr) == ALLOW, nr
    refused = {numbers[column] for numbers in CALLS.values()}
    assert [nr for nr in range(460) if run(prog, audit, nr) == REFUSE] == sorted(refused)


@pytest.mark.parametrize("arch", sorted(ARCHES))
def test_clone_makes_no_namespace_and_clone3_is_not_there(arch):
    """What unshare would do, by clone's flags: refused; a fork's or a thread's flags are not."""
    audit, column = ARCHES[arch]
    prog = program(arch)
    fork, thread = 17, 0x3D0F00  # SIGCHLD; glibc's pthread_create flags (CLONE_VM | FS | FILES | ...)
    assert run(prog, audit, CLONE[column], fork) == ALLOW
    assert run(prog, audit, CLONE[column], thread) == ALLOW
    for bit in range(32):
        if NAMESPACE_FLAGS >> bit & 1:
            assert run(prog, audit, CLONE[column], fork | 1 << bit) == REFUSE, hex(1 << bit)
    assert NAMESPACE_FLAGS == 0x10000000 | 0x40000000 | 0x00020000 | 0x20000000 | 0x08000000 | 0x04000000 | 0x02000000
    assert run(prog, audit, CLONE3[column]) == NOSYS  # the C library then uses clone


@pytest.mark.parametrize("arch", sorted(ARCHES))
def test_another_conventions_calls_are_refused_whatever_their_number(arch):
    audit, _ = ARCHES[arch]
    prog = program(arch)
    for other in (0x40000003, 0x40000028, 0xC0000028, 0):  # i386, arm, riscv-ish and nonsense
        for nr in (0, 20, 39, 172):
            assert run(prog, other, nr) == REFUSE, (hex(other), nr)
    if arch == "x86_64":  # x32: the native convention, with a bit set in the number
        assert run(prog, audit, X32_BIT | 39) == REFUSE


@pytest.mark.parametrize("arch", sorted(ARCHES))
def test_the_numbers_are_the_kernels(arch):
    header = HEADERS[arch]
    if not header.exists():
        pytest.skip(f"no {header} here (Debian's linux-libc-dev)")
    known = {m.group(1): int(m.group(2))
             for m in re.finditer(r"#define __NR(?:3264)?_(\w+)\s+(\d+)", header.read_text())}
    _, column = ARCHES[arch]
    assert {name: numbers[column] for name, numbers in CALLS.items()} == {name: known[name] for name in CALLS}
    assert (CLONE[column], CLONE3[column]) == (known["clone"], known["clone3"])


# -- whether this machine's jobs get the filter: the grader's warning (seccomp.filter_problem) ----------

def test_this_machine_takes_the_filter_and_it_refuses_a_listed_call():
    """Linux on x86-64 or aarch64 (CI's): a child installs the filter and is refused ``unshare``."""
    import platform
    import sys

    if not sys.platform.startswith("linux") or platform.machine() not in ARCHES:
        pytest.skip(f"no filter for {sys.platform} on {platform.machine()}")
    assert seccomp.filter_problem() is None


def test_a_probe_whose_filter_refuses_nothing_says_so():
    """The probe checks the refusal itself: a filter that was said to be installed but was not
    (here: the install replaced by a no-op) is exit status 4, not a filter that works."""
    import subprocess
    import sys

    code = ("import attn_course.seccomp as s\n"
            "s.refuse_kernel_calls = lambda libc=None: True\n"
            "raise SystemExit(s._probe())\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 4, r.stderr
    assert "still answered" in seccomp._PROBE_PROBLEMS[4]


@pytest.mark.parametrize(("system", "machine", "expect"), [
    ("darwin", "arm64", "not Linux (darwin)"),
    ("linux", "s390x", "no filter for this processor (s390x); known: aarch64, x86_64"),
])
def test_a_system_without_the_filter_is_named(monkeypatch, system, machine, expect):
    import platform
    import sys

    monkeypatch.setattr(sys, "platform", system)
    monkeypatch.setattr(platform, "machine", lambda: machine)
    assert seccomp.filter_problem().startswith(expect)


@pytest.mark.parametrize(("status", "expect"), [(3, "the kernel did not take the filter"),
                                                (4, "still answered a call"),
                                                (1, "the probe of the filter failed (exit status 1)"),
                                                (9, "exit status 9")])
def test_a_failed_probe_is_named_by_what_it_found(monkeypatch, tmp_path, status, expect):
    """The probe's child (here a stand-in for the interpreter that exits as the probe would);
    Python's own failure (an exception: status 1) is not taken for a verdict on the filter."""
    import platform
    import sys

    if not sys.platform.startswith("linux") or platform.machine() not in ARCHES:
        pytest.skip("the probe's child runs only where a filter is known")
    stand_in = tmp_path / "python"
    stand_in.write_text(f"#!/bin/sh\nexit {status}\n")
    stand_in.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(stand_in))
    problem = seccomp.filter_problem()
    assert problem is not None and expect in problem, problem
    assert problem in seccomp.unfiltered_warning(problem)
