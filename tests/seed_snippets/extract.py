"""Extract the code blocks that use attn_tensors from the seed documents.

Run from the repository root: ``python tests/seed_snippets/extract.py ../shared/seeds``.
The snippets are committed next to this file so the test runs without the
seeds; ``test_seed_snippets.py`` checks the copies still match when the seeds
are present.
"""

from __future__ import annotations

import pathlib
import sys


def code_blocks(text: str) -> list[str]:
    """Fenced blocks (``` ... ```), in order, without the fence lines."""
    blocks, current = [], None
    for line in text.splitlines():
        if line.strip().startswith("```"):
            if current is None:
                current = []
            else:
                blocks.append("\n".join(current) + "\n")
                current = None
        elif current is not None:
            current.append(line)
    return blocks


def snippets(seed_dir: pathlib.Path) -> dict[str, str]:
    found = {}
    for f in sorted(seed_dir.glob("*.txt")):
        k = 0
        for block in code_blocks(f.read_text()):
            if "attn_tensors" in block:
                k += 1
                found[f"seed{f.name[:3]}_{k}.py"] = block
    return found


if __name__ == "__main__":
    here = pathlib.Path(__file__).parent
    for name, code in snippets(pathlib.Path(sys.argv[1])).items():
        (here / name).write_text(code)
        print(name)
