"""Whether a job's code changed the code that checks it.

A submission runs in the process that traces its functions with the course's
probes (:mod:`attn_course.specs._gen`).  At import, or while it is traced, it
could replace ``jax.value_and_grad``, a probe, or one of JAX's derivative
rules, so that a wrong gradient comes out right: a red team's archive with a
nan gradient at zero weights scored 3/3 by wrapping ``jax.value_and_grad`` in
``nan_to_num``.  :func:`take` records, before the package is loaded, what of
that machinery exists: the functions, classes and modules that the globals of
every module of JAX, jaxlib, NumPy and the course name (the code, defaults and
closures of JAX's autodiff entry points' and the course's functions; a
class's methods and descriptors, compiled ones too; the class of each module
and class, which no dict entry shows), every dict of handlers by
type there, the import system's finders, every table of rules JAX keeps for
its primitives (lowerings, derivatives, transposes, batching, partial
evaluation: found, not listed, :func:`rule_tables`), and the primitives' own
methods.  :func:`changed` names
the first that differs, and the job reports its exercises as ``tampered``
from then on.

Only what existed when taken counts (a module JAX imports later, or a rule
it adds for a primitive of its own, is new, not changed; a rule added for a
primitive that existed is a change), and only callables (module data such as
caches changes as JAX runs).  It is not a wall: code that puts back what it
changed before the check is not seen, and neither are changes below Python.
Two things complement it: the worker's audit hook notes a function's code or
defaults replaced in *any* module (:func:`attn_course.watch.watch_code_swaps`),
and the class report lists, for review, code that reaches for such means
(:mod:`attn_course.review`).
"""

from __future__ import annotations

import collections
import functools
import itertools
import operator
import sys
import types
from typing import Any, Callable, Iterator, NamedTuple

REGISTRIES = (
    ("jax._src.interpreters.ad", "primitive_jvps"),
    ("jax._src.interpreters.ad", "primitive_transposes"),
    ("jax._src.interpreters.ad", "fancy_transposes"),
    ("jax._src.interpreters.batching", "primitive_batchers"),
    ("jax._src.interpreters.batching", "fancy_primitive_batchers"),
    ("jax._src.interpreters.partial_eval", "custom_partial_eval_rules"),
    ("jax._src.interpreters.mlir", "_lowerings"),
)
"""JAX's rules for its primitives, by primitive: a rule replaced changes every derivative of it.
These are watched even when empty; every other table of rules in JAX's modules is found by
:func:`rule_tables`."""

CODE_WATCHED = ("jax", "jax._src.api", "jax._src.interpreters.ad")
"""Modules whose functions' code is compared too, besides the course's own: JAX's autodiff entry
points and rules.  (Reading a function's code in a forked job copies the page it is on: every
function of the watched modules cost a job about 6 ms more.)"""

_METHODS = (types.FunctionType, classmethod, staticmethod, property)


class Group(NamedTuple):
    """Things read together: ``fetch()`` gives them now, ``before`` as they were, ``names`` which."""

    fetch: Callable[[], tuple]
    before: tuple
    names: tuple[str, ...]


class Baseline(NamedTuple):
    groups: tuple[Group, ...]
    hooks: tuple = (None, None)  # the profile and trace hooks when taken (a coverage tool's, a debugger's)

    def __len__(self) -> int:
        return sum(len(g.before) for g in self.groups)


def _behaviour(value: Any) -> bool:
    """What of a class's own attributes says what it does: its methods and descriptors, Python's or
    compiled (a red team replaced ``consume_with_handlers`` of jaxlib's C++ ``ExecuteResults``, a
    nanobind method, not one of :data:`_METHODS`, by a function that made every nan of a program's
    outputs 0); not its data (a counter a class keeps may change as JAX runs)."""
    return isinstance(value, _METHODS) or callable(value) or hasattr(type(value), "__get__")


