"""deploy/check-client-closure.sh, the CI check that ILSClient still builds for Apple platforms: it fails on a
system-library target or an unguarded Glibc/CSodium/CMalloc/CSQLite import anywhere in ILSClient's closure, and it
passes on the real tree. deploy/check-targets.sh, the CI check of all three target rules of docs/architecture.md
(roles never import roles, nothing server-side imports ILSClient, ILSClient's closure as above): each rule broken
once, in the manifest and in a source file, fails it with the offending line, as does an import of a target that is
not among the importer's dependencies. Also the boundaries between targets
that the same closure shows, and the gateway binary that links no FoundationNetworking."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import REPO_ROOT

CHECK = REPO_ROOT / "deploy" / "check-client-closure.sh"
TARGET_RULES = REPO_ROOT / "deploy" / "check-targets.sh"
TIMEOUT_S = 120


def run_check(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(CHECK), *args], capture_output=True, text=True, timeout=TIMEOUT_S, check=False)


def closure(target: str, package: Path = REPO_ROOT) -> set[str]:
    result = run_check("--package", str(package), "--target", target, "--list")
    assert result.returncode == 0, result.stderr
    return set(result.stdout.split())


@pytest.fixture
def package_copy(tmp_path: Path) -> Path:
    """Package.swift and Sources, plus an empty directory per test target (the manifest names them)."""
    copy = tmp_path / "package"
    copy.mkdir()
    shutil.copy2(REPO_ROOT / "Package.swift", copy / "Package.swift")
    shutil.copytree(REPO_ROOT / "Sources", copy / "Sources")
    for directory in (REPO_ROOT / "Tests").iterdir():
        if directory.is_dir():
            (copy / "Tests" / directory.name).mkdir(parents=True)
    return copy


def prepend(path: Path, text: str) -> None:
    path.write_text(text + path.read_text())


def test_an_unguarded_glibc_import_in_the_client_fails_with_its_path_and_line(package_copy: Path) -> None:
    source = package_copy / "Sources" / "ILSDial" / "OverlayDialer.swift"
    prepend(source, "@preconcurrency internal import Glibc\n")
    result = run_check("--package", str(package_copy))
    assert result.returncode == 1
    assert "Sources/ILSDial/OverlayDialer.swift:1: '@preconcurrency internal import Glibc'" in result.stdout


def test_a_system_library_dependency_of_the_client_fails_naming_the_chain(package_copy: Path) -> None:
    (package_copy / "Sources" / "CInjected").mkdir()
    (package_copy / "Sources" / "CInjected" / "module.modulemap").write_text(
        'module CInjected [system] {\n    header "shim.h"\n    export *\n}\n'
    )
    (package_copy / "Sources" / "CInjected" / "shim.h").write_text("#include <stdio.h>\n")
    manifest = package_copy / "Package.swift"
    text = manifest.read_text()
    text = text.replace("    targets: [\n", '    targets: [\n        .systemLibrary(name: "CInjected"),\n', 1)
    client = 'name: "ILSClient",\n            dependencies: [\n'
    text = text.replace(client, client + '                "CInjected",\n', 1)
    assert text.count("CInjected") == 2, "the manifest's layout changed: update the injection"
    manifest.write_text(text)
    result = run_check("--package", str(package_copy))
    assert result.returncode == 1
    assert "system-library target CInjected is in ILSClient's closure (ILSClient -> CInjected)" in result.stdout


def test_imports_are_judged_by_the_if_block_around_them(package_copy: Path) -> None:
    directory = package_copy / "Sources" / "ILSClient"
    (directory / "Guarded.swift").write_text(
        "#if canImport(Glibc)\nimport Glibc\n#elseif canImport(Darwin)\nimport Darwin\n#endif\n"
        "#if !canImport(CMalloc)\n#else\npublic import CMalloc\n#endif\n"
        "// import CSQLite\n/*\nimport CSQLite\n*/\n"
    )
    (directory / "Unguarded.swift").write_text(
        "#if os(Linux)\nimport Glibc\n#endif\n"
        "#if canImport(Glibc)\n#else\nimport Glibc\n#endif\n"
        "#if canImport(Glibc)\nimport CSQLite\n#endif\n"
        "package import struct CSodium.crypto_kx_keypair\n"
    )
    result = run_check("--package", str(package_copy))
    findings = [line for line in result.stdout.splitlines() if "ILSClient/" in line]
    assert [line.split(": ", 1)[0] for line in findings] == [
        "Sources/ILSClient/Unguarded.swift:2",
        "Sources/ILSClient/Unguarded.swift:6",
        "Sources/ILSClient/Unguarded.swift:9",
        "Sources/ILSClient/Unguarded.swift:11",
    ], result.stdout


def test_the_real_tree_passes() -> None:
    assert "CSodium" not in closure("ILSClient") and "ILSSodium" not in closure("ILSClient")
    # The app scans QR codes, it does not draw them: libqrencode stays the CLI's.
    assert "CQREncode" not in closure("ILSClient") and "ILSQRCode" not in closure("ILSClient")
    result = run_check()
    assert result.returncode == 0, result.stdout + result.stderr


def test_only_the_cli_links_the_console() -> None:
    """Hummingbird and swift-mustache are the console's alone: no role, no test helper, never the app's library."""
    for target in ("ILSClient", "ILSController", "ILSGateway", "ILSTunnel", "ILSTesting", "ILSAdmin"):
        linked = closure(target)
        assert not {t for t in linked if "Hummingbird" in t or "Mustache" in t or t == "ILSConsole"}, (target, linked)
    assert "ILSConsole" in closure("ils-gateway")


def test_http_modes_proxy_core_links_nothing_of_the_overlay() -> None:
    linked = closure("ILSProxy")
    assert "ILSSplice" in linked
    assert not linked & {"ILSFabric", "ILSCrypto", "CSodium", "product:NIOHTTP2", "product:NIOSSL"}, linked


def test_no_server_side_role_links_the_apps_library() -> None:
    for role in ("ILSGateway", "ILSController", "ILSProxy", "ILSFabric", "ILSIdentity", "ILSTunnel", "ils-gateway"):
        assert "ILSClient" not in closure(role), role
    assert "ILSDial" in closure("ILSTunnel") and "ILSDial" in closure("ILSClient")


def run_target_rules(package: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(TARGET_RULES), "--package", str(package)], capture_output=True, text=True, timeout=TIMEOUT_S, check=False
    )


def add_dependency(package: Path, target: str, dependency: str) -> None:
    manifest = package / "Package.swift"
    text = manifest.read_text()
    opening = f'name: "{target}",\n            dependencies: [\n'
    assert text.count(opening) == 1, "the manifest's layout changed: update the injection"
    manifest.write_text(text.replace(opening, opening + f'                "{dependency}",\n', 1))


def test_the_target_rules_pass_on_the_tree() -> None:
    result = run_target_rules(REPO_ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "roles import no role" in result.stdout and "is Apple-clean" in result.stdout


def test_a_role_importing_a_role_fails_rule_1_with_the_import(package_copy: Path) -> None:
    prepend(package_copy / "Sources" / "ILSTunnel" / "Tunnel.swift", "@preconcurrency package import ILSGateway\n")
    result = run_target_rules(package_copy)
    assert result.returncode == 1
    assert (
        "Sources/ILSTunnel/Tunnel.swift:1: '@preconcurrency package import ILSGateway': "
        "rule 1: a role (ILSTunnel) imports another role (ILSGateway)"
    ) in result.stdout, result.stdout


def test_a_role_depending_on_a_role_fails_rule_1_naming_the_dependency(package_copy: Path) -> None:
    add_dependency(package_copy, "ILSConsole", "ILSController")
    result = run_target_rules(package_copy)
    assert result.returncode == 1
    assert "Package.swift: ILSConsole depends on ILSController: rule 1" in result.stdout, result.stdout


def test_server_side_code_importing_the_client_fails_rule_2(package_copy: Path) -> None:
    prepend(package_copy / "Sources" / "ils-gateway" / "EnrollCommand.swift", "import ILSClient\n")
    add_dependency(package_copy, "ILSTunnel", "ILSClient")
    result = run_target_rules(package_copy)
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert "Sources/ils-gateway/EnrollCommand.swift:1: 'import ILSClient': rule 2: ils-gateway imports the app's " \
        "library (ILSClient); dial and enroll through ILSDial and ILSIdentity" in lines, result.stdout
    assert any(line.startswith("Package.swift: ILSTunnel depends on ILSClient: rule 2") for line in lines), lines
    # A comment is no import, and the example app and the tests may import the client.
    assert not [line for line in lines if "ils-client-example" in line or "Tests/" in line], lines


def test_an_import_outside_the_targets_dependencies_fails_rule_4(package_copy: Path) -> None:
    """Such an import builds only when another target built the module first: a clean CI build once failed on a test
    file that imported ILSClient after ILSTesting stopped depending on it."""
    prepend(package_copy / "Sources" / "ILSProxy" / "ProxyCore.swift", "internal import ILSConsole\n")
    result = run_target_rules(package_copy)
    assert result.returncode == 1
    assert (
        "Sources/ILSProxy/ProxyCore.swift:1: 'internal import ILSConsole': rule 4: ILSProxy imports ILSConsole, "
        "which is not among its dependencies (Package.swift)"
    ) in result.stdout, result.stdout


def test_a_client_closure_finding_fails_the_target_rules_too(package_copy: Path) -> None:
    prepend(package_copy / "Sources" / "ILSDial" / "LinkState.swift", "import Glibc\n")
    result = run_target_rules(package_copy)
    assert result.returncode == 1
    assert "Sources/ILSDial/LinkState.swift:1: 'import Glibc' outside '#if canImport(Glibc)'" in result.stdout


def test_the_gateway_binary_links_no_foundation_networking(ils_bin: Path, client_example_bin: Path) -> None:
    """The server no longer links the app's library, so not Foundation's URLSession (nor libcurl) either; the
    example app, which uses URLSession, shows what the check would see."""

    def libraries(binary: Path) -> str:
        return subprocess.run(["ldd", str(binary)], capture_output=True, text=True, timeout=30, check=True).stdout

    assert "libFoundationNetworking" in libraries(client_example_bin)
    linked = libraries(ils_bin)
    assert "libFoundationNetworking" not in linked and "libcurl" not in linked, linked
