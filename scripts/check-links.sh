#!/usr/bin/env bash
# Checks every relative link in the repository's markdown files: the file it
# names exists, and a #fragment names a heading of that file (GitHub's
# anchors: lower case, punctuation dropped, spaces to hyphens). Links to
# other sites are not fetched. Prints each broken link and exits 1 if any.
#
# Usage: scripts/check-links.sh
set -euo pipefail
cd "$(dirname "$0")/.."
git ls-files -z --cached --others --exclude-standard '*.md' | python3 -c '
import os, re, sys

files = [f for f in sys.stdin.read().split("\0") if f]
link = re.compile(r"\[(?:[^\]]|\][^(])*?\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")

def lines_outside_fences(path):
    fenced = False
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if line.lstrip().startswith(("```", "~~~")):
                fenced = not fenced
                continue
            if not fenced:
                yield number, line

def slug(heading):
    text = re.sub(r"`|\*\*|\*|_(?=\W)|(?<=\W)_", "", heading.strip().lower())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")

anchors = {}
def anchors_of(path):
    if path not in anchors:
        seen, found = {}, set()
        for _, line in lines_outside_fences(path):
            m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
            if m:
                base = slug(m.group(1))
                n = seen.get(base, 0)
                seen[base] = n + 1
                found.add(base if n == 0 else f"{base}-{n}")
        anchors[path] = found
    return anchors[path]

def links_of(path):
    # Link text may wrap onto the next line, so search the text outside
    # fences as a whole, fenced lines blanked to keep the line numbers.
    kept = dict(lines_outside_fences(path))
    with open(path, encoding="utf-8") as f:
        count = sum(1 for _ in f)
    text = "".join(kept.get(n, "\n") for n in range(1, count + 1))
    for m in link.finditer(text):
        yield text.count("\n", 0, m.start(1)) + 1, m.group(1)

broken = 0
for source in files:
    for number, target in links_of(source):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):
            continue
        path, _, fragment = target.partition("#")
        resolved = os.path.normpath(os.path.join(os.path.dirname(source), path)) if path else source
        problem = None
        if not os.path.exists(resolved):
            problem = "no such file"
        elif fragment and resolved.endswith(".md") and fragment not in anchors_of(resolved):
            problem = "no such heading"
        if problem:
            broken += 1
            print(f"{source}:{number}: {target}: {problem}")
checked = len(files)
print(f"{checked} markdown files checked, {broken} broken links", file=sys.stderr)
sys.exit(1 if broken else 0)
'
