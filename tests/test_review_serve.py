"""An outside review of the sidecar's wire: docs/serve.md's promises, checked by a plain
Node script that speaks the protocol directly (clients/node/test/review-wire.js)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "clients" / "node" / "test" / "review-wire.js"
NODE = shutil.which("node")

pytestmark = [
    pytest.mark.skipif(NODE is None, reason="no node binary here (CI's machine has Node 20)"),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sidecar's lineages "
                       "are Linux's"),
]


def _run(case: str) -> None:
    assert NODE is not None
    env = {"PATH": "/usr/bin:/bin", "PROCTABLE_PYTHON": sys.executable}
    r = subprocess.run([NODE, str(SCRIPT), case], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]


def test_notifications_are_never_answered() -> None:
    """A request without id (unknown method, wrong params) gets no answer, as documented."""
    _run("notifications_never_answered")


def test_missing_cwd_is_not_reported_as_command_not_found() -> None:
    """`start` in a missing cwd must not tell the client that `sh` does not exist."""
    _run("missing_cwd_is_not_command_not_found")
