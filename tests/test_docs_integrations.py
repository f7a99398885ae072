"""The integrations page's examples: the test-file example passes under the plugin.

tests/test_docs.py runs every ```python block of the README and docs/ as
written; a block that starts with "# test_<name>.py" is a test file as well,
and here it runs as one, in a pytest of its own with --leaked-processes=fail:
it must pass, and leave nothing to report.
"""

from __future__ import annotations

import pathlib
import re

import pytest

from ._reliability import linux_only

pytestmark = linux_only

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "integrations.md"
_BLOCK = re.compile(r"^```python\n(.*?)^```\s*$", re.MULTILINE | re.DOTALL)


def _sections() -> dict[str, list[str]]:
    """Section title -> its python blocks."""
    if not PAGE.exists():
        return {}
    out: dict[str, list[str]] = {}
    for part in re.split(r"^## ", PAGE.read_text(), flags=re.MULTILINE)[1:]:
        title, _, body = part.partition("\n")
        out[title.strip()] = _BLOCK.findall(body)
    return out


SECTIONS = _sections()
TEST_FILES = [code for blocks in SECTIONS.values() for code in blocks
              if code.startswith("# test_")]
needs_page = pytest.mark.skipif(not SECTIONS, reason="needs docs/ beside tests/")


@needs_page
def test_both_sections_have_examples_and_the_readme_points_to_them() -> None:
    assert SECTIONS["psutil-compatible iteration"]
    assert SECTIONS["A pytest plugin: no test leaves a process behind"]
    assert TEST_FILES
    readme = (ROOT / "README.md").read_text()
    for title in ("## psutil-compatible iteration",
                  "## No test leaves a process behind: the pytest plugin"):
        assert title in readme
    assert readme.count("(docs/integrations.md)") >= 2


@needs_page
@pytest.mark.parametrize("code", TEST_FILES, ids=[c.split("\n", 1)[0][2:] for c in TEST_FILES])
def test_test_file_example_passes_with_fail(pytester: pytest.Pytester, code: str) -> None:
    name = code.split("\n", 1)[0][2:].strip()
    (pytester.path / name).write_text(code)
    r = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--leaked-processes=fail",
                                      name, timeout=120)
    r.assert_outcomes(passed=code.count("\ndef test_"))
    assert "leaked processes" not in r.stdout.str()
