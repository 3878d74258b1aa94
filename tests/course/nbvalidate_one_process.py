"""`nbgrader validate [--invert] NOTEBOOK...` with every notebook run in one Python process.

nbgrader's own :class:`nbgrader.validator.Validator` decides (cell types,
checksums of locked cells, which grade cells pass or fail) and prints its
verdicts; only its ``Execute`` preprocessor, which starts a Jupyter kernel
per notebook (about 3 s each, most of it starting Python and importing
JAX), is replaced by :class:`InProcessExecute`: each notebook's code cells
run in order in one IPython shell of this process, reset between notebooks,
with the notebook's folder as the current folder (nbgrader's ``validate``
changes to it), and a cell that raises gets an ``error`` output as a
kernel's would (nbgrader reads a grade cell with one as failed).

The test suite runs the real ``nbgrader validate --invert`` on one released
notebook and this on all ten (tests/course/test_nbgrader.py).

    python tests/course/nbvalidate_one_process.py [--invert] NOTEBOOK...
"""

from __future__ import annotations

import contextlib
import io
import sys
import traceback


def _in_process_execute():
    from nbformat.v4 import new_output
    from nbgrader.preprocessors import NbGraderPreprocessor

    from IPython.core.interactiveshell import InteractiveShell

    class InProcessExecute(NbGraderPreprocessor):
        """Run the notebook's code cells in this process's IPython shell (a fresh namespace)."""

        def preprocess(self, nb, resources):
            shell = InteractiveShell.instance()
            shell.showtraceback = lambda *a, **k: None  # the error is recorded below, not printed
            shell.reset(new_session=True)
            for cell in nb.cells:
                if cell.cell_type != "code":
                    continue
                out = io.StringIO()
                with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                    result = shell.run_cell(cell.source, silent=True, store_history=False)
                err = result.error_before_exec or result.error_in_exec
                cell.outputs = []
                if out.getvalue():
                    cell.outputs.append(new_output("stream", name="stdout", text=out.getvalue()))
                if err is not None:
                    cell.outputs.append(new_output(
                        "error", ename=type(err).__name__, evalue=str(err),
                        traceback=traceback.format_exception_only(type(err), err)))
            return nb, resources

    return InProcessExecute


def main(argv: list[str]) -> int:
    from attn_course.quick_imports import skip_iri_parsers

    skip_iri_parsers()  # before nbgrader imports nbformat
    from nbgrader.preprocessors import CheckCellMetadata, ClearOutput
    from nbgrader.validator import Validator

    invert = "--invert" in argv
    paths = [a for a in argv if a != "--invert"]
    validator = Validator(invert=invert)
    validator.preprocessors = [CheckCellMetadata, ClearOutput, _in_process_execute()]
    for path in paths:
        validator.validate_and_print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
