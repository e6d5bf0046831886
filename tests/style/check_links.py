#!/usr/bin/env python3
"""Every relative link in the repository's Markdown resolves inside it.

Usage: check_links.py REPO_ROOT

Checks [text](target) and [text]: target links in every tracked *.md file
(git ls-files, so build trees are skipped): a target without a scheme must
name an existing file or directory inside the repository, and a #anchor on
a Markdown target must match one of its headings. Prints each broken link
as FILE:LINE: target (reason) and exits 1 if there is one.
"""
import os
import re
import subprocess
import sys

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)|^\s*\[[^\]]+\]:\s*(\S+)")
FENCE = re.compile(r"^\s*(```|~~~)")


def anchors(path):
    """GitHub-style anchors of a Markdown file's headings."""
    out = set()
    in_fence = False
    with open(path, encoding="utf-8") as f:
        for line in f:
            if FENCE.match(line):
                in_fence = not in_fence
            if in_fence or not line.startswith("#"):
                continue
            title = line.lstrip("#").strip().lower()
            title = re.sub(r"[^\w\- ]", "", title)
            out.add(title.replace(" ", "-"))
    return out


def main():
    root = os.path.realpath(sys.argv[1] if len(sys.argv) > 1 else ".")
    files = subprocess.run(["git", "-C", root, "ls-files", "*.md"], check=True,
                           capture_output=True, text=True).stdout.split()
    broken = []
    for rel in files:
        path = os.path.join(root, rel)
        in_fence = False
        with open(path, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                if FENCE.match(line):
                    in_fence = not in_fence
                if in_fence:
                    continue
                for m in LINK.finditer(line):
                    target = m.group(1) or m.group(2)
                    if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#") and \
                            not target[1:]:
                        continue  # http:, mailto:, ...
                    file_part, _, anchor = target.partition("#")
                    dest = os.path.realpath(os.path.join(os.path.dirname(path), file_part)) \
                        if file_part else path
                    if not (dest == root or dest.startswith(root + os.sep)):
                        broken.append(f"{rel}:{number}: {target} (outside the repository)")
                    elif not os.path.exists(dest):
                        broken.append(f"{rel}:{number}: {target} (no such file)")
                    elif anchor and dest.endswith(".md") and anchor not in anchors(dest):
                        broken.append(f"{rel}:{number}: {target} (no heading #{anchor})")
    for b in broken:
        print(b)
    if broken:
        print(f"{len(broken)} broken link(s)")
        return 1
    print(f"{len(files)} Markdown files, every relative link resolves")
    return 0


if __name__ == "__main__":
    sys.exit(main())
