"""Packaging: what a user gets from the wheel, and the build rules that make it.

The first group inspects the installed package and runs everywhere, also against
a wheel that cibuildwheel installed. The second reads the source tree (setup.py,
MANIFEST.in, pyproject.toml, the workflows) and skips where the tests run
without one. The slowest checks (fresh venvs) run only when PROCTABLE_SLOW_TESTS=1
(CI's packaging job sets it).
"""

from __future__ import annotations

import importlib.metadata as md
import importlib.resources
import importlib.util
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from typing import Optional

import pytest

import proctable

ROOT = pathlib.Path(__file__).resolve().parent.parent
HAVE_TREE = all((ROOT / n).exists() for n in ("pyproject.toml", "setup.py", "MANIFEST.in", "csrc"))
FREE_THREADED = bool(sysconfig.get_config_var("Py_GIL_DISABLED"))
PY = sys.executable

needs_tree = pytest.mark.skipif(
    not HAVE_TREE, reason="needs the source tree next to tests/ (tests run from an installed wheel)"
)
slow = pytest.mark.skipif(
    os.environ.get("PROCTABLE_SLOW_TESTS") != "1",
    reason="slow (builds in fresh venvs): set PROCTABLE_SLOW_TESTS=1 to run it",
)


def _run(args: list[str], cwd: pathlib.Path, timeout: float = 60,
         env: Optional[dict[str, str]] = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          check=False, env=env)


def _name(requirement: str) -> str:
    return re.split(r"[\s<>=!~;\[(]", requirement, maxsplit=1)[0].lower()


# -- the installed package ------------------------------------------------------------


def test_py_typed_ships() -> None:
    assert importlib.resources.files("proctable").joinpath("py.typed").is_file()


@pytest.mark.parametrize("module", ["_native", "_rows"])
def test_native_core_is_compiled_and_abi3(module: str) -> None:
    # The compiled modules, never a pure-Python fallback.
    mod = importlib.import_module(f"proctable.{module}")
    path = pathlib.Path(mod.__file__ or "")
    if FREE_THREADED:  # no stable ABI on free-threaded builds: a version-specific module
        assert ".abi3." not in path.name, path.name
    else:
        assert path.name.endswith(".abi3.so"), path.name


