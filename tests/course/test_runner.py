"""run_worker's bookkeeping when a job dies: who is blamed, who runs again (a scripted server)."""

from __future__ import annotations

import dataclasses
import json
import time

import pytest

from attn_course import values
from attn_course.registry import all_exercises
from attn_course.runner import Ran, run_worker
from attn_course.sandbox import Limits
from attn_course.server import Done, Line, ServerError
from attn_course.watch import sealer

ZERO = {"status": "ok", "value": {"value": values.encode(__import__("numpy").zeros(2))}}


class Box:
    """The scripted server's sandbox: how many forks its process limit refused, and how many
    processes its memory limit killed."""

    def __init__(self):
        self.refused = self.killed = 0

    def processes_refused(self):
        return self.refused

    def memory_kills(self):
        return self.killed


KEY = "k" * 32  # the scripted jobs' watch's key
SEAL = sealer(KEY)


class Scripted:
    """A worker server that plays one script per job: ('start', id), ('phase', None), ('result', id),
    ('sealed', message) (the worker's lines, sealed with the job's key, which its watch's first
    line gives), ('line', message) (a line of the job's own),
    ('sleep', seconds), ('refuse', None) (its sandbox refuses a fork), ('oom', None) (its memory
    limit kills a process), ('exit', status) (the job ends so), 'hang', 'die' or 'done'."""

    def __init__(self, scripts, answers_stop=True):
        self.scripts, self.jobs, self.starts, self.kills, self.stops = list(scripts), [], 1, 0, 0
        self.answers_stop = answers_stop
        self.sandbox = Box()

    def submit(self, job):
        self.jobs.append([item["id"] for item in job["exercises"]])
        self.cases = {item["id"]: len(item["cases"]) for item in job["exercises"]}
        self.script = [("line", {"watch": KEY})] + list(self.scripts.pop(0))

    def wait(self, timeout):
        """Like a server's: at once when the script has more to say, else after ``timeout``."""
        if not self.script or self.script[0] == "hang":
            time.sleep(timeout)

    def poll(self):
        out = []
        while self.script:
            step = self.script.pop(0)
            if step == "die":
                if out:  # what was relayed before the death arrives first
                    self.script.insert(0, step)
                    return out
                raise ServerError("the worker server died")
            if step == "done":
                out.append(Done(0, ""))
                return out
            if step == "hang":  # nothing more, ever: the runner's clock decides
                self.script.insert(0, step)
                return out
            kind, ex = step
            if kind == "refuse":
                self.sandbox.refused += 1
                continue
            if kind == "oom":
                self.sandbox.killed += 1
                continue
            if kind == "exit":
                out.append(Done(ex, ""))
                return out
            if kind == "sleep":
                time.sleep(ex)
                return out
            text = ({"start": ex} if kind == "start" else {"phase": "compile"} if kind == "phase"
                    else ex if kind in ("line", "sealed") else {"id": ex, "results": [ZERO] * self.cases[ex]})
            out.append(Line(ex if kind == "line" and isinstance(ex, str)  # (a line as it is written)
                            else json.dumps(text) if kind == "line" else SEAL(json.dumps(text))))
        return out

    def kill(self):
        self.kills += 1
        self.starts += 1

    def stop_job(self, late=None):
        """The job reached a limit: it ends, and this server is kept (as a clean real one is);
        or, if it does not answer (its job stopped it), it is killed.  Lines left in the script
        after a "hang" are the ones relayed late, while the job is being stopped."""
        from attn_course.server import Stopped

        self.stops += 1
        rest = [step for step in self.script if isinstance(step, tuple) and step[0] in ("start", "result")]
        self.script = []
        if late is not None:
            late += [SEAL(json.dumps({"start": ex} if kind == "start" else {"id": ex, "results": [ZERO] * self.cases[ex]}))
                     for kind, ex in rest]
        if not self.answers_stop:
            self.kill()
        return Stopped.KEPT if self.answers_stop else Stopped.LOST


def _items(*ids):
    """The exercises as ones whose values the job itself reports (not traced for an evaluation job,
    as 5.5: a scripted job writes values; what is tested here is which exercise a failure is)."""
    ex = all_exercises()
    return [(dataclasses.replace(ex[i], traced=False), ex[i].make_cases(False)) for i in ids]


