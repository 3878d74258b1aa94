"""The run-time watch of a job's process: audit hooks (:func:`sys.addaudithook`) on the job's code.

Two hooks, installed in a job's own process before any of its code runs (an
audit hook cannot be removed, and the process ends with its job):

* :func:`watch_runs` writes a line to the job's results channel the first time
  the job's code does what a rule of the review reads for (ctypes, gc's object
  graph, frames and hooks, code from a string, code objects, processes): what a
  reader's rules miss is seen as it runs (:mod:`attn_course.review`).  What no
  audit event would show at all is refused as it loads: native code that is not an
  installed library's, the modules of :data:`REFUSED_MODULES`, another interpreter.
* :func:`watch_code_swaps` notes a function's code or defaults replaced, where
  the function is not the job's own: :mod:`attn_course.tamper` compares only
  some modules' functions, and the job's exercises are ``tampered`` from then on.

Both ask the same question of a frame, whether it is a library's
(:func:`library_frames`): the code of a module of the standard library or an
installed package, loaded as such by the import system, and not code the job
compiled under a library's file name.
"""

from __future__ import annotations

import _json
import _stat
import _thread
import importlib.machinery
import io
import os
import posix
import sys
import types
from pathlib import Path
from typing import Callable, NamedTuple

import numpy as np

# audit events (:func:`sys.addaudithook`) that are run-time evidence of a rule of the review
# (:data:`attn_course.review.RULES`): the rule, and whether the code that counts is the first
# that is not a library's (True: the standard library's or an installed package's own frames,
# which did it for their caller, are passed), or the code that called the audited function itself
# (False: logging, warnings and namedtuple read frames or compile code for themselves)
RAN_EVENTS: dict[str, tuple[str, bool]] = {
    "ctypes.": ("ctypes", True),  # (every ctypes.* event)
    "gc.get_objects": ("gc", True), "gc.get_referrers": ("gc", True), "gc.get_referents": ("gc", True),
    "sys._getframe": ("hooks", False), "sys._current_frames": ("hooks", False), "sys.setprofile": ("hooks", False),
    "sys.settrace": ("hooks", False), "sys.addaudithook": ("hooks", False),
    "exec": ("dynamic code", False), "compile": ("dynamic code", False),
    "code.__new__": ("code objects", False), "function.__new__": ("code objects", False),
    "marshal.loads": ("code objects", False), "object.__setattr__": ("code objects", False),
    "subprocess.Popen": ("processes", True), "os.system": ("processes", True), "os.fork": ("processes", True),
    "os.forkpty": ("processes", True), "os.kill": ("processes", True), "os.killpg": ("processes", True),
    "os.exec": ("processes", True), "os.posix_spawn": ("processes", True), "os.spawn": ("processes", True),
    "socket.__new__": ("processes", True),
    "object.__getattr__": ("hooks", False),  # (a frame of a traceback, generator or coroutine: FRAME_ATTRIBUTES)
    "open": ("raw memory", True),  # (a process's memory file, /proc/<pid>/mem: refused as well)
    # native code that no rule here would see run, refused as well (:data:`REFUSED_MODULES`): an
    # extension module of the job's own or one of those, and another interpreter, whose code no audit
    # hook of this one's sees (red team: ctypes run by _xxsubinterpreters.run_string, unseen)
    "import": ("native code", True), "cpython.PyInterpreterState_New": ("native code", True),
    # (SQLite's extensions are native libraries it loads: where this Python can, refused as well)
    "sqlite3.enable_load_extension": ("native code", True), "sqlite3.load_extension": ("native code", True),
}
NATIVE_EVENTS = frozenset(e for e, (rule, _) in RAN_EVENTS.items() if rule == "native code")  # (all refused)
# the extension modules a job may not import, wherever they lie: they read and write any address
# of the process with no audit event (cffi's backend: cast an id() to a char * and write through
# it), run code in another interpreter (below), or are CPython's own tests of its C internals
REFUSED_MODULES = frozenset({
    "_cffi_backend", "_xxsubinterpreters", "_xxinterpchannels", "_interpreters", "_interpchannels", "_interpqueues",
    "_testcapi", "_testinternalcapi",
    "_testbuffer", "_testmultiphase", "_testsinglephase", "_testimportmultiple", "_testclinic",
    "_ctypes_test", "_xxtestfuzz"})
FRAME_ATTRIBUTES = frozenset({"tb_frame", "gi_frame", "cr_frame", "ag_frame"})
# the standard library's functions that read a traceback's frames and hand them to their caller
# (inspect.trace calls getinnerframes): (function, module)
HANDS_OUT_FRAMES = (("walk_tb", "traceback"), ("getinnerframes", "inspect"), ("trace", "inspect"),
                    ("walk_stack", "traceback"))  # (walk_stack(None) reads its own frame, then f_back)
