#!/usr/bin/env python3
"""Lays out the runtime stage of deploy/Containerfile as a directory, without
a container engine, for scripts/checks/image.sh.

    image_rootfs.py CONTAINERFILE REPO TARGET_DIR ROOTFS

What it reads from the Containerfile (so the check follows the file, not a
copy of it): the last stage's base image, every COPY (from the build context,
or --from the build stage, with --chown and --chmod), ENV, USER, VOLUME,
HEALTHCHECK, ENTRYPOINT and CMD. What it stands in for:

- the base image: only gcr.io/distroless/cc-debian12 is understood. It is
  replaced by what that image provides to this binary: /etc/passwd and
  /etc/group with root, nobody and nonroot (65532), /tmp, /home/nonroot, and
  the shared libraries `ldd` names, copied from this machine (Debian 12, the
  same glibc and libgcc as distroless's Debian 12). A library outside glibc
  and libgcc fails: distroless/cc would not have it.
- the build stage: `/src/...` (its WORKDIR, the repository) is this
  repository, `target/` the target directory given (package.sh's, where the
  production binary is built here); a directory a RUN makes with `install -d -m MODE DIR` is made empty
  with that mode.

Prints shell assignments (eval them): RUN_UID, RUN_GID, ENV_ARGS (NAME=VALUE
words for env -i), ENTRYPOINT, CMD, HEALTHCHECK (the exec form's words),
VOLUMES.
"""

import json
import os
import re
import shlex
import shutil
import subprocess
import sys

DISTROLESS = "gcr.io/distroless/cc-debian12"
# The shared objects distroless/cc-debian12 has, by file name.
DISTROLESS_LIBS = {
    "libc.so.6",
    "libm.so.6",
    "libgcc_s.so.1",
    "libpthread.so.0",
    "libdl.so.2",
    "librt.so.1",
    "ld-linux-x86-64.so.2",
    "ld-linux-aarch64.so.1",
}
PASSWD = """root:x:0:0:root:/root:/sbin/nologin
nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin
nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin
"""
GROUP = """root:x:0:
tty:x:5:
staff:x:50:
nobody:x:65534:
nonroot:x:65532:
"""


def fail(msg):
    sys.exit(f"image_rootfs.py: {msg}")


def instructions(path):
    """(KEYWORD, rest) per instruction: comments dropped, continuations joined."""
    out, buf = [], ""
    with open(path) as f:
        for raw in f:
            line = raw.rstrip("\n")
            if not buf and (not line.strip() or line.lstrip().startswith("#")):
                continue
            if line.endswith("\\"):
                buf += line[:-1] + " "
                continue
            buf += line
            word, _, rest = buf.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
            buf = ""
    return out


def flags_and_args(rest):
    """`--a=b --c=d x y` -> ({'a': 'b', 'c': 'd'}, ['x', 'y'])."""
    words = shlex.split(rest)
    flags = {}
    while words and words[0].startswith("--"):
        k, _, v = words.pop(0)[2:].partition("=")
        flags[k] = v
    return flags, words


def exec_form(rest, what):
    try:
        words = json.loads(rest)
    except json.JSONDecodeError:
        fail(f"{what} must be in exec form (a JSON array): {rest}")
    if not (isinstance(words, list) and all(isinstance(w, str) for w in words)):
        fail(f"{what} must be a JSON array of strings: {rest}")
    return words


def stages(instrs):
    """[(name, base, [instructions])] in order."""
    out = []
    for word, rest in instrs:
        if word == "FROM":
            parts = rest.split()
            name = parts[2] if len(parts) >= 3 and parts[1].upper() == "AS" else None
            out.append((name, parts[0], []))
        elif out:
            out[-1][2].append((word, rest))
    return out


def ids(rootfs, spec):
    """`user:group` (names or numbers) -> (uid, gid) per the rootfs's files."""
    def lookup(file, name):
        if name.isdigit():
            return int(name)
        with open(os.path.join(rootfs, "etc", file)) as f:
            for line in f:
                fields = line.split(":")
                if fields[0] == name:
                    return int(fields[2])
        fail(f"{name}: not in the image's /etc/{file}")
    user, _, group = spec.partition(":")
    uid = lookup("passwd", user)
    if group:
        return uid, lookup("group", group)
    with open(os.path.join(rootfs, "etc", "passwd")) as f:
        for line in f:
            fields = line.split(":")
            if int(fields[2]) == uid:
                return uid, int(fields[3])
    return uid, uid


