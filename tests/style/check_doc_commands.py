#!/usr/bin/env python3
"""Every sluicectl command and Sluice server flag the docs name exists.

Usage: check_doc_commands.py REPO_ROOT BIN_DIR

In every tracked *.md file, code (``` blocks and `spans`) that runs
`sluicectl`, `sluice-coordinator` or `sluice-dataserver` is checked against
the binaries in BIN_DIR: sluicectl's command word must be one `sluicectl
--help` lists, and every --flag after the binary's name must be one of its
flags (`--helpfull`; `--noX` for a boolean X). Prints each unknown name as
FILE:LINE: ... and exits 1 if there is one.
"""
import os
import re
import subprocess
import sys

BINARIES = ("sluicectl", "sluice-coordinator", "sluice-dataserver")
FENCE = re.compile(r"^\s*(```|~~~)")
SPAN = re.compile(r"`([^`]+)`")


def flags_of(binary):
    out = subprocess.run([binary, "--helpfull"], capture_output=True, text=True)
    text = out.stdout + out.stderr
    builtin = {"help", "helpfull", "helpshort", "helppackage", "version"}
    return builtin | set(re.findall(r"^\s+--([A-Za-z0-9_]+) \(", text, re.M))


def commands_of(binary):
    out = subprocess.run([binary, "--help"], capture_output=True, text=True)
    text = out.stdout + out.stderr
    section = text.split("Commands:", 1)[1] if "Commands:" in text else ""
    return set(re.findall(r"^  ([a-z][a-z-]*)", section, re.M))


def code_of(path):
    """(line number, code) for every code block line and inline span."""
    in_fence = False
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if FENCE.match(line):
                in_fence = not in_fence
                continue
            if in_fence:
                yield number, line
            else:
                for m in SPAN.finditer(line):
                    yield number, m.group(1)


def main():
    root, bin_dir = sys.argv[1], sys.argv[2]
    known = {b: flags_of(os.path.join(bin_dir, b)) for b in BINARIES}
    commands = commands_of(os.path.join(bin_dir, "sluicectl"))
    files = subprocess.run(["git", "-C", root, "ls-files", "*.md"], check=True,
                           capture_output=True, text=True).stdout.split()
    problems, checked = [], 0
    for rel in files:
        for number, code in code_of(os.path.join(root, rel)):
            for binary in BINARIES:
                for m in re.finditer(r"(?:^|[\s/])" + re.escape(binary) + r"(?=\s|$)", code):
                    rest = code[m.end():]
                    # Up to the end of the command (a pipe, ;, && or a comment).
                    rest = re.split(r"\s(?:\||;|&&|#)\s|\s\\$", rest)[0]
                    words = rest.split()
                    checked += 1
                    if binary == "sluicectl":
                        first = next((w for w in words if not w.startswith("-")), None)
                        if first and re.fullmatch(r"[a-z][a-z-]*", first) and \
                                first not in commands:
                            problems.append(f"{rel}:{number}: sluicectl has no command "
                                            f"'{first}'")
                    for w in words:
                        fm = re.match(r"^--(?:\[no\])?([A-Za-z0-9_]+)", w)
                        if not fm:
                            continue
                        name = fm.group(1)
                        if name in known[binary] or (name.startswith("no") and
                                                     name[2:] in known[binary]):
                            continue
                        problems.append(f"{rel}:{number}: {binary} has no flag --{name}")
    for p in problems:
        print(p)
    if problems:
        print(f"{len(problems)} unknown command(s) or flag(s)")
        return 1
    print(f"{checked} command lines in {len(files)} Markdown files name only real "
          "commands and flags")
    return 0


if __name__ == "__main__":
    sys.exit(main())
