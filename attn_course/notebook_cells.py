"""A notebook's code cells by nbgrader grade id, read from untrusted JSON (no nbformat, nothing run).

Shared by the grader (:mod:`attn_course.nbgrader_bridge`), the similarity
report and the student's ``submit``, which refuses a notebook the grader
could not read.
"""

from __future__ import annotations

import json

MAX_NOTEBOOK_CELLS = 400


def cells_by_id(nb: object) -> dict[str, list[str]]:
    """grade_id -> sources of the code cells that carry it (a notebook is untrusted JSON)."""
    found: dict[str, list[str]] = {}
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        raise ValueError("not a notebook")
    for cell in nb["cells"][:MAX_NOTEBOOK_CELLS]:
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        meta = cell.get("metadata")
        grade_id = meta.get("nbgrader", {}).get("grade_id") if isinstance(meta, dict) and isinstance(meta.get("nbgrader"), dict) else None
        src = cell.get("source", "")
        if isinstance(src, list) and all(isinstance(s, str) for s in src):
            src = "".join(src)
        if not isinstance(grade_id, str) or not isinstance(src, str):
            continue
        found.setdefault(grade_id, []).append(src)
    return found


def answer_cells(text: str | bytes) -> str:
    """The sources of a notebook's answer cells (grade ids ``*-answer``), in the notebook's order,
    one after the other; raises ValueError where the text is not a notebook."""
    try:
        cells = cells_by_id(json.loads(text))
    except (RecursionError, UnicodeDecodeError, TypeError, AttributeError) as err:
        raise ValueError("not a notebook") from err
    return "\n\n".join(src for grade_id, sources in cells.items() if grade_id.endswith("-answer") for src in sources)