# the libraries that compile and run the source their caller gives them: their naming compile or
# exec is not their own doing (red team: code.InteractiveInterpreter().runsource(src) was not seen)
RUN_CALLERS_SOURCE = ("code", "codeop", "runpy", "timeit", "pdb", "bdb", "profile", "cProfile", "trace", "doctest")
# the libraries that read their caller's frame for its module's name, and hand it to no one
# (namedtuple, typing's NamedTuple and TypeVar, enum's functional API): another library that
# returns a frame not a library's (inspect.currentframe, inspect.stack) gives the job a frame
# of its own or the grader's, the job's doing (red team)
READ_CALLERS_NAME = ("collections/__init__", "typing", "enum")
_CODE_ATTRIBUTES = ("__code__", "__defaults__", "__kwdefaults__", "__closure__", "__globals__")
SWAPPED_ATTRIBUTES = ("__code__", "__defaults__", "__kwdefaults__")  # (watch_code_swaps)
# for the events a library may cause for itself (those of RAN_EVENTS not traced past libraries):
# the names its own call is written with.  A library's frame whose code names none of them did
# not call the function itself: it called what it was given, a callable of the job's (red team:
# contextlib.ExitStack.callback(sys._getframe, 1), or exec, called from a library's frame)
OWN_CALLS: dict[str, frozenset[str]] = {
    "sys._getframe": frozenset({"_getframe"}), "sys._current_frames": frozenset({"_current_frames"}),
    "sys.setprofile": frozenset({"setprofile"}), "sys.settrace": frozenset({"settrace"}),
    "sys.addaudithook": frozenset({"addaudithook"}),
    # (and the import system's loader of an extension module, whose own set-up in C compiles and runs
    # code: mlx.core's, as a student imports it.  Only a library's gets that far: "import", below)
    "exec": frozenset({"exec", "eval", "exec_dynamic"}), "compile": frozenset({"compile", "exec", "eval", "exec_dynamic"}),
    "code.__new__": frozenset({"CodeType", "replace"}),
    "function.__new__": frozenset({"FunctionType", "LambdaType"}),
    "object.__setattr__": frozenset(_CODE_ATTRIBUTES),  # (not setattr: functools.update_wrapper sets
    "object.__getattr__": FRAME_ATTRIBUTES,  # what its caller names, __code__ too: red team)
}
FROZEN = "<frozen "  # (the file name of a frozen module's code: importlib's own)

# what the hooks call is C, or this module's (whose functions' code or defaults the job cannot
# replace unseen, watch_code_swaps): the job may rebind a module's globals (posixpath.os, and
# os.path.normpath calls os.fspath; json.dumps calls json._default_encoder), which no hook sees
_normpath = getattr(posix, "_path_normpath", None) or os.path.normpath  # (C, where this Python has it)
_quote = _json.encode_basestring_ascii  # (a JSON string, quoted)


def _isfile(path, _stat_=posix.stat, _isreg=_stat.S_ISREG) -> bool:
    """:func:`os.path.isfile`, with what it calls held (C)."""
    try:
        return _isreg(_stat_(path).st_mode)
    except (OSError, ValueError, TypeError):
        return False


_LIBRARIES: list[tuple[str, ...]] = []  # (_libraries, once per process)


def _libraries() -> tuple[str, ...]:
    """Where the code of no job lies: the standard library and the installed packages."""
    if _LIBRARIES:
        return _LIBRARIES[0]
    import site
    import sysconfig

    paths = sysconfig.get_paths()
    dirs = [paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths]
    dirs += [os.path.dirname(os.__file__), os.path.dirname(os.path.dirname(np.__file__))]  # (where they are)
    dirs += [d for d in getattr(site, "getsitepackages", lambda: [])() if os.path.isabs(d)]  # (a distribution's own)
    # (and a folder made for packages that the worker's path has besides: a user site, one a .pth
    # file adds, which a server puts back on its path: attn_course.sandbox.worker_site_dirs)
    dirs += [d for d in sys.path if isinstance(d, str) and os.path.isabs(d)
             and os.path.basename(os.path.normpath(d)) in ("site-packages", "dist-packages")]
    found = {os.path.realpath(d) + os.sep for d in dirs} | {os.path.abspath(d) + os.sep for d in dirs}
    _LIBRARIES.append(tuple(sorted(found)))
    return _LIBRARIES[0]


_MODULE_DICT = types.ModuleType.__dict__["__dict__"].__get__  # (a module's own namespace, whatever its class says)


def _library_module(m, libraries: tuple[str, ...], _type=type, _str=str, isfile=_isfile, normpath=_normpath,
                    issubclass_=issubclass, module=types.ModuleType, namespace=_MODULE_DICT,
                    spec_type=importlib.machinery.ModuleSpec) -> bool:
    """Whether the import system loaded module ``m`` from the standard library or an installed
    package (frozen or built in, or a ``.py`` or ``.so`` file under ``libraries``).

    Read from the module's own namespace and its spec's, as the import system made them: a job's
    object in ``sys.modules`` is asked nothing of its own (a property, a module's ``__getattr__``
    would be the job's code, run in the watch's hook)."""
    if not issubclass_(_type(m), module):
        return False
    spec = namespace(m).get("__spec__")
    if _type(spec) is not spec_type:
        return False
    origin = spec.__dict__.get("origin")
    if _type(origin) is not _str:
        return False
    if origin == "frozen" or origin == "built-in":
        return True
    origin = normpath(origin)  # ("<a library's folder>/../../tmp/x.py" is /tmp's: red team, round 8)
    return origin.startswith(libraries) and origin.endswith((".py", ".so")) and isfile(origin)


