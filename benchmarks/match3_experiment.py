"""Match3: one layer of standard attention against one 2-simplicial layer.

    .venv/bin/python benchmarks/match3_experiment.py            # full run (< 60 s, 2 cores)
    .venv/bin/python benchmarks/match3_experiment.py --steps 300

Trains both layers (same width, features, readout, optimiser, batches and
seed) on Sanford et al.'s Match3 and prints a table of test accuracies next
to the class-balance baseline and a hand-built 2-simplicial layer.  The task,
the construction and the set-up are documented in
``attn_tensors/experiments/match3.py``; the book calls
``attn_tensors.experiments.match3.run_match3`` directly.
"""

from __future__ import annotations

import argparse
import time

from attn_tensors.experiments.match3 import Match3Config, format_table, run_match3


def main() -> None:
    default = Match3Config()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for field in ("S", "M", "d", "hidden", "steps", "batch", "n_train", "n_test", "seed"):
        parser.add_argument(f"--{field}", type=int, default=getattr(default, field))
    parser.add_argument("--lr", type=float, default=default.lr)
    args = vars(parser.parse_args())
    t0 = time.perf_counter()
    results = run_match3(Match3Config(**args))
    print(format_table(results))
    print(f"total wall time {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
