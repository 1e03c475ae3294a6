#!/usr/bin/env python3
"""container_lint.py CONTAINERFILE BINARY...: the Containerfile's structure (dockerfile-parse) and
its runtime stage's packages against the libraries the binaries load (ldd, dpkg -S).

Checks: a build stage FROM debian:12 that runs deploy/install-deps.sh, the CMake build and
`cmake --install ... --component programs`; a runtime stage FROM debian:12-slim that copies the
programs from the build stage, runs as a non-root USER, has an exec-form ENTRYPOINT; and every
shared library of every binary (ldd) comes from a Debian package that the runtime stage's
apt-get install list names, or that those packages depend on (installed Depends, transitively),
or that Debian's slim image has (Essential / Priority required)."""
import json
import os
import re
import subprocess
import sys

from dockerfile_parse import DockerfileParser


def sh(*a):
    return subprocess.run(a, capture_output=True, text=True).stdout


def main():
    path, bins = sys.argv[1], sys.argv[2:]
    df = DockerfileParser(fileobj=open(path, "rb"))
    st = df.structure
    bad = []
    stages, cur = [], None
    for ins in st:
        if ins["instruction"] == "FROM":
            cur = {"from": ins["value"], "ins": []}
            stages.append(cur)
        elif cur is not None:
            cur["ins"].append(ins)
    if len(stages) < 2:
        bad.append(f"{len(stages)} stage(s): want a build and a runtime stage")
        return report(bad)
    build, run = stages[0], stages[-1]
    if not re.match(r"(docker\.io/library/)?debian:12\b.* AS build", build["from"], re.I):
        bad.append(f"build stage is FROM {build['from']}, not debian:12 AS build")
    if not re.match(r"(docker\.io/library/)?debian:12-slim\b", run["from"]):
        bad.append(f"runtime stage is FROM {run['from']}, not debian:12-slim")
    bruns = " ".join(i["value"] for i in build["ins"] if i["instruction"] == "RUN")
    for want in ("deploy/install-deps.sh", "cmake --build", "--component programs"):
        if want not in bruns:
            bad.append(f"the build stage does not run {want}")
    rins = run["ins"]
    if not any(i["instruction"] == "COPY" and "--from=build" in i["value"] for i in rins):
        bad.append("the runtime stage copies nothing from the build stage")
    users = [i["value"].split(":")[0] for i in rins if i["instruction"] == "USER"]
    if not users or users[-1] in ("root", "0"):
        bad.append("the runtime stage does not end as a non-root USER")
    ep = [i["value"] for i in rins if i["instruction"] == "ENTRYPOINT"]
    if not ep or not ep[-1].strip().startswith("["):
        bad.append("the runtime stage has no exec-form ENTRYPOINT")
    # The runtime stage's packages: the words after `apt-get install` flags, up to &&.
    pkgs = set()
    for i in rins:
        if i["instruction"] != "RUN":
            continue
        for m in re.finditer(r"apt-get install((?:\s+[^&|;]+)+)", i["value"]):
            pkgs |= {w for w in m.group(1).split() if not w.startswith("-") and w != "\\"}
    if not pkgs:
        bad.append("the runtime stage installs no packages")
    # Everything they pull in, from the installed packages' Depends (this machine has them).
    closure, todo = set(), list(pkgs)
    while todo:
        p = todo.pop()
        if p in closure:
            continue
        closure.add(p)
        deps = sh("dpkg-query", "-W", "-f=${Depends},${Pre-Depends}", p)
        for alt in deps.split(","):
            name = alt.strip().split("|")[0].strip().split(" ")[0].split(":")[0]
            if name:
                todo.append(name)
    base = set()
    for line in sh("dpkg-query", "-W", "-f=${Package} ${Essential} ${Priority}\n").splitlines():
        f = line.split()
        if len(f) == 3 and (f[1] == "yes" or f[2] == "required"):
            base.add(f[0])
    libs = {}
    for b in bins:
        for line in sh("ldd", b).splitlines():
            m = re.match(r"\s*(\S+) => (/\S+)", line)
            if m:
                libs.setdefault(m.group(2), set()).add(os.path.basename(b))
    for lib, users_ in sorted(libs.items()):
        real = os.path.realpath(lib)
        owner = ""
        for cand in (real, lib, "/usr" + real if not real.startswith("/usr") else real[4:]):
            out = sh("dpkg", "-S", cand)
            if out:
                owner = out.split(":")[0]
                break
        if not owner:
            bad.append(f"{lib} ({', '.join(sorted(users_))}) belongs to no Debian package")
        elif owner not in closure and owner not in base:
            bad.append(f"{lib} ({', '.join(sorted(users_))}) is in {owner}, which the runtime "
                       f"stage does not install (nor depend on)")
    print(f"runtime stage: {len(pkgs)} packages ({' '.join(sorted(pkgs))}); "
          f"{len(libs)} libraries of {len(bins)} binaries checked")
    return report(bad)


def report(bad):
    for b in bad:
        print("container_lint:", b)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