def _no_attribute_added(classes: list[tuple[str, type]]) -> Group:
    """That no class of the watched modules' Python code gained an attribute of its own: one added
    over an inherited method (``DynamicJaxprTracer.__mul__`` over ``Tracer.__mul__``) changes what
    it does and no entry taken before says so.  Each class keeps every name it had (looked up, in
    one pass of C code) and has no more of them: a count alone missed a name removed (its
    ``__doc__``) for the one added."""
    proxies = tuple(vars(c) for _, c in classes)
    getters = tuple(operator.itemgetter(*keys, keys[0]) for keys in (tuple(p) for p in proxies))
    before = tuple(map(len, proxies))
    consume, call = collections.deque(maxlen=0).extend, operator.call

    def fetch() -> tuple:
        try:
            consume(map(call, getters, proxies))  # (a name gone raises)
            if tuple(map(len, proxies)) == before:
                return (_SAME,)
        except Exception:  # noqa: BLE001
            pass
        return (object(),)

    return Group(fetch, (_SAME,), ("a class of the watched modules (an attribute added or removed)",))


WATCHED_PACKAGES = ("jax", "jaxlib", "numpy", "ml_dtypes", "opt_einsum", "attn_course", "mlx")
"""Packages every module of which is watched (found, not listed): what the probes, the worker and
JAX's tracing, lowering and compiling run, and MLX, which the probes call on an MLX job (loaded
by those jobs only, before their package: :func:`attn_course.worker.run_job`; a red team's
package replaced ``mlx.core.value_and_grad``, and 3.2's nan gradient scored 3/3 on MLX).  A red
team rebound ``MulOp`` in jaxlib's generated StableHLO module, which JAX's lowering rule for ``mul`` calls through a module global (every rule
table holding the same objects): ``0 * x`` compiled to 0, 3.2's mistake scored 3/3, nothing
flagged; the list then named 33 modules of JAX's and a few others.  Not every module loaded:
a library a student may import changes what it likes of the standard library's as it loads
(MLX replaces ``reprlib.Repr.repr_array``), and that is not the checks' code."""

WATCHED_MODULES = ("builtins", "json", "json.encoder", "operator", "functools", "itertools", "math")
"""Modules of the standard library's that the worker and JAX call through the module."""


def watched_modules() -> list[types.ModuleType]:
    """The modules of :data:`WATCHED_PACKAGES` and :data:`WATCHED_MODULES` loaded now, by name."""
    return [m for n, m in sorted(list(sys.modules.items()), key=lambda item: item[0])
            if isinstance(m, types.ModuleType) and (n in WATCHED_MODULES or n.split(".")[0] in WATCHED_PACKAGES)]


def _type_keyed(value: Any) -> bool:
    """A dict of handlers by type (``pxla.global_result_handlers``: what turns a program's outputs
    into arrays, by their abstract type): a red team put its own entry for ``ShapedArray`` there,
    which made every nan of the job's program 0 -- no rule table, no code changed."""
    if not isinstance(value, dict) or not value:
        return False
    try:
        return any(isinstance(k, type) for k in itertools.islice(value, 64))
    except RuntimeError:  # (changed size while read: another thread's registration)
        return False


class Entries(NamedTuple):
    """The values of ``container`` (a dict or a class's ``__dict__``) at ``keys``, each named:
    :func:`take` reads them all as one :func:`_flat` group."""

    container: Any
    keys: tuple
    names: tuple[str, ...]


def _entries(container: Any, keys: list, label: Callable[[Any], str]) -> Entries:
    keys = tuple(keys)
    return Entries(container, keys, tuple(label(k) for k in keys))