def test_a_death_whose_last_lines_were_lost_blames_only_the_exercise_that_dies_alone():
    """3.2 finished but its result died with the server; 3.3 is the one that kills it."""
    server = Scripted([
        [("start", "3.1"), ("result", "3.1"), ("start", "3.2"), "die"],  # 3.2's result and 3.3's start lost
        [("start", "3.2"), ("result", "3.2"), "done"],
        [("start", "3.3"), "die"],
    ])
    raw = run_worker(server, {}, _items("3.1", "3.2", "3.3"), Limits())
    assert server.jobs == [["3.1", "3.2", "3.3"], ["3.2"], ["3.3"]]
    assert [o.status for o in raw["3.1"]] == ["ok"] * len(raw["3.1"])
    assert [o.status for o in raw["3.2"]] == ["ok"] * len(raw["3.2"])
    assert [o.status for o in raw["3.3"]] == ["crashed"]


def test_a_death_with_one_exercise_left_blames_it_at_once():
    server = Scripted([[("start", "3.1"), ("result", "3.1"), ("start", "3.2"), "die"]])
    raw = run_worker(server, {}, _items("3.1", "3.2"), Limits())
    assert server.jobs == [["3.1", "3.2"]]
    assert [o.status for o in raw["3.2"]] == ["crashed"]


def test_a_limit_reached_in_the_jobs_program_runs_each_exercise_alone(monkeypatch):
    """Every exercise was traced; the time ran out in the program of the whole job (lowering,
    compiling, running it): it is nobody's in particular, so each runs alone, and the one that
    runs out of time alone is the one that pays."""
    from attn_course import runner

    monkeypatch.setattr(runner, "FIRST_EXERCISE_GRACE_S", 0.0)
    server = Scripted([
        [("start", "3.1"), ("start", "3.2"), ("phase", None), "hang"],
        [("start", "3.1"), ("phase", None), ("result", "3.1"), "done"],
        [("start", "3.2"), ("phase", None), "hang"],
    ])
    raw = run_worker(server, {}, _items("3.1", "3.2"), Limits(per_exercise_s=0.2))
    assert server.jobs == [["3.1", "3.2"], ["3.1"], ["3.2"]]
    assert (server.stops, server.kills) == (2, 0)  # each hang is stopped; no server is started again
    assert [o.status for o in raw["3.1"]] == ["ok"] * len(raw["3.1"])
    assert [o.status for o in raw["3.2"]] == ["timeout"]


def test_a_server_that_does_not_answer_a_stop_leaves_the_blame_open(monkeypatch):
    """The time ran out while the job's last line seen was 3.1's start; but its server did not
    answer the stop (the job had stopped the server: 3.2's start line may be unrelayed), so 3.1
    is not blamed on that line: each unfinished exercise runs alone, and 3.2 pays."""
    from attn_course import runner

    monkeypatch.setattr(runner, "FIRST_EXERCISE_GRACE_S", 0.0)
    server = Scripted([
        [("start", "3.1"), "hang"],
        [("start", "3.1"), ("result", "3.1"), "done"],
        [("start", "3.2"), "hang"],
    ], answers_stop=False)
    raw = run_worker(server, {}, _items("3.1", "3.2"), Limits(per_exercise_s=0.2))
    assert server.jobs == [["3.1", "3.2"], ["3.1"], ["3.2"]]
    assert [o.status for o in raw["3.1"]] == ["ok"] * len(raw["3.1"])
    assert [o.status for o in raw["3.2"]] == ["timeout"]


def test_a_line_relayed_only_after_the_limit_leaves_the_blame_open(monkeypatch):
    """The time ran out on 3.1's start line, but 3.2's start arrives while the job is being
    stopped (its server was slow to relay it): 3.1 may have finished in time, so it is not
    blamed on that line; each unfinished exercise runs alone, and 3.2 pays."""
    from attn_course import runner

    monkeypatch.setattr(runner, "FIRST_EXERCISE_GRACE_S", 0.0)
    server = Scripted([
        [("start", "3.1"), "hang", ("start", "3.2")],
        [("start", "3.1"), ("result", "3.1"), "done"],
        [("start", "3.2"), "hang"],
    ])
    raw = run_worker(server, {}, _items("3.1", "3.2"), Limits(per_exercise_s=0.2))
    assert server.jobs == [["3.1", "3.2"], ["3.1"], ["3.2"]]
    assert (server.stops, server.kills) == (2, 0)
    assert [o.status for o in raw["3.1"]] == ["ok"] * len(raw["3.1"])
    assert [o.status for o in raw["3.2"]] == ["timeout"]


