"""The code the class report lists for review (attn_course.review): read, never run, never scored."""

from __future__ import annotations

import json
import os
import re
import unicodedata

import pytest

from attn_course import EXERCISES, RELEASE_LIBRARY, ROOT
from attn_course.archive import library_files
from attn_course.notebook_cells import answer_cells
from attn_course.review import MAX_FLAGS, RULES, WORDS, WHY, ran_flags, review_package, review_text
from attn_course.runner import Ran

REF = {k: v.decode() for k, v in library_files(ROOT).items()}
RELEASE = {k: v.decode() for k, v in library_files(RELEASE_LIBRARY).items()}

# one line of each kind, and the rule that must name it
SAMPLES = [
    ("import ctypes", "ctypes"), ("libc = ctypes.CDLL(None)", "ctypes"), ("from _ctypes import x", "ctypes"),
    ("import gc", "gc"), ("for o in gc.get_objects():", "gc"), ("gc.get_referrers(f)", "gc"),
    ("sys.setprofile(hook)", "hooks"), ("threading.settrace(t)", "hooks"), ("sys._getframe(1)", "hooks"),
    ("frame.f_back.f_globals", "hooks"), ("inspect.stack()", "hooks"), ("sys.monitoring.use_tool_id(1, 'x')", "hooks"),
    ("sys.modules['jax'] = fake", "sys.modules"), ("f.__code__ = g.__code__", "code objects"),
    ("probe.__closure__[0].cell_contents", "code objects"), ("types.FunctionType(c, {})", "code objects"),
    ("import builtins", "builtins"), ("__builtins__['len'] = f", "builtins"),
    ("exec(source)", "dynamic code"), ("eval(text)", "dynamic code"), ("__import__('os')", "dynamic code"),
    ("importlib.import_module(name)", "dynamic code"), ("compile(s, 'x', 'exec')", "dynamic code"),
    ("from jax._src import ad", "jax internals"), ("import jaxlib", "jax internals"),
    ("subprocess.run(['sh'])", "processes"), ("os.system('id')", "processes"), ("os.fork()", "processes"),
    ("import signal", "processes"), ("socket.socket()", "processes"), ("os._exit(0)", "processes"),
    ("import attn_course.values as v", "course code"), ("jax.debug.callback(f)", "callbacks"),
    ("jax.pure_callback(f, shape, x)", "callbacks"), ("setattr(t, name, value)", "attributes by name"),
    ("f.__dict__.update(d)", "attributes by name"), ("vars(m)[k] = v", "attributes by name"),
    # (from the red team: names built from strings, and names in full-width letters, which Python reads as ASCII)
    ("globals()['__bu' + 'iltins__']['__imp' + 'ort__']('ct' + 'ypes')", "attributes by name"),
    ("getattr(f, '__co' + 'de__')", "attributes by name"), ("object.__getattribute__(f, n)", "attributes by name"),
    ("import \uff43\uff54\uff59\uff50\uff45\uff53 as _w", "ctypes"), ("\uff53ys.modules['a'] = m", "sys.modules"),
    ("from sys import modules as _M", "sys.modules"), ("from sys import path, argv as a, modules", "sys.modules"),
    ("from sys import (modules)", "sys.modules"), ("sys._current_frames()", "hooks"),
    # (red team, round 11: frames handed out by the libraries that read a traceback's, and an attribute
    # or a module reached by a name built from strings without getattr or importlib)
    ("f = next(traceback.walk_tb(e.__traceback__))[0]", "hooks"), ("inspect.getinnerframes(tb)", "hooks"),
    ("inspect.trace()", "hooks"), ("inspect.getattr_static(t, 'f_' + 'back')", "attributes by name"),
    ("pkgutil.resolve_name('attn_' + 'course.worker')", "dynamic code"),
    ("pxla = pydoc.locate('jax._src.interpreters.pxla')", "dynamic code"), ("import sys as _s", "sys.modules"), ("from pydoc import locate", "dynamic code"),
    ("runpy.run_path(path)", "dynamic code"), ("zipimport.zipimporter(path)", "dynamic code"),
    # (round 12: sys under another name, an attribute set or read through object's own methods)
    ("_s.modules['attn_' + 'course.specs.ch03']", "sys.modules"), ("object.__setattr__(e, 'probe', p)", "attributes by name"),
    ("operator.methodcaller('__getattri' 'bute__', n)(o)", "attributes by name"),
    ("traceback.walk_stack(None)", "hooks"), ("concurrent.futures.ThreadPoolExecutor(1)", "processes"),
    ("from concurrent import futures", "processes"), ("_thread.start_new_thread(f, ())", "processes"),
    # (the tenth session: cffi's backend, a second interpreter, an extension module loaded by hand)
    ("import _cffi_backend as B", "native code"), ("ffi = cffi.FFI()", "native code"),
    ("import _xxsubinterpreters as s", "native code"), ("from _interpreters import create", "native code"),
    # (its round of the red team: raw memory from an id() through a class named by strings or DLPack,
    # a traceback's frame, pickle's globals, a plugin loader, members by name, sys under another name)
    ("a = id(x) + 24", "raw memory"), ("c = get_raw_capsule(a, 'dltensor', 0)", "raw memory"),
    ("def __dlpack__(self, *a):", "raw memory"), ("V = type('V', (), {k: d})", "attributes by name"),
    ("t = e.__traceback__", "hooks"), ("o = pickle.loads(b'x')", "attributes by name"),
    ("m = dict(inspect.getmembers(x))", "attributes by name"), ("import os, sys as _s", "sys.modules"),
    ("xla_client.load_pjrt_plugin_dynamically('p', path)", "native code"),
    ("con.enable_load_extension(True)", "native code"), ("_imp.create_dynamic(spec)", "native code"),
    ("np.lib.stride_tricks.as_strided(x, (9,), (8,))", "raw memory"), ("np.ctypeslib.as_array(p, (4,))", "raw memory"),
    ("A.__array_interface__ = {'data': (address, False), 'shape': (9,), 'typestr': '<f8'}", "raw memory"),
    # (red team, round 9: the name as a dict's key, a string, which is otherwise not read)
    ("X = type('X', (), {'__array_interface__': {'data': (address, False), 'shape': (8,)}})", "raw memory"),
    # (red team, round 5 of the eighth session: the private package as a name of a ``from jax import``,
    # and JAX's public way to its rule tables, registering a lowering of one's own)
    ("from jax import _src", "jax internals"), ("from jax import numpy as jnp, _src as s", "jax internals"),
    ("from jax.interpreters import mlir", "jax internals"), ("mlir.register_lowering(p, rule, platform='cpu')", "jax internals"),
    ("ad.primitive_jvps[p] = rule", "jax internals"), ("t = m._platform_specific_lowerings", "jax internals"),
    ("from jax import extend", "jax internals"), ("jax.extend.core.primitives.mul_p", "jax internals"),
    # (round 6: rules rewritten in place, a primitive's own bind or class, attributes by dotted strings)
    ("held.__setstate__((rule, (), {}, None))", "code objects"), ("mul_p.__class__ = Safe", "code objects"),
    ("lax.mul_p.bind = bind", "code objects"), ("string.Formatter().get_field('0.x', [m], {})", "attributes by name"),
    ("f = jax.custom_vjp(entropy)", "own derivative"), ("return (jnp.nan_to_num(g, nan=0.0),)", "own derivative"),
    ("@jax.custom_jvp", "own derivative"), ("f.defvjp(fwd, bwd)", "own derivative"),
    ("f = mx.custom_function(entropy)", "own derivative"), ("@f.vjp", "own derivative"), ("@ f . jvp", "own derivative"),
    ("V = vars", "attributes by name"), ("G, S = getattr, setattr", "attributes by name"),
    ("D = delattr", "attributes by name"), ("I = __import__", "dynamic code"),
    ("c = jnp.log.trace(x).jaxpr", "jax internals"), ("c._jaxpr = other.jaxpr", "jax internals"),
    ("c._consts = other.consts", "jax internals"),
]


