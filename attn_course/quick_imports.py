"""Third-party work done at import time that the course's processes never use, skipped.

``nbformat`` (and through it nbgrader and nbclient) imports ``jsonschema``,
whose format checkers import ``rfc3987_syntax`` when it is installed (the
``format-nongpl`` extra that Jupyter's packages ask for).  That module builds
several Earley parsers of the IRI grammar as it is imported: about 1.8 CPU-s
in every process that reads a notebook (python-jsonschema/jsonschema#1428),
for the ``iri`` and ``iri-reference`` formats, which no notebook or nbgrader
schema uses.  :func:`skip_iri_parsers` makes that optional import fail, as
if the package were absent (jsonschema then checks those two formats no
more; every other check is unchanged).  It is called by the course's
commands and by its modules that read notebooks, before they import them.
"""

from __future__ import annotations

import sys


def skip_iri_parsers() -> None:
    """Before ``jsonschema`` is first imported: it will not import ``rfc3987_syntax``."""
    if "jsonschema" not in sys.modules:  # once imported, its format checkers are made
        sys.modules.setdefault("rfc3987_syntax", None)  # None: "import rfc3987_syntax" raises ImportError
