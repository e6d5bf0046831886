#!/usr/bin/python3
"""The container image's runtime stage installs what the binaries link.

usage: image_libs_test.py DOCKERFILE BIN_DIR

Every shared library `ldd` resolves for sluice-coordinator, sluice-dataserver
and sluicectl must come from a Debian package the runtime stage of
k8s/image/Dockerfile installs, or one those packages depend on (the closure is
taken from this machine's dpkg database, i.e. the same bookworm packages).
Also checks the check itself fails when a needed package is left out.
"""
import os
import re
import subprocess
import sys

BINARIES = ["sluice-coordinator", "sluice-dataserver", "sluicectl"]


def runtime_packages(dockerfile):
    text = open(dockerfile).read()
    stage = re.split(r"^FROM .* AS runtime\s*$", text, flags=re.M)
    if len(stage) != 2:
        sys.exit(f"{dockerfile}: no 'FROM ... AS runtime' stage")
    runtime = stage[1].replace("\\\n", " ")
    packages = set()
    for m in re.finditer(r"apt-get install ([^&\n]*)", runtime):
        packages |= {t for t in m.group(1).split() if not t.startswith("-")}
    for b in BINARIES:
        if b not in runtime:
            sys.exit(f"{dockerfile}: the runtime stage does not copy {b}")
    if "USER " not in runtime or re.search(r"^USER (0|root)\b", runtime, re.M):
        sys.exit(f"{dockerfile}: the runtime stage must run as a non-root USER")
    return packages


_DEPENDS = None


def depends(package):
    """Dependency clauses of an installed package (None if not installed)."""
    global _DEPENDS
    if _DEPENDS is None:
        out = subprocess.run(
            ["dpkg-query", "-W", "-f=${Package}\t${db:Status-Abbrev}\t${Depends}, ${Pre-Depends}\n"],
            capture_output=True, text=True, check=True).stdout
        _DEPENDS = {}
        for line in out.splitlines():
            name, status, deps = line.split("\t")
            if not status.startswith("ii"):
                continue
            clauses = []
            for clause in deps.split(","):
                alternatives = [re.sub(r"\(.*?\)|:any", "", a).strip() for a in clause.split("|")]
                alternatives = [a for a in alternatives if a]
                if alternatives:
                    clauses.append(alternatives)
            _DEPENDS[name] = clauses
    return _DEPENDS.get(package)


def closure(packages):
    seen, todo = set(), list(packages)
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        for alternatives in depends(p) or []:
            installed = [a for a in alternatives if depends(a) is not None]
            todo.extend(installed[:1] or alternatives[:1])
    return seen


_OWNERS = None


def package_of(path):
    """The installed package owning `path` (dpkg's file lists, read once)."""
    global _OWNERS
    if _OWNERS is None:
        _OWNERS = {}
        info = "/var/lib/dpkg/info"
        for name in os.listdir(info):
            if name.endswith(".list"):
                package = name[:-len(".list")].split(":")[0]
                with open(os.path.join(info, name)) as f:
                    for line in f:
                        _OWNERS[line.rstrip("\n")] = package
    real = os.path.realpath(path)
    for candidate in (path, real, "/usr" + path, "/usr" + real, path.replace("/usr/", "/", 1),
                      real.replace("/usr/", "/", 1)):
        if candidate in _OWNERS:
            return _OWNERS[candidate]
    return None


def linked_packages(bin_dir):
    needed = {}
    for b in BINARIES:
        out = subprocess.run(["ldd", os.path.join(bin_dir, b)], capture_output=True, text=True,
                             check=True).stdout
        if "not found" in out:
            sys.exit(f"{b}: unresolved libraries:\n{out}")
        for lib in re.findall(r"=> (/\S+)", out):
            pkg = package_of(lib)
            if pkg is None:
                sys.exit(f"{b}: {lib} belongs to no Debian package")
            needed.setdefault(pkg, set()).add(os.path.basename(lib))
    return needed


def missing(installed, needed):
    have = closure(installed)
    return {p: libs for p, libs in needed.items() if p not in have}


def main():
    dockerfile, bin_dir = sys.argv[1], sys.argv[2]
    installed = runtime_packages(dockerfile)
    needed = linked_packages(bin_dir)
    gaps = missing(installed, needed)
    if gaps:
        for p, libs in sorted(gaps.items()):
            print(f"runtime stage lacks {p} (for {', '.join(sorted(libs))})")
        sys.exit(1)
    # The check can fail: without libarchive13 its library is reported.
    if "libarchive13" not in missing(installed - {"libarchive13"}, needed):
        sys.exit("the check did not notice libarchive13 left out")
    print(f"image: {len(needed)} library packages, all installed by the runtime stage "
          f"({len(installed)} listed)")


if __name__ == "__main__":
    main()
