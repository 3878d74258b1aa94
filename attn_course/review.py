"""Code to review: constructs in a submission that no exercise needs and that can reach the checks.

A job's probes run in the job's own process, beside the submission's code
(:mod:`attn_course.worker`).  :mod:`attn_course.tamper` finds, as the job
runs, what the submission changed of the code that checks it: a function
replaced, a rule rebound, a hook set.  Some changes it cannot see -- the
process's memory written in place through ``ctypes``, a closure's cell
rewritten through ``gc`` -- and the sandbox is no help there: the job may
do anything to its own process.  So the grader also *reads* each archive
(never runs it) for the constructs such changes are made of, and lists
them in the class report (``report.md``, "Code to review"): ``ctypes``,
``gc``'s object graph, profile and trace hooks, ``sys.modules``, code
objects and closures, ``builtins``, dynamic code (``exec``, ``eval``,
``__import__``), ``importlib``, stack frames, JAX's private modules,
processes, signals and sockets, the grader's own modules, host callbacks (run
while the compiled program runs), NumPy's views of raw memory, and attributes
and names reached by strings (``getattr``, ``globals()``).  Names are read
as Python reads them (NFKC: full-width letters are the ASCII ones).  A flag
changes no score: it is a place for the instructor to look (this is a
complement to the checks that run, not a proof: a reader's rules can be
dodged, and a person reads the list).

What the reader's rules miss is also seen as it runs: a job's own code that loads a library
through ctypes, walks gc's object graph, reads frames or sets hooks, runs code from a string or
starts a process is said by the job's process at once, through Python's audit hooks
(:func:`attn_course.watch.watch_runs`), and listed ``(as it ran)`` with its line.

Only what the student wrote is read: lines that are not in the release's
version of the same module (or of the same notebook's answer cells), so the
reference's own code, copied by an honest student, is never flagged
(``tests/course/test_review.py`` checks the whole reference library).
"""

from __future__ import annotations

import functools
import io
import re
import tokenize
import unicodedata
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Iterable, Mapping

from .notebook_cells import answer_cells
from .text import plain, python_lines, python_source

MAX_TEXT = 1 << 20  # characters of a module read (a submission's module is far smaller)
# characters an archive may have tokenized to blank its strings and comments (the whole library is
# a quarter of it); past it a module is read as it is, strings too (tokenizing is Python, about
# 2 s a megabyte: an archive of 16 such modules held the grader, outside every limit, for a minute)
MAX_TOKENIZED = 1 << 20
MAX_FLAGS = 20  # flags kept per archive (the count says how many there were)
# characters of an archive's code that are read at all (the rules, line by line): four times the
# whole library.  Every line a rule matched made a flag, kept or not: an archive of 78 modules of
# `y = id(x)` made 1.5 million and held the grader 50 s, outside every limit (red team, round 12)
MAX_READ = 1 << 20
UNREAD = "not read"  # the flag of the code past MAX_READ


@dataclass(frozen=True)
class Rule:
    name: str
    pattern: re.Pattern
    why: str


def _rule(name: str, pattern: str, why: str) -> Rule:
    return Rule(name, re.compile(pattern), why)


