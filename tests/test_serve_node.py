"""The Node client's tests and the README's examples, run with the real ``node`` binary.

They speak only the documented protocol (docs/serve.md) to a real sidecar: the
`proctable` command of this Python's environment, put first on PATH.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CLIENT = ROOT / "clients" / "node"
NODE = shutil.which("node")

pytestmark = [
    pytest.mark.skipif(NODE is None, reason="no node binary here (CI's machine has Node 20)"),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sidecar's lineages "
                       "are Linux's"),
]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    bindir = os.path.dirname(sys.executable)
    if not os.path.exists(os.path.join(bindir, "proctable")):
        pytest.skip("the proctable command is not installed beside this Python")
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    return env


def _node(script: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    assert NODE is not None
    return subprocess.run([NODE, str(script)], cwd=cwd, env=_env(), capture_output=True,
                          text=True, timeout=300, check=False)


@pytest.mark.parametrize("script", sorted(p.name for p in (CLIENT / "test").glob("*.test.js")))
def test_node_client_tests(script: str) -> None:
    r = _node(CLIENT / "test" / script, CLIENT)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    assert "# fail 0" in r.stdout and "# pass " in r.stdout


def _examples() -> list[str]:
    text = (CLIENT / "README.md").read_text()
    return re.findall(r"```js\n(.*?)```", text, re.S)


def test_the_readme_has_the_field_cases() -> None:
    text = (CLIENT / "README.md").read_text()
    for case in ("replacement under the same key", "exactly one `exited`, then `deleted`",
                 "rerun", "restart", "`watch`", "`setsid`'d tool job"):
        assert case in text, case
    assert len(_examples()) >= 6


@pytest.mark.parametrize("n", range(len(_examples())))
def test_readme_example_runs(n: int, tmp_path: Path) -> None:
    (tmp_path / "node_modules").mkdir()
    (tmp_path / "node_modules" / "proctable-client").symlink_to(CLIENT)
    script = tmp_path / f"example{n}.js"
    script.write_text(_examples()[n])
    r = _node(script, tmp_path)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
