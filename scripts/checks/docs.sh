#!/usr/bin/env bash
# The docs hold together: every relative link in a Markdown file names a file
# that exists (and, with a #anchor into a Markdown file, a heading there), and
# no file names the design notes that are not in the repository (the names
# are built below so that this script does not match itself).
set -euo pipefail
cd "$(dirname "$0")/../.."
if ! command -v python3 >/dev/null; then
    echo "docs: python3 is missing" >&2
    exit 1
fi
python3 - <<'PY'
import os, re, subprocess, sys

files = subprocess.run(["git", "ls-files"], capture_output=True, text=True, check=True).stdout.split()
bad = []

# 1. Names of notes that live outside the repository.
gone = ["DESIGN" + ".md", "WIRE" + ".md", "../" + "shared"]
for f in files:
    try:
        text = open(f, encoding="utf-8").read()
    except (UnicodeDecodeError, IsADirectoryError, FileNotFoundError):
        continue
    for n, line in enumerate(text.splitlines(), 1):
        for g in gone:
            if g in line:
                bad.append(f"{f}:{n}: names {g}, which is not in the repository")

# 2. Relative links in Markdown files.
def anchors(path):
    out = set()
    for line in open(path, encoding="utf-8"):
        m = re.match(r"^#+\s+(.*)", line)
        if m:
            a = m.group(1).strip().lower()
            a = re.sub(r"[^\w\- ]", "", a).replace(" ", "-")
            out.add(a)
    return out

link = re.compile(r"\]\(([^)\s]+)\)")
for f in files:
    if not f.endswith(".md"):
        continue
    in_code = False
    for n, line in enumerate(open(f, encoding="utf-8"), 1):
        if line.lstrip().startswith("```"):
            in_code = not in_code
        if in_code:
            continue
        for target in link.findall(line):
            if re.match(r"^[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            dest = os.path.normpath(os.path.join(os.path.dirname(f), path)) if path else f
            if not os.path.exists(dest):
                bad.append(f"{f}:{n}: link to {target}: no such file")
            elif anchor and dest.endswith(".md") and anchor not in anchors(dest):
                bad.append(f"{f}:{n}: link to {target}: no such heading")

# 3. Paths the architecture names in backticks exist (`src/link/back/pool.rs`,
#    or relative to a crate's `src/` as the prose often says them:
#    `link/io/writer.rs`), and a `path::function` names a function that is
#    there. The map of the code must not point at rooms that moved.
named = re.compile(r"`((?:[\w.-]+/)+[\w.-]*|[\w-]+\.(?:rs|sh|toml|md|py))(?:::(\w+))?`")
roots = ["", "src/", "crates/", "crates/route/src/", "crates/iso8583/src/", "crates/wire/src/",
         "crates/util/src/", "tests/", "scripts/"]
for f in ["docs/architecture.md", "CONTRIBUTING.md"]:
    if not os.path.exists(f):
        continue
    in_code = False
    for n, line in enumerate(open(f, encoding="utf-8"), 1):
        if line.lstrip().startswith("```"):
            in_code = not in_code
        if in_code:
            continue
        for path, func in named.findall(line):
            # Placeholders (`SERVICE/node/I`) and globs name no one file.
            if "*" in path or path.startswith(("http", "/")) or any(
                re.fullmatch(r"[A-Z_]+", part) for part in path.split("/")
            ):
                continue
            if "/" not in path:
                found = [t for t in files if os.path.basename(t) == path]
            else:
                found = [r + path for r in roots if os.path.exists(r + path.rstrip("/"))]
            if not found:
                bad.append(f"{f}:{n}: names `{path}`, which does not exist")
            elif func and not any(
                os.path.isfile(p) and re.search(r"\bfn " + func + r"\b", open(p, encoding="utf-8").read())
                for p in found
            ):
                bad.append(f"{f}:{n}: names `{path}::{func}`, which has no fn {func}")

# 4. The layer diagram has every room: each directory module of src/.
arch = open("docs/architecture.md", encoding="utf-8").read()
diagram = arch.split("## The layers", 1)[-1].split("```", 2)[1]
for room in sorted({t.split("/")[1] for t in files if t.startswith("src/") and t.count("/") >= 2}):
    if not re.search(r"^\s*" + re.escape(room) + "/", diagram, re.M):
        bad.append(f"docs/architecture.md: the layer diagram leaves out src/{room}/")

for b in bad:
    print("docs:", b, file=sys.stderr)
sys.exit(1 if bad else 0)
PY