@pytest.mark.parametrize("line, rule", SAMPLES)
def test_each_construct_is_flagged_by_its_rule(line, rule):
    flags = review_text("attn_tensors/statmech.py", f"def f(x):\n    {line}\n    return x\n")
    assert rule in {f.rule for f in flags} and {f.where for f in flags} == {"attn_tensors/statmech.py:2"}, flags
    assert WORDS.search(unicodedata.normalize("NFKC", line))  # (the fast first pass sees it too, as Python reads it)


@pytest.mark.parametrize("line", [
    "# import ctypes (a comment is not code)", "y = jax.jit(f).lower(x).compile()", "z = re.compile('a')",
    "w = jnp.stack([a, b])", "evaluated = f(x)", "signals = x  # not signal handling", "return x.sum(axis=-1)",
    "doc = 'the signal of each row, threading the mask through (eval notes)'", "self.vars = x",
    "\u03b1 = 1.0 / \u03c4  # Greek names", "n_locals(x)", "global_mask = m",
    "if isinstance(x, jax.core.Tracer):", "rows.extend(out)", "from jax import numpy as jnp, lax",
    "name = x.__class__.__name__", "if p.bind == q:", "_test_shapes = imp_weights(xx)",
    "out, pull = jax.vjp(f, x)", "y = A @ B.T", "@jax.jit", "@jax.vmap", "@partial(jax.vmap, in_axes=0)", "n_vars = x.vars", "has = hasattr(x, 'shape')",
    "w = jnp.zeros(3, dtype=type(x))", "n = x.id(3) + grid(2)", "if type(a) is type(b):",
])
def test_ordinary_code_is_not_flagged(line):
    assert review_text("attn_tensors/statmech.py", f"def f(x):\n    {line}\n    return x\n") == []


def test_only_what_the_student_wrote_is_read():
    stub = "import importlib\n\ndef g():\n    raise NotImplementedError\n"
    text = stub + "\ndef h():\n    return eval('1')\n"
    assert [(f.where, f.rule) for f in review_text("m.py", text, stub)] == [("m.py:7", "dynamic code")]


def test_the_reference_library_and_solutions_are_never_flagged():
    """An honest student who writes what the reference does is never listed."""
    release_answers = {f"notebooks/{nb.name}": answer_cells(nb.read_bytes())
                       for nb in sorted(EXERCISES.glob("ch*/ch*.ipynb"))}
    solutions = {f"notebooks/{nb.name}": nb.read_bytes() for nb in sorted((ROOT / "solutions").glob("ch*/ch*.ipynb"))}
    assert len(solutions) == 10 and set(solutions) == set(release_answers)
    assert review_package(REF, RELEASE, solutions, release_answers) == ([], 0)
    # and the same code read against nothing is flagged: the comparison, not blindness, spares it
    assert review_package(REF, {})[1] > 0


def test_many_flags_of_one_rule_hide_no_other_rule():
    """Red team, round 12: twenty getattr lines in a module read first filled the archive's
    twenty flags, and its ``import ctypes`` was in no report.  Every rule's first is kept."""
    files = dict(RELEASE)
    files["attn_tensors/aaa.py"] = "".join(f"a{i} = getattr(x, 'shape{i}', None)\n" for i in range(3 * MAX_FLAGS))
    files["attn_tensors/statmech.py"] += "\nimport ctypes\n"
    flags, n = review_package(files, RELEASE)
    assert len(flags) == MAX_FLAGS and n == 3 * MAX_FLAGS + 1
    assert [f.rule for f in flags].count("ctypes") == 1 and flags[-1].rule == "ctypes"  # (in file order)
    # what ran comes first, and what was read keeps every rule's first too
    from attn_course.grade import Grader
    from attn_course.results import ArchiveResult
    from attn_course.runner import Ran

    result = ArchiveResult("a.zip", "", "", [], review=[f.to_dict() for f in flags], review_count=n)
    Grader._ran([Ran("processes", "attn_tensors/statmech.py", 3)], files, result)
    rules = [f["rule"] for f in result.review]
    assert len(rules) == MAX_FLAGS and rules[0] == "processes" and "ctypes" in rules and result.review_count == n + 1


def test_an_archive_of_endless_flagged_lines_is_read_up_to_a_budget(monkeypatch):
    """Red team, round 12: 78 modules of 20,000 lines ``y = id(x)`` made 1.5 million flags, 20 kept,
    and held the grader 50 s.  The archive's code is read up to MAX_READ characters, the rest is
    said to be unread, and no rule's flags past MAX_FLAGS are made.  (Read with a budget of 64 k
    characters here: the same reading, 16 times shorter, and a module boundary inside it.)"""
    from attn_course import review
    from attn_course.review import UNREAD

    MAX_READ = 1 << 16
    monkeypatch.setattr(review, "MAX_READ", MAX_READ)
    module = "y = id(x)\n" * 2_000
    files = {f"attn_tensors/m{k:02d}.py": module for k in range(78)}
    calls = []
    real = review.Flag

    def counted(*args):
        calls.append(args)
        return real(*args)

    monkeypatch.setattr(review, "Flag", counted)
    flags, n = review_package(files, {})
    read_lines = MAX_READ // len("y = id(x)\n")
    assert n == read_lines + 1 and len(flags) == MAX_FLAGS
    assert len(calls) == MAX_FLAGS + 1  # made: the kept ones and the unread's, never the other 6,500
    assert flags[-1].rule == UNREAD and flags[-1].where == f"attn_tensors/m{MAX_READ // len(module):02d}.py"


