"""What the README checks share (check_doc_links.py, check_doc_examples.py): the README.md files
of the tree, and a file's lines outside fenced code blocks."""
import os

SKIP_DIRS = {".git", "build", "node_modules", "runs", "data", "gpu"}


def readmes(root):
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if x not in SKIP_DIRS and not x.startswith("build"))
        for f in sorted(files):
            if f == "README.md":
                yield os.path.join(d, f)


def outside_fences(text):
    """(line number, line) of the lines outside ``` or ~~~ fenced blocks."""
    fence = None
    for n, line in enumerate(text.split("\n"), 1):
        s = line.strip()
        if fence:
            if s.startswith(fence):
                fence = None
            continue
        if s.startswith("```") or s.startswith("~~~"):
            fence = s[:3]
            continue
        yield n, line
