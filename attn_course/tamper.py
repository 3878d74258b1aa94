"""Whether a job's code changed the code that checks it.

A submission runs in the process that traces its functions with the course's
probes (:mod:`attn_course.specs._gen`).  At import, or while it is traced, it
could replace ``jax.value_and_grad``, a probe, or one of JAX's derivative
rules, so that a wrong gradient comes out right: a red team's archive with a
nan gradient at zero weights scored 3/3 by wrapping ``jax.value_and_grad`` in
``nan_to_num``.  :func:`take` records, before the package is loaded, what of
that machinery exists: the functions and classes of the watched modules (a
function's code, defaults and the functions its closure holds; a class's
methods), the derivative, transpose and batching rules JAX keeps for its
primitives, and the primitives' own methods.  :func:`changed` names the first
that differs, and the job reports its exercises as ``tampered`` from then on.

Only what existed when taken counts (a module JAX imports later, or a rule
it adds, is new, not changed), and only callables (module data such as
caches changes as JAX runs).  It is not a wall: code that puts back what it
changed before the check is not seen, and neither are changes below Python.
Two things complement it: the worker's audit hook notes a function's code or
defaults replaced in *any* module (:func:`attn_course.watch.watch_code_swaps`),
and the class report lists, for review, code that reaches for such means
(:mod:`attn_course.review`).
"""

from __future__ import annotations

import operator
import sys
import types
from typing import Any, Callable, NamedTuple

WATCHED = (
    "jax", "jax.numpy", "jax.lax", "jax.nn", "jax.tree_util", "jax.scipy.special",
    "jax._src.api", "jax._src.api_util", "jax._src.core", "jax._src.pjit", "jax._src.dispatch",
    "jax._src.stages", "jax._src.linear_util", "jax._src.tree_util", "jax._src.ad_util",
    "jax._src.custom_derivatives", "jax._src.interpreters.ad", "jax._src.interpreters.partial_eval",
    "jax._src.interpreters.batching", "jax._src.interpreters.mlir", "jax._src.interpreters.pxla",
    "jax._src.lax.lax", "jax._src.lax.control_flow.loops", "jax._src.lax.control_flow.conditionals",
    "jax._src.numpy.lax_numpy", "jax._src.numpy.ufuncs", "jax._src.numpy.reductions",
    "jax._src.numpy.util", "jax._src.nn.functions", "jax._src.scipy.special",
    "numpy", "json", "json.encoder", "builtins",
)
"""Modules whose functions the probes, the worker or JAX's autodiff run (besides the course's own)."""

REGISTRIES = (
    ("jax._src.interpreters.ad", "primitive_jvps"),
    ("jax._src.interpreters.ad", "primitive_transposes"),
    ("jax._src.interpreters.ad", "fancy_transposes"),
    ("jax._src.interpreters.batching", "primitive_batchers"),
    ("jax._src.interpreters.batching", "fancy_primitive_batchers"),
    ("jax._src.interpreters.partial_eval", "custom_partial_eval_rules"),
    ("jax._src.interpreters.mlir", "_lowerings"),
)
"""JAX's rules for its primitives, by primitive: a rule replaced changes every derivative of it."""

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


def _watched_modules() -> list[types.ModuleType]:
    names = [n for n in list(sys.modules) if n == "attn_course" or n.startswith("attn_course.")]
    return [m for m in (sys.modules.get(n) for n in [*WATCHED, *sorted(names)]) if isinstance(m, types.ModuleType)]


def _entries(container: Any, keys: list, label: Callable[[Any], str]) -> Group:
    """The values of ``container`` (a dict or a class's ``__dict__``) at ``keys``."""
    keys = tuple(keys)
    get = container.get
    return Group(lambda: tuple(map(get, keys)), tuple(map(get, keys)), tuple(label(k) for k in keys))


def _attributes(objects: list, attr: str, names: list[str]) -> Group:
    read = operator.attrgetter(attr)
    objects = tuple(objects)
    return Group(lambda: tuple(map(read, objects)), tuple(map(read, objects)), tuple(f"{n} ({attr})" for n in names))


def take() -> Baseline:
    """What the watched code is now (before a job's package is loaded)."""
    groups: list[Group] = []
    functions: list[tuple[str, types.FunctionType]] = []  # (of the modules whose code is compared)
    primitive = getattr(sys.modules.get("jax._src.core"), "Primitive", None)
    for module in _watched_modules():
        where = module.__name__
        space = module.__dict__
        code = where in CODE_WATCHED or where.split(".")[0] == "attn_course"
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
                    methods = [(a, m) for a, m in list(vars(value).items()) if isinstance(m, _METHODS)]
                    if methods:
                        groups.append(_entries(vars(value), [a for a, _ in methods],
                                               lambda a, c=f"{where}.{key}": f"{c}.{a}"))
                        if code:
                            functions += [(f"{where}.{key}.{a}", m) for a, m in methods
                                          if isinstance(m, types.FunctionType)]
            elif primitive is not None and isinstance(value, primitive):
                own = vars(value)
                attrs = [a for a, m in list(own.items()) if callable(m)]
                if attrs:
                    groups.append(_entries(own, attrs, lambda a, c=f"{where}.{key}": f"{c}.{a}"))
            elif callable(value):
                keys.append(key)
                if code and isinstance(value, types.FunctionType):
                    functions.append((f"{where}.{key}", value))
        groups.append(_entries(space, keys, lambda k, c=where: f"{c}.{k}"))
    for module_name, attr in REGISTRIES:
        rules = getattr(sys.modules.get(module_name), attr, None)
        if isinstance(rules, dict):
            groups.append(_entries(rules, list(rules), lambda p, c=f"{module_name}.{attr}": f"{c}[{p}]"))
    registry = sys.modules.get("attn_course.registry")
    if registry is not None:  # the exercises' own probes and functions (data of the course's, not
        # a module's globals: a red team's package swapped 3.2's probe for one that made nan 0)
        exercises = registry.all_exercises()
        ids = sorted(exercises)
        groups.append(_entries(exercises, ids, lambda i: f"the exercises[{i!r}]"))
        objects = [exercises[i] for i in ids]
        for attr in ("probe", "function", "id"):
            groups.append(_attributes(objects, attr, [f"exercise {i}" for i in ids]))
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
    modules = sorted(m.__name__ for m in _watched_modules())
    groups.append(_entries(sys.modules, modules, lambda n: f"sys.modules[{n!r}]"))
    for module_name, attr in REGISTRIES:
        module = sys.modules.get(module_name)
        if module is not None and attr in vars(module):
            groups.append(_entries(vars(module), [attr], lambda a, c=module_name: f"{c}.{a}"))
    return Baseline(tuple(groups), (sys.getprofile(), sys.gettrace()))


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
