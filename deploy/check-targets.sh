#!/usr/bin/env bash
# Fails when the target rules of docs/architecture.md ("Layers") are broken, naming each offending dependency or
# import:
#   1. roles never import roles: ILSController, ILSGateway, ILSTunnel and ILSConsole (each the core of one command)
#      neither depend on one another in Package.swift nor import one another in a source file;
#   2. nothing server-side imports ILSClient, the app's library: no target but ils-client-example and the test
#      targets depends on it or imports it (what the tunnel, the CLI and the bench need to dial and enroll is in
#      ILSDial and ILSIdentity, below it);
#   3. ILSClient's closure has no system library and no unguarded Glibc or C module import
#      (deploy/check-client-closure.sh);
#   4. a target imports only targets of ours that it depends on, directly or not: otherwise it builds only when
#      another target happened to build that module first (a clean build once failed so).
# A finding is printed as PATH:LINE: 'the import' (or Package.swift: the dependency) and the rule; exit status 1.
#
# Usage: deploy/check-targets.sh [--package DIR]
#   --package DIR  the package to check (default: this repository)
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
package="$(cd "$here/.." && pwd)"
while [[ $# -gt 0 ]]; do
    case "$1" in
        --package) package="$(cd "$2" && pwd)"; shift 2 ;;
        -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
        *) echo "check-targets: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done

status=0
PYTHONDONTWRITEBYTECODE=1 PYTHONPATH="$here" python3 - "$package" <<'PY' || status=1
import os
import sys

from swift_sources import describe, imports

package = sys.argv[1]
description = describe(package, "check-targets")
targets = {t["name"]: t for t in description["targets"]}

ROLES = ("ILSController", "ILSGateway", "ILSTunnel", "ILSConsole")
CLIENT = "ILSClient"
MAY_IMPORT_CLIENT = {"ils-client-example"}


def closure(name):
    """The local targets `name` depends on, directly or not."""
    seen, stack = set(), [name]
    while stack:
        for dependency in targets[stack.pop()].get("target_dependencies", []):
            if dependency not in seen:
                seen.add(dependency)
                stack.append(dependency)
    return seen


def is_test(target):
    return target.get("type") == "test"


def forbidden(importer, module):
    """The rule `importer` breaks by depending on or importing `module`, or None."""
    if importer in ROLES and module in ROLES and module != importer:
        return f"rule 1: a role ({importer}) imports another role ({module})"
    if module == CLIENT and importer != CLIENT and importer not in MAY_IMPORT_CLIENT and not is_test(targets[importer]):
        return f"rule 2: {importer} imports the app's library ({CLIENT}); dial and enroll through ILSDial and ILSIdentity"
    return None


findings = 0
for name in sorted(targets):
    target = targets[name]
    for dependency in target.get("target_dependencies", []):
        rule = forbidden(name, dependency)
        if rule:
            findings += 1
            print(f"Package.swift: {name} depends on {dependency}: {rule}")
    for source in target.get("sources", []):
        if not source.endswith(".swift"):
            continue
        path = os.path.join(target["path"], source)
        reachable = closure(name)
        for number, module, text, _ in imports(os.path.join(package, path)):
            rule = forbidden(name, module)
            if rule is None and module in targets and module != name and module not in reachable:
                # Such an import builds only when another target happens to have built the module first.
                rule = f"rule 4: {name} imports {module}, which is not among its dependencies (Package.swift)"
            if rule:
                findings += 1
                print(f"{path}:{number}: '{text}': {rule}")

if findings:
    print(f"check-targets: {findings} finding(s) against the target rules (docs/architecture.md, Layers)", file=sys.stderr)
    sys.exit(1)
print(f"check-targets: roles import no role, only ils-client-example and tests import {CLIENT}, and every import is a dependency")
PY
"$here/check-client-closure.sh" --package "$package" || status=1
exit "$status"