def _flat(entries: list[Entries]) -> Group:
    """Every value of ``entries``, read in one pass of C code: a group of its own per module,
    class and table (some 5,000 once jaxlib's dialects' classes were watched) cost 14 ms a check,
    one 8.  A key gone raises in the pass; then each is read again, the missing one as a new object."""
    entries = [e for e in entries if e.keys]
    containers = tuple(e.container for e in entries)
    getters = tuple(operator.itemgetter(*e.keys, e.keys[0]) for e in entries)  # (always a tuple)
    names = tuple(n for e in entries for n in (*e.names, e.names[0]))
    chain, call, gone = itertools.chain.from_iterable, operator.call, object()

    def fetch() -> tuple:
        try:
            return tuple(chain(map(call, getters, containers)))
        except Exception:  # noqa: BLE001 - a key removed, or a container of the job's making
            out = []
            for e in entries:
                try:
                    out += [e.container[k] if k in e.container else gone for k in (*e.keys, e.keys[0])]
                except Exception:  # noqa: BLE001
                    out += [gone] * (len(e.keys) + 1)
            return tuple(out)

    return Group(fetch, fetch(), names)


def _attributes(objects: list, attr: str, names: list[str]) -> Group:
    read = operator.attrgetter(attr)
    objects = tuple(objects)
    return Group(lambda: tuple(map(read, objects)), tuple(map(read, objects)), tuple(f"{n} ({attr})" for n in names))


_MRO = type.__dict__["__mro__"].__get__  # (a class's own, read without its metaclass's code)
_CLASS_DICT = type.__dict__["__dict__"].__get__


def _resolved(cls: type, name: str) -> Any:
    """``cls.name`` as Python resolves a slot, read from the dicts of the classes of its MRO, each
    key found by identity (a class's names are interned; ``name`` is a literal): no
    ``__getattribute__`` of a metaclass's runs, and no key of the job's is hashed or compared."""
    for c in _MRO(cls):
        for key, value in _CLASS_DICT(c).items():
            if key is name:
                return value
    return None


def _keys_plain(containers: list) -> Group:
    """That no key of a dict the check reads by name can run code as it is hashed or compared:
    every key's class resolves ``__eq__`` and ``__hash__`` to what the keys' classes had when
    taken (``str``'s, ``object``'s: a primitive JAX defines later is as plain as the old ones),
    read first, by ``id`` (nothing of the job's is hashed or compared).  A key is compared with
    the name looked up when their hashes meet: a red team's key that hashed as
    ``"total_ordering"``, put first in ``functools``' dict, ran the job's ``__eq__`` inside the
    check, which put back what the job had changed for as long as the check read it (round 15:
    3.2's nan gradient 3/3 on JAX and MLX, nothing flagged)."""
    containers = tuple(containers)
    ident, kind, chain = id, type, itertools.chain.from_iterable
    known = {t: None for t in map(kind, chain(containers))}  # (str, JAX's primitives' classes, types...)
    plain = frozenset(ident(_resolved(t, n)) for t in known for n in ("__eq__", "__hash__"))
    allowed = set(map(ident, known))  # (classes found plain since are added)
    slots = [(t, n, _resolved(t, n)) for t in known for n in ("__eq__", "__hash__")]

    def fetch() -> tuple:  # (one pass of C code over every key: a few ms)
        try:
            for t, n, was in slots:  # (a class of the keys given a comparison of its own: Primitive.__eq__)
                if _resolved(t, n) is not was:
                    return (object(),)
            if allowed.issuperset(map(ident, map(kind, chain(containers)))):
                return (_SAME,)
            for t in {ident(t): t for t in map(kind, chain(containers)) if ident(t) not in allowed}.values():
                if ident(_resolved(t, "__eq__")) not in plain or ident(_resolved(t, "__hash__")) not in plain:
                    return (object(),)
                allowed.add(ident(t))
            return (_SAME,)
        except Exception:  # noqa: BLE001
            return (object(),)

    return Group(fetch, (_SAME,), ("a key of the job's in a dict the check reads, whose hash or comparison is its own code",))


