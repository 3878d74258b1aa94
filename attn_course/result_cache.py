"""Trusted-side results kept on disk, shared by the processes of a test session.

The expected values (:func:`attn_course.runner.reference_results`) and the
mistakes catalogue's outputs (:mod:`attn_course.diagnose`) cost JAX tracing
and compiling in every process that needs them, and a test session needs
the same ones in many processes (pytest's workers, every ``attn-course
grade`` it starts).  With ``ATTN_COURSE_RESULT_CACHE`` set to a folder, each
is computed once and read back by the others: one JSON file per result,
written atomically, computed under a file lock so that two processes never
compute the same one side by side.  Without the variable nothing is kept.

A result's file is named by a digest of everything the result depends on:
what is computed (the exercise, the function or catalogue entries), the
cases' names and inputs, the source of the ``attn_tensors`` that was
imported and of the modules of ``attn_course`` that compute it
(:func:`computing_sources`), the versions of Python, NumPy, JAX and jaxlib,
the machine, the JAX backend and the XLA flags.  Change any of them
and the result is computed again; a cache can make a run faster, never
change what it computes.  The folder holds expected values of hidden cases:
it is private (mode 0700), and no sandbox binds it (a worker sees only the
workers' compilation cache, :func:`attn_course.xla_cache.worker_cache_dir`).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import platform
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterable

from . import values

ENV = "ATTN_COURSE_RESULT_CACHE"
_SOURCES: dict[Path, tuple[tuple, str]] = {}  # a file or folder -> (its files' stat, digest)


def folder() -> Path | None:
    """The cache's folder (made private), or None when results are not kept."""
    path = os.environ.get(ENV)
    if not path:
        return None
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
        os.chmod(path, 0o700)
    except OSError:
        return None
    return path


def cases_digest(cases: Iterable[Any]) -> str:
    """A digest of cases' names, inputs and eager flags (the inputs as the workers receive them)."""
    h = hashlib.sha256()
    for c in cases:
        h.update(json.dumps([c.name, values.encode(c.inputs), bool(c.eager)], sort_keys=True).encode())
        h.update(b"\0")
    return h.hexdigest()


def source_digest(path: Path) -> str:
    """A digest of a ``*.py`` file, or of those under a folder (recomputed when one of them changes)."""
    path = Path(path).resolve()
    if path.is_file():
        files, top = [path], path.parent
    else:
        files, top = sorted(p for p in path.rglob("*.py") if "__pycache__" not in p.parts), path
    stats = tuple((str(p), p.stat().st_mtime_ns, p.stat().st_size) for p in files)
    known = _SOURCES.get(path)
    if known is not None and known[0] == stats:
        return known[1]
    h = hashlib.sha256()
    for p in files:
        h.update(str(p.relative_to(top)).encode() + b"\0" + p.read_bytes() + b"\0")
    _SOURCES[path] = (stats, h.hexdigest())
    return h.hexdigest()


def _machine() -> list[str]:
    import jax
    import jaxlib
    import numpy as np

    cpu = ""
    try:
        cpu = next((ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("model name")), "")
    except OSError:
        pass
    return [sys.version, np.__version__, jax.__version__, jaxlib.__version__, platform.machine(), cpu,
            jax.default_backend(), str(jax.config.jax_enable_x64), os.environ.get("XLA_FLAGS", "")]


def computing_sources() -> tuple[str, ...]:
    """What a result is computed by, in attn_course: the worker's modules and specs (probes and
    cases, as a sandbox gets them), the mistakes catalogue, and the modules that run and store
    them.  The rest (grading, reports, the CLI) is not part of a key: editing it keeps the results."""
    from .sandbox import WORKER_MODULES

    return (*WORKER_MODULES, "specs", "mistakes", "book.py", "text.py",  # the catalogue imports the last two
            "runner.py", "diagnose.py", "result_cache.py")


def _key(kind: str, parts: list) -> str:
    import attn_tensors

    course = Path(__file__).parent
    sources = [source_digest(Path(attn_tensors.__file__).parent)]
    sources += [source_digest(course / name) for name in computing_sources()]
    text = json.dumps([kind, parts, sources, _machine()], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def cached(kind: str, parts: list, compute: Callable[[], Any]) -> Any:
    """``compute()`` (plain JSON data: :func:`attn_course.values.encode`'s form), computed once per key.

    ``kind`` names what is computed and ``parts`` everything it depends on
    besides the sources, the versions and the machine (which the key always
    holds).  Without the cache folder this is ``compute()``.  Either way the
    result is what JSON gives back, so a hit and a miss return the same data.
    """
    where = folder()
    if where is None:
        return json.loads(json.dumps(compute(), allow_nan=False))
    key = _key(kind, parts)
    path = where / f"{kind}-{key}.json"
    hit = _read(path, key)
    if hit is not None:
        return hit[0]
    with _locked(where / f"{kind}-{key}.lock"):
        hit = _read(path, key)  # another process may have computed it meanwhile
        if hit is not None:
            return hit[0]
        text = json.dumps({"key": key, "value": compute()}, allow_nan=False)
        _write(path, text)
    return json.loads(text)["value"]


def _read(path: Path, key: str) -> tuple[Any] | None:
    try:
        obj = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(obj, dict) or obj.get("key") != key or "value" not in obj:
        return None
    return (obj["value"],)


def _write(path: Path, text: str) -> None:
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError:
        pass  # a cache that cannot be written is only slower


class _locked:
    """An exclusive lock on a file (shared by this machine's processes); none if it cannot be had."""

    def __init__(self, path: Path):
        self.path, self.fd = path, None

    def __enter__(self):
        try:
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        except OSError:
            if self.fd is not None:
                os.close(self.fd)
            self.fd = None
        return self

    def __exit__(self, *exc):
        if self.fd is not None:
            os.close(self.fd)  # closing releases the lock
