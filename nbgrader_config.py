"""nbgrader configuration of the course (nbgrader 0.9.6).

The instructor's source notebooks are in ``solutions/`` and the released
student versions in ``exercises/``, so the usual commands work from the
repository root::

    nbgrader generate_assignment ch05      # solutions/ch05 -> exercises/ch05
    nbgrader validate solutions/ch05/ch05.ipynb
    nbgrader export                        # grades.csv

Students' notebooks are graded by ``attn-course grade SUBMISSIONS --out
GRADING --notebooks``: their answer cells run in the grading sandbox and the
scores go into nbgrader's gradebook.  ``nbgrader autograde`` would run them
unconfined, as your user, next to the secret and the hidden tests: it is
refused here unless ATTN_UNCONFINED_AUTOGRADE=1 (for notebooks you trust).

Submissions, autograded notebooks, feedback and the gradebook live under
``grading/`` (not committed).  nbgrader runs ``alembic`` as a command: the
environment's ``bin`` must be on PATH (``make`` does that).
"""

import os
import sys
from pathlib import Path

if "autograde" in sys.argv[1:3] and os.environ.get("ATTN_UNCONFINED_AUTOGRADE") != "1":
    raise SystemExit(
        "nbgrader autograde would run students' notebooks unconfined, as your user, where they can read "
        "the secret and the hidden tests and write the gradebook. Grade them with\n"
        "    attn-course grade SUBMISSIONS --out GRADING --notebooks\n"
        "(set ATTN_UNCONFINED_AUTOGRADE=1 only for notebooks you trust).")

c = get_config()  # noqa: F821 - provided by nbgrader

ROOT = Path(__file__).resolve().parent
c.CourseDirectory.root = str(ROOT)
c.CourseDirectory.course_id = "attn-tensors"
c.CourseDirectory.source_directory = "solutions"
c.CourseDirectory.release_directory = "exercises"
c.CourseDirectory.submitted_directory = "grading/submitted"
c.CourseDirectory.autograded_directory = "grading/autograded"
c.CourseDirectory.feedback_directory = "grading/feedback"
c.CourseDirectory.solution_directory = "grading/source_solutions"
(ROOT / "grading").mkdir(exist_ok=True)  # sqlite does not create the folder
c.CourseDirectory.db_url = f"sqlite:///{ROOT / 'grading' / 'gradebook.db'}"

# The stub that replaces each solution region in the released notebooks.
c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}

# Notebooks import JAX; give a cold kernel time to compile.
c.Execute.timeout = 300
c.ExecutePreprocessor.timeout = 300

# nbgrader's default feedback shows the hidden tests; remove them (the test
# cells' output names no hidden value: see attn_course.nbcheck).
c.GenerateFeedback.preprocessors = [
    "nbgrader.preprocessors.GetGrades",
    "nbconvert.preprocessors.CSSHTMLHeaderPreprocessor",
    "nbgrader.preprocessors.ClearHiddenTests",
]