def _types(objects: list, names: list[str]) -> Group:
    """The class of each object, read by ``type`` (which no class can lie to, as it can about
    ``__class__``): a module's class swapped for a subclass with a property of a function's name
    (``jax.vjp``, ``mlx.core.value_and_grad``, ``numpy.asarray``) gives that property's value to
    every ``module.name``, while the module's dict, and so every entry taken, stays the same
    (red team, round 14: 3.2's nan gradient 3/3 on JAX and on MLX)."""
    objects, kind = tuple(objects), type
    return Group(lambda: tuple(map(kind, objects)), tuple(map(kind, objects)), tuple(f"{n} (its class)" for n in names))


def _jax_modules() -> list[types.ModuleType]:
    return [m for n, m in list(sys.modules.items())
            if (n == "jax" or n.startswith("jax.")) and isinstance(m, types.ModuleType)]


def _is_table(value: Any, primitive: type, hint: str) -> int:
    """1 for a table of rules by primitive, 2 for one by platform of such tables, 0 otherwise.

    Found by its keys, or (an empty one) by its type hint in the module."""
    if not isinstance(value, dict):
        return 0
    if any(isinstance(k, primitive) for k in list(value)):
        return 1
    inner = list(value.values())
    if inner and all(isinstance(v, dict) for v in inner) and any(isinstance(k, primitive) for v in inner for k in v):
        return 2
    return 1 if "Primitive" in hint else 0


class Table(NamedTuple):
    """A table of JAX's rules by primitive (``nested``: by platform, of such tables), and the
    globals of JAX's modules bound to it (rebound to a copy, JAX would read the copy)."""

    name: str
    rules: dict
    nested: bool
    homes: tuple[tuple[str, str], ...]


def rule_tables(primitive: type | None = None) -> list[Table]:
    """Every table of JAX's modules that maps a primitive to a rule (its lowering, derivative,
    transpose, batching, partial evaluation...), or a platform to such a table, each once.

    A red team registered a lowering of its own for ``mul`` and ``div`` on the CPU
    (``jax.interpreters.mlir.register_lowering(..., platform="cpu")``, JAX's public API): it
    went into the platform's table, which JAX reads before ``_lowerings``, the only one watched
    then; ``0 * nan`` became 0, and the classic mistake's nan gradient with it. No table is
    picked by hand now: :data:`REGISTRIES` and any other that holds primitives (or whose type
    hint names them) when the baseline is taken."""
    if primitive is None:
        primitive = getattr(sys.modules.get("jax._src.core"), "Primitive", None)
        if primitive is None:
            return []
    found: dict[int, list] = {}
    for module_name, attr in REGISTRIES:
        table = getattr(sys.modules.get(module_name), attr, None)
        if isinstance(table, dict):
            found.setdefault(id(table), [f"{module_name}.{attr}", table, False, []])
    for module in _jax_modules():
        hints = vars(module).get("__annotations__")
        hints = hints if isinstance(hints, dict) else {}
        for attr, value in list(vars(module).items()):
            if not isinstance(value, dict):
                continue
            entry = found.get(id(value))
            if entry is None:
                kind = _is_table(value, primitive, str(hints.get(attr, "")))
                if not kind:
                    continue
                entry = found[id(value)] = [f"{module.__name__}.{attr}", value, kind == 2, []]
            entry[3].append((module.__name__, attr))
    return sorted((Table(n, t, nested, tuple(homes)) for n, t, nested, homes in found.values()), key=lambda t: t.name)


def _direct(tables: list[Table]) -> Iterator[dict]:
    for table in tables:
        if table.nested:
            yield from (v for v in list(table.rules.values()) if isinstance(v, dict))
        else:
            yield table.rules


def _slots(cls: type) -> tuple[str, ...]:
    out: list[str] = []
    for c in cls.__mro__:
        names = vars(c).get("__slots__", ())
        out += [names] if isinstance(names, str) else [n for n in names if isinstance(n, str)]
    return tuple(n for n in out if n not in ("__dict__", "__weakref__"))


_partial_state = functools.partial.__reduce__  # (C: a subclass's own __reduce__ is not called)