RULES: tuple[Rule, ...] = (
    _rule("ctypes", r"\b_?ctypes\b", "writes the process's memory: can change the checks unseen"),
    # (the tenth session's red team: an address from id() made an array through a class whose
    # __array_interface__ was named by strings put together, or through DLPack, a capsule of any
    # address made by scipy's get_raw_capsule)
    _rule("raw memory", r"\bctypeslib\b|\bas_strided\b|\bstride_tricks\b|__array_(?:interface|struct)__"
                        r"|(?<![\w.])id\s*\(|\bget_raw_capsule\b|\b_ccallback(?:_c)?\b|\bLowLevelCallable\b"
                        r"|__dlpack__|\bPyCapsule\w*",
          "NumPy arrays over any address of the process: its memory read or written, as with ctypes"),
    # (the tenth session: cffi's backend casts an id() to a pointer, and a second interpreter runs
    # ctypes where no audit hook of the job's sees it; the watch refuses both as they run)
    _rule("native code", r"\b_?cffi(?:_backend)?\b|\b_test(?:internal)?capi\b|\b_(?:xx)?(?:sub)?interp(?:reters|channels|queues)\b"
                         r"|\b(?:create|exec)_dynamic\b|\b_imp\b|\bload_pjrt_plugin\w*|\bregister_plugin\b"
                         r"|\b(?:enable_)?load_extension\b|\bregister_ffi_target\b",
          "native code of its own, or code in another interpreter: out of every check's sight"),
    _rule("gc", r"\bimport\s+gc\b|\bfrom\s+gc\s+import\b|\bgc\s*\.\s*get_(?:referrers|referents|objects)\b",
          "reaches every live object, the checks' own among them"),
    _rule("hooks", r"\bset(?:profile|trace)\b|\bsys\s*\.\s*monitoring\b|\b_getframe\b|\b_current_frames\b"
                   r"|\bwalk_(?:stack|tb)\b|\bget(?:inner|outer)frames\b|\bf_(?:back|globals|locals)\b"
                   r"|\binspect\s*\.\s*(?:currentframe|stack|trace)\b|\b__traceback__\b|\btb_frame\b",
          "runs inside, or reads the frames of, the code that checks it"),
    # (the names of a ``from sys import`` as a list, not ``.*``: with ``.*`` each import on a line
    # scanned the rest of it, and a line of many imports held the grader for hours: red team)
    # (round 10: ``import sys as _s`` then ``_s.modules``: every rule that reads ``sys.`` missed it)
    _rule("sys.modules", r"\bsys\s*\.\s*modules\b|\.\s*modules\s*\[|\bsys\s+as\b"
                         r"|\bfrom\s+sys\s+import\s*\(?\s*(?:\w+(?:\s+as\s+\w+)?\s*,\s*)*modules\b",
          "replaces modules the checks import"),
    # (round 6 of the eighth session's red teams: a partial's function replaced by __setstate__, an
    # object's class swapped, a primitive's bind set on the object itself)
    _rule("code objects", r"__(?:code|closure|globals|defaults|kwdefaults|setstate)__|\bco_consts\b|__class__\s*=(?!=)"
                          r"|\b(?:Code|Function)Type\b|\bcell_contents\b|\.\s*bind\s*=(?!=)",
          "rewrites functions (its own, or the checks')"),
    _rule("builtins", r"\b__builtins__\b|\bimport\s+builtins\b|\bbuiltins\s*\.", "changes what every module sees"),
    # (round 8 of the ninth session: pydoc.locate("jax._src.interpreters.pxla") reached a module whose
    # name was only a string, which the review blanks)
    _rule("dynamic code", r"(?<![\w.])(?:exec|eval|compile|__import__)\s*\(|(?<![\w.])__import__\b"
                          r"|\bimportlib\b|\bpkgutil\b|\bresolve_name\b"
                          r"|\b(?:pydoc|runpy|zipimport|zipimporter)\b|\blocate\s*\(",
          "code or modules the grader cannot read in the archive"),
    # (the public modules that reach the same rules too, and their names in a ``from jax import``
    # list: red team, ``from jax import _src`` and ``jax.interpreters.mlir.register_lowering``)
    _rule("jax internals", r"\bjax\s*\.\s*extend\b|\b(?:_src|interpreters|jaxlib)\b"
                           r"|\bfrom\s+jax\s+import\s*\(?\s*(?:\w+(?:\s+as\s+\w+)?\s*,\s*)*(?:_src|interpreters|extend)\b"
                           r"|\bregister_lowering\b|lowerings\b|\bprimitive_(?:jvps|transposes|linearizations|batchers)\b"
                           # (round 6: a jitted jax.numpy function's cached trace, from .trace(x).jaxpr, doctored
                           # in place: later traces inline the doctored copy)
                           r"|\b_?jaxpr\b|\b_(?:consts|eqns)\b",
          "JAX's rules for its primitives (lowerings, derivatives): what gradients are made of"),
    _rule("processes", r"\b(?:subprocess|multiprocessing|socket|signal|mmap|pty|threading|_thread)\b"
                       r"|\bconcurrent\s*\.\s*futures\b|\bfrom\s+concurrent\s+import\b"
                       r"|\bos\s*\.\s*(?:system|fork|kill|popen|exec\w*|spawn\w*|_exit)\b",
          "processes, signals, sockets or threads: nothing an exercise needs"),
    # (round 6: the classic mistake's nan gradient made 0 by the student's own custom_vjp, whose backward
    # pass is its own pullback through nan_to_num: no check's code changed, every value right)
    # (round 14: MLX's twin, mx.custom_function with an @f.vjp of its own; a call of jax.vjp is an
    # honest way to check a derivative, a decorator naming .vjp is not)
    _rule("own derivative", r"\b(?:custom_vjp|custom_jvp|defvjp|defjvp|nan_to_num|custom_function)\b"
                            r"|@\s*\w+(?:\s*\.\s*\w+)*\s*\.\s*(?:vjp|jvp)\b",
          "a derivative of its own, or nan erased: a gradient the exercise checks may come from it, not the formula"),
    _rule("course code", r"\battn_course\b", "the grader's own modules: its probes, its worker, how results are written"),
    _rule("callbacks", r"\b(?:pure_callback|io_callback)\b|\bdebug\s*\.\s*callback\b",
          "Python run while the compiled program runs, after the checks that follow its trace"),
    _rule("attributes by name", r"\b(?:setattr|getattr|getattr_static|attrgetter|methodcaller|get_field)\s*\(|\b__dict__\b"
                                r"|\bFormatter\b"
                                r"|__getattribute__|\b__setattr__\s*\("
                                r"|(?<![\w.])(?:vars|globals|locals)\s*\("
                                # (round 15: ``V = vars``, then ``V(jax)``: the name held, not called)
                                r"|(?<![\w.])(?:vars|globals|locals|getattr|setattr|delattr)\b(?!\s*\()"
                                # (the tenth session's red team: pickle's globals by name, members
                                # by name, a class made of a namespace of names from strings)
                                r"|\b(?:c?[Pp]ickle|_pickle|copyreg|shelve|dill|cloudpickle)\b|\bfind_class\b"
                                r"|\bgetmembers\b|\bnew_class\b|(?<![\w.])type\s*\([^,()\n]*,[^,\n]*,",
          "reaches attributes or names it can build from pieces of strings, out of a reader's sight"),
)


