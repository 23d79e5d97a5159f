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

for b in bad:
    print("docs:", b, file=sys.stderr)
sys.exit(1 if bad else 0)
PY
