"""The docs are tested: every Python example runs as written, the command-line
reference is the parser's, every page is in the site, and the site builds clean.

The conventions for examples are in docs/development.md ("Examples are tests").
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest

import proctable

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PY = sys.executable
needs_docs = pytest.mark.skipif(not DOCS.is_dir(), reason="needs docs/ beside tests/")

PAGES = sorted([ROOT / "README.md", *DOCS.glob("*.md")]) if DOCS.is_dir() else []
_BLOCK = re.compile(r"^```python\n(.*?)^```\s*$", re.MULTILINE | re.DOTALL)
_SETUP = re.compile(r"<!-- examples: setup\n(.*?)-->", re.DOTALL)

# The placeholder command of the examples: "your program", a real one here.
_AGENT = "#!/bin/sh\nexec sleep 30\n"

# Runs one page's blocks in order, in one namespace or each in a fresh one (as a
# reader would paste it alone); a failure names page:line.
_RUNNER = r"""
import json, sys
page, blocks, alone = json.load(open(sys.argv[1]))
ns = {"__name__": "__main__"}
for line, code in blocks:
    exec(compile(code, f"{page}:{line}", "exec"), {"__name__": "__main__"} if alone else ns)
print("examples ok", flush=True)
"""


def examples(page: pathlib.Path) -> list[tuple[int, str]]:
    """(first line, code) of the page's setup comment and its python blocks, in order."""
    text = page.read_text()
    out = []
    for m in _SETUP.finditer(text):
        out.append((text[:m.start(1)].count("\n") + 1, textwrap.dedent(m.group(1))))
    for m in _BLOCK.finditer(text):
        out.append((text[:m.start(1)].count("\n") + 1, m.group(1)))
    return out


def _page_id(p: pathlib.Path) -> str:
    return str(p.relative_to(ROOT))


def run_examples(page: pathlib.Path, tmp_path: pathlib.Path, alone: bool = False) -> str:
    """The page's examples run as written in a fresh interpreter (in one namespace,
    or each block alone), as a lineage: whatever they leave running is ended and
    is a failure. Their stdout."""
    import json

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    agent = bin_dir / "agent"
    agent.write_text(_AGENT)
    agent.chmod(0o755)
    spec = tmp_path / "blocks.json"
    spec.write_text(json.dumps([_page_id(page), examples(page), alone]))
    runner = tmp_path / "runner.py"
    runner.write_text(_RUNNER)
    env = {**os.environ,
           "PATH": os.pathsep.join([str(bin_dir), os.path.dirname(PY),
                                    os.environ.get("PATH", "")])}
    out_path, err_path = tmp_path / "out", tmp_path / "err"
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        # Files, not pipes: a process an example leaves behind would hold a pipe open.
        lin = proctable.Lineage.spawn([PY, str(runner), str(spec)], stdout=out, stderr=err,
                                      stdin=subprocess.DEVNULL, cwd=tmp_path, env=env)
        try:
            rc = lin.process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            rc = None
        finally:
            report = lin.terminate(grace=1.0, kill_timeout=5.0)  # ends what they left
    stdout, stderr = out_path.read_text(), err_path.read_text()
    assert rc == 0, f"{_page_id(page)}: exit {rc}\n{stdout}\n{stderr}"
    assert stdout.rstrip().endswith("examples ok")
    left = report.termed + report.killed  # running still when the examples ended
    assert not left, f"{_page_id(page)}: the examples left {left} running"
    return stdout


# Pages whose examples a test of their own runs (each block alone, with what they
# print checked): tests/test_docs_supervisor.py.
OWN_TEST = {"docs/supervisor.md"}


@needs_docs
@pytest.mark.parametrize("page", [p for p in PAGES if examples(p)
                                  and _page_id(p) not in OWN_TEST], ids=_page_id)
def test_every_python_example_runs_as_written(page: pathlib.Path,
                                              tmp_path: pathlib.Path) -> None:
    run_examples(page, tmp_path)


@needs_docs
def test_the_readme_and_the_guides_have_examples() -> None:
    for name in ("README.md", "docs/getting-started.md", "docs/table.md", "docs/exits.md",
                 "docs/protocol.md"):
        assert examples(ROOT / name), f"{name} has no python example"


@needs_docs
def test_the_cli_reference_is_the_parser() -> None:
    from proctable.cli._reference import markdown

    page = (DOCS / "cli.md").read_text()
    assert page == markdown(), (
        "docs/cli.md is out of date: python -m proctable.cli._reference > docs/cli.md")