@dataclass(frozen=True)
class Flag:
    """One line of a submission that a :class:`Rule` matched."""

    where: str  # "attn_tensors/statmech.py:12", or "notebooks/ch03.ipynb (answer cells):4"
    rule: str
    line: str  # the line, stripped and capped (plain text: escape it where it is shown)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping) -> "Flag":
        return cls(str(data.get("where", "")), str(data.get("rule", "")), str(data.get("line", "")))


WHY = {r.name: r.why for r in RULES}
WHY[UNREAD] = (f"the archive's code is longer than the review reads ({MAX_READ // 2**20} M characters): "
               "what lies past it was not read, by any rule")


def _code_lines(text: str) -> list[str]:
    """The module's lines with their comments and string literals blanked (a docstring that
    speaks of a signal is not code; ``__import__("ctypes")`` is still its ``__import__``); the
    lines as they are where the text does not tokenize (a syntax error: the import fails
    anyway, but it is read).  Each line is rebuilt once, from its blanked spans (rebuilt at each
    of a line's strings, a line of a million ``'',`` took a minute of the grader's time)."""
    text = python_source(text)
    lines = python_lines(text)
    spans: dict[int, list[tuple[int, int]]] = {}
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type not in (tokenize.COMMENT, tokenize.STRING):
                continue
            (r0, c0), (r1, c1) = tok.start, tok.end
            for row in range(r0, r1 + 1):
                spans.setdefault(row - 1, []).append((c0 if row == r0 else 0, c1 if row == r1 else len(lines[row - 1])))
    except (tokenize.TokenError, SyntaxError, IndexError, RecursionError, MemoryError):
        return lines
    for row, blanks in spans.items():
        if row >= len(lines):
            continue
        chars = list(lines[row])
        for start, end in blanks:
            chars[start:end] = " " * (end - start)
        lines[row] = "".join(chars)
    return lines