def test_a_start_line_again_does_not_restart_the_clock(monkeypatch):
    """A job may say an exercise starts again (a case of it runs alone after the program), but its
    time counts from its first start: one that repeats it forever is still stopped."""
    from attn_course import runner

    monkeypatch.setattr(runner, "FIRST_EXERCISE_GRACE_S", 0.0)
    # 0.3 s allowed; starts repeated over 6 s: a clock restarted by each would never run out
    server = Scripted([[("start", "3.1")] + [("sleep", 0.05), ("start", "3.1")] * 120 + ["done"]])
    raw = run_worker(server, {}, _items("3.1"), Limits(per_exercise_s=0.3))
    assert [o.status for o in raw["3.1"]] == ["timeout"]


def test_a_job_at_its_process_limit_is_stopped_at_once_and_blames_its_exercise():
    """A fork bomb in 3.2: stopped when the sandbox refuses a fork, long before its time limit;
    3.2 alone is blamed (no exercise-by-exercise rerun), and 3.3 runs in a new job."""
    server = Scripted([
        [("start", "3.1"), ("result", "3.1"), ("start", "3.2"), ("refuse", None), "hang"],
        [("start", "3.3"), ("result", "3.3"), "done"],
    ])
    raw = run_worker(server, {}, _items("3.1", "3.2", "3.3"), Limits(per_exercise_s=20))
    assert server.jobs == [["3.1", "3.2", "3.3"], ["3.3"]]
    assert (server.stops, server.kills) == (1, 0)  # the job is stopped; its server serves 3.3
    assert [o.status for o in raw["3.2"]] == ["crashed"] and "process limit" in raw["3.2"][0].message
    assert [o.status for o in raw["3.3"]] == ["ok"] * len(raw["3.3"])


class _Command:
    """A sandbox that runs a given command as the server (no confinement: our own script)."""

    keeps_stopped_servers = True

    def __init__(self, code: str):
        import sys

        self.argv = [sys.executable, "-c", code]

    def server_command(self):
        return self.argv, None

    def cleanup(self):
        pass

    def close(self):
        pass


def test_the_runner_wakes_when_the_server_writes_and_does_not_spin_on_a_closed_pipe():
    """WorkerServer.wait: back as soon as a line arrives (not at its timeout); once the server has
    closed its end while alive, a pause per call rather than a loop that returns at once."""
    from attn_course.server import WorkerServer

    server = WorkerServer(_Command("import os, sys, time\ntime.sleep(0.3)\n"
                                   "sys.stdout.write('{\"out\": \"x\"}\\n'); sys.stdout.flush()\n"
                                   "os.close(1); sys.stdout = None\ntime.sleep(30)\n"))
    server.launch()
    try:
        t = time.monotonic()
        server.wait(20)
        woke = time.monotonic() - t
        assert woke < 15, woke  # the line woke it, not the timeout
        assert server.poll() == [Line("x")]
        calls, t = 0, time.monotonic()
        while time.monotonic() - t < 0.5:  # the pipe is at its end but the server lives
            server.wait(0.1)
            assert server.poll() == []
            calls += 1
        assert calls < 200, calls  # a pause of 10 ms a call is 50 at most; a spin is thousands
    finally:
        server.close()


def _answering(done_line: str | None) -> _Command:
    """A fake server that says it is ready, takes a job, and answers a stop with ``done_line``
    (None: it never answers)."""
    answer = "" if done_line is None else f"sys.stdout.write({done_line!r} + '\\n'); sys.stdout.flush()\n"
    return _Command("import sys, time\n"
                    "sys.stdout.write('{\"ready\": true}\\n'); sys.stdout.flush()\n"
                    "sys.stdin.readline()\n"  # the job
                    "sys.stdout.write('{\"out\": \"working\"}\\n'); sys.stdout.flush()\n"
                    "sys.stdin.readline()\n"  # the stop
                    + answer + "time.sleep(60)\n")


def test_a_stopped_job_keeps_its_server_only_when_the_server_answers_clean():
    """WorkerServer.stop_job: kept (still running) when the server ends the job and its sandbox
    is clean; killed when it says it is not clean, or does not answer in time (lost: what it had
    not relayed is lost), or when its sandbox cannot end a job from inside (Limited's)."""
    from attn_course.server import Stopped, WorkerServer

    for done_line, keeps, stopped in [('{"done": -9, "tail": "", "clean": true}', True, Stopped.KEPT),
                                      ('{"done": -9, "tail": "", "clean": false}', True, Stopped.KILLED),
                                      (None, True, Stopped.LOST),
                                      ('{"done": -9, "tail": "", "clean": true}', False, Stopped.KILLED)]:
        sandbox = _answering(done_line)
        sandbox.keeps_stopped_servers = keeps
        server = WorkerServer(sandbox)
        try:
            server.start()
            server.submit({"files": {}, "exercises": []})
            assert server.stop_job(timeout_s=1.0) is stopped, (done_line, keeps)
            assert (server.proc is not None and server.proc.poll() is None) is (stopped is Stopped.KEPT)
        finally:
            server.close()


