#!/usr/bin/env python3
"""Checks that every relative link in the repository's README.md files resolves.

A link [text](target) or [text](target#anchor) whose target is not a URL must name an existing
file or folder, relative to the README that holds it; an anchor must be a heading of the target
file (GitHub's rule: lower case, punctuation dropped, spaces to hyphens). Links inside code
(fenced blocks and `inline code`) are not links and are skipped.

    python3 tests/check_doc_links.py [REPO_ROOT]     (default: the folder above tests/)

Prints each broken link and exits 1 if there is one.
"""
import os
import re
import sys

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from doc_files import outside_fences, readmes  # noqa: E402


def prose_lines(text):
    """(line number, line) outside fenced code blocks, with inline code removed."""
    for n, line in outside_fences(text):
        yield n, re.sub(r"`[^`]*`", "", line)


def slug(heading):
    s = heading.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)  # keeps letters, digits, _, -, spaces
    return s.replace(" ", "-")


def anchors(path):
    """Anchors of a file's headings, inline code included (GitHub keeps its text)."""
    seen, out = {}, set()
    for _, line in outside_fences(open(path, encoding="utf-8").read()):
        m = HEADING.match(line)
        if m:
            base = slug(m.group(2))
            out.add(base if base not in seen else f"{base}-{seen[base]}")
            seen[base] = seen.get(base, 0) + 1
    return out


def check(path, root):
    errors = []
    rel = os.path.relpath(path, root)
    for n, line in prose_lines(open(path, encoding="utf-8").read()):
        for target in LINK.findall(line):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            file_part, _, anchor = target.partition("#")
            dest = path if not file_part else os.path.normpath(os.path.join(os.path.dirname(path), file_part))
            where = f"{rel}:{n}: {target}"
            if not os.path.exists(dest):
                errors.append(f"{where}: {os.path.relpath(dest, root)} does not exist")
            elif anchor and (os.path.isdir(dest) or not dest.endswith(".md")):
                errors.append(f"{where}: an anchor into a file that is not markdown")
            elif anchor and anchor not in anchors(dest):
                errors.append(f"{where}: no heading '#{anchor}' in {os.path.relpath(dest, root)}")
            elif not os.path.realpath(dest).startswith(os.path.realpath(root) + os.sep) and dest != root:
                errors.append(f"{where}: points outside the repository")
    return errors


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1
                           else os.path.join(os.path.dirname(__file__), ".."))
    errors, files = [], 0
    for path in readmes(root):
        files += 1
        errors += check(path, root)
    for e in errors:
        print(f"error: {e}")
    print(f"check_doc_links: {files} README.md file(s), {len(errors)} broken link(s)")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
