"""A worker server that does not start is the grader's problem, never a submission's score.

Found by grading as a user other than root with a Python environment whose
packages the sandbox could not see: every server's start failed (``No
module named 'numpy'``), every exercise of every archive became "the worker
could not start", and each student was written down with 0 points -- final
results, which a second run skipped as graded.  Now the reason is read back
from the server's start, no archive is scored when not one server starts,
and an archive whose server does not start is left ungraded (retried on
the next run) with the reason, and the command fails.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from attn_course import ROOT
from attn_course.archive import build_archive, library_files
from attn_course.identity import token_for
from attn_course.registry import all_exercises
from attn_course.runner import run_worker
from attn_course.sandbox import Limits
from attn_course.server import StartError, WorkerServer

SECRET = "start-secret"
WHY = "ModuleNotFoundError: No module named 'numpy'"


class Failing:
    """A sandbox whose server fails as it starts, writing ``stderr`` (a Python expression) first."""

    kind = "failing"
    keeps_stopped_servers = True

    def __init__(self, stderr: str):
        self.argv = [sys.executable, "-c", f"import sys; sys.stderr.write({stderr}); sys.exit(1)"]
        self.starts = 0

    def server_command(self):
        self.starts += 1
        return self.argv, None

    def cleanup(self):
        pass

    def close(self):
        pass

    def processes_refused(self):
        return 0

    def memory_kills(self):
        return 0


def _failing(stderr: str = repr(f"Traceback (most recent call last):\n  ...\n{WHY}\n")) -> Failing:
    return Failing(stderr)


def test_a_server_that_does_not_start_says_why():
    server = WorkerServer(_failing())
    with pytest.raises(StartError) as err:
        server.start()
    assert err.value.reason == WHY
    assert str(err.value) == f"the worker server did not start: {WHY}"
    server.close()


def test_what_a_start_wrote_is_read_back_bounded_and_printable():
    """Only its end, one line, at most 300 characters, with no terminal escapes."""
    server = WorkerServer(_failing("'x' * 10**6 + '\\n\\x1b[2J\\x1b]0;owned\\x07' + 'y' * 5000 + '\\n\\n'"))
    with pytest.raises(StartError) as err:
        server.start()
    reason = err.value.reason
    assert 0 < len(reason) <= 300 and "y" in reason and "xxx" not in reason
    assert reason.isprintable(), repr(reason)
    server.close()


def test_the_runner_scores_nothing_when_the_archives_first_job_finds_no_server():
    ex = all_exercises()["3.5"]
    server = WorkerServer(_failing())
    with pytest.raises(StartError):
        run_worker(server, {}, [(ex, ex.make_cases(False))], Limits(), start_errors=True)
    # a student's check (and a later job of the archive): every exercise fails, with the reason
    out = run_worker(server, {}, [(ex, ex.make_cases(False))], Limits())
    assert [o.status for o in out["3.5"]] == ["crashed"] and WHY in out["3.5"][0].message, out
    server.close()


class DiesThenFails(Failing):
    """Starts once (and dies in its first job), then never starts again."""

    def __init__(self, marker):
        code = (f"import os, sys\nif os.path.exists({str(marker)!r}):\n"
                f"    sys.stderr.write({WHY!r} + '\\n'); sys.exit(1)\n"
                f"open({str(marker)!r}, 'w').close()\n"
                "sys.stdout.write('{\"ready\": true}\\n'); sys.stdout.flush()\n"
                "sys.stdin.readline(); sys.exit(3)\n")
        self.argv, self.starts = [sys.executable, "-c", code], 0


def test_a_server_that_does_not_start_after_the_archives_own_job_crashed_it_is_a_crash(tmp_path):
    """Only a start before any of the archive's jobs is the grader's problem: after a job of the
    archive killed its server, a server that does not start costs the exercises still to run."""
    ex = all_exercises()
    items = [(ex[i], ex[i].make_cases(False)) for i in ("3.2", "3.5")]
    server = WorkerServer(DiesThenFails(tmp_path / "started"))
    try:
        out = run_worker(server, {}, items, Limits(), start_errors=True)
    finally:
        server.close()
    assert set(out) == {"3.2", "3.5"}
    assert all(o.status == "crashed" for outs in out.values() for o in outs), out


def _class(folder):
    folder.mkdir()
    ref = library_files(ROOT)
    for sid in ("ada", "bob"):
        build_archive(folder / f"{sid}.zip", sid, ref, token=token_for(sid, SECRET))


def test_no_archive_is_scored_when_no_worker_server_starts(tmp_path, monkeypatch, capsys):
    from attn_course import grade
    from attn_course.cli import main

    monkeypatch.setenv("ATTN_COURSE_SECRET", SECRET)
    monkeypatch.setattr(grade, "confinement", lambda *a, **k: _failing())
    _class(tmp_path / "subs")
    out = tmp_path / "grading"
    rc = main(["grade", str(tmp_path / "subs"), "--out", str(out), "--exercises", "3.5", "--no-bwrap"])
    err = capsys.readouterr().err
    assert rc == 1
    assert "cannot grade: the worker server did not start: " + WHY in err, err
    assert not (out / "results").exists() or not any((out / "results").iterdir())
    assert not (out / "gradebook.csv").exists()


def test_an_archive_whose_server_does_not_start_is_left_for_the_next_run(tmp_path, monkeypatch):
    """One slot's server starts, the other's never does: the archive on the second is not
    scored (no 0 in the gradebook), says why, and is graded by the next run."""
    from attn_course import grade

    monkeypatch.setenv("ATTN_COURSE_SECRET", SECRET)
    _class(tmp_path / "subs")
    g = grade.Grader(tmp_path / "grading", "3.5", jobs=1, log=lambda *a: None)
    g.prepare()
    real = g._server(0)
    g._servers[0] = WorkerServer(_failing())
    try:
        res = g.grade_one(tmp_path / "subs" / "ada.zip", 0)
        assert res.error and res.total == 0
        assert WHY in res.rejected and "retried on the next run" in res.rejected
        g._servers[0].close()
        g._servers[0] = real
        res = g.grade_one(tmp_path / "subs" / "ada.zip", 0)
        assert not res.error and res.total == 2, res
    finally:
        g.close()


# -- where a worker finds its packages, and what it must not find ---------------------------------


def _spec_at(path):
    from importlib.machinery import ModuleSpec

    spec = ModuleSpec("numpy", None, origin=str(path / "__init__.py"), is_package=True)
    spec.submodule_search_locations = [str(path)]
    return spec


def test_a_workers_packages_outside_the_installation_are_put_on_its_path(tmp_path, monkeypatch):
    """numpy in a user site (or a site folder a .pth adds): the server, which runs ``python -I``,
    gets that folder on its path, and bubblewrap binds it; a folder inside the installation, one
    not made for packages (it may hold anything of the grader's) or one that holds the course's
    folder is not added."""
    import importlib.util

    from attn_course import sandbox

    user_site = tmp_path / "home" / ".local" / "lib" / "python3.11" / "site-packages"
    (user_site / "numpy").mkdir(parents=True)
    home = tmp_path / "home"
    (home / "scipy").mkdir()
    where = {"numpy": _spec_at(user_site / "numpy"),
             "jax": _spec_at(Path(sys.prefix) / "lib" / "jax"),  # inside the installation
             "scipy": _spec_at(home / "scipy"),  # a home folder on PYTHONPATH: not a folder for packages
             "ml_dtypes": _spec_at(tmp_path / "site-packages" / "ml_dtypes")}
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: where.get(name))
    with monkeypatch.context() as m:  # a site folder that holds the course's folder
        m.setattr(sandbox, "ROOT", tmp_path / "site-packages" / "course")
        assert sandbox.worker_site_dirs() == [str(user_site.resolve())]
    del where["ml_dtypes"]
    assert sandbox.worker_site_dirs() == [str(user_site.resolve())]
    argv = sandbox._server_argv("/opt/attn-course", "/tmp")
    boot = argv[argv.index("-c") + 1]
    assert f"sys.path.extend({[str(user_site.resolve())]!r})" in boot
    if sandbox.bwrap_works():
        box = sandbox.Bubblewrap(0, sandbox.GRADING_LIMITS, None)
        try:
            assert (str(user_site.resolve()), str(user_site.resolve())) in box._binds()
        finally:
            box.close()


@pytest.mark.skipif(sys.platform != "linux", reason="bubblewrap")
def test_an_installed_copy_of_the_reference_is_hidden_from_jobs(tmp_path, monkeypatch):
    """``pip install .`` (not ``-e``) puts the reference library into site-packages, which
    bubblewrap binds: a job sees an empty, read-only folder there; the rest of the folder stays."""
    import os
    import subprocess

    from attn_course import sandbox

    if not sandbox.bwrap_works():
        pytest.skip("no working bubblewrap")
    site = tmp_path / "site"
    (site / "attn_tensors").mkdir(parents=True)
    (site / "attn_tensors" / "statmech.py").write_text("REFERENCE = 'the solutions'\n")
    (site / "other").mkdir()
    (site / "other" / "module.py").write_text("visible = True\n")
    for p in (tmp_path, site, site / "attn_tensors", site / "other"):
        os.chmod(p, 0o755)
    monkeypatch.setattr(sandbox, "worker_site_dirs", lambda: [str(site)])
    box = sandbox.Bubblewrap(0, sandbox.GRADING_LIMITS, None)
    try:
        script = (f"ls -A {site}/attn_tensors; cat {site}/other/module.py; "
                  f"cat {site}/attn_tensors/statmech.py; touch {site}/attn_tensors/x && echo wrote")
        r = subprocess.run(box._launch(None) + ["/bin/sh", "-c", script], capture_output=True, text=True,
                           cwd="/", env=sandbox.worker_env("/tmp", None), timeout=60)
    finally:
        box.close()
    assert "visible = True" in r.stdout, (r.stdout, r.stderr)
    assert "solutions" not in r.stdout and "statmech" not in r.stdout and "wrote" not in r.stdout, r.stdout


def test_grading_with_limits_only_warns_of_an_installed_copy_of_the_reference(tmp_path, monkeypatch, capsys):
    """Limits only cannot hide a folder: an installed copy of the course that every user may read
    is named in a warning (bubblewrap covers it, above); one closed to others is not."""
    import os
    import shutil
    import tempfile

    from attn_course import sandbox
    from attn_course.cli import main

    monkeypatch.setenv("ATTN_COURSE_SECRET", SECRET)
    monkeypatch.setattr(sandbox, "bwrap_works", lambda: False)
    (tmp_path / "subs").mkdir()
    grade = ["grade", str(tmp_path / "subs"), "--out", str(tmp_path / "grading"), "--exercises", "3.5"]
    top = Path(tempfile.mkdtemp(prefix="installed-"))  # (pytest's own folders are private)
    try:
        copy = top / "site" / "attn_tensors"
        copy.mkdir(parents=True)
        for p in (top, copy.parent, copy):
            os.chmod(p, 0o755)
        monkeypatch.setattr(sandbox, "hidden_course_copies", lambda folders: [str(copy)])
        assert main(grade) == 2  # (an empty folder: the warnings, then 'no archives', nothing graded)
        err = capsys.readouterr().err
        assert f"an installed copy of the course ({copy}) holds the reference library" in err, err
        os.chmod(copy.parent, 0o700)
        assert main(grade) == 2  # (an empty folder: the warnings, then 'no archives', nothing graded)
        assert "installed copy" not in capsys.readouterr().err
    finally:
        shutil.rmtree(top, ignore_errors=True)


def test_a_dask_worker_whose_servers_do_not_start_refuses_its_archives(monkeypatch):
    """On a cluster such a worker refuses (WorkerRefused, with the reason): the archive goes to
    another worker, and that worker gets no more of the batch (attn_course.dask_pool)."""
    from attn_course import dask_pool, grade
    from attn_course.identity import secret_fingerprint

    monkeypatch.setenv("ATTN_COURSE_SECRET", SECRET)
    monkeypatch.setattr(grade, "confinement", lambda *a, **k: _failing())
    config = dask_pool.TaskConfig("3.5", Limits(), False, False, None, True, False, secret_fingerprint(SECRET))
    with pytest.raises(dask_pool.WorkerRefused, match="could not start a worker server .*" + WHY):
        dask_pool._WorkerGrader(config)


@pytest.mark.slow
def test_a_grader_whose_packages_come_through_a_pth_file_grades(tmp_path):
    """End to end, as it failed: a Python environment that finds NumPy and JAX through a ``.pth``
    file (``site.addsitedir`` of another ``site-packages``, as a user site or a shared environment
    does) grades an honest archive in bubblewrap.  Before, every server failed to start (``No
    module named 'numpy'``) and the student got 0."""
    import csv
    import os
    import site
    import subprocess

    from attn_course import sandbox

    if not sandbox.bwrap_works():
        pytest.skip("no working bubblewrap")
    env_dir = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True, timeout=120)
    ours = [p for p in site.getsitepackages() if Path(p).name == "site-packages" and (Path(p) / "numpy").is_dir()]
    assert ours, site.getsitepackages()
    (next(env_dir.glob("lib/python3*/site-packages")) / "zz_course.pth").write_text(
        f"import site; site.addsitedir({ours[0]!r})\n")
    python = str(env_dir / "bin" / "python")
    probe = subprocess.run([python, "-c", "import sys, numpy; print(numpy.__file__.startswith(sys.prefix))"],
                           capture_output=True, text=True, timeout=120)
    assert probe.stdout.strip() == "False", probe  # NumPy is found outside the environment's own folder
    subs = tmp_path / "subs"
    subs.mkdir()
    build_archive(subs / "ada.zip", "ada", library_files(ROOT), token=token_for("ada", SECRET))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env.update(ATTN_COURSE_SECRET=SECRET, PATH=f"{env_dir / 'bin'}:{os.environ['PATH']}")
    r = subprocess.run([python, "-m", "attn_course.cli", "grade", str(subs), "--out", str(tmp_path / "grading"),
                        "--exercises", "3.5", "--jobs", "1"], capture_output=True, text=True, env=env,
                       timeout=600, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = list(csv.DictReader(open(tmp_path / "grading" / "gradebook.csv")))
    assert [(row["student_id"], row["total"]) for row in rows] == [("ada", "2")], rows