class Held(NamedTuple):
    """Objects held (module namespaces, functions), and the set of their ids."""

    ids: frozenset
    held: tuple

    def add(self, found: list) -> "Held":
        """These and ``found`` (those not here already)."""
        found = [o for o in found if id(o) not in self.ids]
        return Held(self.ids | {id(o) for o in found}, self.held + tuple(found)) if found else self


def _stdlib_files(names) -> frozenset[str]:
    """The files of these modules of the standard library (``collections/__init__`` for a package)."""
    return frozenset(_normpath(os.path.join(os.path.dirname(os.__file__), n + ".py")) for n in names)


_SEEN: dict[str, object] = {}  # a module's name -> the module looked at (namespaces)
_LIBRARY = [Held(frozenset(), ())]  # the library modules' (namespaces)
_EVERY = [Held(frozenset(), ())]  # every module's (namespaces)


def namespaces(refresh: bool = True) -> tuple[Held, Held]:
    """The namespaces of the library modules loaded so far (:func:`_library_module`), and of every module.

    Each module is looked at once: the template refreshes them before each
    fork, so that a job's watch (``refresh=False``) starts from them as they
    are, touching no module (looking at every module took about 12 ms a job,
    a file's status each, and writing to their pages after the fork 3 ms
    more).  Both are immutable, made anew by each refresh, and the hooks hold
    them: a job can neither change a set nor free a namespace in it to make
    one of its own at its address.
    """
    if refresh or not _SEEN:
        libraries = _libraries()
        found, every = [], []
        for name, m in list(sys.modules.items()):
            if _SEEN.get(name) is m:
                continue
            _SEEN[name] = m
            namespace = getattr(m, "__dict__", None)
            if type(namespace) is dict:
                every.append(namespace)
                if _library_module(m, libraries):
                    found.append(namespace)
        _LIBRARY[0], _EVERY[0] = _LIBRARY[0].add(found), _EVERY[0].add(every)
    return _LIBRARY[0], _EVERY[0]


class LibraryFrames(NamedTuple):
    """Whether a frame is a library's (:func:`library_frames`), and the file names the job compiled
    code under that name a library's file (no frame of theirs is a library's from then on)."""

    is_library: Callable[[types.FrameType], bool]
    forged: set


_FRAMES: list[LibraryFrames] = []  # (library_frames, once per process)


def library_frames() -> LibraryFrames:
    """The one test, in a job's process, of whether a frame is a library's: its code's file is under
    the libraries (or a frozen module's), it is not a name the job compiled code under, and its
    globals are the namespace of a module the import system loaded from there (:func:`_library_module`:
    those of the template's, held, or, for a module loaded since, found once and held).  A file's
    name alone is the job's to choose (a compiled file that named itself ``<frozen ...>``; code
    compiled from a string under ``os.py``'s name, run in ``inspect``'s namespace: red team, round 8)."""
    if _FRAMES:
        return _FRAMES[0]
    libraries = _libraries()
    library = namespaces(refresh=False)[0]
    late: dict[int, dict] = {}  # (namespaces of library modules loaded since, held)
    refused: set[int] = set()
    forged: set[str] = set()
    modules, library_module, namespace, module = sys.modules, _library_module, _MODULE_DICT, types.ModuleType
    _id, _type, _str, _list, issubclass_, normpath = id, type, str, list, issubclass, _normpath

    def is_library(frame) -> bool:
        name = frame.f_code.co_filename
        if not (_type(name) is _str and (normpath(name).startswith(libraries) or name.startswith(FROZEN))):
            return False
        if forged and normpath(name) in forged:
            return False
        g = _id(frame.f_globals)
        if g in library.ids or g in late:
            return True
        if g in refused:
            return False
        for m in _list(modules.values()):  # (a library module loaded since: as the import system made it)
            if issubclass_(_type(m), module) and namespace(m) is frame.f_globals and library_module(m, libraries):
                late[g] = frame.f_globals
                return True
        refused.add(g)
        return False

    _FRAMES.append(LibraryFrames(is_library, forged))
    return _FRAMES[0]


SWAPPED = [""]  # a function of code not the job's whose code or defaults were replaced (its name)
_OWN = [("<notebook cell",)]  # where the job's own code lives (its package's folder, its cells)
_SWAPS_WATCHED = [False]


_FUNCTIONS = [Held(frozenset(), ())]  # the functions that exist before any job (note_functions)
# the libraries that give a function they have just made its defaults or code, whenever they are
# called (namedtuple the defaults of its __new__; types.coroutine the flags of a generator's code)
SETS_UP_ITS_OWN = ("collections/__init__", "types")


