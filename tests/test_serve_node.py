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
    try:
        return subprocess.run([NODE, str(script)], cwd=cwd, env=_env(), capture_output=True,
                              text=True, timeout=300, check=False)
    except subprocess.TimeoutExpired as exc:  # say where it hung
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else ""
        err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else ""
        pytest.fail(f"{script.name} did not end within 300 s:\n{out[-4000:]}\n{err[-4000:]}")


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


NPM = shutil.which("npm")


def _install_step() -> list[str]:
    """The README's install command (in its Install section), as words."""
    text = (CLIENT / "README.md").read_text()
    section = text.split("## Install", 1)[1].split("\n## ", 1)[0]
    [line] = [ln for ln in re.findall(r"```sh\n(.*?)```", section, re.S)[0].splitlines()
              if ln.startswith("npm install")]
    return line.split("#", 1)[0].split()


def _npm_install(project: Path, *extra: str) -> None:
    """Install the client into project as the README says, with no network: a registry
    that refuses every connection and an empty cache (the package needs neither)."""
    assert NPM is not None
    (project / "package.json").write_text('{"name": "app", "version": "1.0.0", "private": true}\n')
    words = _install_step()
    assert words[:2] == ["npm", "install"] and words[-1] == "./clients/node", words
    env = {**_env(), "npm_config_registry": "http://127.0.0.1:9/",
           "npm_config_cache": str(project / ".npm-cache"), "npm_config_update_notifier": "false"}
    r = subprocess.run([NPM, *words[1:-1], *extra, str(CLIENT)], cwd=project, env=env,
                       capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]


@pytest.mark.skipif(NPM is None, reason="no npm here")
@pytest.mark.parametrize("extra", [(), ("--install-links",)], ids=["link", "copy"])
def test_the_readmes_install_step_works_offline(extra: tuple[str, ...], tmp_path: Path) -> None:
    """Issue 30 item 7 and issue 31 item 6: ``require("proctable-client")`` as the README
    shows failed, for the README gave no install step. It gives ``npm install
    ./clients/node``, and that works with no network (linked, or copied)."""
    _npm_install(tmp_path, *extra)
    installed = tmp_path / "node_modules" / "proctable-client"
    assert (installed / "index.d.ts").is_file() and (installed / "package.json").is_file()
    assert installed.is_symlink() == (not extra)
    script = tmp_path / "hello.js"
    script.write_text('const { Sidecar, PROTOCOL } = require("proctable-client");\n'
                      "(async () => {\n"
                      "  const pt = Sidecar.spawn();\n"
                      "  const h = await pt.hello();\n"
                      "  if (h.protocol !== PROTOCOL) throw new Error(String(h.protocol));\n"
                      "  process.exitCode = await pt.end();\n"
                      "})();\n")
    r = _node(script, tmp_path)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]


TSC = shutil.which("tsc")


@pytest.mark.skipif(TSC is None, reason="no tsc here (Debian: apt-get install node-typescript)")
def test_index_d_ts_covers_every_method_and_event() -> None:
    """Issue 31, item 6: index.d.ts says what every method returns (watch's null
    included) and types every option and event; ``tsc --strict`` checks a file that
    uses them all (clients/node/test/types/usage.ts)."""
    assert TSC is not None
    r = subprocess.run([TSC, "-p", str(CLIENT / "test" / "types" / "tsconfig.json")],
                       capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]


def test_the_readme_names_every_method_error_and_option() -> None:
    """Issue 31, item 6: the README lacked the error names ``cancelled`` and
    ``forbidden`` and adopt's ``cwd`` and ``env``. It names every method of the
    sidecar, every application error, and every option of start, adopt and restart."""
    from proctable.serve._protocol import APP_ERRORS, METHODS, STANDARD_ERRORS

    text = (CLIENT / "README.md").read_text()
    calls = text.split("## Calls", 1)[1].split("\n## ", 1)[0]
    for method in set(METHODS) - {"version", "hello"}:
        assert f"`{method}(" in calls, method
    for name in [*APP_ERRORS, *STANDARD_ERRORS.values()]:
        assert f"`{name}`" in calls, name
    for option in [*METHODS["start"], *METHODS["adopt"], "max_restarts", "reset_after",
                   "fast_exit", "max_fast_exits", "delay", "fresh_args", "fresh",
                   "fresh_timeout", "callTimeout"]:
        if option not in ("key", "pid", "start_time"):
            assert f"`{option}`" in calls or f"{option}}}" in calls or f"{{{option}" in calls \
                or f", {option}" in calls, option


@pytest.mark.skipif(NPM is None, reason="no npm here")
@pytest.mark.parametrize("n", range(len(_examples())))
def test_readme_example_runs(n: int, tmp_path: Path) -> None:
    _npm_install(tmp_path)  # as the README's Install section says
    script = tmp_path / f"example{n}.js"
    script.write_text(_examples()[n])
    r = _node(script, tmp_path)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]


# -- the wire spoken directly by a plain Node script -----------------------------------


WIRE_SCRIPT = CLIENT / "test" / "raw-wire.js"


def _wire_case(case: str) -> None:
    assert NODE is not None
    env = {"PATH": "/usr/bin:/bin", "PROCTABLE_PYTHON": sys.executable}
    r = subprocess.run([NODE, str(WIRE_SCRIPT), case], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]


def test_notifications_are_never_answered() -> None:
    """A request without id (unknown method, wrong params) gets no answer, as
    documented.

    Found by an outside review of the sidecar's wire (docs/serve.md's promises), with a
    plain Node script that speaks the protocol directly
    (clients/node/test/raw-wire.js)."""
    _wire_case("notifications_never_answered")


def test_missing_cwd_is_not_reported_as_command_not_found() -> None:
    """`start` in a missing cwd must not tell the client that `sh` does not exist.

    Found by an outside review of the sidecar's wire (docs/serve.md's promises), with a
    plain Node script that speaks the protocol directly
    (clients/node/test/raw-wire.js)."""
    _wire_case("missing_cwd_is_not_command_not_found")