@needs_docs
def test_every_page_is_in_the_site_and_every_link_resolves() -> None:
    nav = (ROOT / "mkdocs.yml").read_text()
    for page in DOCS.glob("*.md"):
        assert re.search(rf":\s+{re.escape(page.name)}\s*$", nav, re.MULTILINE), page.name
    for md in [ROOT / "README.md", *DOCS.glob("*.md")]:
        for target in re.findall(r"\]\(([^)#\s]+\.md)(?:#[^)]*)?\)", md.read_text()):
            assert (md.parent / target).is_file(), f"{md.name}: broken link {target}"


@needs_docs
@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None,
                    reason="the docs extra is not installed (pip install '.[docs]')")
def test_the_site_builds_with_warnings_as_errors(tmp_path: pathlib.Path) -> None:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    r = subprocess.run([PY, "-m", "mkdocs", "build", "--strict", "--site-dir",
                        str(tmp_path / "site")], cwd=ROOT, capture_output=True, text=True,
                       timeout=300, check=False, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "WARNING" not in r.stderr
    api = (tmp_path / "site" / "api" / "index.html").read_text()
    assert "The whole process table, read in one pass" in api  # from snapshot's docstring
    # Docstrings use Sphinx roles (:class:`Identity`); the reference shows them as
    # code or links, never as raw role text.
    raw = {}
    for page in (tmp_path / "site").rglob("*.html"):
        found = _ROLE.findall(page.read_text())
        if found:
            raw[str(page.relative_to(tmp_path / "site"))] = found[:5]
    assert raw == {}, raw
    # a role naming a public object is a link to its entry
    assert re.search(r'<a [^>]*href="#proctable\.Identity"[^>]*>\s*<code>Identity</code>', api), (
        "a role naming a public class is not a link to it")


_ROLE = re.compile(r":(?:class|func|meth|attr|exc|data|mod|obj|py:\w+):(?:<code>|`)")


def _section(text: str, heading: str) -> str:
    """The body of the Markdown section with this heading (up to the next one of
    its level or higher)."""
    m = re.search(rf"^(#+) {re.escape(heading)}\s*$", text, re.M)
    assert m is not None, f"no section {heading!r}"
    level = len(m.group(1))
    end = re.search(rf"^#{{1,{level}}} ", text[m.end():], re.M)
    return text[m.end(): m.end() + end.start() if end else len(text)]


@needs_docs
def test_the_readme_says_how_to_get_the_fast_reader_from_source() -> None:
    section = _section((ROOT / "README.md").read_text(), "Building from source")
    # the packages, per distribution, each on its package manager's command line
    for distro, line in (("Debian", r"apt(-get)? install .*clang.*bpftool.*libbpf-dev"),
                         ("Fedora", r"dnf install .*clang.*bpftool.*libbpf-devel"),
                         ("Alpine", r"apk add .*clang.*bpftool.*libbpf-dev")):
        assert distro in section and re.search(line, section), distro
    assert "Ubuntu" in section
    # the check: proctable.reader(), in an example that runs (test_examples_run)
    assert any("proctable.reader()" in code for code in _BLOCK.findall(section))
    # the build's note sends the reader here
    builder = (ROOT / "csrc" / "build_ffi.py").read_text()
    assert "'Building from source'" in builder


@needs_docs
def test_the_built_site_is_git_ignored() -> None:
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    r = subprocess.run(["git", "check-ignore", "-q", "site/index.html"], cwd=ROOT,
                       capture_output=True, timeout=60, check=False)
    assert r.returncode == 0, "site/ (mkdocs build's output) is not in .gitignore"


@needs_docs
def test_the_docs_say_a_lineage_starts_helpers_and_what_the_first_read_costs() -> None:
    lineage = (DOCS / "lineage.md").read_text()
    intro = lineage[: lineage.index("\n## ")]
    assert re.search(r"helper process", intro), "lineage.md's opening does not say it"
    readme = _section((ROOT / "README.md").read_text(), "Lineage")
    assert re.search(r"helper process", readme)
    bpf = _section((DOCS / "table.md").read_text(), "The BPF reader")
    assert re.search(r"first (table )?read[^.]*\d+ ms", bpf), "the first read's cost"
    readme_src = _section((ROOT / "README.md").read_text(), "Building from source")
    assert re.search(r"first (table )?read[^.]*\d+ ms", readme_src)
