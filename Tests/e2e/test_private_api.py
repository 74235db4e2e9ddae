"""deploy/check-private-api.sh, the CI check behind the one private API the project uses (swift-crypto's
`CCryptoBoringSSL`, for AES-GCM records sealed in place; docs/design/private-api.md, "The one private API"): it passes on the
real tree, and it fails on an import of swift-crypto's internals anywhere else, on a manifest that lost the pin, and on
a resolved swift-crypto outside the pinned minor version."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import REPO_ROOT

CHECK = REPO_ROOT / "deploy" / "check-private-api.sh"
EXCEPTION = "Sources/ILSCrypto/AESGCMInPlace.swift"


def run_check(package: Path = REPO_ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(CHECK), "--package", str(package)], capture_output=True, text=True, timeout=60, check=False
    )


@pytest.fixture
def package_copy(tmp_path: Path) -> Path:
    copy = tmp_path / "package"
    shutil.copytree(REPO_ROOT / "Sources", copy / "Sources")
    (copy / "Tests").mkdir()
    shutil.copy2(REPO_ROOT / "Package.swift", copy / "Package.swift")
    return copy


def test_the_real_tree_passes() -> None:
    result = run_check()
    assert result.returncode == 0, result.stderr
    assert EXCEPTION in result.stdout


def test_the_exception_is_the_only_file_that_imports_boringssl() -> None:
    importing = [
        path.relative_to(REPO_ROOT).as_posix()
        for root in (REPO_ROOT / "Sources", REPO_ROOT / "Tests")
        for path in root.rglob("*.swift")
        if ".build" not in path.parts and "import CCryptoBoringSSL" in path.read_text()
    ]
    assert importing == [EXCEPTION]


@pytest.mark.parametrize(
    "line",
    [
        "import CCryptoBoringSSL",
        "@_implementationOnly import CCryptoBoringSSL",
        "internal import CCryptoBoringSSLShims",
        "@preconcurrency package import CryptoBoringWrapper",
    ],
)
def test_an_import_elsewhere_fails(package_copy: Path, line: str) -> None:
    planted = package_copy / "Sources" / "ILSProxy" / "Planted.swift"
    planted.write_text(f"{line}\n\nlet planted = 1\n")
    result = run_check(package_copy)
    assert result.returncode == 1
    assert "Sources/ILSProxy/Planted.swift:1:" in result.stderr


def test_an_import_in_a_test_fails(package_copy: Path) -> None:
    (package_copy / "Tests" / "Anything").mkdir()
    (package_copy / "Tests" / "Anything" / "T.swift").write_text("import Foundation\nimport CCryptoBoringSSL\n")
    result = run_check(package_copy)
    assert result.returncode == 1
    assert "Tests/Anything/T.swift:2:" in result.stderr


def test_a_comment_or_a_can_import_passes(package_copy: Path) -> None:
    (package_copy / "Sources" / "ILSProxy" / "Mention.swift").write_text(
        "// not an import CCryptoBoringSSL\n#if canImport(CCryptoBoringSSL)\nlet x = 1\n#endif\n"
    )
    assert run_check(package_copy).returncode == 0


def test_an_unpinned_manifest_fails(package_copy: Path) -> None:
    manifest = package_copy / "Package.swift"
    text = manifest.read_text()
    pinned = '.upToNextMinor(from: "4.5.2")'
    assert pinned in text
    manifest.write_text(text.replace(pinned, 'from: "4.5.2"'))
    result = run_check(package_copy)
    assert result.returncode == 1
    assert "pinned" in result.stderr


def test_a_resolved_version_outside_the_pin_fails(package_copy: Path) -> None:
    def resolved(version: str) -> None:
        pins = [{"identity": "swift-crypto", "kind": "remoteSourceControl", "state": {"version": version}}]
        (package_copy / "Package.resolved").write_text(json.dumps({"pins": pins, "version": 3}))

    resolved("4.5.9")
    assert run_check(package_copy).returncode == 0
    resolved("4.6.0")
    result = run_check(package_copy)
    assert result.returncode == 1
    assert "4.6.0" in result.stderr
