"""What a worker server does with JAX before it forks its jobs (worker._setup_jax).

The template imports JAX but must not start its backend (XLA's threads do
not survive a fork); what can be done before the fork is done there once,
so that every job's child inherits it: JAX's searches of the installed
packages' metadata for plugins, which cost each child about 0.03 CPU-s as
its backend started.  Checked in a fresh interpreter, as a server starts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROGRAM = r"""
import importlib.metadata as metadata, json, os, sys
from attn_course import worker
worker._setup_jax()
from jax._src import xla_bridge
before = {"backends": len(xla_bridge._backends), "threads": __import__("threading").active_count()}
r, w = os.pipe()
pid = os.fork()
if pid == 0:  # a job's child: count what its backend's start reads of the packages' metadata
    reads = []
    real = metadata.distributions
    metadata.distributions = lambda *a, **k: (reads.append(1), real(*a, **k))[1]
    import jax
    devices = [d.platform for d in jax.devices()]
    os.write(w, json.dumps({"reads": len(reads), "devices": devices}).encode())
    os._exit(0)
os.close(w)
os.waitpid(pid, 0)
print(json.dumps({"before": before, "child": json.loads(os.read(r, 1 << 16))}))
"""


def test_the_template_starts_no_backend_and_its_children_search_no_metadata():
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
    env.pop("ATTN_COURSE_CACHE", None)
    out = subprocess.run([sys.executable, "-c", PROGRAM], env=env, cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["before"] == {"backends": 0, "threads": 1}, got  # nothing of XLA's runs before the fork
    assert got["child"]["devices"] == ["cpu"], got
    assert got["child"]["reads"] == 0, got  # the plugin search was done, once, before the fork