@pytest.mark.parametrize("how", ["the job is killed", "its server is killed", "a process it started is killed"])
def test_a_job_at_its_memory_limit_is_stopped_and_blames_its_exercise(how):
    """The memory group killed a process of the job (3.2): 3.2 alone is blamed, by the limit's
    name rather than as a death of unknown cause, and 3.3 runs in a new job."""
    # (a server's death is seen before the runner's next look at the memory group: ("sleep", 0)
    # ends a poll, and the next one raises at once)
    end = {"the job is killed": [("oom", None), ("exit", -9)], "its server is killed": [("sleep", 0), ("oom", None), "die"],
           "a process it started is killed": [("oom", None), "hang"]}[how]
    scripts = [[("start", "3.1"), ("result", "3.1"), ("start", "3.2"), *end]]
    if how == "its server is killed":  # its last lines may be lost: each unfinished one runs alone
        scripts.append([("start", "3.2"), *end])
    scripts.append([("start", "3.3"), ("result", "3.3"), "done"])
    server = Scripted(scripts)
    raw = run_worker(server, {}, _items("3.1", "3.2", "3.3"), Limits(per_exercise_s=20, total_memory_mb=512))
    assert server.jobs[0] == ["3.1", "3.2", "3.3"] and server.jobs[-1] == ["3.3"]
    assert [o.status for o in raw["3.2"]] == ["crashed"]
    assert "more than 512 MB of memory (memory limit)" in raw["3.2"][0].message
    assert [o.status for o in raw["3.1"]] == [o.status for o in raw["3.3"]] == ["ok"] * len(raw["3.3"])


WARM_UP_S = 4.0  # the fake server's warm-up after a job: longer than an exercise's limit and its grace


class _Warming(_Command):
    """A fake server that answers each job at once (ZERO for every case), then warms up for
    WARM_UP_S before it says it is ready for the next, as a real server does after a job.
    ``start``: code run before it says it is ready the first time; ``dies_in``: the exercise
    whose start it dies at."""

    def __init__(self, after_job: str = f"time.sleep({WARM_UP_S})", start: str = "", dies_in: str = ""):
        super().__init__(
            "import hmac, json, os, sys, time\n"
            + start +
            "ZERO = " + repr(ZERO) + "\n"
            f"KEY = {KEY!r}\n"
            "def say(obj):\n"
            "    sys.stdout.write(json.dumps(obj) + '\\n'); sys.stdout.flush()\n"
            "def sealed(obj):  # (as attn_course.watch.sealer seals the worker's lines)\n"
            "    text = json.dumps(obj)\n"
            "    return text + '\\t' + hmac.new(KEY.encode(), text.encode(), 'sha256').hexdigest()\n"
            "say({'ready': True})\n"
            "for line in sys.stdin:\n"
            "    say({'out': json.dumps({'watch': KEY})})\n"
            "    for ex in json.loads(line)['exercises']:\n"
            "        say({'out': sealed({'start': ex['id']})})\n"
            f"        if ex['id'] == {dies_in!r}:\n"
            "            os._exit(1)\n"
            "        say({'out': sealed({'id': ex['id'], 'results': [ZERO] * len(ex['cases'])})})\n"
            "    say({'done': 0, 'tail': '', 'clean': True})\n"
            f"    {after_job}\n"
            "    say({'ready': True})\n")

    def processes_refused(self):
        return 0

    def memory_kills(self):
        return 0