@pytest.mark.skipif(not FREE_THREADED, reason="only free-threaded CPython runs without a GIL")
def test_free_threaded_import_keeps_the_gil_off(tmp_path: pathlib.Path) -> None:
    # An extension that does not declare itself free-threading safe turns the GIL
    # back on at import; the wheels for 3.14t promise that proctable does not.
    env = {k: v for k, v in os.environ.items() if k != "PYTHON_GIL"}
    code = "import sys, proctable; proctable.snapshot(); print(sys._is_gil_enabled())"
    r = _run([PY, "-c", code], cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False", r.stderr


def test_version_matches_metadata() -> None:
    assert md.version("proctable") == proctable.__version__


def test_metadata_dependencies_and_extras() -> None:
    meta = md.metadata("proctable")
    assert meta["Requires-Python"] == ">=3.9"
    requires = md.requires("proctable") or []
    runtime = {_name(r) for r in requires if "extra ==" not in r}
    assert runtime == {"cffi"}

    def extra(name: str) -> set[str]:
        return {_name(r) for r in requires if re.search(rf"extra == ['\"]{name}['\"]", r)}

    assert {"psutil", "pytest", "pytest-benchmark", "hypothesis"} <= extra("test")
    assert extra("bench") == {"psutil"}


def _console_scripts() -> dict[str, str]:
    eps = md.entry_points()
    group = (eps.select(group="console_scripts") if hasattr(eps, "select")
             else eps.get("console_scripts", []))  # type: ignore[attr-defined]
    return {ep.name: ep.value for ep in group}


def test_console_script_entry_point() -> None:
    assert _console_scripts().get("proctable") == "proctable.cli:main"


def _script() -> Optional[str]:
    beside = pathlib.Path(sysconfig.get_path("scripts")) / "proctable"
    return str(beside) if beside.exists() else shutil.which("proctable")


def test_console_script_runs_outside_the_tree(tmp_path: pathlib.Path) -> None:
    script = _script()
    if script is None:
        pytest.skip("the proctable script is neither beside this interpreter nor on PATH")
    r = _run([script, "--version"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"proctable {proctable.__version__}"
    r = _run([script, "ps"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0].split()[:2] == ["PID", "PPID"]


def test_python_m_proctable_version(tmp_path: pathlib.Path) -> None:
    r = _run([PY, "-m", "proctable", "--version"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"proctable {proctable.__version__}"


@pytest.mark.skipif(os.environ.get("PROCTABLE_REQUIRE_BPF") != "1",
                    reason="only release wheels promise the BPF reader (PROCTABLE_REQUIRE_BPF=1)")
def test_release_wheel_has_the_bpf_reader() -> None:
    # Built in (whether it can load here, in a container, is another matter).
    why = proctable.reader().why_not or ""
    assert not why.startswith("built without BPF"), why


def test_import_and_snapshot_outside_the_tree(tmp_path: pathlib.Path) -> None:
    code = "import proctable, os; t = proctable.snapshot(); print(len(t), os.getpid() in t)"
    r = _run([PY, "-c", code], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    count, found = r.stdout.split()
    assert int(count) > 1 and found == "True"


# -- the build rules (source tree) ------------------------------------------------------

# Runs setup.py with setuptools.setup() captured and sysconfig saying "with a GIL"
# (gil) or "free-threaded" (ft), whatever this interpreter is; prints the arguments.
_CAPTURE = """
import json, runpy, sys, sysconfig
import setuptools
captured = {}
setuptools.setup = lambda **kw: captured.update(kw)
real = sysconfig.get_config_var
gil_disabled = 1 if sys.argv[2] == "ft" else 0
sysconfig.get_config_var = lambda name: gil_disabled if name == "Py_GIL_DISABLED" else real(name)
runpy.run_path(sys.argv[1])
captured["ext_modules"] = [
    {"name": e.name, "py_limited_api": e.py_limited_api, "define_macros": e.define_macros}
    for e in captured.get("ext_modules", [])]
captured["cmdclass"] = {k: v.__name__ for k, v in captured.get("cmdclass", {}).items()}
print(json.dumps(captured))
"""


@needs_tree
@pytest.mark.parametrize("build", ["gil", "ft"])
def test_setup_tags_abi3_except_on_free_threaded_builds(build: str) -> None:
    if importlib.util.find_spec("setuptools") is None:
        pytest.skip("setuptools is not installed here (pip builds in an isolated env)")
    r = _run([PY, "-c", _CAPTURE, str(ROOT / "setup.py"), build], cwd=ROOT)
    assert r.returncode == 0, r.stderr
    kw = json.loads(r.stdout.splitlines()[-1])
    assert kw["cffi_modules"] == ["csrc/build_ffi.py:ffibuilder"]
    # objects are never reused across build options (a build without BPF, then with)
    assert kw["cmdclass"] == {"build_ext": "build_ext_proctable"}
    (rows,) = kw["ext_modules"]
    assert rows["name"] == "proctable._rows"
    if build == "gil":
        assert kw["options"] == {"bdist_wheel": {"py_limited_api": "cp39"}}
        assert rows["py_limited_api"] is True
        assert rows["define_macros"] == [["Py_LIMITED_API", "0x03090000"]]
    else:
        assert kw["options"] == {}
        assert rows["py_limited_api"] is False and rows["define_macros"] == []


@needs_tree
def test_setup_refuses_to_build_without_cffi() -> None:
    # Without cffi, setuptools would ignore cffi_modules and make a pure wheel
    # with no C core: setup.py must stop the build instead, and say why.
    code = "import runpy, sys; sys.modules['cffi'] = None; runpy.run_path(sys.argv[1])"
    r = _run([PY, "-c", code, str(ROOT / "setup.py")], cwd=ROOT)
    assert r.returncode != 0
    assert "proctable needs cffi to build its C core" in r.stderr


def _copy_tree(dest: pathlib.Path) -> pathlib.Path:
    """The source tree without build products, VCS data or caches."""
    junk = shutil.ignore_patterns(".git", "build", "dist", "*.egg-info", "__pycache__", ".venv*",
                                  ".*_cache", ".hypothesis", ".benchmarks", "*.so", "*.o")
    shutil.copytree(ROOT, dest, ignore=junk)
    return dest


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[pathlib.Path, pathlib.Path]:
    """An sdist and the wheel built from it, as `python -m build` makes them."""
    if not HAVE_TREE:
        pytest.skip("needs the source tree next to tests/ (tests run from an installed wheel)")
    base = tmp_path_factory.mktemp("build")
    # Asked from a neutral cwd: a build/ directory in the checkout would pass for it.
    if _run([PY, "-m", "build", "--version"], cwd=base).returncode != 0:
        pytest.skip("the `build` frontend is not installed (pip install build; .ci/run does)")
    src = _copy_tree(base / "src")
    out = base / "dist"
    r = _run([PY, "-m", "build", "--outdir", str(out), str(src)], cwd=base, timeout=300)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    (sdist,) = out.glob("*.tar.gz")
    (wheel,) = out.glob("*.whl")
    return sdist, wheel


def test_sdist_ships_the_c_sources_and_no_compiled_files(
        built: tuple[pathlib.Path, pathlib.Path]) -> None:
    sdist, _ = built
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    csrc = (ROOT / "csrc").iterdir()
    wanted = {f"csrc/{p.name}" for p in csrc if p.suffix in (".c", ".h", ".py")}
    wanted |= {"setup.py", "pyproject.toml", "README.md", "CHANGELOG.md", "LICENSE",
               "src/proctable/py.typed", "src/proctable/__init__.py", "tests/conftest.py",
               "src/proctable/bench/wire_client.js"}
    assert wanted <= names, sorted(wanted - names)
    compiled = [n for n in names if n.endswith((".so", ".o", ".a", ".dylib", ".pyc", ".pyd"))
                or "__pycache__" in n or n.endswith("_native.c")]
    assert compiled == []


def test_wheel_holds_the_compiled_core_and_py_typed(
        built: tuple[pathlib.Path, pathlib.Path]) -> None:
    _, wheel = built
    name, version, pytag, abitag, _plat = wheel.name[: -len(".whl")].split("-")
    assert (name, version) == ("proctable", proctable.__version__)
    if FREE_THREADED:
        assert abitag.endswith("t") and abitag != "abi3"
    else:
        assert (pytag, abitag) == ("cp39", "abi3")
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
    assert {"proctable/py.typed", "proctable/__init__.py"} <= names
    assert ("proctable/_native.abi3.so" in names) != FREE_THREADED
    assert ("proctable/_rows.abi3.so" in names) != FREE_THREADED
    assert "proctable/_rows.pyi" in names
    assert "proctable/bench/wire_client.js" in names  # proctable bench --wire runs it
    sources = [n for n in names if n.endswith((".c", ".h")) or n.startswith(("tests/", "csrc/"))]
    assert sources == []
    entry_points = f"proctable-{version}.dist-info/entry_points.txt"
    with zipfile.ZipFile(wheel) as zf:
        assert "proctable = proctable.cli:main" in zf.read(entry_points).decode()
        # The lineage's native helper, executable as installed (pip keeps the bit).
        helper = zf.getinfo("proctable/proctable-lineage")
        assert (helper.external_attr >> 16) & 0o111 == 0o111


def _venv(where: pathlib.Path) -> pathlib.Path:
    r = _run([PY, "-m", "venv", str(where)], cwd=where.parent, timeout=120)
    assert r.returncode == 0, r.stderr
    return where / "bin" / "python"


@slow
def test_wheel_installs_and_runs_in_a_fresh_venv(
        built: tuple[pathlib.Path, pathlib.Path], tmp_path: pathlib.Path) -> None:
    _, wheel = built
    py = _venv(tmp_path / "venv")
    r = _run([str(py), "-m", "pip", "install", "--quiet", str(wheel)], cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr
    r = _run([str(py), "-c", "import proctable; print(len(proctable.snapshot()))"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert int(r.stdout) > 1
    r = _run([str(tmp_path / "venv" / "bin" / "proctable"), "ps"], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert str(os.getpid()) in r.stdout


@slow
@needs_tree
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the BPF reader is Linux-only")
def test_build_without_bpf_tools_makes_a_proc_only_wheel_and_says_so(
        tmp_path: pathlib.Path) -> None:
    py = _venv(tmp_path / "venv")
    src = _copy_tree(tmp_path / "src")
    out = tmp_path / "out"
    env = dict(os.environ, PROCTABLE_BUILD_BPF="0")
    r = _run([str(py), "-m", "pip", "wheel", "-v", "--no-deps", "-w", str(out), str(src)],
             cwd=tmp_path, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "building without the BPF reader (PROCTABLE_BUILD_BPF=0)" in r.stdout + r.stderr
    (wheel,) = out.glob("*.whl")
    r = _run([str(py), "-m", "pip", "install", "--quiet", str(wheel)], cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr
    code = "import proctable; print(proctable.reader()); print(len(proctable.snapshot()))"
    r = _run([str(py), "-c", code], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    first, count = r.stdout.splitlines()
    assert first == ("Reader(name='proc', why_not='built without BPF (PROCTABLE_BUILD_BPF=0)')")
    assert int(count) > 1
    env = dict(os.environ, PROCTABLE_BUILD_BPF="0", PROCTABLE_REQUIRE_BPF="1")
    r = _run([str(py), "-m", "pip", "wheel", "--no-deps", "-w", str(tmp_path / "out2"), str(src)],
             cwd=tmp_path, timeout=300, env=env)
    assert r.returncode != 0
    assert "PROCTABLE_REQUIRE_BPF=1, but the BPF reader cannot be built" in r.stdout + r.stderr


def _in_pty(args: list[str], cwd: pathlib.Path, env: dict[str, str],
            timeout: float = 300) -> tuple[int, str]:
    """Run args with a pseudo-terminal as its controlling terminal (a person's
    `pip install .`): (exit code, all it showed there)."""
    import pty
    import select
    import signal
    import time

    pid, master = pty.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.chdir(cwd)
            os.execvpe(args[0], args, env)
        finally:
            os._exit(127)
    out = b""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            r, _, _ = select.select([master], [], [], 1.0)
            if r:
                try:
                    data = os.read(master, 65536)
                except OSError:  # EIO: the child closed the terminal
                    break
                if not data:
                    break
                out += data
    finally:
        os.close(master)
        got, status = os.waitpid(pid, os.WNOHANG)
        if got == 0:
            os.kill(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), out.decode(errors="replace")


@slow
@needs_tree
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the BPF reader is Linux-only")
@pytest.mark.skipif(str(proctable.reader().why_not).startswith("built without BPF"),
                    reason="this build has no BPF reader: the tools to build one are missing")
def test_a_build_without_bpf_says_so_and_never_decides_the_next_build(
        tmp_path: pathlib.Path) -> None:
    # A plain `pip install .` without the BPF tools, then again with them (here:
    # PROCTABLE_BUILD_BPF=0, then unset), from the same tree and its build/.
    py = _venv(tmp_path / "venv")
    src = _copy_tree(tmp_path / "src")
    env = dict(os.environ, PROCTABLE_BUILD_BPF="0")
    rc, shown = _in_pty([str(py), "-m", "pip", "install", "--quiet", str(src)], tmp_path, env)
    assert rc == 0, shown[-3000:]
    # the note reaches the person at the terminal, without pip -v
    assert "building without the BPF reader (PROCTABLE_BUILD_BPF=0)" in shown, shown[-3000:]
    code = "import proctable; print(proctable.reader().why_not)"
    r = _run([str(py), "-c", code], cwd=tmp_path)
    assert r.stdout.strip() == "built without BPF (PROCTABLE_BUILD_BPF=0)", r.stderr
    env.pop("PROCTABLE_BUILD_BPF")
    r = _run([str(py), "-m", "pip", "install", "--quiet", str(src)], cwd=tmp_path,
             timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    r = _run([str(py), "-c", code], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert not r.stdout.startswith("built without BPF"), r.stdout  # the stale object is not reused


@slow
@needs_tree
def test_build_without_cffi_fails_instead_of_making_a_pure_wheel(tmp_path: pathlib.Path) -> None:
    py = _venv(tmp_path / "venv")
    r = _run([str(py), "-m", "pip", "install", "--quiet", "setuptools>=77", "wheel"],
             cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr
    src = _copy_tree(tmp_path / "src")
    out = tmp_path / "out"
    r = _run([str(py), "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-w", str(out),
              str(src)], cwd=tmp_path, timeout=300)
    assert r.returncode != 0
    assert "proctable needs cffi to build its C core" in r.stdout + r.stderr
    assert not list(out.glob("*.whl"))


# -- the release configuration (source tree) ---------------------------------------------

WORKFLOWS = ROOT / ".github" / "workflows"
_PINNED = re.compile(r"uses:\s*[\w.-]+/[\w./-]+@[0-9a-f]{40}\s+#\s*v\d")


@pytest.mark.skipif(not WORKFLOWS.is_dir(), reason="no .github/workflows (not a git checkout)")
@pytest.mark.parametrize("name", ["ci.yml", "wheels.yml"])
def test_workflow_actions_are_pinned_and_permissions_least(name: str) -> None:
    text = (WORKFLOWS / name).read_text()
    uses = [line.strip() for line in text.splitlines() if re.match(r"\s*-?\s*uses:", line)]
    assert uses
    assert [u for u in uses if not _PINNED.search(u)] == [], "pin every action to a full SHA"
    assert re.search(r"^permissions:\n  contents: read\n", text, re.MULTILINE)
    # Only the publish job may mint an OIDC token (trusted publishing).
    assert text.count("id-token: write") == (1 if name == "wheels.yml" else 0)


@needs_tree
def test_cibuildwheel_builds_one_abi3_wheel_per_platform() -> None:
    try:
        import tomllib
    except ImportError:  # Python < 3.11
        tomllib = pytest.importorskip("tomli")
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())
    cibw = cfg["tool"]["cibuildwheel"]
    assert cibw["build"] == ["cp39-*", "cp314-*", "cp314t-*"]
    assert cibw["test-command"].startswith("pytest {project}/tests")
    assert cibw["test-extras"] == ["test"]
    linux = cibw["linux"]
    # The release wheels carry the BPF reader: its tools in the build container,
    # and a build that cannot make it fails (the test command sees the variable too).
    assert all(tool in linux["before-all"] for tool in ("clang", "bpftool", "libbpf-devel"))
    musl = [o for o in cibw["overrides"] if o["select"] == "*-musllinux*"]
    assert musl and all(t in musl[0]["before-all"] for t in ("clang", "bpftool", "libbpf-dev"))
    assert linux["environment"] == {"PROCTABLE_REQUIRE_BPF": "1"}
    ini = cfg["tool"]["pytest"]["ini_options"]
    assert {"-ra", "--strict-markers", "--strict-config"} <= set(ini["addopts"])
    assert ini["xfail_strict"] is True
    assert ini["testpaths"] == ["tests"]  # benchmarks/ stays out of the plain run
