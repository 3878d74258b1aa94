"""XLA's persistent compilation cache, shared by the trusted side and the workers."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """Where compiled XLA executables are kept between runs (ATTN_COURSE_CACHE)."""
    default = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "attn-course" / "xla"
    return Path(os.environ.get("ATTN_COURSE_CACHE", default))


def enable_compile_cache(path: Path | str | None = None) -> None:
    """Use JAX's persistent compilation cache: a program compiles once per shape, ever.

    A check or a grading run makes many small calls whose compilation
    dominates the time; the cache makes a second run several times faster.
    Workers see the folder read-only: they use what the trusted side compiled.
    JAX opens its cache folder once per process: a call with another folder
    makes it open the new one (the grader switches between its own cache
    and the workers').
    """
    import jax
    from jax.experimental.compilation_cache import compilation_cache

    path = Path(path or cache_dir())
    try:
        path.mkdir(parents=True, exist_ok=True)
        if path == cache_dir():  # the grader's own programs embed hidden cases: no other user reads them
            os.chmod(path, 0o700)
    except OSError:
        pass
    if jax.config.jax_compilation_cache_dir != str(path):
        jax.config.update("jax_compilation_cache_dir", str(path))
        # JAX opens its cache at the first compilation and keeps that folder
        # for good: without a reset, a later folder would never be used.
        compilation_cache.reset_cache()
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


# How every program of a job is compiled, on the workers and by the trusted side
# that fills their cache (:func:`compile_for_workers`): one thread each, no LLVM
# optimisation (a case's arrays are tiny, and a program that misses the cache --
# any code but the reference's -- compiles about a third faster), and XLA's older
# emitters for fused operations instead of its MLIR-based ones (the whole
# assignment's program of 47 exercises compiles in 1.6-2.3 CPU-s instead of
# 3.6-4.1, to the same bits on every case of the reference: tests/course/
# test_job_program.py), and its LLVM module in one piece rather than split for
# threads it does not have (a chapter-3 job's program that misses the cache:
# 0.087 -> 0.071 CPU-s, medians of 7; the whole assignment's 1.46 -> 1.25; the
# same bits).  They are given with each compilation, not as XLA_FLAGS:
# XLA reads XLA_FLAGS once per process, when its backend starts, so a trusted
# process whose backend was already running (a test session, a notebook)
# compiled with its own options under the workers' flags, and no worker ever
# found its entries.  Options given with the compilation are part of the key
# whatever the process read before.
WORKER_COMPILER_OPTIONS = {"xla_cpu_multi_thread_eigen": False, "xla_backend_optimization_level": 0,
                           "xla_cpu_use_fusion_emitters": False, "xla_cpu_parallel_codegen_split_count": 1}
# Those that only make compiling cheaper: an XLA that no longer knows one (it refuses every
# program that names it) compiles without it (:func:`compile_for_workers`).
CHEAPER_ONLY = ("xla_cpu_use_fusion_emitters", "xla_cpu_parallel_codegen_split_count")
_options = dict(WORKER_COMPILER_OPTIONS)  # what this process's XLA accepts of them


def compile_for_workers(lowered):
    """``lowered`` (a JAX ``Lowered`` program) compiled with the workers' options.

    Where this XLA refuses one of :data:`CHEAPER_ONLY` ("No such compile
    option"), it is left out, for this program and the process's later ones;
    any other error is raised.  The trusted side and the workers compile
    through here, so that both compute the same cache keys.
    """
    global _options
    while True:
        try:
            return lowered.compile(compiler_options=_options)
        except Exception as err:  # noqa: BLE001 - JAX's runtime error: its type is JAX's own
            text = str(err)
            unknown = [name for name in CHEAPER_ONLY if name in _options and name in text]
            if "No such compile option" not in text or not unknown:
                raise
            _options = {k: v for k, v in _options.items() if k not in unknown}  # (XLA names one at a time)


def compiler_options() -> dict:
    """The workers' compiler options that this process's XLA accepted so far (all, until one is refused)."""
    return dict(_options)


def worker_cache_dir() -> Path:
    """The compilation cache that workers read: written only by the trusted side.

    It holds the programs of the reference's own probes (on the cases of the
    class), so a submission whose program is the reference's loads it
    instead of compiling.  Its folder is not listable (mode 0311) and is bound
    read-only into the sandbox: a job can open an entry only by its key, a
    hash of the very program it would compile, so the cache tells it nothing
    that its own code does not, and no job can plant an entry for another.
    """
    path = cache_dir().parent / "worker-xla"
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, 0o311)
    return path


def check_cache_dir() -> Path:
    """The compilation cache of ``attn-course check``'s worker: the student's own checks.

    A check runs the student's own code, unconfined, on the student's own
    machine, so its worker writes here as it compiles: the next check loads
    every program that did not change instead of compiling it again.  A
    folder of its own, beside the others: nothing the grader trusts reads it.
    """
    return cache_dir().parent / "check-xla"


class worker_keys:
    """Within this block, programs compiled here are cached under the workers' keys.

    JAX's key includes the environment's XLA_FLAGS, which a worker does not
    have (:func:`attn_course.sandbox.worker_env`): it is set aside here.
    """

    def __enter__(self):
        self.saved = os.environ.pop("XLA_FLAGS", None)
        return self

    def __exit__(self, *exc):
        if self.saved is not None:
            os.environ["XLA_FLAGS"] = self.saved


class compile_cache:
    """Within this block, compiled programs go to (and come from) the cache at ``path``;
    after it, the folder in use before (if any) is used again."""

    def __init__(self, path: Path | str):
        self.path = path

    def __enter__(self):
        import jax

        self.saved = jax.config.jax_compilation_cache_dir
        enable_compile_cache(self.path)
        return self

    def __exit__(self, *exc):
        import jax
        from jax.experimental.compilation_cache import compilation_cache

        if self.saved is not None:
            enable_compile_cache(self.saved)
        else:
            jax.config.update("jax_compilation_cache_dir", None)
            compilation_cache.reset_cache()