def test_the_warm_up_after_a_job_is_not_on_the_next_jobs_clock():
    """A server warms up after each job before it reads the next (the class's shapes: seconds for
    a whole course, more on a busy machine); the next archive's job, sent meanwhile, waited for
    it with its first exercise's clock running, and could time out on the grader's own work.
    Its clock now starts when the server is ready: with a warm-up longer than the limit and its
    grace, both jobs finish, neither is timed out, and the server is the same."""
    from attn_course.runner import FIRST_EXERCISE_GRACE_S
    from attn_course.server import WorkerServer

    limits = Limits(per_exercise_s=0.5)
    assert WARM_UP_S > limits.per_exercise_s + FIRST_EXERCISE_GRACE_S
    server = WorkerServer(_Warming())
    try:
        server.start()
        # (from before the first job: the warm-up begins as the server answers it, a moment before
        # the grader reads that answer, so it lies wholly between here and the second job's end
        # whatever the machine's load; timed from the second job's send it was 3.997 s once in CI)
        t = time.monotonic()
        for archive in range(2):
            raw = run_worker(server, {}, _items("3.1"), limits)
            assert [o.status for o in raw["3.1"]] == ["ok"] * len(raw["3.1"]), (archive, raw["3.1"])
        assert time.monotonic() - t >= WARM_UP_S  # the second job did wait for the warm-up
        assert server.starts == 1
    finally:
        server.close()


@pytest.mark.parametrize("after_job", ["sys.exit(0)", "say({'out': 'x'})", "print('not json', flush=True)"])
def test_a_server_that_does_not_come_back_from_its_warm_up_is_replaced(after_job):
    """Ends, or says anything but that it is ready, after a job: the next job runs on a new
    server (the grader's problem, not the next archive's), with its results."""
    from attn_course.server import WorkerServer

    server = WorkerServer(_Warming(after_job))
    try:
        server.start()
        for _ in range(2):
            raw = run_worker(server, {}, _items("3.1"), Limits(per_exercise_s=20))
            assert [o.status for o in raw["3.1"]] == ["ok"] * len(raw["3.1"]), raw["3.1"]
        assert server.starts == 2
    finally:
        server.close()


def test_the_warm_up_after_a_job_is_not_on_the_archives_budget():
    """Nor on the archive's budget (the same wait, before the archive's own job is sent): with a
    budget shorter than the warm-up, the second archive's exercise still runs."""
    from attn_course.runner import Budget
    from attn_course.server import WorkerServer

    server = WorkerServer(_Warming())
    try:
        server.start()
        for archive in range(2):
            budget = Budget(time.monotonic() + WARM_UP_S / 2)
            raw = run_worker(server, {}, _items("3.1"), Limits(per_exercise_s=20), budget)
            assert [o.status for o in raw["3.1"]] == ["ok"] * len(raw["3.1"]), (archive, raw["3.1"])
        assert budget.deadline >= time.monotonic() - 1  # moved back by the wait
    finally:
        server.close()


START_S = 1.5  # the fake server's start, after its first


def _crashing(marker) -> _Warming:
    """A fake server that dies in 3.1 and answers the rest at once; every start after its first
    takes START_S (the marker file says whether it started before)."""
    return _Warming("pass", dies_in="3.1",
                    start=(f"marker = {str(marker)!r}\n"
                           f"if os.path.exists(marker): time.sleep({START_S})\n"
                           "open(marker, 'a').close()\n"))


def test_a_new_server_is_the_archives_cost_only_after_its_own_job_ended_the_last(tmp_path):
    """An archive whose job killed its server pays for the next start in its own later jobs
    (crashing the server at every exercise buys no time); the next archive, which found the
    server gone, does not."""
    from attn_course.runner import Budget
    from attn_course.server import WorkerServer

    server = WorkerServer(_crashing(tmp_path / "started"))
    try:
        server.start()
        mine = Budget(time.monotonic() + 100.0)
        before = mine.deadline
        raw = run_worker(server, {}, _items("3.2", "3.1"), Limits(per_exercise_s=20), mine)
        assert [o.status for o in raw["3.1"]] == ["crashed"] and raw["3.2"][0].status == "ok"
        assert mine.lost_server and not server.running()
        raw = run_worker(server, {}, _items("3.2"), Limits(per_exercise_s=20), mine)  # its public cases
        assert raw["3.2"][0].status == "ok" and server.starts == 2
        assert mine.deadline - before < START_S / 2  # the new server's start was charged to it
        server.kill()  # as a crash of the archive before would leave it
        theirs = Budget(time.monotonic() + 100.0)
        before = theirs.deadline
        raw = run_worker(server, {}, _items("3.2"), Limits(per_exercise_s=20), theirs)
        assert raw["3.2"][0].status == "ok" and server.starts == 3 and not theirs.lost_server
        assert theirs.deadline - before >= START_S  # not charged to the next archive
    finally:
        server.close()


