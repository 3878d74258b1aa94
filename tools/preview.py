"""Build a few pages of the book on their own, strictly, in a private folder.

    python tools/preview.py chapters/03_statistical_mechanics.md [more pages...]

Makes a throw-away book in a temporary folder (the real _config.yml, the
extensions and the bibliography, a table of contents with just these pages)
and runs `jupyter-book build -W -n --keep-going` on it. Several authors can
preview at once without sharing a _build folder. Prints the HTML folder.
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]


def main(pages: list[str]) -> int:
    if not pages:
        print(__doc__)
        return 2
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="book-preview-"))
    for name in ("_config.yml", "references.bib", "_ext", "_static"):
        if (ROOT / name).exists():
            os.symlink(ROOT / name, tmp / name)
    entries = []
    for page in pages:
        src = (ROOT / page).resolve()
        rel = src.relative_to(ROOT)
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, tmp / rel)
        # figures and data next to the page travel with it
        for extra in src.parent.glob(f"{src.stem}_*"):
            if extra.is_file():
                shutil.copy2(extra, tmp / rel.parent / extra.name)
        entries.append(str(rel.with_suffix("")))
    # Labels of the chapters that are not in this preview get stub pages, and
    # the bibliography page comes along, so cross-references resolve.
    text = "".join((ROOT / p).read_text() for p in pages)
    stubs = []
    for label in sorted(set(re.findall(r"\{ref\}`((?:ch|app)-[\w-]+)`", text))):
        if f"({label})=" not in text:
            (tmp / f"stub-{label}.md").write_text(f"({label})=\n# Stub for {label}\n")
            stubs.append(f"stub-{label}")
    bib = ROOT / "chapters" / "bibliography.md"
    if "chapters/bibliography" not in entries:
        (tmp / "chapters").mkdir(exist_ok=True)
        shutil.copy2(bib, tmp / "chapters" / "bibliography.md")
        stubs.append("chapters/bibliography")
    entries += stubs
    (tmp / "index.md").write_text("# Preview\n\n" + "\n".join(f"- {e}" for e in entries) + "\n")
    toc = "format: jb-book\nroot: index\nchapters:\n" + "".join(f"  - file: {e}\n" for e in entries)
    (tmp / "_toc.yml").write_text(toc)
    jb = pathlib.Path(sys.executable).with_name("jupyter-book")
    proc = subprocess.run([str(jb), "build", str(tmp), "-W", "-n", "--keep-going"], cwd=tmp)
    print(f"\nHTML: {tmp / '_build' / 'html'}")
    return proc.returncode


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
