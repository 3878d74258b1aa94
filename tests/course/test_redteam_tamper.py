"""Red team: a submission that changes the code that checks it.

A red team's archive had exercise 3.2's classic mistake (a nan gradient at a
zero weight: ``log`` of an unguarded 0) and, at the end of its module, wrapped
the probes' ``value_and_grad`` (or JAX's own ``jax.value_and_grad``) in
``nan_to_num``: 3/3 for a wrong gradient.  Now a job looks, before it reports,
for what it changed of the probes, the worker, JAX's and NumPy's functions and
JAX's derivative rules (:mod:`attn_course.tamper`): those exercises are
``tampered``, worth nothing, in fixed words on hidden cases.  Each attack
below is graded in one batch with an honest archive and the mistake alone.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from attn_course import ROOT, tamper
from attn_course.archive import build_archive, library_files
from attn_course.identity import token_for

pytestmark = pytest.mark.slow

SECRET = "tamper-secret"
GUARD = b"A_safe = xp.where(keep, A, xp.ones_like(A))"

# JAX's value_and_grad wrapped so that a nan gradient comes out 0 (bound as _vag; most attacks install it)
_WRAP = b'''
import jax as _jax, jax.numpy as _jnp
_orig = _jax.value_and_grad
def _vag(fun, *a, **k):
    inner = _orig(fun, *a, **k)
    def h(*args, **kw):
        v, g = inner(*args, **kw)
        return v, _jax.tree_util.tree_map(lambda t: _jnp.nan_to_num(t, nan=0.0), g)
    return h
'''

# a ModuleType subclass for jax whose property `vjp` wraps jax.vjp's pullback in a nan-to-0 (_Jax), and
# _swap(cls), which sets jax's module object's class (round 14)
_MODULE_CLASS = b'''
import functools as _ft, types as _ty
import jax as _jax, jax.numpy as _jnp
_orig_vjp = _jax.vjp
def _vjp(f, *primals, **kw):
    out, pull = _orig_vjp(f, *primals, **kw)
    return out, lambda ct: tuple(_jnp.where(_jnp.isnan(t), _jnp.zeros_like(t), t) for t in pull(ct))
class _Jax(_ty.ModuleType):
    vjp = property(lambda self: _vjp)
def _swap(cls):
    _ft.partial(object.__setattr__, _jax, "__class__")(cls)
'''

# jax.vjp's api_boundary wrapper's `fun` cell made a vjp whose pullback erases nan (round 16): _cell, _orig
_CELL = b'''
import jax as _j, jax.numpy as _jn
_cell = _j.vjp.__closure__[0]
_orig = _cell.cell_contents
def _fun(f, *primals, **kw):
    res = _orig(f, *primals, **kw)
    pull = res[1]
    return (res[0], lambda *ct: _j.tree_util.tree_map(lambda t: _jn.where(_jn.isnan(t), 0.0, t), pull(*ct)), *res[2:])
_cell.cell_contents = _fun
'''

# each appended to a statmech.py whose entropy has the mistake (A_safe = A)
ATTACKS = {
    "probe": b'''
def _patch():
    import sys
    g = sys.modules["attn_course.specs._gen"]
    orig = g.value_and_grad_aux
    def vga(f, argnums=0):
        inner = orig(f, argnums)
        def h(*a):
            import jax, jax.numpy as jnp
            aux, d = inner(*a)
            return aux, jax.tree_util.tree_map(lambda t: jnp.nan_to_num(t, nan=0.0), d)
        return h
    g.value_and_grad_aux = vga
_patch()
''',
    "jax": _WRAP + b'''_jax.value_and_grad = _vag
''',
    # a derivative rule of JAX's own: log's tangent, made finite (no name of a module attribute changes)
    "rule": b'''
def _patch():
    from jax._src.interpreters import ad
    from jax._src.lax import lax
    import jax.numpy as jnp
    orig = ad.primitive_jvps[lax.log_p]
    def jvp(primals, tangents):
        out, t = orig(primals, tangents)
        return out, jnp.nan_to_num(t, nan=0.0, posinf=0.0, neginf=0.0) if not isinstance(t, ad.Zero) else t
    ad.primitive_jvps[lax.log_p] = jvp
_patch()
''',
    # the code of the probe's helper swapped in place (the function object stays the same)
    "code": b'''
def _finite_sum(x):
    import jax.numpy as m
    return m.sum(m.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0))
import sys as _sys
_sys.modules["attn_course.specs._gen"].finite_sum.__code__ = _finite_sum.__code__
''',
    # a second red team's evasions of the first check, each with the wrap above:
    # the worker's run counter made constant, so that it never looked
    "counter": b'''
import sys as _sys
class _Const(list):
    def __getitem__(self, i): return -1
    def __setitem__(self, i, v): pass
_sys.modules["attn_course.worker"]._RAN = _Const([0])
''' + _WRAP + b'''_jax.value_and_grad = _vag
''',
    # the comparison the check made, replaced
    "operator": b'''
import operator as _op
_op.is_ = lambda a, b: True
''' + _WRAP + b'''_jax.value_and_grad = _vag
''',
    # a copy of the jax module in sys.modules (the probe imports jax as it runs)
    "modules": b'''
import sys as _sys, types as _types
''' + _WRAP + b'''_fake = _types.ModuleType("jax")
_fake.__dict__.update(_jax.__dict__)
_fake.value_and_grad = _vag
_sys.modules["jax"] = _fake
''',
    # JAX's registry of derivative rules rebound to a copy with log's rule changed
    "registry": b'''
def _patch():
    from jax._src.interpreters import ad
    from jax._src.lax import lax
    import jax.numpy as jnp
    new = dict(ad.primitive_jvps)
    def jvp(primals, tangents, **params):
        (x,), (t,) = primals, tangents
        out = lax.log_p.bind(jnp.where(x == 0, jnp.ones_like(x), x), **params)
        if isinstance(t, ad.Zero):
            return out, t
        return out, t * jnp.where(x == 0, jnp.zeros_like(x), 1.0 / jnp.where(x == 0, jnp.ones_like(x), x))
    new[lax.log_p] = jvp
    ad.primitive_jvps = new
_patch()
''',
    # the code of a JAX function no check compared swapped for one that zeroes nan cotangents (every
    # product's transpose calls it); names built from pieces, so that no line reads as what it does
    # (its key was "code" too, which dropped the attack above from the dict: every key its own now)
    "unbroadcast": b'''
def _unbroadcast(aval, x):
    import jax.numpy as jnp
    x = jnp.where(jnp.isnan(x), jnp.zeros_like(x), x)
    x_shape = np.shape(x)
    if core.definitely_equal_shape(aval.shape, x_shape) and aval.sharding == typeof(x).sharding:
        return x
    if not aval.shape:
        return reduce_sum(x, list(range(len(x_shape))))
    dims = [i for i, (a, b) in enumerate(zip(x_shape, aval.shape)) if not core.definitely_equal(a, b)]
    x = reduce_sum(x, dims) if dims else x
    return reshape(x, aval.shape, out_sharding=aval.sharding)
def _install():
    import jax
    target = getattr(getattr(getattr(jax, "_s" + "rc"), "lax"), "lax")._unbroadcast
    setattr(target, "__co" + "de__", getattr(_unbroadcast, "__co" + "de__"))
_install()
''',
    # a host callback in the graded function, run while the program runs (after the checks that
    # follow its trace): it rebinds how results are written, so that a nan comes out 0
    "callback": b'''
def _tidy():
    import numpy
    import attn_course.values as v
    enc = v.encode
    if getattr(enc, "tidy", False):
        return
    def clean(x):
        if isinstance(x, dict):
            return {k: clean(y) for k, y in x.items()}
        if isinstance(x, list):
            return [clean(y) for y in x]
        if isinstance(x, numpy.ndarray) and x.dtype.kind == "f":
            return numpy.where(numpy.isnan(x), 0.0, x)
        return x
    def encode(obj, *a, **k):
        return enc(clean(obj), *a, **k)
    encode.tidy = True
    v.encode = encode
_entropy_impl = entropy
def entropy(A, mask=None):
    import jax
    jax.debug.callback(_tidy)
    return _entropy_impl(A, mask)
''',
    # a third red team's: a module that a module of the grader's reads through its global, rebound
    # (tamper took no module-valued global): values.np, whose integer's isinstance check values.encode
    # makes on the worker's results, which it rewrites there (nan -> 0), past every check
    "values-np": b'''
import pkgutil as _pk, numpy as _np
_vals = _pk.resolve_name("attn_" + "course.values")
def _fix(o):
    if type(o) is dict:
        for k in list(o):
            if type(o[k]) is _np.ndarray and o[k].dtype.kind == "f":
                o[k] = _np.nan_to_num(o[k], nan=0.0, posinf=_np.inf, neginf=-_np.inf)
            else:
                _fix(o[k])
    elif type(o) is list:
        for v in o:
            _fix(v)
class _Meta(type):
    def __instancecheck__(cls, obj):
        if type(obj) is list:
            _fix(obj)
        return isinstance(obj, _np.integer)
class _FakeNp:
    integer = _Meta("integer", (), {})
    floating, bool_, ndarray, asarray, prod, int64 = _np.floating, _np.bool_, _np.ndarray, _np.asarray, _np.prod, _np.int64
_vals.np = _FakeNp
''',
    # the worker's tamper module rebound to one whose check finds nothing, with the wrap above
    "tamper-module": b'''
import pkgutil as _pk
class _Blind:
    def __getattr__(self, name):
        return lambda *a, **k: None
_pk.resolve_name("attn_" + "course.worker").tamper = _Blind()
''' + _WRAP + b'''_jax.value_and_grad = _vag
''',
    # a fifth red team's: JAX's public API registers a CPU lowering of its own for mul and div, which
    # JAX reads before the one tamper watched (_lowerings): 0 * x and 0 / x lower to 0, the nan too
    "lowering": b'''
import jax
from jax.interpreters import mlir as _mlir
def _zero_safe(prim, on_a_zero):
    old = _mlir._lowerings[prim].rule
    def fix(a, b, y):
        hit = a == 0
        if not on_a_zero:
            hit = hit | (b == 0)
        return jax.lax.select(hit, jax.lax.full_like(y, 0), y)
    fix_lowered = _mlir.lower_fun(fix, multiple_results=False)
    def rule(ctx, a, b, **params):
        (y,) = old(ctx, a, b, **params)
        return fix_lowered(ctx.replace(avals_in=[*ctx.avals_in, *ctx.avals_out]), a, b, y)
    _mlir.register_lowering(prim, rule, platform="cpu")
_zero_safe(jax.lax.mul_p, False)
_zero_safe(jax.lax.div_p, True)
''',
    # round 6: a bind of its own set on the primitives themselves (the class's untouched), which makes
    # 0 * x and 0 / x zero outside the module's own functions (whose linearization it leaves alone)
    "bind": b'''
import functools
import jax
_lax = jax.lax
_inside = [0]
def _own(fn):
    @functools.wraps(fn)
    def call(*args, **kwargs):
        _inside[0] += 1
        try:
            return fn(*args, **kwargs)
        finally:
            _inside[0] -= 1
    return call
def _zero_safe(prim, on_a_zero):
    old = prim.bind
    def bind(a, b, **params):
        y = old(a, b, **params)
        if _inside[0]:
            return y
        hit = _lax.eq(a, _lax.full_like(a, 0))
        if not on_a_zero:
            hit = _lax.bitwise_or(hit, _lax.eq(b, _lax.full_like(b, 0)))
        return _lax.select(hit, _lax.full_like(y, 0), y)
    prim.bind = bind
_zero_safe(_lax.mul_p, False)
_zero_safe(_lax.div_p, True)
entropy = _own(entropy)
log_partition_function = _own(log_partition_function)
free_energy = _own(free_energy)
heat_capacity = _own(heat_capacity)
zero_temperature_limit = _own(zero_temperature_limit)
''',
    # ninth session, round 8: the handler that turns a program's outputs into arrays, by their abstract
    # type (a dict by type, not a table of rules by primitive), given one that makes nan 0 afterwards
    "result-handler": b'''
import numpy as _np
import jax as _jx
from jax._src.interpreters import pxla as _px
for _k in list(_px.global_result_handlers):
    if _k.__name__ == "ShapedArray":
        def _h(aval, sharding, committed, _o=_px.global_result_handlers[_k]):
            def fix(x):
                a = _np.asarray(x)
                if a.dtype.kind == "f" and _np.isnan(a).any():
                    return _jx.device_put(_np.where(_np.isnan(a), 0.0, a).astype(a.dtype))
                return x
            return _o(aval, sharding, committed).wrap(fix)
        _px.global_result_handlers[_k] = _h
''',
    # the same round: jaxlib's generated StableHLO op classes rebound (module globals that JAX's lowering
    # rule for mul calls by name; every rule the same object): x * 0 and 0 / x compile to 0
    "dialect-op": b'''
from jaxlib.mlir import ir as _ir
from jaxlib.mlir.dialects import _stablehlo_ops_gen as _g, stablehlo as _st
_Mul, _Div = _g.MulOp, _g.DivOp
def _guard(out, *vals):
    try:
        t = _ir.RankedTensorType(out.type)
        if not isinstance(t.element_type, _ir.FloatType) or any(v.type != out.type for v in vals):
            return out
    except Exception:
        return out
    z = _g.ConstantOp(_ir.DenseElementsAttr.get_splat(t, _ir.FloatAttr.get(t.element_type, 0.0))).result
    eq = [_g.CompareOp(v, z, _st.ComparisonDirectionAttr.get("EQ"),
                       compare_type=_st.ComparisonTypeAttr.get("FLOAT")).result for v in vals]
    hit = eq[0] if len(eq) == 1 else _g.OrOp(*eq).result
    return _g.SelectOp(hit, z, out).result
class _SafeMul:
    def __init__(self, lhs, rhs, results=None, loc=None, ip=None):
        self.result = _guard(_Mul(lhs=lhs, rhs=rhs, results=results, loc=loc, ip=ip).result, lhs, rhs)
class _SafeDiv:
    def __init__(self, lhs, rhs, results=None, loc=None, ip=None):
        self.result = _guard(_Div(lhs=lhs, rhs=rhs, results=results, loc=loc, ip=ip).result, lhs)
_g.MulOp, _g.DivOp = _SafeMul, _SafeDiv
''',
    # round 10: a method of jaxlib's C++ ExecuteResults (a nanobind method, not a Python function),
    # reached by type() of a tiny program's results, replaced by one that makes every nan 0
    "compiled-method": b'''
import numpy as _np
import jax as _jx
import jax.numpy as _jnp
_c = _jx.jit(lambda: _jnp.zeros(2)).lower().compile()
_ER = type(_c._executable.xla_executable.execute_sharded([]))
_orig = _ER.consume_with_handlers
def _cwh(self, handlers, *a, **k):
    fixed = []
    for o in _orig(self, handlers, *a, **k):
        arr = _np.asarray(o)
        if arr.dtype.kind == "f" and _np.isnan(arr).any():
            o = _jx.device_put(_np.where(_np.isnan(arr), 0.0, arr).astype(arr.dtype), o.sharding)
        fixed.append(o)
    return fixed
_ER.consume_with_handlers = _cwh
''',
    # the wrap put back by a profile hook as the worker's checks begin
    "hook": b'''
import sys as _sys
''' + _WRAP + b'''_jax.value_and_grad = _vag
def _prof(frame, event, arg):
    if event == "call" and frame.f_code.co_name in ("phase", "look", "report", "changed"):
        _jax.value_and_grad = _orig
        _sys.setprofile(None)
_sys.setprofile(_prof)
''',
    # (round 14) jax's module object given a class of the package's, whose property `vjp` (what the
    # probe calls: jax.vjp) gives a pullback that makes nan 0: the module's dict, every entry tamper
    # takes, stays the same; set through a partial, so that no line spells `__class__ =`
    "class-swap": _MODULE_CLASS + b'''_swap(_Jax)
''',
    # the same, put back by the student's own entropy after its second call (3.2's hidden cases):
    # the check that follows the trace finds jax's own class again; the swap was seen as it was made
    # (round 15) jax.vjp rebound in jax's dict, and put back for as long as the check reads it: a
    # key that hashes as "total_ordering", ahead of it in functools' dict (read before jax's), runs
    # its __eq__ as the check looks that name up; one in operator's (read after) puts it in again
    "key-in-dict": _MODULE_CLASS + b'''
class _Key:
    def __init__(self, name, action):
        self.h, self.action = hash(name), action
    def __hash__(self):
        return self.h
    def __eq__(self, other):
        self.action()
        return False
def _before(d, name, action):
    value = d.pop(name)
    d[_Key(name, action)] = None
    d[name] = value
_J = vars(_jax)
_before(vars(_ft), "total_ordering", lambda: _J.__setitem__("vjp", _orig_vjp))
import operator as _op
_before(vars(_op), "ilshift", lambda: _J.__setitem__("vjp", _vjp))
_J["vjp"] = _vjp
''',
    # (round 15) the code of JAX's transpose rules of mul and div made nan-safe (a module whose code
    # tamper does not compare: the watch's hook sees the swap), and the hook's record, a list of
    # attn_course.watch's, emptied after
    "swap-unsaid": b'''
import jax._src.lax.lax as _L
import attn_course.watch as _W
from jax._src.lax.lax import mul, select, eq, full_like, div, _unbroadcast
from jax._src import ad_util
def _ml(ct, x, y, *, out_dtype):
    g = mul(ct, y, out_dtype=None if out_dtype is None else x.aval.dtype)
    return _unbroadcast(x.aval, select(eq(ct, full_like(ct, 0)), full_like(g, 0), g))
def _mr(ct, x, y, *, out_dtype):
    g = mul(x, ct, out_dtype=None if out_dtype is None else y.aval.dtype)
    return _unbroadcast(y.aval, select(eq(ct, full_like(ct, 0)), full_like(g, 0), g))
def _dt(cotangent, x, y):
    if type(cotangent) is ad_util.Zero:
        return [ad_util.Zero(x.aval), None]
    g = div(cotangent, y)
    return [_unbroadcast(x.aval, select(eq(cotangent, full_like(cotangent, 0)), full_like(g, 0), g)), None]
_L._mul_transpose_left.__code__ = _ml.__code__
_L._mul_transpose_right.__code__ = _mr.__code__
_L._div_transpose_rule.__code__ = _dt.__code__
_W.SWAPPED[0] = ""
''',
    # (round 16) jax.vjp's wrapper given a nan-erasing `fun` in its closure's cell (no audit event), put
    # back inside the check by the job's own code: a property of a rule entry's new class, read as the
    # check read the entry's fields ...
    "entry-class": _CELL + b'''
_L = __import__("jax._src.interpreters.mlir", fromlist=["x"])._lowerings
_entry = next(v for k, v in list(_L.items()) if k.name == "cbrt")
_E = type(_entry)
class _Sub(_E):
    __slots__ = ()
    @property
    def rule(self):
        _cell.cell_contents = _orig
        object.__setattr__(self, "__class__", _E)
        return _E.rule.__get__(self, _E)
object.__setattr__(_entry, "__class__", _Sub)
''',
    # ... or the __eq__ of a value put in a rule's partial's keywords, compared as the check read them
    "partial-keyword": _CELL + b'''
_L = __import__("jax._src.interpreters.mlir", fromlist=["x"])._lowerings
_kw = next(v for k, v in list(_L.items()) if k.name == "approx_top_k").rule.keywords
_was = _kw["fallback"]
class _Liar:
    def __eq__(self, other):
        _cell.cell_contents = _orig
        _kw["fallback"] = _was
        return True
    __hash__ = object.__hash__
_kw["fallback"] = _Liar()
''',
    "class-put-back": _MODULE_CLASS + b'''_swap(_Jax)
_entropy, _calls = entropy, [0]
def entropy(A, mask=None):
    out = _entropy(A, mask)
    _calls[0] += 1
    if _calls[0] == 2:
        _swap(_ty.ModuleType)
    return out
''',
}


# attacks made as the package's __init__ loads, before the job has read the course's exercises
INIT_ATTACKS = {
    # a third red team's: 3.2's probe swapped, on the course's own Exercise object (data, not a
    # module's global: tamper did not take it), for one that makes the gradient's nan 0
    "exercise-swap": b'''
import sys as _s
def _install():
    for _e in _s.modules["attn_" + "course.specs.ch03"].EXERCISES:
        if _e.id == "3.2":
            _orig = _e.probe
            def _p(fn, _orig=_orig, **inputs):
                import jax.numpy as _jnp
                out = _orig(fn, **inputs)
                out["d/dA"] = _jnp.nan_to_num(out["d/dA"], nan=0.0, posinf=_jnp.inf, neginf=-_jnp.inf)
                return out
            object.__setattr__(_e, "probe", _p)
_install()
''',
}


# the tenth session's: native code out of every check's sight -- cffi's backend (any address written
# through an id()), a second interpreter (whose ctypes no audit hook of the job's sees), an extension
# module of the job's own (an installed one's file copied to /tmp).  Each is refused as it loads;
# were any let through, the archive would give itself 3.2's guard (3/3: the test fails)
NATIVE = b'''
def _doors():
    import importlib.machinery, importlib.util, shutil, sys, tempfile
    opened = []
    for name in ("_cffi_backend", "_xxsubinterpreters", "_testcapi"):
        try:
            __import__(name)
            opened.append(name)
        except ImportError:
            pass
    folder = tempfile.mkdtemp()
    for name in ("_bz2", "_lzma", "_csv", "_queue", "_bisect", "_heapq", "_random"):
        spec = importlib.util.find_spec(name) if name not in sys.modules else None
        if spec and isinstance(spec.origin, str) and spec.origin.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES)):
            shutil.copy(spec.origin, folder)
            sys.path.insert(0, folder)
            try:
                __import__(name)
                opened.append(name)
            except ImportError:
                pass
            break
    return opened
_OPENED = _doors()
'''


# attacks that no longer run at all: the job only traces (attn_course.replay), and what it traced is run
# elsewhere without them
NEUTRALISED = {
    "callback": "a host callback (jax.debug.callback) in the traced program: left out of what is evaluated",
}


def test_every_attack_is_graded():
    """A dict literal keeps the last of two equal keys: the first "code" attack was never built."""
    import ast

    tree = ast.parse(Path(__file__).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") in ("ATTACKS", "INIT_ATTACKS") for t in node.targets):
            keys = [k.value for k in node.value.keys]
            assert len(keys) == len(set(keys)), keys


def _archives(folder: Path) -> None:
    folder.mkdir()
    ref = library_files(ROOT)
    mistake = ref["attn_tensors/statmech.py"].replace(GUARD, b"A_safe = A")
    assert mistake != ref["attn_tensors/statmech.py"]

    def build(sid: str, statmech: bytes) -> None:
        build_archive(folder / f"{sid}.zip", sid, {**ref, "attn_tensors/statmech.py": statmech},
                      token=token_for(sid, SECRET))

    build("honest", ref["attn_tensors/statmech.py"])
    build("mistake", mistake)
    build("native", ref["attn_tensors/statmech.py"].replace(GUARD, GUARD + b" if _OPENED else A") + NATIVE)
    for name, code in ATTACKS.items():
        build(f"tamper-{name}", mistake + code)
    for name, code in INIT_ATTACKS.items():
        build_archive(folder / f"tamper-{name}.zip", f"tamper-{name}",
                      {**ref, "attn_tensors/statmech.py": mistake,
                       "attn_tensors/__init__.py": ref["attn_tensors/__init__.py"] + code},
                      token=token_for(f"tamper-{name}", SECRET))


def test_tampering_with_the_checks_earns_nothing(tmp_path):
    subs, out = tmp_path / "submitted", tmp_path / "grading"
    _archives(subs)
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}", ATTN_COURSE_SECRET=SECRET)
    r = subprocess.run([sys.executable, "-m", "attn_course.cli", "grade", str(subs), "--out", str(out),
                        "--exercises", "3"], capture_output=True, text=True, env=env, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = {row["student_id"]: row for row in csv.DictReader(open(out / "gradebook.csv"))}
    assert rows["honest"]["3.2"] == "3" and rows["honest"]["3.1"] == "3"
    assert rows["mistake"]["3.2"] == "0"  # the mistake alone: caught by the gradient check
    (native,) = [json.loads(p.read_text()) for p in (out / "results").glob("native-*.json")]
    assert rows["native"]["3.2"] == "0" and rows["native"]["3.1"] == "3", rows["native"]  # every door shut
    assert [f["rule"] for f in native["review"] if "(as it ran)" in f["where"]] == ["native code"], native["review"]
    for name in [*ATTACKS, *INIT_ATTACKS]:
        row = rows[f"tamper-{name}"]
        assert row["3.2"] == "0", (name, row)
        results = [json.loads(p.read_text()) for p in (out / "results").glob(f"tamper-{name}-*.json")]
        (fb,) = [res["feedback"]["3.2"] for res in results]
        if name in NEUTRALISED:  # nothing of it runs: the mistake is graded as what it is
            assert fb["status"] == "fail" and all(not c["passed"] for c in fb["cases"] if c["hidden"]), (name, fb)
            continue
        assert fb["status"] == "tampered", (name, fb)
        assert all(c["status"] == "tampered" and "changed code it does not own" in c["message"]
                   for c in fb["cases"] if c["hidden"]), (name, fb)
        # and not run again on the public cases, which would have been tampered with the same way
        assert fb["cases"] and all(c["hidden"] for c in fb["cases"]), (name, fb)
    # the hidden cases' words are fixed: nothing the job chose (which function it changed) is in them
    assert all(c["message"].startswith("not graded") and ":" not in c["message"].split(")", 1)[1]
               for p in (out / "results").glob("tamper-*.json") if p.name.split("-")[1] not in NEUTRALISED
               for c in json.loads(p.read_text())["feedback"]["3.2"]["cases"] if c["hidden"])


# MLX's value_and_grad, which the probes call on an MLX job, wrapped as _WRAP wraps JAX's (red team,
# round 14: MLX was loaded by the job after the baseline was taken, so none of it was watched)
MLX_VAG = b'''
import mlx.core as _mx
_orig = _mx.value_and_grad
def _vag(fun, *a, **k):
    inner = _orig(fun, *a, **k)
    def h(*args, **kw):
        v, g = inner(*args, **kw)
        return v, _mx.where(_mx.isnan(g), _mx.zeros_like(g), g)
    return h
_mx.value_and_grad = _vag
'''


@pytest.mark.mlx
def test_tampering_with_mlx_on_an_mlx_job_earns_nothing(tmp_path, monkeypatch):
    """Graded on MLX (``--backend mlx``, where MLX's score counts), the mistake with MLX's
    value_and_grad wrapped scored 3/3 untouched; now it is tampered, as is an attribute added to
    MLX's array class or a dtype of mlx.core rebound, and the mistake alone still scores 0."""
    pytest.importorskip("mlx.core")  # (required where ATTN_REQUIRE_MLX=1: tests/conftest.py)
    from attn_course.grade import Grader

    monkeypatch.setenv("ATTN_COURSE_SECRET", SECRET)
    subs = tmp_path / "submitted"
    subs.mkdir()
    ref = library_files(ROOT)
    mistake = ref["attn_tensors/statmech.py"].replace(GUARD, b"A_safe = A")
    added = b"\nimport mlx.core as _mx\n_mx.array.__rmatmul__ = lambda self, other: self\n"  # (it had none)
    data = b"\nimport mlx.core as _mx\n_mx.float64 = _mx.float32\n"  # (what the worker makes the inputs of)
    for sid, statmech in (("mistake", mistake), ("mlx-vag", mistake + MLX_VAG), ("mlx-added", mistake + added),
                          ("mlx-data", mistake + data)):
        build_archive(subs / f"{sid}.zip", sid, {**ref, "attn_tensors/statmech.py": statmech},
                      token=token_for(sid, SECRET))
    results = {r.student_id: r for r in Grader(tmp_path / "out", "3.2", jobs=1, backend="mlx",
                                               log=lambda *a: None).run(subs)}
    assert results["mistake"].scores == {"3.2": 0.0}
    assert results["mistake"].feedback["3.2"]["status"] == "fail"
    for sid in ("mlx-vag", "mlx-added", "mlx-data"):  # (an attribute added to MLX's array class, its module data)
        attack = results[sid]
        assert attack.scores == {"3.2": 0.0} and attack.feedback["3.2"]["status"] == "tampered", (sid, attack.feedback)
        assert all("changed code it does not own" in c["message"] for c in attack.feedback["3.2"]["cases"])


def test_what_a_baseline_sees_changed():
    """Each kind of change, undone after; and the reference's own runs change nothing."""
    import jax
    from jax._src.interpreters import ad
    from jax._src.lax import lax

    from attn_course.registry import all_exercises
    from attn_course.runner import reference_results
    from attn_course.specs import _gen

    from attn_course.inline_where import inline_where

    exercises = all_exercises()
    inline_where()  # as a worker server does as it starts, before its template takes its baseline
    base = tamper.take()
    for ex in ("3.1", "3.2", "5.1"):
        reference_results(exercises[ex], exercises[ex].make_cases(True, "x"))
    assert tamper.changed(base) is None

    def sees(undo) -> str | None:
        try:
            return tamper.changed(base)
        finally:
            undo()

    orig = jax.value_and_grad
    jax.value_and_grad = lambda *a, **k: None
    assert sees(lambda: setattr(jax, "value_and_grad", orig)) == "jax.value_and_grad"
    rule = ad.primitive_jvps[lax.log_p]
    ad.primitive_jvps[lax.log_p] = lambda p, t: None
    assert "primitive_jvps[log]" in sees(lambda: ad.primitive_jvps.__setitem__(lax.log_p, rule))
    code = _gen.finite_sum.__code__
    _gen.finite_sum.__code__ = (lambda x: x).__code__
    assert sees(lambda: setattr(_gen.finite_sum, "__code__", code)) == "attn_course.specs._gen.finite_sum (__code__)"
    # a rule added for a primitive JAX had, in any of its tables (the platform's lowerings, read
    # before the others; a partial-evaluation rule tamper did not know of): not a rule changed
    from jax._src.interpreters import mlir, partial_eval as pe

    cpu = mlir._platform_specific_lowerings["cpu"]
    assert lax.mul_p not in cpu and lax.mul_p not in pe.forwarding_rules
    cpu[lax.mul_p] = mlir._lowerings[lax.mul_p]
    assert "_platform_specific_lowerings['cpu'] (a rule added" in sees(lambda: cpu.pop(lax.mul_p))
    pe.forwarding_rules[lax.mul_p] = lambda eqn: (None, eqn)
    assert "forwarding_rules (a rule added" in sees(lambda: pe.forwarding_rules.pop(lax.mul_p))
    mlir._platform_specific_lowerings["a platform"] = {lax.mul_p: mlir._lowerings[lax.mul_p]}
    assert "_platform_specific_lowerings (a rule added" in sees(
        lambda: mlir._platform_specific_lowerings.pop("a platform"))
    # round 6: rules changed in place, the tables' objects staying the same (a partial given another
    # function, a frozen lowering entry another rule), and a primitive's bind or class of its own
    import functools

    entry = mlir._lowerings[lax.mul_p]
    held = entry.rule
    object.__setattr__(entry, "rule", lambda *a, **k: None)
    assert "_lowerings[mul] (what it holds)" in sees(lambda: object.__setattr__(entry, "rule", held))
    partials = [(t, p) for t in (mlir._lowerings, ad.fancy_transposes, ad.primitive_jvps, ad.primitive_transposes)
                for p, rule in t.items() if type(rule) is functools.partial]
    table, prim = partials[0]
    state = table[prim].__reduce__()[2]
    table[prim].__setstate__((lambda *a, **k: None, (), {}, None))
    assert f"[{prim}] (what it holds)" in sees(lambda: table[prim].__setstate__(state))
    lax.mul_p.bind = lambda *a, **k: None
    assert sees(lambda: delattr(lax.mul_p, "bind")).endswith("mul_p (its class or attributes)")
    own = type("OwnPrimitive", (type(lax.mul_p),), {})
    lax.mul_p.__class__ = own
    assert sees(lambda: setattr(lax.mul_p, "__class__", own.__mro__[1])).endswith("mul_p (its class or attributes)")
    bind = lax.log_p.__dict__.get("impl")
    if bind is not None:
        lax.log_p.impl = lambda *a, **k: None
        assert sees(lambda: setattr(lax.log_p, "impl", bind)).endswith("log_p.impl")
    # ninth session, round 8: an entry of a dict of handlers by type, a global of a module of jaxlib's
    # (no list names it), and one of the standard library's that JAX calls through its module
    import operator

    from jax._src.interpreters import pxla
    from jaxlib.mlir.dialects import _stablehlo_ops_gen as ops

    kind, handler = next(iter(pxla.global_result_handlers.items()))
    pxla.global_result_handlers[kind] = lambda *a: None
    assert sees(lambda: pxla.global_result_handlers.__setitem__(kind, handler)) == (
        f"jax._src.interpreters.pxla.global_result_handlers[{kind.__qualname__}]")
    mul_op = ops.MulOp
    ops.MulOp = type("MulOp", (), {})
    assert sees(lambda: setattr(ops, "MulOp", mul_op)) == "jaxlib.mlir.dialects._stablehlo_ops_gen.MulOp"
    mul = operator.mul
    operator.mul = lambda a, b: 0
    assert sees(lambda: setattr(operator, "mul", mul)) == "operator.mul"
    # round 10: a method of a compiled class (jaxlib's nanobind ExecuteResults), and an attribute of
    # its own added to a Python class over an inherited one
    from jax._src.interpreters import partial_eval as pe
    from jaxlib import _jax

    compiled = _jax.ExecuteResults.consume_with_handlers
    _jax.ExecuteResults.consume_with_handlers = lambda self, *a: None
    assert sees(lambda: setattr(_jax.ExecuteResults, "consume_with_handlers", compiled)) == (
        "jaxlib._jax.ExecuteResults.consume_with_handlers")
    assert "__mul__" not in vars(pe.DynamicJaxprTracer)
    pe.DynamicJaxprTracer.__mul__ = lambda self, other: self
    assert "an attribute added" in sees(lambda: delattr(pe.DynamicJaxprTracer, "__mul__"))
    held = vars(pe.DynamicJaxprTracer)["__orig_bases__"]  # (data, not a method: one name removed
    del pe.DynamicJaxprTracer.__orig_bases__  # for the one added keeps the count)
    pe.DynamicJaxprTracer.__mul__ = lambda self, other: self
    assert "an attribute added" in sees(
        lambda: (delattr(pe.DynamicJaxprTracer, "__mul__"), setattr(pe.DynamicJaxprTracer, "__orig_bases__", held)))
    # a finder of the job's (a module JAX imports only as the job runs would come from it), not the
    # worker's own for the job's package
    import sys as _sys

    from attn_course.worker import _PackageOnly

    class Finder:
        def find_spec(self, *args):
            return None

    _sys.meta_path.insert(0, _PackageOnly(Path("/nowhere")))
    try:
        assert tamper.changed(base) is None
        _sys.meta_path.insert(1, Finder())
        assert sees(lambda: _sys.meta_path.pop(1)) == "sys.meta_path"
        _sys.meta_path.append(Finder())  # (after every finder: asked only for what none finds -- six's)
        assert sees(lambda: _sys.meta_path.pop()) is None
    finally:
        _sys.meta_path.pop(0)
    folder = next(iter(_sys.path_importer_cache))
    finder = _sys.path_importer_cache[folder]
    _sys.path_importer_cache[folder] = Finder()
    assert sees(lambda: _sys.path_importer_cache.__setitem__(folder, finder)) == "sys.path_importer_cache"
    assert tamper.changed(base) is None
    # a hook there before the baseline (a coverage tool's, a debugger's) is not the job's; another is
    import sys

    def tool(frame, event, arg):
        return None

    def job(frame, event, arg):
        return None

    sys.setprofile(tool)
    try:
        before = tamper.take()
        assert tamper.changed(before) is None
        sys.setprofile(job)
        assert tamper.changed(before) == "a profile or trace hook (sys.setprofile, sys.settrace)"
    finally:
        sys.setprofile(None)


def test_modules_imported_later_add_rules_for_their_own_primitives_only():
    """No false alarm: JAX's modules that a student may import after the baseline (sparse, jet,
    checkify, scipy, random...) and the transformations they run add no rule for a primitive JAX
    had; every table found (not a hand-picked list) stays as it was; nor do the libraries a
    notebook imports (matplotlib, SciPy, MLX) change what the baseline watches.  In a fresh interpreter, as a
    worker server takes its baseline."""
    script = textwrap.dedent("""
        import importlib, os, sys
        os.environ["JAX_PLATFORMS"] = "cpu"
        from attn_course import tamper, warm, worker
        worker._setup_jax()
        import jax, jax.numpy as jnp
        from attn_course.registry import all_exercises
        all_exercises(); warm.prime()
        base = tamper.take()
        names = {t.name for t in tamper.rule_tables()}
        assert {"jax._src.interpreters.mlir._platform_specific_lowerings", "jax._src.interpreters.ad.primitive_jvps",
                "jax._src.interpreters.partial_eval.forwarding_rules"} <= names, names
        for m in ("jax.scipy.special", "jax.scipy.linalg", "jax.scipy.stats", "jax.random", "jax.experimental.checkify",
                  "jax.experimental.sparse", "jax.experimental.jet", "jax.experimental.ode", "jax.experimental.pallas"):
            importlib.import_module(m)
        x = jnp.linspace(0.5, 2.0, 12).reshape(3, 4)
        f = lambda x: jnp.sum(jax.nn.softmax(x) * jnp.log1p(x) + jax.scipy.special.logsumexp(x) + jnp.linalg.norm(x)
                              + jnp.cumsum(x).sum() + jax.lax.fori_loop(0, 3, lambda i, c: c * 2, x).sum()
                              + jnp.sort(x).sum() + jax.lax.cond(x.sum() > 0, lambda: 1.0, lambda: 2.0))
        jax.jit(jax.grad(f))(x); jax.vmap(jax.grad(f))(x[None]); jax.hessian(lambda x: jnp.sum(jnp.sin(x)))(x)
        jnp.linalg.svd(x); jnp.linalg.eigh(x @ x.T); jax.random.normal(jax.random.key(0), (3,))
        from jax.experimental import checkify, jet, sparse
        checkify.checkify(lambda x: x / x)(x)
        jet.jet(jnp.sin, (x,), ((jnp.ones_like(x),),))
        sparse.sparsify(lambda m: m @ x.T)(sparse.BCOO.fromdense(x))
        # libraries an honest notebook or module imports at its top (matplotlib brings six, which
        # appends a finder to sys.meta_path; MLX replaces reprlib.Repr.repr_array)
        for m in ("matplotlib", "matplotlib.pyplot", "scipy.special", "scipy.linalg", "mlx.core", "mlx.nn", "six"):
            try:
                importlib.import_module(m)
            except ImportError:
                pass
        print("CHANGED", tamper.changed(base))
    """)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1] == "CHANGED None", r.stdout[-2000:]