def test_what_a_job_was_seen_doing_is_collected_once_each_and_only_in_its_shape():
    """``{"ran": RULE, "file": F, "line": N}`` lines (attn_course.watch.watch_runs), sealed with the key
    of the job's first line (``{"watch": K}``): the first of each rule of the review's; any other
    shape, a line not sealed or sealed with another key, is ignored (red team: a forged first line
    of a rule hid the real one); the results are unchanged."""
    forged = sealer("b" * 32)
    good = {"ran": "ctypes", "file": "attn_tensors/statmech.py", "line": 12}
    bad = [("sealed", {"ran": "no such rule", "file": "", "line": 1}), ("sealed", {"ran": "gc", "file": "x" * 301, "line": 1}),
           ("sealed", {"ran": "gc", "file": "", "line": True}), ("sealed", {"ran": "gc", "file": "", "line": -1}),
           ("sealed", {"ran": "gc", "file": 3, "line": 1}), ("sealed", {"ran": "gc", "file": "", "line": 1, "more": 1}),
           ("line", {"ran": "gc", "file": "", "line": 1}), ("line", dict(good, line=1, key=KEY)),
           ("line", {"watch": "b" * 32})]
    late = {"ran": "hooks", "file": "attn_tensors/statmech.py", "line": 30}
    steps = [("start", "3.1")] + bad + [("line", forged(json.dumps(dict(good, line=2))))] + \
        [("sealed", good), ("sealed", dict(good, line=13)), ("sealed", late), ("result", "3.1"), "done"]
    ran: list = []
    raw = run_worker(Scripted([steps]), {}, _items("3.1"), Limits(per_exercise_s=20), ran=ran)
    assert [o.status for o in raw["3.1"]] == ["ok"] * len(raw["3.1"])
    assert ran == [Ran("ctypes", "attn_tensors/statmech.py", 12), Ran("hooks", "attn_tensors/statmech.py", 30)]
    assert run_worker(Scripted([steps]), {}, _items("3.1"), Limits(per_exercise_s=20)).keys() == {"3.1"}


def test_a_flood_of_empty_lines_is_output_too():
    """Red team: a line's end did not count toward the output limit, and a job wrote empty lines
    without end (the runner's limits are looked at between polls: one poll held a minute)."""
    steps = [("start", "3.1")] + [("line", "")] * 2000 + ["hang"]
    raw = run_worker(Scripted([steps]), {}, _items("3.1"), Limits(per_exercise_s=20, output_mb=0.001))
    assert [o.status for o in raw["3.1"]] == ["crashed"] and "output limit" in raw["3.1"][0].message


def test_a_poll_returns_a_bounded_number_of_messages_and_reads_a_long_line_once():
    """Red team: one poll returned every whole line the pipe held (a flood of short lines held it
    for a minute, 640 MB), and a line read in many pieces was copied and searched again at each
    (quadratic: 3.7 s of the grader's time for a line of 24 MB).  A poll returns at most MAX_POLL
    messages, the rest at the next (wait returns at once meanwhile); a line's pieces are searched
    once each, and the line comes whole."""
    import os

    from attn_course.server import MAX_POLL, WorkerServer

    r, w = os.pipe()
    os.set_blocking(r, False)

    class Proc:
        stdout = os.fdopen(r, "rb", buffering=0)

        def poll(self):
            return None

    server = WorkerServer(Box())
    server.proc = Proc()
    try:
        server._buf += b'{"out": ""}\n' * (2 * MAX_POLL + 5)
        sizes = [len(server.poll()) for _ in range(4)]
        assert sizes == [MAX_POLL, MAX_POLL, 5, 0]
        text = "x" * 100_000
        wire = json.dumps({"out": text}).encode()
        for i in range(0, len(wire), 1000):
            os.write(w, wire[i:i + 1000])
            assert server.poll() == [] and server._scan == len(server._buf)  # (never searched again)
        os.write(w, b"\n")
        assert server.poll() == [Line(text)] and len(server._buf) == 0
    finally:
        server.proc = None
        Proc.stdout.close()
        os.close(w)


def test_a_kill_is_not_blamed_on_a_limit_alone():
    """A job that sends itself SIGKILL (``os.kill(-1, SIGKILL)``: red team, round 7) was told it was
    "killed: a limit on memory or CPU time"; the memory limit is named apart (``_memory_limit``)."""
    from attn_course.runner import describe_exit

    text = describe_exit(-9)
    assert "SIGKILL" in text and "its own code" in text and "CPU time" in text
    assert describe_exit(128 + 9) == text
