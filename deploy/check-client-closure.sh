#!/usr/bin/env bash
# Fails when ILSClient (the library an iPad, Mac or Vision Pro app links) could no longer build for Apple platforms:
#   (a) a system-library target (CSodium, CMalloc, CSQLite, CQREncode: pkg-config, Linux packages) is in its dependency closure;
#   (b) a Swift source of a local target in the closure imports Glibc, CSodium, CMalloc, CSQLite or CQREncode outside an
#       `#if canImport(<that module>)` block (any access level or attribute: `internal import`, `@preconcurrency`).
# Each finding is printed as PATH:LINE (or the chain of targets that pulls a system library in); exit status 1.
#
# The closure comes from `swift package describe --type json`: local target dependencies, and the targets of this
# package's own products when a target depends on one. Other packages' targets are not followed (they are not
# resolved here); what reaches them is listed with --list.
#
# Usage: deploy/check-client-closure.sh [--package DIR] [--target NAME] [--list]
#   --package DIR  the package to check (default: this repository)
#   --target NAME  the target whose closure is checked (default: ILSClient)
#   --list         print the closure (local targets, then other packages' products) instead of checking it
set -euo pipefail

package="$(cd "$(dirname "$0")/.." && pwd)"
target=ILSClient
list=0
while [[ $# -gt 0 ]]; do
    case "$1" in
        --package) package="$(cd "$2" && pwd)"; shift 2 ;;
        --target) target="$2"; shift 2 ;;
        --list) list=1; shift ;;
        -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
        *) echo "check-client-closure: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done

# `describe` reads the manifest and the source tree only; a scratch directory of its own keeps it off a build that
# holds .build's lock.
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
if ! (cd "$package" && swift package --scratch-path "$scratch" describe --type json) >"$scratch/describe.json" \
    2>"$scratch/describe.err"; then
    echo "check-client-closure: 'swift package describe' failed in $package:" >&2
    cat "$scratch/describe.err" >&2
    exit 2
fi

python3 - "$package" "$target" "$list" "$scratch/describe.json" <<'PY'
import json
import os
import re
import sys
from collections import deque

package, root, list_only, describe_path = sys.argv[1], sys.argv[2], sys.argv[3] == "1", sys.argv[4]
with open(describe_path) as f:
    description = json.load(f)

targets = {t["name"]: t for t in description["targets"]}
products = {p["name"]: p["targets"] for p in description["products"]}
if root not in targets:
    print(f"check-client-closure: no target named {root} in {package}", file=sys.stderr)
    sys.exit(2)

# Breadth first, remembering who pulled each target in, so a finding names the chain.
parent = {root: None}
external = set()
queue = deque([root])
while queue:
    name = queue.popleft()
    target = targets[name]
    following = list(target.get("target_dependencies", []))
    for product in target.get("product_dependencies", []):
        if product in products:
            following.extend(products[product])
        else:
            external.add(product)
    for dependency in following:
        if dependency in targets and dependency not in parent:
            parent[dependency] = name
            queue.append(dependency)

if list_only:
    for name in sorted(parent):
        print(name)
    for product in sorted(external):
        print(f"product:{product}")
    sys.exit(0)


def chain(name):
    names = []
    while name is not None:
        names.append(name)
        name = parent[name]
    return " -> ".join(reversed(names))


def is_system(target):
    return target.get("type") == "system-target" or target.get("module_type") == "SystemLibraryTarget"


FORBIDDEN = ("Glibc", "CSodium", "CMalloc", "CSQLite", "CQREncode")
ATTRIBUTE = r"@[\w.]+(?:\([^)]*\))?\s+"
IMPORT = re.compile(
    rf"^\s*(?:{ATTRIBUTE})*(?:(?:public|package|internal|fileprivate|private|open)\s+)?(?:{ATTRIBUTE})*"
    r"import\s+(?:(?:typealias|struct|class|enum|protocol|let|var|func)\s+)?(\w+)"
)
DIRECTIVE = re.compile(r"^\s*#(if|elseif|else|endif)\b(.*)")


def guards(condition, module):
    """Whether code under `condition` only compiles where `module` can be imported."""
    return re.search(rf"(?<![!\w])canImport\(\s*{module}\s*(?:,[^)]*)?\)", condition) is not None


def unguarded_imports(path):
    # Each open #if block: its condition and whether we are in its #else.
    stack = []
    in_comment = False
    with open(path, encoding="utf-8", errors="replace") as f:
        for number, raw in enumerate(f, start=1):
            line = raw
            if in_comment:
                if "*/" not in line:
                    continue
                line = line.split("*/", 1)[1]
                in_comment = False
            line = re.sub(r"/\*.*?\*/", "", line)
            if "/*" in line:
                line, in_comment = line.split("/*", 1)[0], True
            line = line.split("//", 1)[0]
            directive = DIRECTIVE.match(line)
            if directive:
                kind, condition = directive.group(1), directive.group(2).strip()
                if kind == "if":
                    stack.append((condition, False))
                elif kind == "elseif" and stack:
                    stack[-1] = (condition, False)
                elif kind == "else" and stack:
                    stack[-1] = (stack[-1][0], True)
                elif kind == "endif" and stack:
                    stack.pop()
                continue
            imported = IMPORT.match(line)
            if not imported or imported.group(1) not in FORBIDDEN:
                continue
            module = imported.group(1)
            guarded = any(
                guards(condition, module)
                if not in_else
                else re.fullmatch(rf"!\s*canImport\(\s*{module}\s*\)", condition) is not None
                for condition, in_else in stack
            )
            if not guarded:
                yield number, module, raw.strip()


failures = 0
for name in sorted(parent):
    target = targets[name]
    if is_system(target):
        failures += 1
        print(f"Package.swift: system-library target {name} is in {root}'s closure ({chain(name)})")
        continue
    for source in target.get("sources", []):
        if not source.endswith(".swift"):
            continue
        path = os.path.join(target["path"], source)
        for number, module, text in unguarded_imports(os.path.join(package, path)):
            failures += 1
            print(f"{path}:{number}: '{text}' outside '#if canImport({module})', in {root}'s closure ({chain(name)})")

if failures:
    print(
        f"check-client-closure: {failures} finding(s): {root} must build for iOS, macOS and visionOS "
        "(no system library, no unguarded Glibc or C module import)",
        file=sys.stderr,
    )
    sys.exit(1)
print(f"check-client-closure: {root}'s closure ({len(parent)} local targets) is Apple-clean")
PY