def test_a_notebook_answer_cell_is_read_and_an_archive_keeps_its_first_flags():
    nb = {"cells": [{"cell_type": "code", "source": "import ctypes\n" * 3,
                     "metadata": {"nbgrader": {"grade_id": "ex-3-1-answer", "solution": True}}}],
          "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    flags, n = review_package(RELEASE, RELEASE, {"notebooks/ch03.ipynb": json.dumps(nb).encode()})
    assert n == 3 and [f.where for f in flags] == [f"notebooks/ch03.ipynb (answer cells):{i}" for i in (1, 2, 3)]
    many = dict(RELEASE)
    many["attn_tensors/statmech.py"] += "".join(f"\nx{i} = __import__('os')" for i in range(3 * MAX_FLAGS))
    flags, n = review_package(many, RELEASE)
    assert len(flags) == MAX_FLAGS and n == 3 * MAX_FLAGS
    assert review_package(RELEASE, RELEASE, {"notebooks/ch03.ipynb": b"not json"}) == ([], 0)


def test_a_line_is_kept_as_plain_text():
    line = "import ctypes; x = '\x1b[31m' + 'a' * 500"
    (flag,) = review_text("m.py", line)
    assert "\x1b" not in flag.line and len(flag.line) <= 160


def test_every_rule_has_a_sample():
    assert {r.name for r in RULES} == {rule for _, rule in SAMPLES}


def test_a_docstring_is_not_code():
    text = ('def f(A):\n    """The entropy signal of each row: threading the mask through the stack.\n\n'
            '    Handy to compile (as in: collect) a table; see also eval(uate) notes.\n    """\n'
            '    return __import__("ctypes")\n')
    assert [(f.where, f.rule) for f in review_text("m.py", text)] == [("m.py:6", "dynamic code")]


def test_what_ran_is_shown_with_the_archives_own_line():
    """The job says only the rule and where; the line shown is the archive's file's (a job that
    names a line out of range, or a file not in the archive, gets no text of its own shown)."""
    files = {"attn_tensors/statmech.py": "a = 1\nimport pickle; pickle.loads(p)\n"}
    flags = ran_flags([Ran("ctypes", "attn_tensors/statmech.py", 2), Ran("ctypes", "attn_tensors/statmech.py", 1),
                       Ran("gc", "attn_tensors/statmech.py", 99), Ran("hooks", "../../etc/passwd", 1),
                       Ran("processes", "<cells>", 0), Ran("dynamic code", "", 0)], files)
    assert [(f.where, f.rule, f.line) for f in flags] == [
        ("attn_tensors/statmech.py:2 (as it ran)", "ctypes", "import pickle; pickle.loads(p)"),
        ("attn_tensors/statmech.py:99 (as it ran)", "gc", ""),
        ("the archive's code (as it ran)", "hooks", ""), ("answer cells (as they ran)", "processes", ""),
        ("code it made, wrote elsewhere or ran in a thread (as it ran)", "dynamic code", "")]


def _watched(pkg, run: str, *paths):
    """``run`` in a Python of its own (an audit hook is for good), under attn_course.watch.watch_runs
    for the job package ``pkg`` (on sys.path, with ``paths``), writing to a pipe whose lines are
    printed once ``run`` is done."""
    import subprocess
    import sys

    script = (f"import os, sys; sys.path[:0] = {[str(ROOT), str(pkg), *map(str, paths)]!r}\n"
              "from attn_course import watch\n"
              "r, w = os.pipe()\n"
              f"watch.watch_runs(__import__('pathlib').Path({str(pkg)!r}), w)\n"
              f"{run}\n"
              "os.close(w); print(os.read(r, 65536).decode(), end='')\n")
    # (-B, as a worker server runs: a package imported again in a later call would otherwise load the
    # bytecode the first wrote, which the watch takes for code objects the job made)
    return subprocess.run([sys.executable, "-B", "-c", script], capture_output=True, text=True, timeout=120)


def _seen(pkg, run: str, *paths, after: str = "") -> list[tuple[str, str, int]]:
    """What the watch said as ``run`` ran (:func:`_watched`), as (rule, file, line): after
    ``after`` (honest code, about which it must say nothing) where given."""
    out = _watched(pkg, f"{after}\nos.write(w, b'-\\n')\n{run}" if after else run, *paths)
    assert out.returncode == 0, out.stderr[-2000:]
    key, *lines = out.stdout.splitlines()
    if after:
        assert lines[:1] == ["-"], lines
        lines = lines[1:]
    return [(g["ran"], g["file"], g["line"]) for g in _unsealed(key, lines)]


def _unsealed(first: str, lines: list[str]) -> list[dict]:
    """The watch's lines, each sealed with the key of its first line (``{"watch": KEY}``)."""
    from attn_course.watch import unseal

    key = json.loads(first)["watch"]
    texts = [unseal(key, line) for line in lines]
    assert len(key) == 32 and None not in texts, lines
    return [json.loads(t) for t in texts]


def _job_package(tmp_path, source: str):
    """A job's package ``pkg`` whose module ``mod`` is ``source``, and an empty folder ``elsewhere``
    (for code of the job's outside its package), both under ``tmp_path``."""
    pkg, elsewhere = tmp_path / "pkg", tmp_path / "elsewhere"
    (pkg / "mod").mkdir(parents=True)
    elsewhere.mkdir()
    (pkg / "mod" / "__init__.py").write_text(source)
    return pkg, elsewhere


PEEK = "import sys\ndef peek():\n    return sys._getframe(0)\n"  # (a module that reads a frame)


def _pyc(source: str, filename: str) -> bytes:
    """A compiled module's file (no timestamp check) of ``source``, its code naming ``filename``."""
    import importlib.util
    import marshal

    return importlib.util.MAGIC_NUMBER + b"\0" * 12 + marshal.dumps(compile(source, filename, "exec"))


WATCHED = """\
import collections, logging, pickle, subprocess, sys, warnings
def quiet():  # what the standard library does for itself is not the module's doing
    logging.getLogger("x").info("hi"); collections.namedtuple("P", "a b"); warnings.warn("careful")
    return sorted([3, 1])
def loud():
    pickle.loads(b"cctypes\\nCDLL\\n(NtR.")
    exec("y = 2")
    subprocess.run(["true"])
    sys._getframe(0)
    quiet.__code__ = quiet.__code__.replace(co_filename="/usr/lib/python3.11/fake.py")
"""


def test_a_jobs_own_code_is_seen_as_it_runs(tmp_path):
    """attn_course.watch.watch_runs in a process of its own (an audit hook is for good): each rule
    once, with the job's file and line, at once; the standard library's own frame reads and the
    package's import are not the job's doing; code of the job's outside its package (written
    elsewhere, made from a string) is the job's too, named by no file."""

    pkg, elsewhere = _job_package(tmp_path, "from . import code\n")
    (pkg / "mod" / "code.py").write_text(WATCHED)
    (elsewhere / "other.py").write_text("import gc\ndef walk(x):\n    return gc.get_referrers(x)\n")
    out = _watched(pkg, "import mod, other\n"
                        "mod.code.quiet(); os.write(w, b'-\\n'); mod.code.loud(); mod.code.loud(); other.walk(r)",
                   elsewhere)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert lines[1] == "-", lines  # nothing before loud(): the imports, quiet()
    got = _unsealed(lines[0], lines[2:])
    where = "mod/code.py"
    assert got == [{"ran": "ctypes", "file": where, "line": 6}, {"ran": "dynamic code", "file": where, "line": 7},
                   {"ran": "processes", "file": where, "line": 8}, {"ran": "hooks", "file": where, "line": 9},
                   {"ran": "code objects", "file": where, "line": 10}, {"ran": "gc", "file": "", "line": 0}], got
    assert all(g["ran"] in WHY for g in got)


def test_a_job_that_takes_its_channel_away_while_it_does_so_ends(tmp_path):
    """Red team: the job put /dev/null in place of its results channel while it used ctypes, then
    put the channel back: the watch's line was lost.  The job now ends there (a crash: its exercise
    is lost); a job that leaves its channel alone runs on."""

    pkg, _ = _job_package(tmp_path, 
        "import ctypes, os\n"
        "def hide(fd):\n"
        "    keep = os.dup(fd); null = os.open(os.devnull, os.O_WRONLY); os.dup2(null, fd)\n"
        "    ctypes.CDLL(None).getpid()\n"
        "    os.dup2(keep, fd)\n")
    out = _watched(pkg, "import mod\nmod.hide(w)\nprint('ran on')")
    assert out.returncode == 3 and "ran on" not in out.stdout, (out.returncode, out.stdout, out.stderr[-2000:])


def test_frames_a_library_hands_the_job_are_seen_but_not_its_reading_of_a_traceback(tmp_path):
    """Red team, round 11: a job caught its own exception and had ``traceback.walk_tb`` or
    ``inspect.getinnerframes`` (``inspect.trace``) give it the frame, whose ``f_back`` it climbed to
    the grader's (``inspect.getattr_static``: no audit event), and read the key its results are
    sealed with: the library's own reading of ``tb_frame`` passed as the library's.  Such a hand-out
    is the job's doing now; ``traceback.format_exc`` (which hands out no frame) is not, nor JAX's
    traceback filter walking the frames of an error in the job's jitted code for itself."""
    pkg, _ = _job_package(tmp_path,
        "import inspect, traceback\n"
        "def caught():\n"
        "    try:\n"
        "        1 / 0\n"
        "    except ZeroDivisionError as e:\n"
        "        return e\n"
        "def told():\n"
        "    try:\n"
        "        1 / 0\n"
        "    except ZeroDivisionError:\n"
        "        return traceback.format_exc()\n"
        "def walk():\n"
        "    return next(traceback.walk_tb(caught().__traceback__))[0]\n"
        "def inner():\n"
        "    try:\n"
        "        1 / 0\n"
        "    except ZeroDivisionError:\n"
        "        return inspect.trace()[0].frame\n"
        "def stacked(n=4):\n"
        "    return stacked(n - 1) if n else next(iter(traceback.walk_stack(None)))[0]\n"
        "def filtered():  # (an error in a jitted function: JAX's traceback filter walks its frames)\n"
        "    import jax\n"
        "    try:\n"
        "        jax.jit(lambda x: x[[0.5]])(jax.numpy.ones(2))\n"
        "    except Exception:\n"
        "        return None\n")
    assert _seen(pkg, "mod.walk()", after="import mod\nmod.told()\nmod.filtered()") == [("hooks", "mod/__init__.py", 13)]
    assert _seen(pkg, "mod.inner()", after="import mod\nmod.told()") == [("hooks", "mod/__init__.py", 18)]
    # (walk_stack(None) reads its own frame, then hands out those behind it: red team, round 12)
    assert _seen(pkg, "mod.stacked()", after="import mod\nmod.told()") == [("hooks", "mod/__init__.py", 20)]


def test_every_watched_event_is_a_rule_of_the_review():
    from attn_course.watch import RAN_EVENTS

    assert {rule for rule, _ in RAN_EVENTS.values()} <= set(WHY)


def test_a_module_is_read_up_to_its_cap_as_python_reads_it(monkeypatch):
    """Red team, round 11: the cap was on the text as written, and NFKC makes U+FDFA eighteen
    characters: a 2 MB module of them was read as 12.6 M characters (22 s; an archive of seven, 82 s
    of the grader's time).  What the rules read is capped as Python reads it."""
    from attn_course import review

    monkeypatch.setattr(review, "MAX_TEXT", 10_000)
    read: list[int] = []

    class Words:
        def search(self, text):
            read.append(len(text))
            return WORDS.search(text)

    monkeypatch.setattr(review, "WORDS", Words())
    review_text("attn_tensors/statmech.py", "x = 1  # " + "\ufdfa" * 9_000 + "\n")
    assert sum(read) <= 10_000, sum(read)


def test_a_run_of_combining_marks_is_cut_before_it_is_normalised():
    """Red team, round 12: NFKC puts a run of combining marks in canonical order by insertion, and a
    comment of 40k marks of one class then 40k of another took 29 s of the grader's time.  A run is
    cut to 32 marks first (no name has more); names are read as Python reads them all the same."""
    from attn_course.review import _as_python_reads

    text = "x = 1  # " + "\u0301" * 40_000 + "\u0316" * 40_000
    assert len(_as_python_reads(text)) <= len("x = 1  # ") + 32
    assert _as_python_reads("import \uff43\uff54\uff59\uff50\uff45\uff53 # e\u0301") == "import ctypes # \u00e9"


def test_no_rule_reads_on_to_the_end_of_the_line():
    """Red team: the sys.modules rule read ``from sys import`` then ``.*`` then ``modules``: each of
    a line's imports scanned (and backtracked over) the rest of it, in the grader's own process,
    before any limit -- 61 s for a line of 256k characters, hours for an archive of sixteen
    modules of a million.  No rule has ``.`` under an unbounded repeat; such a line is read at
    once, and says nothing (it imports no ``modules``)."""
    for rule in RULES:
        assert not re.search(r"(?<!\\)\.(?:[*+]|\{\d*,\})", rule.pattern.pattern), rule.name
    line = "stack = 0; " + "from  sys\timport  " * 4000
    assert review_text("attn_tensors/statmech.py", line + "\n") == []


def test_an_archive_has_a_megabyte_tokenized_and_the_rest_read_as_it_is(monkeypatch):
    """Blanking strings tokenizes (Python, about 2 s a megabyte): an archive's modules share
    MAX_TOKENIZED characters of it; past it a module is read whole, strings too (red team: 16
    modules of a million characters held the grader for minutes).  A line of many strings is
    blanked in one pass, to the same text."""
    from attn_course import review

    line = "x = [" + "'gc.get_objects()'," * 500 + "]  # gc.get_objects()"
    blank = "x = [" + (" " * len("'gc.get_objects()'") + ",") * 500 + "]  " + " " * len("# gc.get_objects()")
    assert review._code_lines(f"import gc\n{line}\n")[1] == blank
    module = "import gc\ns = 'eval(x)'\n"
    files = {"attn_tensors/a.py": module, "attn_tensors/b.py": module}
    assert [f.rule for f in review_package(files, {})[0]] == ["gc", "gc"]
    monkeypatch.setattr(review, "MAX_TOKENIZED", len(module))
    flags = review_package(files, {})[0]
    assert [(f.where, f.rule) for f in flags] == [("attn_tensors/a.py:1", "gc"), ("attn_tensors/b.py:1", "gc"),
                                                   ("attn_tensors/b.py:2", "dynamic code")]


def test_the_watch_sees_through_threads_rebinding_and_names_of_libraries(tmp_path):
    """Red team, round 7: ctypes called by a thread the job started (no frame of the job's on its
    stack), os.write rebound around the call (the hook looked it up as it ran), and a compiled
    module that named itself <frozen ...> (taken for a library's): each is seen."""
    pkg, elsewhere = _job_package(tmp_path, 
        "import concurrent.futures, ctypes, gc, os, sys\n"
        "def threaded():\n"
        "    with concurrent.futures.ThreadPoolExecutor(1) as pool:\n"
        "        pool.submit(ctypes.CDLL, None).result()\n"
        "def rebound():\n"
        "    write = os.write\n"
        "    os.write = lambda fd, data: len(data)\n"
        "    try:\n"
        "        gc.get_referrers(os)\n"
        "    finally:\n"
        "        os.write = write\n")
    (elsewhere / "hidden.pyc").write_bytes(_pyc(PEEK, "<frozen numpy._hidden>"))
    got = _seen(pkg, "import mod, hidden\nmod.threaded(); mod.rebound(); hidden.peek()", elsewhere)
    assert got == [  # (hidden.pyc's import, from the script)
        ("code objects", "", 0), ("ctypes", "", 0), ("gc", "mod/__init__.py", 9), ("hooks", "", 0)], got


@pytest.mark.parametrize("where", ["folder", "zip"])
def test_compiled_code_the_job_imports_is_seen_whatever_it_claims_to_be(tmp_path, where):
    """A compiled module (no archive has one), in a folder or a zip on the path, whose code names
    a library's file, and which then gives itself a library's origin: taken for a library's, its
    frame reads were not the job's.  Its import is now seen, on the job's line; a library's own
    compiled files are not."""
    import zipfile

    pkg, elsewhere = _job_package(tmp_path, 
        "import json, sys\n"
        "def smuggle():\n"
        "    import hidden\n"
        "    hidden.__spec__.origin = json.__file__\n"
        "    return hidden.peek()\n"
        "def honest():\n"
        "    import email.mime.text\n")
    fake = os.path.join(os.path.dirname(json.__file__), "fake.py")
    pyc = _pyc(PEEK, fake)
    if where == "zip":
        with zipfile.ZipFile(elsewhere / "hidden.zip", "w") as z:
            z.writestr("hidden.pyc", pyc)
        path = elsewhere / "hidden.zip"
    else:
        (elsewhere / "hidden.pyc").write_bytes(pyc)
        path = elsewhere
    # (after: a library's compiled files, email's from its cache, are its own)
    got = _seen(pkg, "mod.smuggle()", path, after="import mod\nmod.honest()")
    assert got == [("code objects", "mod/__init__.py", 3)], got


def test_a_library_that_calls_what_the_job_gave_it_does_the_jobs_doing(tmp_path):
    """Red team: sys._getframe and exec handed to contextlib.ExitStack.callback were called from
    a library's frame, and taken for the library reading frames or compiling for itself (as
    logging and namedtuple do, which stay unseen).  A library's frame that does not name the
    function called what it was given: the job's doing, on the job's line."""
    from attn_course.watch import OWN_CALLS, RAN_EVENTS

    assert {e for e, (_, past) in RAN_EVENTS.items() if not past} == set(OWN_CALLS) | {"marshal.loads"}
    pkg, _ = _job_package(tmp_path, 
        "import collections, contextlib, logging, sys\n"
        "def routed():\n"
        "    logging.getLogger('x').warning('hi'); collections.namedtuple('P', 'a b')\n"
        "    with contextlib.ExitStack() as stack:\n"
        "        stack.callback(sys._getframe, 0)\n"
        "        stack.callback(exec, 'x = 1')\n")
    got = _seen(pkg, "import mod\nmod.routed()")
    assert got == [("dynamic code", "mod/__init__.py", 4),  # (the with statement, whose end ran them)
                   ("hooks", "mod/__init__.py", 4)], got


def test_a_module_on_a_path_through_a_librarys_folder_is_the_jobs(tmp_path):
    """Red team, round 8: a module the job wrote, imported from a path entry spelled
    "<a library's folder>/../../<its folder>", was taken for a library's (its origin and its
    code's file began with the library's folder): its ctypes call was not seen."""
    pkg, elsewhere = _job_package(tmp_path, "def run():\n    import sneaky\n    return sneaky.call()\n")
    (elsewhere / "sneaky.py").write_text("import ctypes\ndef call():\n    return ctypes.CDLL(None).getpid()\n")
    through = os.path.dirname(os.__file__) + "/.." * 12 + str(elsewhere)
    got = _seen(pkg, f"sys.path.insert(0, {through!r})\nimport mod\nmod.run()")
    assert [(rule, where) for rule, where, _ in got] == [("ctypes", "")], got


def test_code_a_job_compiles_under_a_librarys_name_is_its_own(tmp_path):
    """Red team, round 8: a string compiled by code.InteractiveInterpreter under os.py's name, in
    inspect's namespace, ran as a library's code (its frame reads, ctypes and gc calls unseen, its
    compile a library's own).  Code compiled under a library's file name from a source that is not
    that file's text is the job's, on the job's line, and so is every frame of that name from then
    on; a library compiling a file's own text (runpy) is not the job's doing."""
    pkg, _ = _job_package(tmp_path,
        "import code, colorsys, inspect, os, runpy\n"
        "SRC = 'import sys\\ndef peek():\\n    return sys._getframe(0)\\n'\n"
        "def honest():\n"
        "    runpy.run_path(colorsys.__file__)\n"
        "def forged():\n"
        "    code.InteractiveInterpreter(inspect.__dict__).runsource(SRC, os.__file__, 'exec')\n"
        "    return inspect.__dict__['peek']()\n")
    got = _seen(pkg, "mod.forged()", after="import mod\nmod.honest()")
    assert got == [("dynamic code", "mod/__init__.py", 6), ("hooks", "", 0)], got


def test_code_a_library_renames_after_a_librarys_file_is_the_jobs(tmp_path):
    """Red team: code from a string, run in inspect's namespace under the name "<input>" (its
    frames the job's), renamed after inspect.py by a library (hypothesis's impersonate calls
    code.replace for its caller): its frames passed for inspect's own.  A code object renamed
    after a library's file is the job's making, and that file's frames are the job's from then
    on; a library's module doing so as it is imported (types.coroutine, for asyncio) is not."""
    pkg, _ = _job_package(tmp_path,
        "import code, inspect\n"
        "SRC = 'import sys\\ndef peek():\\n    return sys._getframe(0)\\n'\n"
        "def honest():\n"
        "    import asyncio\n"
        "def renamed():\n"
        "    from hypothesis.internal.reflection import impersonate\n"
        "    code.InteractiveInterpreter(inspect.__dict__).runsource(SRC, '<input>', 'exec')\n"
        "    impersonate(inspect.getmembers)(inspect.__dict__['peek'])\n"
        "    return inspect.__dict__['peek']()\n")
    got = _seen(pkg, "mod.renamed()", after="import mod\nmod.honest()")
    assert got == [  # (code.py runs its caller's source)
        ("dynamic code", "mod/__init__.py", 7), ("code objects", "mod/__init__.py", 8), ("hooks", "", 0)], got


SWAPS = """\
import asyncio, colorsys, difflib, functools, os, types
import pyparsing  # (both set up functions of their own as they load: asyncio's __sleep0's code, pyparsing's defaults)
def new():  # a function of a module loaded since the job began
    colorsys.rgb_to_hsv.__code__ = (lambda r, g, b: (r, g, b)).__code__
def through_a_library():  # (functools' frame names setattr, not the attribute)
    functools.update_wrapper(colorsys.hls_to_rgb, lambda h, l, s: (h, l, s), assigned=("__code__",), updated=())
def old():  # a library's own assignment, to a (generator) function of a module loaded before the job
    gen = min(f.__name__ for f in vars(os).values() if isinstance(f, types.FunctionType) and f.__code__.co_flags & 0x20)
    types.coroutine(getattr(os, gen))
    return gen
def at_run_time():  # a library's assignment of what its caller gives it, not as a module loads
    from hypothesis.internal.reflection import impersonate
    impersonate(difflib.ndiff)(difflib.unified_diff)
def string_made():  # a function Python made from a string (a namedtuple's __new__), there before the job
    functools._CacheInfo.__new__.__defaults__ = (0, 0, 0, 0)
def made_now():  # a namedtuple the job makes, given its defaults by namedtuple
    import collections
    collections.namedtuple("P", "a b", defaults=(1,))
def own():
    own.__defaults__ = (1,)
"""


def test_code_swapped_in_a_function_not_the_jobs_is_seen_but_a_librarys_own_set_up(tmp_path):
    """Red team, round 8: an honest ``import matplotlib`` (pyparsing) or ``tqdm.auto`` (asyncio)
    made every exercise 0, "tampered": those libraries set the code or defaults of functions of
    their own as they load.  Only a library's own assignment (its frame names the attribute), as a
    library module loads, to a function of a module loaded since the job began passes; the job's
    own, a library's to a function that was there before, or a library's called by the job at run
    time (hypothesis's impersonate here; decorator's FunctionMaker.update sets any function's
    defaults) is seen (attn_course.watch.watch_code_swaps)."""
    import subprocess
    import sys

    pkg, _ = _job_package(tmp_path, SWAPS)
    script = (f"import os, pathlib, sys; sys.path[:0] = {[str(ROOT), str(pkg)]!r}\n"
              "assert not {'asyncio', 'colorsys', 'difflib', 'pyparsing'} & set(sys.modules)\n"
              "from attn_course import watch\n"
              "watch.note_functions()  # (as the server does)\n"
              f"watch.watch_code_swaps(pathlib.Path({str(pkg)!r}))\n"
              "def seen():\n"
              "    found, watch.SWAPPED[0] = watch.SWAPPED[0], ''\n"
              "    return found\n"
              "import mod\n"
              "print([seen()] + [(getattr(mod, f)(), seen()) for f in ('new', 'through_a_library', 'old', 'at_run_time', 'string_made', 'made_now', 'own')])\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    import ast

    got = ast.literal_eval(out.stdout)
    gen = got[3][0]
    assert "__new__" in got[5][1], got  # (named as namedtuple names it)
    assert got[:5] + got[6:] == ["", (None, "colorsys.rgb_to_hsv"), (None, "colorsys.hls_to_rgb"), (gen, f"os.{gen}"),
                                 (None, "difflib.unified_diff"), (None, ""), (None, "")], got


def test_what_the_watch_calls_cannot_be_rebound_by_the_job(tmp_path):
    """The watch's own helpers were Python functions that look up module globals as they run:
    json.dumps calls json._default_encoder (an encoder that writes nothing hid the line),
    threading.current_thread reads threading._active (a thread taken for the main one was not
    looked at), os.path.normpath calls posixpath's globals (any file taken for a library's).  The
    watch holds C functions, or its own."""
    pkg, elsewhere = _job_package(tmp_path,
        "import ctypes, inspect, json, os, posixpath, sys, threading\n"
        "class Quiet:\n"
        "    def encode(self, o):\n"
        "        return ''\n"
        "class Main(dict):  # every thread is the main one\n"
        "    def __getitem__(self, ident):\n"
        "        return threading.main_thread()\n"
        "def rebind():\n"
        "    json._default_encoder = Quiet()\n"
        "    threading._active = Main(threading._active)\n"
        "    posixpath._path_normpath = lambda p: os.__file__\n"
        "def thread():\n"
        "    t = threading.Thread(target=ctypes.CDLL, args=(None,)); t.start(); t.join()\n"
        "def peek(path):\n"
        "    exec(compile('import sys\\ndef peek():\\n    return sys._getframe(0)\\n', path, 'exec'), inspect.__dict__)\n"
        "    return inspect.__dict__['peek']()\n")
    got = _seen(pkg, f"import mod\nmod.rebind(); mod.thread(); mod.peek({str(elsewhere / 'x.py')!r})")
    assert got == [("ctypes", "", 0), ("dynamic code", "mod/__init__.py", 15), ("hooks", "", 0)], got


INSIDE = """\
import ctypes, gc, importlib.util, sys, threading
INSIDE, DONE = threading.Event(), threading.Event()
class Key(str):  # a key of a library module's namespace that the hook's lookup of '__spec__' compares
    def __hash__(self):
        return hash("__spec__")
    def __eq__(self, other):
        if ARMED and ACT == "raise":
            raise KeyError(other)
        if ARMED and ACT == "act":
            gc.get_objects()
        if ARMED and ACT == "hold":  # (the hook held in this thread while another calls ctypes)
            INSIDE.set(); DONE.wait(60)
        return False
ARMED = False
def held():
    t = threading.Thread(target=run); t.start(); INSIDE.wait(60)
    ctypes.CDLL(None)
    DONE.set(); t.join()
def run():
    global ARMED
    spec = importlib.util.find_spec("sched")
    module = importlib.util.module_from_spec(spec)
    namespace = vars(module)
    spec_ = namespace.pop("__spec__")
    namespace[Key("x")] = 1  # (where the spec was: the lookup meets the key first)
    namespace["__spec__"] = spec_
    sys.modules["sched"] = module
    ARMED = True
    spec.loader.exec_module(module)  # (namedtuple reads a frame as sched loads: the hook asks sched for its spec)
"""


@pytest.mark.parametrize("act", ["raise", "act", "hold"])
def test_code_of_the_jobs_run_by_the_watch_is_seen_and_cannot_silence_it(tmp_path, act):
    """The watch asks a module loaded since the job began (sched, made and run by the job through
    importlib, on the stack of namedtuple's frame read) for its spec: a key of the job's in its
    namespace, whose __eq__ the lookup calls, ran the job's code inside the hook.  Raising there
    made the hook drop the event (it passed what failed); acting there went unseen (the hook
    ignored the events of its own thread).  Now what fails is said all the same, and what the
    job's code does there is seen; and while the hook runs in one thread, another's calls are seen
    (holding it was enough to hide them)."""
    pkg, _ = _job_package(tmp_path, f"ACT = {act!r}\n" + INSIDE)
    got = _seen(pkg, "import mod\n" + ("mod.held()" if act == "hold" else "mod.run()"))
    if act == "raise":  # (every event whose walk meets sched's frames, its import's too)
        assert "hooks" in {rule for rule, _, _ in got} and {where for _, where, _ in got} == {""}, got
    elif act == "hold":
        assert got == [("ctypes", "mod/__init__.py", 18)], got
    else:
        assert [(rule, where) for rule, where, _ in got] == [("gc", "")], got


# (round 9) each: the job's module, what the run calls, and what the watch says as it runs
ROUND_9 = {
    # inspect hands its caller's frame, and the grader's behind it, to the job
    "currentframe": ("from inspect import currentframe\ndef run():\n    return currentframe().f_back\n",
                     [("hooks", "mod/__init__.py", 3)]),
    # a traceback's, a generator's frame
    "tb_frame": ("def run():\n    try:\n        1 / 0\n    except ZeroDivisionError as e:\n"
                 "        return e.__traceback__.tb_frame\n", [("hooks", "mod/__init__.py", 5)]),
    # code.py compiles and runs its caller's source
    "runsource": ("import code\ndef run():\n    code.InteractiveInterpreter({}).runsource('x = 1')\n",
                  [("dynamic code", "mod/__init__.py", 3)]),
    # functools sets the attribute its caller names, __code__ too
    "update_wrapper": ("import colorsys, functools\ndef run():\n"
                       "    functools.update_wrapper(colorsys.hls_to_rgb, lambda h, l, s: 0, ('__code__',), ())\n",
                       [("code objects", "mod/__init__.py", 3)]),
    # a process's memory, by its name or a link to it: refused, and said
    # (and, the tenth session's red team, by a str or bytes subclass's name, to open or os.open)
    "memory": ("import os, tempfile\nclass S(str): pass\nclass B(bytes): pass\n"
               "def run():\n    link = os.path.join(tempfile.mkdtemp(), 'm')\n"
               "    os.symlink('/proc/self/mem', link)\n"
               "    for path in ('/proc/self/mem', link, '/proc/%d/mem' % os.getpid(), S('/proc/self/mem'), B(b'/proc/self/mem')):\n"
               "        for opener in (lambda p: open(p, 'r+b'), lambda p: os.open(p, os.O_RDWR)):\n"
               "            try:\n                opener(path)\n            except PermissionError:\n                continue\n"
               "            raise AssertionError(path)\n", [("raw memory", "mod/__init__.py", 8)]),
    # what libraries do for themselves, called by the job: nothing to say
    "honest": ("import enum, inspect, traceback, typing\ndef run():\n    try:\n        1 / 0\n"
               "    except ZeroDivisionError:\n        traceback.format_exc()\n"
               "    inspect.signature(run); typing.NamedTuple('P', [('a', int)]); enum.Enum('E', 'a b')\n", []),
}


@pytest.mark.parametrize("case", sorted(ROUND_9))
def test_what_round_9_did_unseen_is_seen(tmp_path, case):
    """Red team, round 9: frames handed out by inspect or read through a traceback, code run from
    a string by code.py, a code swap through functools.update_wrapper, and a process's memory
    file, each went unseen (at full marks); what libraries do for themselves stays unseen."""
    source, expected = ROUND_9[case]
    pkg, _ = _job_package(tmp_path, source)
    got = _seen(pkg, "import mod\nmod.run()")
    assert got == expected, got


def test_a_jobs_callable_run_by_the_grader_is_the_jobs(tmp_path):
    """Red team, round 9: a C callable of the job's run from the grader's frames -- by the garbage
    collector through weakref.finalize, or handed to the grader as an exercise's function -- was
    taken for the grader's own call (ctypes.memmove wrote to memory unseen).  The grader loads no
    library through ctypes and walks no object graph as a job runs: these are the job's."""
    pkg, _ = _job_package(tmp_path, "")
    got = _seen(pkg, "import ctypes, functools, gc, weakref\n"
                     "from attn_course import worker\n"
                     "class C:\n    pass\n"
                     "o = C(); o.me = o\n"
                     "weakref.finalize(o, gc.get_objects)\n"
                     "del o\n"
                     "worker.as_graded(gc.collect)()\n"
                     "try:\n    worker.as_graded(functools.partial(ctypes.CDLL, None))()\n"
                     "except Exception:\n    pass\n")
    assert got == [("gc", "", 0), ("ctypes", "", 0)], got


@pytest.mark.parametrize("sep", ["\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029", "\x0b", "\x0c", "\r", "\r\n"])
def test_lines_are_numbered_as_python_numbers_them(sep):
    """Red team (ninth session, round 9): a comment holding a character that ``str.splitlines`` breaks
    at and Python does not (``\\x1c``, ``\\u2028``...) shifted every later string's blanking one line
    up, onto code: the next line's ``exec(`` went unflagged, and ran.  A line end Python does read
    (``\\r``, ``\\r\\n``) numbers the lines as Python does."""
    text = f"x = 1  # note{sep}more\nexec('y = 2')\n'''a\nstring'''\nz = 2\n"
    compile(text, "m.py", "exec")  # (valid Python: what the grader would run)
    flags = review_text("m.py", text)
    line = 3 if sep in ("\r", "\r\n") else 2
    assert [(f.where, f.rule) for f in flags] == [(f"m.py:{line}", "dynamic code")], flags


NATIVE = """\
import importlib.machinery, importlib.util, shutil, sys
def load(name, folder=None):
    '''What importing ``name`` (from ``folder``, put first on sys.path) gave: "loaded" or the error.'''
    if folder:
        sys.path.insert(0, folder)
    try:
        __import__(name)
        return "loaded"
    except ImportError as err:
        return str(err)
    finally:
        if folder:
            sys.path.remove(folder)
def copied(folder, but=None):
    '''An installed library's extension module not yet imported (nor ``but``), its file copied into ``folder``.'''
    for name in ("_bz2", "_lzma", "_csv", "_queue", "_bisect", "_json", "_heapq", "_random", "_statistics"):
        spec = importlib.util.find_spec(name) if name not in sys.modules and name != but else None
        if spec and isinstance(spec.origin, str) and spec.origin.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES)):
            shutil.copy(spec.origin, folder)
            return name
"""


def test_native_code_out_of_the_watchs_sight_is_refused_as_it_loads(tmp_path):
    """Red team, the tenth session: three doors to native code that no audit event showed.  cffi's
    backend casts ``id(x)`` to a ``char *`` and writes the process's memory through it (the key the
    results are sealed with, in place); ``_xxsubinterpreters.run_string`` runs ctypes in a second
    interpreter, where the job's audit hook does not run; and an extension module the job wrote
    (here an installed one's file, copied) runs its own initialisation.  Each is refused as it
    loads (an ImportError the job may catch) and said once, with the job's line; an installed
    library's own extension module, and a path that only passes through the libraries, are what
    they are (round 10's L2: ``import mlx.core``, whose set-up in C compiles code, was listed as
    the job's dynamic code)."""
    pkg, elsewhere = _job_package(tmp_path, NATIVE)
    site = tmp_path / "user" / "site-packages"  # (a user site on the worker's path: a library's folder)
    site.mkdir(parents=True)
    out = _watched(pkg, "import mod\n"
                        "honest = mod.load('scipy.special')\n"
                        f"user = mod.copied({str(site)!r})\n"
                        f"assert mod.load(user, {str(site)!r}) == 'loaded'\n"
                        # (mlx.core's own set-up, in C, compiles and runs code: not the job's doing)
                        "mlx = mod.load('mlx.core') if mod.importlib.util.find_spec('mlx') else 'loaded'\n"
                        f"name = mod.copied({str(elsewhere)!r}, but=user)\n"
                        "os.write(w, b'-\\n')\n"
                        "got = [mod.load('_cffi_backend'), mod.load('_xxsubinterpreters'), mod.load('_testcapi'),\n"
                        f"       mod.load(name, {str(elsewhere)!r}),\n"
                        f"       mod.load(name, {'/'.join([os.path.dirname(os.__file__)] + ['..'] * 12) + str(elsewhere)!r})]\n"
                        "print(name, honest, got, file=sys.stderr)\n"
                        "assert honest == mlx == 'loaded' and name, (name, honest, mlx)\n"
                        "assert all('a graded job may' in g for g in got), got\n"
                        "assert name not in sys.modules\n", site)
    assert out.returncode == 0, out.stderr[-2000:]
    key, dash, *lines = out.stdout.splitlines()
    assert dash == "-", out.stdout
    assert [(g["ran"], g["file"], g["line"]) for g in _unsealed(key, lines)] == [("native code", "mod/__init__.py", 7)]
    assert "native code" in WHY



def test_native_code_loaded_by_any_door_is_found_in_the_process_map(tmp_path):
    """The tenth session's red team loaded a library of its own through jaxlib's loader of PJRT
    plugins (C++: no audit event).  That loader now refuses, and whatever door a job finds, what
    it loaded stays mapped executable from a file that is not a library's: a job's report looks
    for one (attn_course.watch.foreign_code) and is ``tampered`` when it finds it.  SQLite's
    extensions are refused as they load."""
    import subprocess
    import sys

    script = f"""
import importlib.machinery, importlib.util, shutil, sys
sys.path.insert(0, {str(ROOT)!r})
import ctypes, jax.numpy, numpy, scipy.special
from attn_course import watch
from jaxlib import xla_client
check = watch.foreign_code()
assert check() == "", check()
watch.refuse_native_loaders()
try:
    xla_client.load_pjrt_plugin_dynamically("mine", "/nowhere/plugin.so")
    raise AssertionError("loaded")
except PermissionError:
    pass
name = next(n for n in ("_csv", "_queue", "_bisect", "_heapq", "_random", "_json")
            if (s := importlib.util.find_spec(n)) and str(s.origin).endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES)))
copy = shutil.copy(importlib.util.find_spec(name).origin, {str(tmp_path)!r})
ctypes.CDLL(copy)
print(check())
r, w = __import__("os").pipe()
watch.watch_runs(__import__("pathlib").Path({str(tmp_path)!r}), w)
try:
    sys.audit("sqlite3.load_extension", None, "ext")
    raise AssertionError("not refused")
except PermissionError:
    pass
"""
    out = subprocess.run([sys.executable, "-B", "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().startswith(f"native code loaded from {tmp_path}"), out.stdout