ANY = re.compile("|".join(f"(?:{r.pattern.pattern})" for r in RULES))
# what is read in a module's strings too, and the rule it is: names no honest text spells, which
# NumPy reads from a dict (an array over any address from {"__array_interface__": {"data": ...}}
# raises no audit event, so no watch sees it run: red team, round 9)
IN_STRINGS = (re.compile(r"__array_(?:interface|struct)__"), "raw memory")
# the words every rule needs, as plain alternatives (each starts with a letter or "_", so the
# regular expression engine skips the text's other characters at once): one fast pass finds
# whether a module has anything to look at more closely
WORDS = re.compile("ctypes|gc|set(?:profile|trace)|monitoring|_getframe|f_(?:back|globals|locals)|currentframe|stack"
                   "|modules|__(?:code|closure|globals|defaults|kwdefaults|builtins|import)__|co_consts|CodeType"
                   "|FunctionType|cell_contents|builtins|exec|eval|compile|importlib|_src|jaxlib|interpreters|extend"
                   "|lowering|primitive_|subprocess"
                   "|multiprocessing|socket|signal|mmap|pty|threading|system|fork|kill|popen|spawn|_exit"
                   "|_current_frames|walk_stack|walk_tb|getinnerframes|getouterframes|inspect|concurrent|_thread|pkgutil|resolve_name|methodcaller"
                   "|pydoc|runpy|zipimport|locate|sys\\s+as"
                   "|attn_course|callback|setattr|delattr|__dict__|vars|ctypeslib|as_strided|stride_tricks|__array_"
                   "|getattr|attrgetter|__getattribute__|globals|locals|__setstate__|__class__|bind|get_field|Formatter"
                   "|custom_vjp|custom_jvp|defvjp|defjvp|nan_to_num|custom_function|vjp|jvp|jaxpr|_consts|_eqns"
                   "|cffi|_test|_xx|_interp|_dynamic|_imp"
                   "|__traceback__|tb_frame|ickle|copyreg|shelve|dill|find_class|getmembers|new_class|type\\s*\\(|id\\s*\\("
                   "|raw_capsule|_ccallback|LowLevelCallable|__dlpack__|Capsule|pjrt|register_plugin|load_extension|ffi_target")


def _combining_class() -> str:
    """A character class of every character with a combining class (a regular expression's)."""
    marks = [c for c in range(0x110000) if unicodedata.combining(chr(c))]
    spans, start = [], marks[0]
    for a, b in zip(marks, marks[1:] + [-1]):
        if b != a + 1:
            spans.append(f"\\U{start:08x}" + (f"-\\U{a:08x}" if a != start else ""))
            start = b
    return "[" + "".join(spans) + "]"


# a run of combining marks past this length is cut to it before NFKC, which puts a run in canonical
# order by insertion: a run of 40k of one class then 40k of another took 29 s (red team); no name
# Python reads has more than a few marks on a letter
@functools.cache
def _marks() -> re.Pattern:
    """(Made at the first text that is not ASCII: looking at every character takes 0.3 s.)"""
    marks = _combining_class()
    return re.compile(f"({marks}{{32}}){marks}+")


def _as_python_reads(text: str) -> str:
    """The text with its names as Python reads them: NFKC-normalised (PEP 3131), so that
    ``import ｃｔｙｐｅｓ`` (full-width letters: Python imports ``ctypes``) is read as what it
    does.  (Strings change too, but no rule reads a string.)"""
    return text if text.isascii() else unicodedata.normalize("NFKC", _marks().sub(r"\1", text))


@functools.lru_cache(maxsize=512)
def _known(stub: str) -> frozenset[str]:
    """The release's lines, stripped (the release's texts are the same objects for every archive)."""
    return frozenset(line.strip() for line in python_lines(_as_python_reads(stub)))


def review_text(where: str, text: str, stub: str = "", budget: list[int] | None = None,
                counts: dict[str, int] | None = None) -> list[Flag]:
    """The flags of one module (or a notebook's answer cells): lines not in ``stub`` that a rule matches.

    ``budget``: ``[characters]`` the archive may still have tokenized (:data:`MAX_TOKENIZED`),
    spent here; once spent, the text's strings and comments are read as code too.  ``counts``:
    the archive's flags so far, by rule; a rule's flags past :data:`MAX_FLAGS` are counted there,
    not made (none of them would be kept)."""
    written = text[:MAX_TEXT]
    # (capped again as Python reads it: NFKC makes one character up to 18 -- U+FDFA -- and a 2 MB
    # module of them held the grader 22 s, an archive of seven 80 s: red team)
    text = _as_python_reads(written)[:MAX_TEXT]
    known = _known(stub)
    lines = python_lines(text)
    shown = python_lines(written)  # (a line is listed as it was written)
    if len(shown) != len(lines):
        shown = lines
    new = [i for i, line in enumerate(lines) if line.strip() not in known]
    new = [i for i in new if WORDS.search(lines[i])]
    if not new or not ANY.search("\n".join(lines[i] for i in new)):  # (most modules: nothing tokenized)
        return []
    if budget is None or budget[0] >= len(text):
        code_lines = _code_lines(text)
        if budget is not None:
            budget[0] -= len(text)
    else:
        code_lines = lines
    flags = []
    for i in new:
        code = code_lines[i] if i < len(code_lines) else lines[i]
        number = i + 1
        if not (code.strip() and ANY.search(code)) and not IN_STRINGS[0].search(lines[i]):
            continue
        found = [rule.name for rule in RULES if rule.pattern.search(code)]
        if IN_STRINGS[1] not in found and IN_STRINGS[0].search(lines[i]):
            found.append(IN_STRINGS[1])
        for name in WHY:
            if name not in found:
                continue
            if counts is not None:
                counts[name] = counts.get(name, 0) + 1
                if counts[name] > MAX_FLAGS:
                    continue
            flags.append(Flag(f"{where}:{number}", name, plain(shown[i].strip(), 160, newlines=False)))
    return flags