def _same_as(value: Any, depth: int = 2) -> Callable[[], bool] | None:
    """A check that ``value`` (a rule, the same object) still holds what it holds now: a partial's
    function, arguments and keywords, a bound method's function and object, a slotted object's
    fields (and theirs, ``depth - 1`` levels down); None for what holds nothing of the kind (a
    plain function: its code or defaults replaced, the worker's audit hook sees it)."""
    kind = type(value)
    if kind is functools.partial:
        func, args, words, extra = _partial_state(value)[2]
        # (keys and values by identity: `==` on a value the job put in the live dict ran its __eq__
        # inside the check, which put back what the job had changed: red team, round 15)
        items = tuple(itertools.chain.from_iterable(words.items())) if words else ()
        inner = [c for c in (_same_as(func, depth - 1),) if c] if depth > 1 else []

        def check(v=value, was=(func, args, words, extra), items=items, inner=inner) -> bool:
            now = _partial_state(v)[2]
            if not all(map(operator.is_, now, was)):
                return False
            if items or now[2]:
                held = tuple(itertools.chain.from_iterable(now[2].items()))
                if len(held) != len(items) or not all(map(operator.is_, held, items)):
                    return False
            return all(c() for c in inner)
        return check
    if kind is types.MethodType:
        was = (value.__func__, value.__self__)
        return lambda v=value, was=was: v.__func__ is was[0] and v.__self__ is was[1]
    slots = _slots(kind) if kind.__module__ != "builtins" else ()
    if not slots:
        return None
    read = operator.attrgetter(*slots)
    fields = read(value) if len(slots) > 1 else (read(value),)
    inner = [c for c in (_same_as(f, depth - 1) for f in fields) if c] if depth > 1 else []

    def check(v=value, was=fields, read=read, one=len(slots) == 1, inner=inner) -> bool:
        if type(v) is not kind:  # (first: a class of the job's whose property runs as a field is read,
            return False         # red team, round 16, put back what the job had changed inside the check)
        now = (read(v),) if one else read(v)
        return all(map(operator.is_, now, was)) and all(c() for c in inner)
    return check


def _holding(container: dict, keys: list, label: Callable[[Any], str]) -> Group:
    """That each entry of ``container`` at ``keys`` holds what it held (:func:`_same_as`): a red
    team rewrote rules in place, the table's objects staying the same -- a partial given another
    function by ``__setstate__``, a frozen ``LoweringRuleEntry`` given another rule by
    ``object.__setattr__`` -- and 3.2's mistake scored 3/3, nothing flagged.  (The entries
    themselves are compared by :func:`_entries`.)"""
    checks, names = [], []
    for key in keys:
        check = _same_as(container.get(key))
        if check is not None:
            checks.append(check)
            names.append(f"{label(key)} (what it holds)")

    def fetch() -> tuple:
        out = []
        for check in checks:
            try:
                out.append(_SAME if check() else object())
            except Exception:  # noqa: BLE001 - an object of the job's making that cannot be read
                out.append(object())
        return tuple(out)

    return Group(fetch, (_SAME,) * len(checks), tuple(names))


