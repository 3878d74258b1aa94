"""nbgrader's gradebook without the ``alembic`` command it runs for each new database.

``nbgrader.api.Gradebook`` stamps a new database with the newest revision
of nbgrader's migrations, which it learns by running ``alembic heads`` as a
command: a second Python that imports alembic and nbgrader, about 4-5 s,
for every new gradebook (each ``attn-course grade --notebooks`` into a new
folder, each ``make release``).  :func:`fast_alembic_head` has nbgrader ask
alembic's own ``ScriptDirectory`` for that revision in this process (a few
milliseconds; the same answer: ``tests/course/test_release.py``), and keeps
the command where that cannot be done.
"""

from __future__ import annotations

import os


def alembic_head() -> str:
    """The newest revision of nbgrader's migrations, read here (what ``alembic heads`` prints first)."""
    from .quick_imports import skip_iri_parsers

    skip_iri_parsers()
    import nbgrader
    from alembic.script import ScriptDirectory

    return ScriptDirectory(os.path.join(os.path.dirname(nbgrader.__file__), "alembic")).get_current_head()


def fast_alembic_head() -> None:
    """Make ``nbgrader.api`` stamp new gradebooks with :func:`alembic_head` (idempotent)."""
    from .quick_imports import skip_iri_parsers

    skip_iri_parsers()
    import nbgrader.api as api

    command = getattr(api.get_alembic_version, "_command", api.get_alembic_version)

    def get_alembic_version() -> str:
        try:
            head = alembic_head()
        except Exception:  # noqa: BLE001 - another layout of nbgrader or alembic: its own way
            head = None
        return head if isinstance(head, str) and head else command()

    get_alembic_version._command = command
    api.get_alembic_version = get_alembic_version
