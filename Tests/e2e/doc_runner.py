"""Runs the shell blocks of a page in docs/ as a reader would, on 127.0.0.1, with the real binary.

A page marks each ```sh block with words after `sh` in the fence's info string (GitHub shows none of them):

    ```sh                      run it; it must exit 0
    ```sh background port=7443 a long-running command (one command, "its own terminal"): started, then waited for
    ```sh background log=TEXT  ... until it listens on that port, or until its output holds TEXT
    ```sh fails                run it; it must exit non-zero (a refusal the page shows on purpose)
    ```sh setup                installation (build, install): not run here, the test supplies the binary instead
    ```sh stop                 "stop it" (Ctrl-C, systemctl stop): SIGTERM to the latest background process

Blocks run in order, each in a fresh `bash -euo pipefail`, but exported variables and the working directory carry
over from one block to the next as they would in one terminal. HOME is a temporary directory. The ports the page
uses (7443, 8000, 8080, ...) are replaced with free ones, so a run never collides with anything else on the machine.
Every block has a timeout, and every background process is stopped at the end.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import pytest

from conftest import REPO_ROOT, ManagedProcess, cli_env, free_port

FENCE = re.compile(r"^```(?P<info>sh[^\n]*)\n(?P<code>.*?)^```\s*$", re.M | re.S)
BLOCK_TIMEOUT_S = 30.0


@dataclass
class Block:
    words: list[str]
    code: str
    line: int

    @property
    def kind(self) -> str:
        for kind in ("background", "fails", "setup", "stop"):
            if kind in self.words:
                return kind
        return "run"

    def option(self, name: str) -> Optional[str]:
        for word in self.words:
            if word.startswith(name + "="):
                return word.split("=", 1)[1].strip('"')
        return None


def extract(page: Path) -> list[Block]:
    text = page.read_text()
    blocks = []
    for m in FENCE.finditer(text):
        words = shlex.split(m.group("info"))[1:]
        blocks.append(Block(words, m.group("code"), text.count("\n", 0, m.start()) + 1))
    return blocks


@dataclass
class BlockResult:
    block: Block
    returncode: int
    output: str

    def describe(self) -> str:
        return f"block at line {self.block.line}:\n{self.block.code}\nexit {self.returncode}\noutput:\n{self.output}"


@dataclass
class DocSession:
    """One reader's terminal session through a page."""

    page: Path
    binary: Path
    home: Path
    doc_ports: tuple[int, ...]
    extra_env: dict[str, str] = field(default_factory=dict)
    ports: dict[int, int] = field(default_factory=dict)
    background: list[ManagedProcess] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.ports = {p: free_port() for p in self.doc_ports}
        bin_dir = self.home / ".local" / "bin"
        bin_dir.mkdir(parents=True)
        (bin_dir / "ils-gateway").symlink_to(self.binary)
        env = cli_env()
        for name in list(env):
            if name.startswith(("ILS_", "NETWORKING_MODE", "BACKEND_URL")):
                del env[name]
        env.update(HOME=str(self.home), PATH=f"{bin_dir}:{env.get('PATH', '/usr/bin:/bin')}",
                   NO_PROXY="*", no_proxy="*")
        env.update(self.extra_env)
        self.env = env
        self.state = self.home / ".doc-env"
        self.cwd_file = self.home / ".doc-cwd"
        self.cwd_file.write_text(str(REPO_ROOT))  # a reader starts in the checkout
        self.state.write_text("")

    def substitute(self, code: str) -> str:
        for doc_port, port in self.ports.items():
            code = re.sub(rf"(?<![\d.]){doc_port}(?!\d)", str(port), code)
        return code

    def port(self, doc_port: int) -> int:
        return self.ports[doc_port]

    def _prelude(self) -> str:
        return f'source {shlex.quote(str(self.state))}\ncd "$(cat {shlex.quote(str(self.cwd_file))})"\n'

    def run(self, block: Block, timeout: float = BLOCK_TIMEOUT_S) -> BlockResult:
        code = self.substitute(block.code)
        save = f"\nexport -p > {shlex.quote(str(self.state))}\npwd > {shlex.quote(str(self.cwd_file))}\n"
        script = "set -euo pipefail\n" + self._prelude() + code + (save if block.kind == "run" else "")
        try:
            proc = subprocess.run(["bash", "-c", script], env=self.env, stdin=subprocess.DEVNULL,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            out = (e.stdout or b"").decode("utf-8", "replace")
            pytest.fail(f"{self.page.name}: block at line {block.line} ran over {timeout:.0f} s\n{code}\n{out}",
                        pytrace=False)
        return BlockResult(block, proc.returncode, proc.stdout.decode("utf-8", "replace"))

    def start(self, block: Block, log_dir: Path) -> ManagedProcess:
        lines = [ln for ln in self.substitute(block.code).replace("\\\n", " ").splitlines()
                 if ln.strip() and not ln.strip().startswith("#")]
        assert len(lines) == 1, f"{self.page.name} line {block.line}: a background block holds one command"
        command = re.sub(r"\s+#.*$", "", lines[0])
        if re.match(r"[A-Za-z_][A-Za-z0-9_]*=", command):  # `VAR=value cmd`: exec takes no assignments
            command = "env " + command
        name = f"doc-line{block.line}"
        proc = ManagedProcess(name, ["bash", "-c", self._prelude() + "exec " + command], log_dir,
                              cwd=Path(self.cwd_file.read_text().strip()), env=self.env)
        proc.start()
        self.background.append(proc)
        if (port := block.option("port")) is not None:
            proc.wait_for_port(self.port(int(port)))
        if (text := block.option("log")) is not None:
            proc.wait_for_log(text)
        return proc

    def stop_all(self) -> None:
        for proc in reversed(self.background):
            proc.stop()


def walk(session: DocSession, blocks: list[Block], log_dir: Path,
         deadline_s: float = 50.0) -> list[tuple[Block, object]]:
    """Runs every block in order and checks each against its kind; returns (block, result or process) pairs."""
    started = time.monotonic()
    results: list[tuple[Block, object]] = []
    for block in blocks:
        if time.monotonic() - started > deadline_s:
            pytest.fail(f"{session.page.name}: the walk-through ran over {deadline_s:.0f} s", pytrace=False)
        if block.kind == "setup":
            results.append((block, None))
        elif block.kind == "stop":
            running = [p for p in session.background if p.alive()]
            assert running, f"{session.page.name} line {block.line}: nothing is running to stop"
            status = running[-1].stop()
            assert status == 0, f"{session.page.name}: {running[-1].args} ended with {status} on SIGTERM"
            results.append((block, status))
        elif block.kind == "background":
            results.append((block, session.start(block, log_dir)))
        else:
            result = session.run(block)
            if block.kind == "fails":
                assert result.returncode != 0, f"{session.page.name}: expected a refusal\n{result.describe()}"
            else:
                assert result.returncode == 0, f"{session.page.name}: a command failed\n{result.describe()}"
            results.append((block, result))
    return results
