#!/usr/bin/python3
"""The container image's runtime stages install what the binaries link.

usage: image_libs_test.py DOCKERFILE BIN_DIR

Every shared library `ldd` resolves for sluice-coordinator, sluice-dataserver
and sluicectl must come from a Debian package the runtime-base stage of
k8s/image/Dockerfile installs (under both images: runtime and prebuilt), or one those packages depend on (the closure is
taken from this machine's dpkg database, i.e. the same bookworm packages).
Also checks the check itself fails when a needed package is left out.

And the build stage installs every development package and build tool of
the Makefile's BUILD_PACKAGES (what `make run` compiles with): CI builds the
image from the host's binaries (make test-image), so this is what keeps
the in-image build of `docker build` in step with the host's.
"""
import os
import re
import subprocess
import sys

BINARIES = ["sluice-coordinator", "sluice-dataserver", "sluicectl"]


BUILD_TOOLS = {"build-essential", "cmake", "ninja-build", "pkg-config", "protobuf-compiler",
               "protobuf-compiler-grpc", "grpc-proto"}


def stages(dockerfile):
    """{stage name: (the image it is FROM, its text)}, continuation lines
    joined."""
    text = open(dockerfile).read().replace("\\\n", " ")
    parts = re.split(r"^FROM (\S+) AS (\S+)\s*$", text, flags=re.M)
    return {name: (base, body) for base, name, body in zip(parts[1::3], parts[2::3], parts[3::3])}


def installed_by(stage):
    packages = set()
    for m in re.finditer(r"apt-get install ([^&\n]*)", stage):
        packages |= {t for t in m.group(1).split() if not t.startswith("-")}
    return packages


def build_stage_packages(dockerfile):
    stage = stages(dockerfile).get("build")
    if stage is None:
        sys.exit(f"{dockerfile}: no 'FROM ... AS build' stage")
    return installed_by(stage[1])


def makefile_build_packages(makefile):
    text = open(makefile).read().replace("\\\n", " ")
    m = re.search(r"^BUILD_PACKAGES := (.*)$", text, flags=re.M)
    if m is None:
        sys.exit(f"{makefile}: no BUILD_PACKAGES")
    return {p for p in m.group(1).split() if p.endswith("-dev") or p in BUILD_TOOLS}


def runtime_packages(dockerfile):
    """What runtime-base installs; both images on it (runtime, built in the
    image, and prebuilt, from the host's build) copy the three binaries."""
    found = stages(dockerfile)
    for name in ("runtime-base", "runtime", "prebuilt"):
        if name not in found:
            sys.exit(f"{dockerfile}: no 'FROM ... AS {name}' stage")
    base = found["runtime-base"][1]
    for name in ("runtime", "prebuilt"):
        if found[name][0] != "runtime-base":
            sys.exit(f"{dockerfile}: the {name} stage is not FROM runtime-base")
        for b in BINARIES:
            if b not in found[name][1]:
                sys.exit(f"{dockerfile}: the {name} stage does not copy {b}")
    if "USER " not in base or re.search(r"^USER (0|root)\b", base, re.M):
        sys.exit(f"{dockerfile}: runtime-base must run as a non-root USER")
    return installed_by(base)


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
    makefile = os.path.join(os.path.dirname(dockerfile), "..", "..", "Makefile")
    wanted = makefile_build_packages(makefile)
    lacking = wanted - build_stage_packages(dockerfile)
    if lacking:
        sys.exit(f"the build stage lacks {', '.join(sorted(lacking))} (in the Makefile's "
                 f"BUILD_PACKAGES)")
    print(f"image: {len(needed)} library packages, all installed by the runtime stage "
          f"({len(installed)} listed); the build stage has the Makefile's {len(wanted)} "
          f"build packages")


if __name__ == "__main__":
    main()
