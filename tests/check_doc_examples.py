#!/usr/bin/env python3
"""Checks that the READMEs' marked code examples are code that is compiled and tested.

A fenced ```cpp block in a README.md that follows the HTML comment

    <!-- compiled: PATH -->

(PATH relative to the repository root, the comment on the line just above the fence, blank lines
allowed between) must appear verbatim in the file PATH, after stripping the block's leading and
trailing blank lines. So an example cannot drift from the test that compiles it.

    python3 tests/check_doc_examples.py [REPO_ROOT]     (default: the folder above tests/)

Prints each mismatch and exits 1 if there is one (or a marker with no block, or a missing PATH).
"""
import os
import re
import sys

MARKER = re.compile(r"^\s*<!--\s*compiled:\s*(\S+)\s*-->\s*$")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from doc_files import readmes  # noqa: E402


def strip_blank_lines(lines):
    while lines and not lines[0].strip():
        lines = lines[1:]
    while lines and not lines[-1].strip():
        lines = lines[:-1]
    return lines


def check(path, root):
    """Returns (number of marked blocks, list of error strings) for one README."""
    lines = open(path, encoding="utf-8").read().split("\n")
    rel = os.path.relpath(path, root)
    errors, count, i = [], 0, 0
    while i < len(lines):
        m = MARKER.match(lines[i])
        if not m:
            i += 1
            continue
        target, where = m.group(1), f"{rel}:{i + 1}"
        j = i + 1
        while j < len(lines) and not lines[j].strip():
            j += 1
        if j >= len(lines) or lines[j].strip() != "```cpp":
            errors.append(f"{where}: the marker is not followed by a ```cpp block")
            i = j
            continue
        k = j + 1
        while k < len(lines) and lines[k].strip() != "```":
            k += 1
        if k >= len(lines):
            errors.append(f"{where}: the ```cpp block is not closed")
            break
        block = "\n".join(strip_blank_lines(lines[j + 1:k]))
        count += 1
        source = os.path.join(root, target)
        if not os.path.isfile(source):
            errors.append(f"{where}: {target} does not exist")
        elif block not in open(source, encoding="utf-8").read():
            errors.append(f"{where}: the block (lines {j + 2}-{k}) is not verbatim in {target}")
        i = k + 1
    return count, errors


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1
                           else os.path.join(os.path.dirname(__file__), ".."))
    total, errors = 0, []
    for path in readmes(root):
        n, e = check(path, root)
        total += n
        errors += e
    for e in errors:
        print(f"error: {e}")
    print(f"check_doc_examples: {total} marked block(s), {len(errors)} error(s)")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
