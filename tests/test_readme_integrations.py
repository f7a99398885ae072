"""The README's examples of process_iter and of the pytest plugin run as written.

Every ```python block of the two sections runs: a block that starts with
"# test_<name>.py" is a test file, run by a pytest of its own with
--leaked-processes=fail (it must pass); the others are executed as they stand.
"""

from __future__ import annotations

import contextlib
import io
import pathlib
import re

import pytest

from ._reliability import linux_only

pytestmark = linux_only

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"
SECTIONS = ("## psutil-compatible iteration", "## A pytest plugin: no test leaves a process behind")


def _blocks() -> list[tuple[str, str]]:
    if not README.exists():
        return []
    text = README.read_text()
    out = []
    for title in SECTIONS:
        start = text.index(title + "\n")
        end = text.find("\n## ", start + len(title))
        body = text[start:end if end >= 0 else len(text)]
        for i, code in enumerate(re.findall(r"```python\n(.*?)```", body, re.S)):
            out.append((f"{title[3:].split(':')[0]} #{i + 1}", code))
    return out


BLOCKS = _blocks()
needs_readme = pytest.mark.skipif(not BLOCKS, reason="needs the README beside tests/")


@needs_readme
def test_every_section_has_examples() -> None:
    names = {name.rsplit(" #", 1)[0] for name, _ in BLOCKS}
    assert len(names) == 2
    assert any(code.startswith("# test_") for _, code in BLOCKS)


@needs_readme
@pytest.mark.parametrize("code", [c for _, c in BLOCKS if not c.startswith("# test_")],
                         ids=[n for n, c in BLOCKS if not c.startswith("# test_")])
def test_python_example_runs(code: str) -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), {"__name__": "readme_example"})


@needs_readme
@pytest.mark.parametrize("code", [c for _, c in BLOCKS if c.startswith("# test_")],
                         ids=[n for n, c in BLOCKS if c.startswith("# test_")])
def test_test_file_example_passes_with_fail(pytester: pytest.Pytester, code: str) -> None:
    name = code.split("\n", 1)[0][2:].strip()
    (pytester.path / name).write_text(code)
    r = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--leaked-processes=fail",
                                      name, timeout=120)
    r.assert_outcomes(passed=code.count("\ndef test_"))
    assert "leaked processes" not in r.stdout.str()
