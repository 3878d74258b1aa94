"""nbgrader configuration of the course (nbgrader 0.9.6).

The instructor's source notebooks are in ``solutions/`` and the released
student versions in ``exercises/``, so the usual commands work from the
repository root::

    nbgrader generate_assignment ch05      # solutions/ch05 -> exercises/ch05
    nbgrader validate solutions/ch05/ch05.ipynb
    nbgrader autograde ch05                # grading/submitted/<student>/ch05
    nbgrader generate_feedback ch05        # grading/feedback (hidden tests removed)
    nbgrader export                        # grades.csv

Submissions, autograded notebooks, feedback and the gradebook live under
``grading/`` (not committed).  nbgrader runs ``alembic`` as a command: the
environment's ``bin`` must be on PATH (``make`` does that).
"""

from pathlib import Path

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
