"""Issue 40, one route table: every controller API path is spelled once, in Sources/ILSCore/ControllerRoutes.swift
(`ControllerEndpoint`), which the controller's router matches against and `ControllerClient` builds requests from.
This test fails if product code spells an API path anywhere else: a string literal that starts with `/v1/`, or a raw
request line (`POST /v1/enroll HTTP/1.1`). Tests may still spell paths (they probe paths the table does not have);
`--help` prose that names a route (`GET /v1/controllers`) is not a literal path and is allowed."""

from __future__ import annotations

import re
from pathlib import Path

from conftest import REPO_ROOT

TABLE = REPO_ROOT / "Sources" / "ILSCore" / "ControllerRoutes.swift"
LITERAL = re.compile(r'"/v1/')
REQUEST_LINE = re.compile(r"\b(GET|POST|PUT|DELETE|PATCH) /v1/\S* HTTP/1\.1")


def spelled_paths(root: Path, base: Path = REPO_ROOT) -> list[str]:
    findings = []
    for source in sorted(root.rglob("*.swift")):
        if source == TABLE:
            continue
        for number, line in enumerate(source.read_text(encoding="utf-8").splitlines(), start=1):
            if line.lstrip().startswith("//"):
                continue
            if LITERAL.search(line) or REQUEST_LINE.search(line):
                findings.append(f"{source.relative_to(base)}:{number}: {line.strip()}")
    return findings


def test_the_route_table_is_the_only_place_an_api_path_is_spelled() -> None:
    assert TABLE.exists()
    assert spelled_paths(REPO_ROOT / "Sources") == []
    # The table itself holds every route.
    assert len(re.findall(r'case \.[\w, .]+: "/v1/', TABLE.read_text())) >= 18


def test_the_check_finds_a_path_spelled_outside_the_table(tmp_path: Path) -> None:
    """The grep can fail: a call with a spelled path, and a raw request line, are both found."""
    sources = tmp_path / "Sources" / "ils-gateway"
    sources.mkdir(parents=True)
    (sources / "Spelled.swift").write_text(
        'let a = try await client.call(.GET, "/v1/whoami")\n'
        'let b = "POST /v1/enroll HTTP/1.1\\r\\n"\n'
        "// GET /v1/whoami in a comment is prose\n"
    )
    found = spelled_paths(tmp_path / "Sources", base=tmp_path)
    assert [line.split(": ", 1)[0] for line in found] == [
        "Sources/ils-gateway/Spelled.swift:1",
        "Sources/ils-gateway/Spelled.swift:2",
    ], found