def refuse_native_loaders() -> None:
    """jaxlib's loader of PJRT plugins, which opens any shared library by its path (in C++: no
    audit event) and runs its set-up, replaced by one that refuses (the tenth session's red team:
    reached through ``pickle``, it ran a library the job wrote).  A worker server calls this before
    anything takes what a job may not change (:mod:`attn_course.tamper` sees it put back); the
    grader's workers run JAX on the CPU, which loads no plugin."""
    try:
        from jaxlib import _jax
    except ImportError:
        return

    def refused(*args, **kwargs):
        raise PermissionError("a graded job may not load a PJRT plugin: native code out of every check's sight")

    if hasattr(_jax, "load_pjrt_plugin"):
        _jax.load_pjrt_plugin = refused


def _executable_files(read, open_, close) -> list[str]:
    """The files this process maps executable (from ``/proc/self/maps``), as the kernel names them."""
    try:
        fd = open_("/proc/self/maps", os.O_RDONLY)
    except OSError:
        return []
    try:
        chunks = []
        while True:
            chunk = read(fd, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        close(fd)
    found = []
    for line in b"".join(chunks).decode("utf-8", "replace").splitlines():
        fields = line.split(None, 5)
        if len(fields) == 6 and "x" in fields[1] and fields[5].startswith("/"):
            found.append(fields[5])
    return found


def foreign_code() -> Callable[[], str]:
    """A check of this process's executable mappings, from now on: the first file mapped that is
    native code the job could have written (the tenth session's red team had jaxlib's plugin
    loader run such a library; whatever the door, it stays mapped), said as "native code loaded
    from PATH"; "" where there is none.  A file counts where it is deleted, or lies on a file
    system that is not read-only, outside the installed libraries (:func:`_libraries`) and the
    folders of what this process mapped before (the Python's own, the C library's, wherever this
    machine keeps them).  What it calls is held now."""
    read, open_, close, statvfs, rdonly = posix.read, posix.open, posix.close, posix.statvfs, os.ST_RDONLY
    trusted, mapped = _libraries(), _executable_files
    before = frozenset(path.rpartition("/")[0] for path in mapped(read, open_, close))

    def check() -> str:
        for path in mapped(read, open_, close):
            deleted = path.endswith(" (deleted)")
            if not deleted and (path.startswith(trusted) or path.rpartition("/")[0] in before):
                continue
            try:
                if not deleted and statvfs(path).f_flag & rdonly:
                    continue  # (not the job's: it can write nowhere there)
            except OSError:
                pass
            return "native code loaded from " + path[:200]
        return ""

    return check


# the stub release's modules compiled, beside this module in the sandbox's copy of the course (staged
# by attn_course.sandbox._stage_release_bytecode, placed in each job's package by
# attn_course.worker.place_release_bytecode); absent where the course runs from its own folder
RELEASE_BYTECODE = Path(__file__).resolve().parent / "release_pyc"
_RELEASE_CODE: list[frozenset] = []


def release_code() -> frozenset:
    """The code of the stub release's compiled modules, as the import system hands it to
    ``marshal.loads`` (the file past its 16-byte header): a job's loading exactly these bytes is the
    release's module imported, not code of the job's making (:func:`watch_runs`).  Read once a
    process (the server reads it before its template forks)."""
    if not _RELEASE_CODE:
        found = set()
        for path in sorted(RELEASE_BYTECODE.rglob("*.pyc")) if RELEASE_BYTECODE.is_dir() else ():
            try:
                data = path.read_bytes()
            except OSError:
                continue
            if len(data) > 16:
                found.add(data[16:])
        _RELEASE_CODE.append(frozenset(found))
    return _RELEASE_CODE[0]


def note_functions() -> None:
    """Holds every function the collector sees now: they existed before any job
    (:func:`watch_code_swaps`).  The server notes them before it freezes what it imported (the
    collector no longer sees those), the template again after a warm-up (what it made since)."""
    import gc

    _FUNCTIONS[0] = _FUNCTIONS[0].add([o for o in gc.get_objects() if type(o) is types.FunctionType])


def watch_code_swaps(package: Path, say: Callable[[str], None] | None = None) -> None:
    """From now on, this process notes (:data:`SWAPPED`) code swapped in functions not of
    ``package`` (or of a notebook's cells).  ``say`` (the first call's, in a process: a job's
    child runs one job) is called with the first as it is made: the job's worker writes it, sealed,
    to the results channel at once, where the job cannot take it back (round 15: the job emptied
    :data:`SWAPPED`, a list of a module's, and a swap of JAX's transpose rules for ``mul`` and
    ``div`` went unseen: 3.2's nan gradient 3/3).

    A function's ``__code__``, ``__defaults__`` or ``__kwdefaults__`` replaced counts where the
    function is not the job's own (its code's file is not the package's, nor a cell's), whatever
    its file: a function Python made from a string (a namedtuple's or a dataclass's methods, JAX's
    among them) is as much the grader's as any (red team, round 9: JAX's DebugInfo.__new__, run
    as it traces, was not seen).  It counts where the function existed before the job (it was
    noted, :func:`note_functions`, or its module was loaded before), or where the job replaced
    it: a library setting up a function it has just made is passed -- as a library module is
    imported (pyparsing gives its new functions defaults, :func:`types.coroutine` sets asyncio's
    ``__sleep0``'s code: an honest ``import matplotlib`` or ``tqdm.auto`` made every exercise 0:
    red team, round 8), or namedtuple and types.coroutine at any time (SETS_UP_ITS_OWN).  Set up
    by a library means the frame that assigns is a library's whose code names the attribute.

    :mod:`attn_course.tamper` compares the code of only some modules' functions (reading every
    function's costs each job about 6 ms of copied pages); Python announces every such
    assignment, in any module, before it is made, and an audit hook cannot be removed.
    """
    _OWN[0] = (str(package) + os.sep, str(Path(package).resolve()) + os.sep, "<notebook cell")
    SWAPPED[0] = ""  # (a job run in a process that ran one before: that one's is not this one's)
    if _SWAPS_WATCHED[0]:
        return
    before = namespaces(refresh=False)[1].ids  # (every module's, as the job began)
    existed = _FUNCTIONS[0].ids
    from .tamper import watched_modules

    # the modules of the checks' (attn_course.tamper's): a class of one swapped, even for a moment,
    # puts a property before its dict, which every `module.name` reads (red team, round 14: jax.vjp
    # and mlx.core.value_and_grad shadowed so, the dict the same, and put back before the check)
    watched = {id(m): m.__name__ for m in watched_modules()}
    is_library = library_frames().is_library
    own, swapped, attributes = _OWN, SWAPPED, SWAPPED_ATTRIBUTES
    told = [say is None]  # (the hook's own, out of the job's reach but for the collector's referents)

    def note(name: str) -> None:
        swapped[0] = name
        if not told[0]:
            told[0] = True
            say(name)
    function, _type, _str, _id, _len, _getattr = types.FunctionType, type, str, id, len, getattr
    getframe, normpath, sets_up_its_own = sys._getframe, _normpath, _stdlib_files(SETS_UP_ITS_OWN)

    def being_set_up(frame, attribute: str) -> bool:
        """Whether ``frame`` (a library's, whose code names ``attribute``) sets up a function it
        has just made: one of SETS_UP_ITS_OWN, or any as a library module is imported (a module's
        frame of a library's comes before any other on its stack: a library's function called at
        run time with what the job chose -- decorator's or prometheus_client's
        ``FunctionMaker.update`` sets any function's defaults, pydevd's any function's code --
        is not)."""
        if not (is_library(frame) and attribute in frame.f_code.co_names):
            return False
        if normpath(frame.f_code.co_filename) in sets_up_its_own:
            return True
        while frame is not None and is_library(frame):
            if frame.f_code.co_name == "<module>":
                return True
            frame = frame.f_back
        return False

    def hook(event: str, args: tuple) -> None:
        if event != "object.__setattr__" or _len(args) < 2:
            return
        if args[1] == "__class__":  # (the module by its id, as it was before: nothing of the job's is read)
            name = watched.get(_id(args[0]))
            if name is not None and not (swapped[0] and told[0]):
                note(f"{name}.__class__"[:200])
            return
        if args[1] not in attributes:
            return
        fn = args[0]
        if _type(fn) is not function:  # (first: another object's attributes are not read, its class neither)
            return
        where = fn.__code__.co_filename
        if (_type(where) is _str and where.startswith(own[0])) or (swapped[0] and told[0]):
            return
        try:
            old = _id(fn) in existed or (_type(where) is _str and (where.startswith("/") or where.startswith(FROZEN))
                                         and _id(fn.__globals__) in before)
            if not old and being_set_up(getframe(1), args[1]):
                return
        except Exception:  # noqa: BLE001 - (a library's, or not: counted)
            pass
        # (strings only: another object's format would be the job's code, run here)
        module, name = _getattr(fn, "__module__", None), _getattr(fn, "__qualname__", None)
        note(f"{module if _type(module) is _str else '?'}.{name if _type(name) is _str else '?'}"[:200])

    sys.addaudithook(hook)
    _SWAPS_WATCHED[0] = True


def sealer(key: str) -> Callable[[str], str]:
    """``seal(text)``: ``text``, a tab and the hex HMAC-SHA256 of ``text`` under ``key`` -- a line of
    the job's channel that :func:`unseal` takes for the job's watch's or worker's.  What it calls
    is bound here, before any of the job's code runs (OpenSSL's HMAC and the methods of ``str``
    and ``bytes``): the job may rebind ``hmac``'s or ``hashlib``'s functions, not these.  A seal
    read off the channel tells nothing of another line's."""
    from _hashlib import hmac_digest

    secret = key.encode()

    def seal(text: str, _digest=hmac_digest, _secret=secret) -> str:
        return text + "\t" + _digest(_secret, text.encode(), "sha256").hex()

    return seal


def unseal(key: str, line: str) -> str | None:
    """The text of a line sealed with ``key`` (:func:`sealer`), or None (not sealed, or not with it)."""
    import hmac

    text, tab, mac = line.rpartition("\t")
    if not tab or len(mac) != 64:
        return None
    try:  # (the line sealed again, as the job's seal would: the job writes what it likes, a lone surrogate too)
        sealed = hmac.compare_digest(sealer(key)(text).encode(), line.encode())
    except (UnicodeError, ValueError, TypeError):
        return None
    return text if sealed else None


def watch_runs(package: Path, fd: int) -> Callable[[str], str]:
    """From now on, in a job's own process: the first time the job's code does what a review rule
    reads for -- loads a library through ctypes, walks gc's object graph, reads frames or sets a
    hook, runs code from a string or makes code objects, starts a process -- one line
    ``{"ran": RULE, "file": PATH, "line": N}``, sealed, is written to ``fd`` (the job's results
    channel) at once, before the call returns: what a reader's rules miss (a name built from
    strings, or written in other letters; a pickle that calls ctypes) is seen as it runs.  First,
    before any of the job's code runs, ``{"watch": KEY}``: a key of this process's own.  Every
    later line that counts is sealed with it (:func:`sealer`), the worker's results too: a line
    of the job's own making does not count (red team: a forged first line of a rule hid the real
    one; a result line written to the channel by the job's code, before the worker's, got credit
    for a gradient the job computed its own way).  Returns the job's ``seal``.

    The job's code is any that is not a library's nor the grader's: a library's frame is one of a
    module of the standard library or an installed package, loaded as such (:func:`library_frames`);
    code the job has compiled under a library's file name, from a source that is not that file's
    text, is its own, and so is every frame of that file from then on (red team, round 8: a string
    compiled by ``code.InteractiveInterpreter`` as ``os.py``, in ``inspect``'s namespace); PATH is
    relative for the package's files, ``<cells>`` for a notebook's, "" for any other code of the
    job's (written elsewhere, made from a string, or run by a thread it started, whose stack holds
    library frames only).  The hook holds what it calls (the job may rebind ``os.write``), and the
    rule is said only once its line is written.  Where ``fd`` is no longer the channel it was
    (closed, or another file put in its place), or the line cannot be written, the job ends at
    once: its exercise is lost, as a crash.
    """
    import threading

    own = (str(package) + os.sep, str(Path(package).resolve()) + os.sep)
    grader = os.path.dirname(os.path.abspath(__file__)) + os.sep
    libraries = _libraries()
    trusted = libraries + (grader,)  # where the compiled files a job may import from lie
    # the functions of the import system that read a compiled file, and their local naming it
    compiled_path = {"_compile_bytecode": "bytecode_path", "_unmarshal_code": "pathname"}
    is_library, forged = library_frames()
    # what the hook calls, held here: the job may rebind a module's functions, this module's
    # tables (through sys.modules) or builtins (red team: os.write rebound around the call), or
    # the globals of a module's function (threading.current_thread's)
    write, fstat, quote, exit_, getframe = posix.write, posix.fstat, _quote, posix._exit, sys._getframe
    _type, _str, _len, normpath, stat, open_ = type, str, len, _normpath, posix.stat, io.open
    events, code_attributes, ctypes_event = dict(RAN_EVENTS), frozenset(_CODE_ATTRIBUTES), RAN_EVENTS["ctypes."]
    own_calls = dict(OWN_CALLS)
    main, get_ident = threading.main_thread().ident, _thread.get_ident
    key = os.urandom(16).hex()
    seal = sealer(key)
    channel = fstat(fd)
    said: set[str] = set()
    framing: set[int] = set()  # the threads whose hook reads its caller's frame
    busy: set[int] = set()  # the threads in the hook (its own calls raise events too; another
    # thread's are seen all the same: a flag of the whole process let a job's thread that kept
    # the hook busy hide the main one's calls)

    frame_attributes, frame_type = FRAME_ATTRIBUTES, types.FrameType
    release = release_code()
    release_sizes = frozenset(len(code) for code in release)

    def released(data) -> bool:
        """Whether ``data`` (what ``marshal.loads`` was given) is a release module's code: bytes or a
        memoryview (neither can be subclassed into running the job's code here), compared by value."""
        if _type(data) is memoryview:
            if data.nbytes not in release_sizes:
                return False
            data = data.tobytes()
        return _type(data) is bytes and _len(data) in release_sizes and data in release
    run_source, read_name = _stdlib_files(RUN_CALLERS_SOURCE), _stdlib_files(READ_CALLERS_NAME)
    hand_outs = frozenset((name, path) for name, module in HANDS_OUT_FRAMES for path in _stdlib_files((module,)))
    proc, fsdecode, creates = stat("/proc/self").st_dev, os.fsdecode, os.O_CREAT
    refused_modules, native_events = REFUSED_MODULES, NATIVE_EVENTS
    issubclass_, str_copy = issubclass, _str.__str__
    importing = "<frozen importlib."

    def memory_file(path, flags) -> bool:
        """Whether ``path``, as ``open`` was given it, is a process's memory (``/proc/<pid>/mem``,
        or a link to it: a regular file of /proc's that only its owner may read and write), which
        writes to any byte of the process as ctypes does (red team).  A name that cannot be looked
        up from here (relative to a folder the job opened) counts if it ends in ``mem``."""
        try:
            if _type(path) is not _str and _type(path) is not bytes and path is not None \
                    and not issubclass_(_type(path), int):  # (a descriptor: already open)
                path = named(path)  # (the tenth session's red team: a str subclass's /proc/self/mem passed)
                if path is None:
                    return True
            if _type(path) is bytes:
                path = fsdecode(path)
            if _type(path) is not _str:
                return False
            try:
                st = stat(path)
            except OSError:
                return not (_type(flags) is int and flags & creates) and (path == "mem" or path.endswith("/mem"))
            return st.st_dev == proc and st.st_mode & 0o177777 == 0o100600
        except Exception:  # noqa: BLE001 - (an odd name: counted)
            return True

    def named(path):
        """The name the call opens, as exact ``str`` or ``bytes``, where ``open`` was given a
        subclass of either (a path object's ``__fspath__`` was asked before the event: its answer is
        what the event holds): the subclass's own data, read with nothing of the job's run (its
        methods are not asked).  None for anything else, which is refused."""
        kind = _type(path)
        if issubclass_(kind, _str):
            return str_copy(path)
        if issubclass_(kind, bytes):
            return b"".join((path,))
        return None

    def hands_out(returned, caller) -> bool:
        """Whether a library's frame read (``caller`` called ``sys._getframe``) returned a frame of the
        job's: inspect.currentframe and inspect.stack hand it, and the grader's frames behind it, to
        their caller (red team).  Those that only read their caller's module name do not count."""
        if _type(returned) is not frame_type or caller is returned or not is_library(caller):
            return False
        name = returned.f_code.co_filename
        if is_library(returned) or (_type(name) is _str and name.startswith(grader)):
            return False
        return normpath(caller.f_code.co_filename) not in read_name

    def names_library(filename) -> bool:
        return _type(filename) is _str and (filename.startswith(FROZEN) or normpath(filename).startswith(libraries))

    def forges(event: str, args: tuple) -> bool:
        """Whether the code made would pass for a library's, and is not: compiled from a source
        that is not the text of the library's file it is named after (or named after a frozen
        module), or a code object's copy renamed after a library's file (red team: hypothesis's
        ``impersonate`` gave code from a string the name of the file of its globals' module)."""
        if event not in ("compile", "code.__new__") or _len(args) < 2 or not names_library(args[1]):
            return False
        if event == "code.__new__" or args[1].startswith(FROZEN):
            return True
        path = normpath(args[1])
        try:
            source = args[0]
            source = source.encode() if _type(source) is _str else bytes(source)  # (an AST: TypeError)
            if stat(path).st_size != _len(source):
                return True
            with open_(path, "rb") as f:
                return f.read() != source
        except Exception:  # noqa: BLE001 - not a file's text
            return True

    def say(line: str) -> None:
        try:
            now = fstat(fd)
            if (now.st_dev, now.st_ino) != (channel.st_dev, channel.st_ino) or write(fd, line.encode()) <= 0:
                exit_(3)
        except BaseException:  # noqa: BLE001 - the channel was taken away: nothing it reports counts
            exit_(3)

    def ran(rule: str, where: str = "", number: int = 0) -> None:
        if rule not in said:
            say(seal('{"ran": %s, "file": %s, "line": %d}' % (quote(rule), quote(where[:300]), number)) + "\n")
            said.add(rule)

    def native(event: str, args: tuple) -> str:
        """Why the job may not have this native code loaded or run ("" where it may): another
        interpreter, a module of :data:`REFUSED_MODULES`, or an extension module whose file is not
        an installed library's (one the job wrote: bytes of its own, or a library's copied)."""
        if event.startswith("sqlite3."):
            return "a graded job may not load SQLite's extensions: native code out of every check's sight"
        if event != "import":
            return "a graded job may not start another interpreter: no check of this one's sees its code"
        name = args[0] if args else None
        if _type(name) is _str and name.rpartition(".")[2] in refused_modules:
            return (f"{name}: a graded job may not import it (it reaches the process's memory, or runs code "
                    "in another interpreter, out of every check's sight)")
        filename = args[1] if _len(args) > 1 else None
        if filename is None or (_type(filename) is _str and filename.startswith(libraries)
                                and normpath(filename) == filename):
            return ""  # (an import by name, or a library's own extension module)
        return ("a graded job may load native code only from the installed libraries, not "
                + (quote(filename[:200]) if _type(filename) is _str else "this file"))

    def hook(event: str, args: tuple) -> None:
        if event == "object.__setattr__" and not (_len(args) > 1 and args[1] in code_attributes):
            return
        if event == "marshal.loads" and args and released(args[0]):
            return  # the stub release's module, as the server placed it beside the job's (its bytes: where
            # it lies is the job's to choose; red team, round 18: every honest job was flagged)
        refusal = native(event, args) if event in native_events else ""
        if event == "import" and not refusal:
            return
        if event == "object.__getattr__" and not (_len(args) > 1 and args[1] in frame_attributes):
            return
        if event == "open" and not (args and memory_file(args[0], args[2] if _len(args) > 2 else 0)):
            return
        found = events.get(event) or (ctypes_event if event.startswith("ctypes.") else None)
        if found is None:
            return
        thread = get_ident()
        if thread in busy:  # the hook's own frame read, or code of the job's run as the hook asks an
            if not (event == "sys._getframe" and thread in framing):  # object of its (a key's __eq__
                ran(found[0])  # in a module's namespace): the job's, whose line is not known
            if event == "open":
                raise PermissionError("a process's memory is not a file a job may open")
            if refusal:
                raise (ImportError if event == "import" else PermissionError)(refusal)
            return
        busy.add(thread)
        rule, past_libraries = found
        try:
            forging = forges(event, args)
            if forging and event == "compile":  # (no frame of code under that name is a library's
                forged.add(normpath(args[1]))   # from now on, whoever asked for it; a renamed copy's,
                # below, once no library's module made it as it loaded)
            if forging:  # the job's, past libraries (a library compiling its own file reads its text)
                past_libraries = True
            elif rule in said:
                return
            framing.add(thread)
            frame = getframe(1)
            framing.discard(thread)
            first = frame
            if event == "marshal.loads":  # the job's doing, past libraries, but for an import of a
                # compiled file of the libraries' or the grader's (importlib's, or zipimport's, local)
                local = compiled_path.get(frame.f_code.co_name) if is_library(frame) else None
                path = frame.f_locals.get(local) if local else None
                past_libraries = not (_type(path) is _str and normpath(path).startswith(trusted))
            if event == "sys._getframe" and args and hands_out(args[0], frame):
                past_libraries = True
            # a traceback's frames handed out by the library that reads them (traceback.walk_tb,
            # inspect.getinnerframes, inspect.trace): from one of the job's own, f_back reaches the
            # grader's (red team: its locals, the job's seal among them, then read unseen)
            handed = (event in ("object.__getattr__", "sys._getframe")
                      and (frame.f_code.co_name, normpath(frame.f_code.co_filename)) in hand_outs)
            if handed:  # whom the frames go to: the frame that called (or iterates) the hand-out
                past_libraries = True
                frame = frame.f_back
                while frame is not None and (frame.f_code.co_name, normpath(frame.f_code.co_filename)) in hand_outs:
                    frame = frame.f_back
                if frame is None or is_library(frame):
                    return  # a library that reads a traceback's frames for itself (JAX's traceback filter)
            names = None if past_libraries else own_calls.get(event)
            named = names is None
            while frame is not None and is_library(frame):
                if not named and not names.isdisjoint(frame.f_code.co_names) \
                        and not (rule == "dynamic code" and normpath(frame.f_code.co_filename) in run_source):
                    named = True
                if forging and event == "code.__new__" and frame.f_code.co_name == "<module>":
                    return  # a library's module setting up code of its own as it is imported (asyncio's
                    # __sleep0 made a coroutine by types.coroutine, as the job imports tqdm.auto)
                frame = frame.f_back
            if frame is None:  # library frames only: a thread the job started (the main one ends in the grader's)
                if thread == main:
                    return
                where, number = "", 0
            elif frame is not first and not past_libraries and named:
                return  # a library reading frames or compiling code for itself (logging, namedtuple)
            else:
                name = frame.f_code.co_filename
                where, number = "", 0
                if _type(name) is _str and name.startswith(grader):
                    if handed or (not past_libraries and (frame is first or first.f_code.co_filename.startswith(importing))):
                        return  # the grader's own call (a notebook's cells compiled, a traceback read),
                        # or an extension module's set-up as the grader imports it (mlx's compiles)
                    # else: the job's callable run by the grader's code or a library's for no one it
                    # names (ctypes.memmove run by the garbage collector through weakref.finalize, or
                    # given as the exercise's function: red team); the grader itself loads no library
                    # through ctypes, walks no object graph and starts no process as a job runs
                elif _type(name) is _str and name.startswith(own):
                    where = name[_len(own[0] if name.startswith(own[0]) else own[1]):]
                    number = frame.f_lineno
                elif _type(name) is _str and name.startswith("<notebook cell"):
                    where = "<cells>"
            if forging and event == "code.__new__":
                forged.add(normpath(args[1]))
            ran(rule, where, number or 0)
        except Exception:  # noqa: BLE001 - what failed to say where is said all the same (the job
            ran(rule)  # could make it fail: red team); the job runs on
        finally:
            framing.discard(thread)
            busy.discard(thread)
            if event == "open":  # (said or not, by whomever: no one may have it)
                raise PermissionError("a process's memory is not a file a job may open")  # noqa: B012
            if refusal:  # (nor this, by whomever)
                raise (ImportError if event == "import" else PermissionError)(refusal)  # noqa: B012

    say('{"watch": %s}\n' % quote(key))
    sys.addaudithook(hook)
    return seal