def base_image(rootfs, binary):
    for d in ("etc", "tmp", "home/nonroot"):
        os.makedirs(os.path.join(rootfs, d), exist_ok=True)
    os.chmod(os.path.join(rootfs, "tmp"), 0o1777)
    os.chown(os.path.join(rootfs, "home/nonroot"), 65532, 65532)
    with open(os.path.join(rootfs, "etc/passwd"), "w") as f:
        f.write(PASSWD)
    with open(os.path.join(rootfs, "etc/group"), "w") as f:
        f.write(GROUP)
    ldd = subprocess.run(["ldd", binary], capture_output=True, text=True, check=True).stdout
    for line in ldd.splitlines():
        m = re.search(r"(/\S+)", line.split("=>")[-1])
        if not m:
            continue  # linux-vdso: the kernel's
        lib = m.group(1)
        if os.path.basename(lib) not in DISTROLESS_LIBS:
            fail(f"{binary} needs {lib}, which {DISTROLESS} does not ship")
        dest = os.path.join(rootfs, lib.lstrip("/"))
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        shutil.copy2(os.path.realpath(lib), dest)


def main():
    containerfile, repo, target, rootfs = sys.argv[1:5]
    all_stages = stages(instructions(containerfile))
    if len(all_stages) < 2:
        fail("expected a build stage and a runtime stage")
    build = {name: (base, body) for name, base, body in all_stages[:-1]}
    _, runtime_base, runtime = all_stages[-1]
    if not runtime_base.startswith(DISTROLESS + ":"):
        fail(f"runtime base {runtime_base}: this check stands in for {DISTROLESS} only")

    copies = [flags_and_args(rest) for word, rest in runtime if word == "COPY"]
    binary = None
    for flags, args in copies:
        if flags.get("from") and args[0].endswith("/target/production/isoswitch"):
            binary = os.path.join(target, "production", "isoswitch")
    if not binary:
        fail("no COPY --from the build stage of target/production/isoswitch")
    base_image(rootfs, binary)

    env, user, volumes, health, entrypoint, cmd = {}, "root", [], None, [], []
    for word, rest in runtime:
        if word == "COPY":
            flags, args = flags_and_args(rest)
            src, dest = args[0], args[1]
            if flags.get("from"):
                if flags["from"] not in build:
                    fail(f"COPY --from={flags['from']}: no such stage")
                made = made_dirs(build[flags["from"]][1])
                workdir = build_workdir(build[flags["from"]][1])
                if src in made:
                    local = None
                elif src.startswith(workdir + "/target/"):
                    local = os.path.join(target, src[len(workdir) + len("/target/"):])
                elif src.startswith(workdir + "/"):
                    local = os.path.join(repo, src[len(workdir) + 1:])
                else:
                    fail(f"COPY --from={flags['from']} {src}: not made by that stage")
            else:
                local = os.path.join(repo, src)
            out = os.path.join(rootfs, dest.lstrip("/"))
            os.makedirs(os.path.dirname(out), exist_ok=True)
            if local is None:
                os.makedirs(out, exist_ok=True)
                os.chmod(out, made[src])
            else:
                shutil.copy2(local, out)
                os.chmod(out, 0o755 if os.access(local, os.X_OK) else 0o644)
            if "chmod" in flags:
                os.chmod(out, int(flags["chmod"], 8))
            if "chown" in flags:
                os.chown(out, *ids(rootfs, flags["chown"]))
        elif word == "ENV":
            for pair in shlex.split(rest):
                k, _, v = pair.partition("=")
                env[k] = v
        elif word == "USER":
            user = rest
        elif word == "VOLUME":
            volumes += exec_form(rest, "VOLUME")
        elif word == "HEALTHCHECK":
            _, _, tail = rest.partition("CMD ")
            health = exec_form(tail.strip(), "HEALTHCHECK CMD")
        elif word == "ENTRYPOINT":
            entrypoint = exec_form(rest, "ENTRYPOINT")
        elif word == "CMD":
            cmd = exec_form(rest, "CMD")
    for v in volumes:
        os.makedirs(os.path.join(rootfs, v.lstrip("/")), exist_ok=True)
    if health is None:
        fail("no HEALTHCHECK CMD in the runtime stage")
    uid, gid = ids(rootfs, user)
    q = shlex.quote
    print(f"RUN_UID={uid}")
    print(f"RUN_GID={gid}")
    print("ENV_ARGS=(" + " ".join(q(f"{k}={v}") for k, v in env.items()) + ")")
    print("ENTRYPOINT=(" + " ".join(map(q, entrypoint)) + ")")
    print("CMD=(" + " ".join(map(q, cmd)) + ")")
    print("HEALTHCHECK=(" + " ".join(map(q, health)) + ")")
    print("VOLUMES=(" + " ".join(map(q, volumes)) + ")")


def build_workdir(body):
    workdir = "/"
    for word, rest in body:
        if word == "WORKDIR":
            workdir = rest.rstrip("/")
    return workdir


def made_dirs(body):
    """Directories a RUN makes with `install -d -m MODE DIR...`: {dir: mode}."""
    made = {}
    for word, rest in body:
        if word != "RUN":
            continue
        for m in re.finditer(r"install -d -m (\d+) ((?:/\S+ ?)+)", rest):
            for d in m.group(2).split():
                made[d] = int(m.group(1), 8)
    return made


if __name__ == "__main__":
    main()
