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

PYTHONDONTWRITEBYTECODE=1 PYTHONPATH="$(dirname "$0")" python3 - "$package" "$target" "$list" <<'PY'
import os
import re
import sys
from collections import deque

from swift_sources import describe, imports

package, root, list_only = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
description = describe(package, "check-client-closure")

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


def guards(condition, module):
    """Whether code under `condition` only compiles where `module` can be imported."""
    return re.search(rf"(?<![!\w])canImport\(\s*{module}\s*(?:,[^)]*)?\)", condition) is not None


def unguarded_imports(path):
    for number, module, text, stack in imports(path):
        if module not in FORBIDDEN:
            continue
        guarded = any(
            guards(condition, module)
            if not in_else
            else re.fullmatch(rf"!\s*canImport\(\s*{module}\s*\)", condition) is not None
            for condition, in_else in stack
        )
        if not guarded:
            yield number, module, text


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
