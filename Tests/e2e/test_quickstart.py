"""The README's first command, run as a newcomer runs it: deploy/quickstart.sh must finish with exit 0 after showing
a streamed answer through the whole overlay (and must not leave anything running)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from conftest import REPO_ROOT


def test_quickstart_streams_an_answer_through_the_dark_gateway() -> None:
    done = subprocess.run(
        ["./deploy/quickstart.sh"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=900
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    assert "owns no listening socket" in out
    events = re.findall(r"^\s+\d\d:\d\d:\d\d\.\d{3}\s+data: \{\"index\": (\d+)", out, flags=re.M)
    assert events == [str(i) for i in range(6)], out[-3000:]
    assert re.search(r" access .*identity=ipad .*status=200", out), out[-3000:]
    state = (REPO_ROOT / ".ils-quickstart").resolve()
    left = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and Path(os.readlink(proc / "cwd")).resolve() == state:
                left.append((proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:
            continue
    assert not left, f"quickstart left processes behind: {left}"