def _primitives(known: frozenset, named: dict) -> list[Group | Entries]:
    """That each primitive JAX had is of the class it was, with the attributes it had, each the
    same object (red team: a ``bind`` of one's own set on ``mul_p`` itself, or its ``__class__``
    made a subclass whose ``bind`` makes 0 * x zero), and that their classes' attributes are.
    ``named``: a primitive's name as a module's global, where it is one (else its own name)."""
    prims = sorted(known, key=lambda p: (str(getattr(p, "name", "")), id(p)))
    classes = sorted({type(p) for p in prims}, key=lambda c: (c.__module__, c.__qualname__))

    def label(obj: Any) -> str:
        return named.get(obj) or f"the primitive {getattr(obj, 'name', obj)}"

    def shape(obj: Any) -> tuple:
        return (type(obj), *vars(obj).keys())

    objects = [*prims, *classes]
    before = tuple(shape(o) for o in objects)
    names = tuple(f"{label(o)} (its class or attributes)" for o in prims) + tuple(
        f"{c.__module__}.{c.__qualname__} (its attributes)" for c in classes)

    def fetch() -> tuple:
        out = []
        for obj, was in zip(objects, before):
            try:
                now = shape(obj)
                out.append(_SAME if len(now) == len(was) and all(map(operator.is_, now, was)) else object())
            except Exception:  # noqa: BLE001
                out.append(object())
        return tuple(out)

    # which attributes, then each one's object (named by it: "...log_p.impl")
    values = [_entries(vars(o), list(vars(o)), lambda a, c=label(o): f"{c}.{a}") for o in prims]
    values += [_entries(vars(c), list(vars(c)), lambda a, n=f"{c.__module__}.{c.__qualname__}": f"{n}.{a}")
               for c in classes]
    return [Group(fetch, (_SAME,) * len(objects), names), *values]


_SAME = "as it was"
_NONE_ADDED = ("none added",)


def _none_added(table: dict, known: frozenset, name: str) -> Group:
    """That ``table`` gained no rule for a primitive JAX had when taken, directly or in a new
    platform's table.  A module imported later adds rules for its own new primitives only; a
    rule added for an old one changes what it computes."""
    before = frozenset(table)
    said = (f"{name} (a rule added for one of JAX's primitives)",)

    def fetch() -> tuple:
        try:
            new = table.keys() - before
            if not new:
                return _NONE_ADDED
            if not known.isdisjoint(new) or any(isinstance(inner, dict) and not known.isdisjoint(inner)
                                                 for inner in (table.get(k) for k in new)):
                return said
            return _NONE_ADDED
        except Exception:  # noqa: BLE001 - a key of the job's making that cannot be hashed or compared
            return said

    return Group(fetch, _NONE_ADDED, said)


def _importers() -> Group:
    """That modules are found as they were: the finders of ``sys.meta_path`` (less the worker's own
    for the job's package, which it puts first as it loads it) and ``sys.path_hooks``, each the same
    object in the same place, none put before them, and the finder cached for each folder Python
    had looked in.  A module that JAX imports only as a job runs would otherwise come from wherever
    a finder of the job's chose (red team: a finder put on ``sys.meta_path`` went unseen)."""
    cache = sys.path_importer_cache
    folders = tuple(cache)

    def fetch() -> tuple:
        try:
            # (looked up as it is read: the worker's global, watched with the others)
            own = getattr(sys.modules.get("attn_course.worker"), "_PackageOnly", None)
            meta, path_hooks = sys.meta_path, sys.path_hooks
            if type(meta) is not list or type(path_hooks) is not list:  # (a list of the job's class:
                return ((), (), (), False)  # its __iter__ would run inside the check, red team, round 16)
            finders = tuple(f for f in list(meta) if type(f) is not own)
            hooks = tuple(path_hooks)
            cached = tuple(cache.get(k, _GONE) for k in folders)
            return (finders, hooks, cached, cache is sys.path_importer_cache)
        except Exception:  # noqa: BLE001 - a list of the job's making
            return ((), (), (), False)

    was = fetch()

    def starts_with(now: tuple, was: tuple) -> bool:
        return len(now) >= len(was) and all(map(operator.is_, now[: len(was)], was))

    def same() -> tuple:
        # (a finder or hook added after all of them is asked only for what they do not find: six,
        # which matplotlib imports, appends one; one put before them decides what JAX imports)
        finders, hooks, cached, one_cache = fetch()
        return tuple(_SAME if ok else object() for ok in (
            starts_with(finders, was[0]), starts_with(hooks, was[1]),
            len(cached) == len(was[2]) and all(map(operator.is_, cached, was[2])), one_cache))

    return Group(same, (_SAME,) * 4, ("sys.meta_path", "sys.path_hooks", "sys.path_importer_cache",
                                       "sys.path_importer_cache (the dict)"))