def review_package(files: Mapping[str, str], release: Mapping[str, str],
                   notebooks: Mapping[str, bytes] = {}, release_notebooks: Mapping[str, str] = {}) -> tuple[list[Flag], int]:
    """Flags of an archive's library (``{path: text}``, against the release's) and notebooks
    (``{"notebooks/chNN.ipynb": bytes}``, answer cells against the release's answer cells):
    at most :data:`MAX_FLAGS` of them (:func:`kept`: every rule's first, then the rest in order),
    and how many there were.  The first :data:`MAX_READ` characters of the archive's code are
    read; where there is more, a flag of :data:`UNREAD` says where the reading stopped."""
    flags: list[Flag] = []
    budget = [MAX_TOKENIZED]
    counts: dict[str, int] = {}
    left = MAX_READ
    texts = [(path, files[path], release.get(path, "")) for path in sorted(files)
             if path.endswith(".py") and files[path] != release.get(path)]
    for name in sorted(notebooks):
        try:
            cells = answer_cells(notebooks[name])
        except ValueError:
            continue  # (the grader says so where it grades notebooks)
        texts.append((f"{name} (answer cells)", cells, release_notebooks.get(name, "")))
    for where, text, stub in texts:
        flags += review_text(where, text[:left], stub, budget, counts)
        if len(text) > left:
            flags.append(Flag(where, UNREAD, f"read up to its character {left + 1:,} only: the archive's code "
                                             f"took the review's {MAX_READ // 2**20} M characters"))
            counts[UNREAD] = 1
            break
        left -= len(text)
    return kept(flags, counts), sum(counts.values())


def kept(flags: list[Flag], counts: Mapping[str, int] | None = None, limit: int = MAX_FLAGS) -> list[Flag]:
    """At most ``limit`` of an archive's flags, in their order: each rule's first (the rarest
    rules' first, where there are more rules than room), then the others as they come.  The
    first ``limit`` alone hid a rule behind as many harmless flags of another (red team, round 12:
    twenty ``getattr`` lines in a module read first, and its ``import ctypes`` was in no report)."""
    if len(flags) <= limit:
        return list(flags)
    by_rule = dict(counts) if counts else Counter(f.rule for f in flags)  # (how many each rule had, kept or not)
    firsts: dict[str, int] = {}
    for i, f in enumerate(flags):
        firsts.setdefault(f.rule, i)
    chosen = set(sorted(firsts.values(), key=lambda i: (by_rule[flags[i].rule], i))[:limit])
    for i in range(len(flags)):
        if len(chosen) >= limit:
            break
        chosen.add(i)
    return [f for i, f in enumerate(flags) if i in chosen]


def ran_flags(ran: Iterable, files: Mapping[str, str]) -> list[Flag]:
    """Flags of what an archive's code was seen doing as it ran (:class:`attn_course.runner.Ran`,
    :func:`attn_course.watch.watch_runs`), a rule once each: ``FILE:LINE (as it ran)`` with that
    line as the archive's file has it (the job says only where), or where no file of the archive is
    named, what the code was (a notebook's cells; code the job made, wrote elsewhere or ran in a thread)."""
    flags: list[Flag] = []
    for r in ran:
        if any(f.rule == r.rule for f in flags):
            continue
        if r.file in files:
            lines = python_lines(files[r.file])
            text = lines[r.line - 1] if 1 <= r.line <= len(lines) else ""
            flags.append(Flag(f"{r.file}:{r.line} (as it ran)", r.rule, plain(text.strip(), 160, newlines=False)))
        else:
            where = {"<cells>": "answer cells (as they ran)",
                     "": "code it made, wrote elsewhere or ran in a thread (as it ran)"}.get(r.file, "the archive's code (as it ran)")
            flags.append(Flag(where, r.rule, ""))
    return flags
