"""deploy/install-deps.sh: the quickstart's list (`--product`) and the test command's (`--tests`, the default) are
separate, so a machine that only runs the product never gets the tests' browser, database server or debugger.

Run with `--dry-run` (prints what it would install, installs nothing) on a PATH of this test's making, from which
chromium, chromedriver, gdb, zbarimg and the rest of the tests' tools are absent, as on a fresh machine."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from conftest import REPO_ROOT

SCRIPT = REPO_ROOT / "deploy" / "install-deps.sh"
# What the script itself runs to decide (and what a fresh Debian machine with Swift has).
BASE_TOOLS = ("bash", "python3", "pkg-config", "awk", "sed", "id", "ls", "cat", "dirname")
TEST_ONLY_DEBIAN = {"chromium", "chromium-driver", "postgresql", "gdb", "zbar-tools", "iptables", "sqlite3", "openssl"}


def dry_run(tmp_path: Path, *args: str, tools: tuple[str, ...] = ()) -> dict[str, list[str]]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for tool in BASE_TOOLS + tools:
        found = shutil.which(tool)
        assert found, f"{tool} is needed to run this test"
        link = bin_dir / tool
        if not link.exists():
            link.symlink_to(found)
    env = {**os.environ, "PATH": str(bin_dir)}
    done = subprocess.run(
        ["bash", str(SCRIPT), *args, "--dry-run"], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    lines = dict(line.split(":", 1) for line in done.stdout.splitlines())
    return {key: value.split() for key, value in lines.items()}


def test_the_quickstart_list_leaves_out_what_only_the_tests_need(tmp_path: Path) -> None:
    product = dry_run(tmp_path, "--product")
    assert product["purpose"] == ["product"]
    # curl and ss are off this PATH: the quickstart needs both, and gets them.
    assert {"curl", "iproute2"} <= set(product["debian"])
    assert not TEST_ONLY_DEBIAN & set(product["debian"]), product["debian"]
    # The tests' Python packages are not asked for (the backend's are, or are there already).
    assert not any("Tests/e2e" in word for word in product["pypi"])


def test_the_test_list_adds_the_browser_and_the_rest(tmp_path: Path) -> None:
    tests = dry_run(tmp_path)
    assert tests["purpose"] == ["tests"]
    assert TEST_ONLY_DEBIAN - {"postgresql"} <= set(tests["debian"]), tests["debian"]
    # And everything the product needs.
    assert {"curl", "iproute2"} <= set(tests["debian"])


def test_nothing_missing_means_nothing_to_install(tmp_path: Path) -> None:
    # On this machine's own PATH (CI installed everything first) neither list asks for anything.
    done = subprocess.run(["bash", str(SCRIPT), "--dry-run"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "debian: \n" in done.stdout + "\n" and "pypi: \n" in done.stdout + "\n", done.stdout


def test_the_quickstart_asks_for_the_product_list_only() -> None:
    text = (REPO_ROOT / "deploy" / "quickstart.sh").read_text()
    assert "./deploy/install-deps.sh --product" in text
    assert "./deploy/install-deps.sh\n" not in text


def test_each_requirements_file_is_one_word(tmp_path: Path) -> None:
    # A python3 on the PATH that has none of the packages: both lists ask pip for their files, each as one word (a
    # repeated `-r` once collapsed into one, and pip took the second file for a package name).
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text("#!/bin/sh\nexec /usr/bin/env -i /usr/bin/python3 -S -I \"$@\"\n")
    (bin_dir / "python3").chmod(0o755)
    tests = dry_run(tmp_path)
    assert "--requirement=deploy/backend/requirements.txt" in tests["pypi"], tests["pypi"]
    assert "--requirement=Tests/e2e/requirements.txt" in tests["pypi"], tests["pypi"]
    assert all(word.startswith("--requirement=") for word in tests["pypi"]), tests["pypi"]