_GONE = object()


def take() -> Baseline:
    """What the watched code is now (before a job's package is loaded)."""
    groups: list[Group | Entries] = []
    functions: list[tuple[str, types.FunctionType]] = []  # (of the modules whose code is compared)
    primitive = getattr(sys.modules.get("jax._src.core"), "Primitive", None)
    named: dict[Any, str] = {}  # a primitive's name as a watched module's global
    classes: list[tuple[str, type]] = []  # (defined in a watched module)
    typed: list[tuple[str, Any]] = []  # the modules, and every class defined in them: their own classes
    for module in watched_modules():
        typed.append((module.__name__, module))
        where = module.__name__
        space = module.__dict__
        code = where in CODE_WATCHED or where.split(".")[0] == "attn_course"
        python = str(getattr(module, "__file__", None) or "").endswith(".py")
        keys = []
        for key, value in list(space.items()):
            if isinstance(value, types.ModuleType):
                # (a module a watched module reads through its global: rebound, every function of
                # that module reads the copy -- red team: attn_course.values.np, worker.tamper)
                keys.append(key)
                continue
            if isinstance(value, type):
                keys.append(key)
                if getattr(value, "__module__", None) == where:
                    typed.append((f"{where}.{key}", value))
                    # (a compiled module's classes add attributes as they run: jaxlib's DeviceList,
                    # ifrt_device_iterator; MLX's do not, and an array's __getattribute__ added
                    # would run the job's code at every read of its dtype: red team, round 14)
                    if python or where.split(".")[0] == "mlx":
                        classes.append((f"{where}.{key}", value))
                    methods = [(a, m) for a, m in list(vars(value).items()) if _behaviour(m)]
                    if methods:
                        groups.append(_entries(vars(value), [a for a, _ in methods],
                                               lambda a, c=f"{where}.{key}": f"{c}.{a}"))
                        if code:
                            functions += [(f"{where}.{key}.{a}", m) for a, m in methods
                                          if isinstance(m, types.FunctionType)]
            elif primitive is not None and isinstance(value, primitive):
                named.setdefault(value, f"{where}.{key}")  # (watched with every other: _primitives)
            elif callable(value):
                keys.append(key)
                if code and isinstance(value, types.FunctionType):
                    functions.append((f"{where}.{key}", value))
            elif where.split(".")[0] == "mlx":  # (MLX's module data does not change as it runs: its
                keys.append(key)  # devices and dtypes, which the worker reads too, are watched as well)
            elif _type_keyed(value):
                keys.append(key)  # (the dict itself, rebound to a copy, is a change too)
                label = lambda t, c=f"{where}.{key}": f"{c}[{getattr(t, '__qualname__', t)}]"  # noqa: E731
                entries = [k for k in list(value) if isinstance(k, type)]
                groups += [_entries(value, entries, label), _holding(value, entries, label)]
        groups.append(_entries(space, keys, lambda k, c=where: f"{c}.{k}"))
    tables = rule_tables(primitive)
    # the primitives JAX has now: those its tables and its modules' globals name
    known = frozenset(
        [p for table in _direct(tables) for p in table if isinstance(p, primitive)]
        + [v for m in _jax_modules() for v in list(vars(m).values()) if isinstance(v, primitive)]) if primitive else frozenset()
    for name, table, nested, _ in tables:
        groups.append(_entries(table, list(table), lambda p, c=name: f"{c}[{p}]"))  # (a platform's table, if nested)
        groups.append(_none_added(table, known, name))
        if not nested:
            groups.append(_holding(table, list(table), lambda p, c=name: f"{c}[{p}]"))
        for platform, inner in list(table.items()) if nested else ():
            if isinstance(inner, dict):
                where = f"{name}[{platform!r}]"
                groups.append(_entries(inner, list(inner), lambda p, c=where: f"{c}[{p}]"))
                groups.append(_none_added(inner, known, where))
                groups.append(_holding(inner, list(inner), lambda p, c=where: f"{c}[{p}]"))
    if known:
        groups += _primitives(known, named)
    registry = sys.modules.get("attn_course.registry")
    if registry is not None:  # the exercises' own probes and functions (data of the course's, not
        # a module's globals: a red team's package swapped 3.2's probe for one that made nan 0)
        exercises = registry.all_exercises()
        ids = sorted(exercises)
        groups.append(_entries(exercises, ids, lambda i: f"the exercises[{i!r}]"))
        objects = [exercises[i] for i in ids]
        for attr in ("probe", "function", "id"):
            groups.append(_attributes(objects, attr, [f"exercise {i}" for i in ids]))
        typed += [(f"exercise {i}", exercises[i]) for i in ids]
        functions += [(f"exercise {i}'s probe", exercises[i].probe) for i in ids
                      if isinstance(exercises[i].probe, types.FunctionType)]
    names, fns = [n for n, _ in functions], [f for _, f in functions]
    groups.append(_attributes(fns, "__code__", names))
    cells, cell_names = [], []
    for name, fn in functions:
        for k, cell in enumerate(fn.__closure__ or ()):
            try:
                inner = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            if callable(inner) and not isinstance(inner, type):
                cells.append(cell)
                cell_names.append(f"{name} (its closure's {fn.__code__.co_freevars[k]})")
    groups.append(_attributes(cells, "cell_contents", cell_names))
    # the modules themselves (a copy of jax put in sys.modules is what `import jax` then gives), and
    # the rule registries as objects (rebound to a copied dict, JAX reads the copy)
    modules = sorted(m.__name__ for m in watched_modules())
    groups.append(_entries(sys.modules, modules, lambda n: f"sys.modules[{n!r}]"))
    for table in tables:
        for module_name, attr in table.homes:
            groups.append(_entries(vars(sys.modules[module_name]), [attr], lambda a, c=module_name: f"{c}.{a}"))
    groups.append(_importers())
    groups.append(_no_attribute_added(classes))
    kinds = _types([o for _, o in typed], [n for n, _ in typed])
    entries = [g for g in groups if isinstance(g, Entries)]
    # what is read by key, every container once: checked first, before any of it is read so
    # (a class's own dict is not the job's to write: its names are made plain strings as they are set,
    # and only the collector's referents reach the dict itself, which the watch sees run)
    keyed = {id(c): c for c in [*(e.container for e in entries), sys.modules, sys.path_importer_cache, vars(sys)]
             if type(c) is not types.MappingProxyType}
    gate = _keys_plain(list(keyed.values()))
    flat = _flat(entries)
    # the keys first, then the classes (before any attribute is read through one: a class of the
    # job's could run its code as it is), then the rest
    rest = [g for g in groups if not isinstance(g, Entries)]
    return Baseline((gate, kinds, flat, *rest), (sys.getprofile(), sys.gettrace()))


def changed(base: Baseline, _is=operator.is_, _all=all, _map=map, _profile=sys.getprofile,
            _trace=sys.gettrace) -> str | None:
    """The first watched thing that is not what it was when ``base`` was taken (its name), or None.

    What it calls is bound as it is defined (a submission that replaced ``operator.is_`` made
    every comparison equal), and a profile or trace hook other than the one there when ``base`` was
    taken is a change too: one can put back what the job changed just as the check starts (no
    honest code sets one; a coverage tool's or a debugger's, set before, is not the job's)."""
    if _profile() is not base.hooks[0] or _trace() is not base.hooks[1]:
        return "a profile or trace hook (sys.setprofile, sys.settrace)"
    for group in base.groups:
        try:
            now = group.fetch()
        except ValueError:  # a closure's cell emptied
            return group.names[0] if group.names else "a closure"
        if not _all(_map(_is, now, group.before)):
            return next(n for n, a, b in zip(group.names, now, group.before) if a is not b)
    return None
