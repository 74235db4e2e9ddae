"""What deploy/check-client-closure.sh and deploy/check-targets.sh both read: the package's description from
`swift package describe`, and each Swift source's imports with the `#if` blocks around them. Python, not a Swift
tool: the checks run before any build, in seconds, and need nothing but the manifest and the sources."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from typing import Iterator

ATTRIBUTE = r"@[\w.]+(?:\([^)]*\))?\s+"
IMPORT = re.compile(
    rf"^\s*(?:{ATTRIBUTE})*(?:(?:public|package|internal|fileprivate|private|open)\s+)?(?:{ATTRIBUTE})*"
    r"import\s+(?:(?:typealias|struct|class|enum|protocol|let|var|func)\s+)?(\w+)"
)
DIRECTIVE = re.compile(r"^\s*#(if|elseif|else|endif)\b(.*)")


def describe(package: str, tool: str) -> dict:
    """The package's description. A scratch directory of its own keeps `describe` off a build that holds .build's
    lock; it reads the manifest and the source tree only. Exits with status 2 if SwiftPM cannot describe it."""
    with tempfile.TemporaryDirectory() as scratch:
        result = subprocess.run(
            ["swift", "package", "--scratch-path", scratch, "describe", "--type", "json"],
            cwd=package,
            capture_output=True,
            text=True,
            check=False,
        )
    if result.returncode != 0:
        print(f"{tool}: 'swift package describe' failed in {package}:\n{result.stderr}", file=sys.stderr)
        sys.exit(2)
    return json.loads(result.stdout)


def imports(path: str) -> Iterator[tuple[int, str, str, list[tuple[str, bool]]]]:
    """Each import outside comments: (line number, module, the line as written, the open `#if` blocks around it, each
    as its condition and whether the import is in its `#else`)."""
    stack: list[tuple[str, bool]] = []
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
            found = IMPORT.match(line)
            if found:
                yield number, found.group(1), raw.strip(), list(stack)
