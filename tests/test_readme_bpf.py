"""The README's examples of the BPF reader run as written."""

from __future__ import annotations

import pathlib
import re
import subprocess

import pytest

from .conftest import PY

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"


def _section(title: str) -> str:
    text = README.read_text()
    start = text.index(f"### {title}\n")
    end = min(i for i in (text.find("\n## ", start + 1), text.find("\n### ", start + 1))
              if i > 0)
    return text[start:end]


def _examples() -> list[str]:
    if not README.exists():
        return []
    return re.findall(r"```python\n(.*?)```", _section("The BPF reader"), re.DOTALL)


@pytest.mark.skipif(not README.exists(), reason="needs the README beside tests/ (a checkout)")
def test_the_section_has_examples() -> None:
    assert _examples()


@pytest.mark.parametrize("code", _examples())
def test_example_runs_as_written(code: str, tmp_path: pathlib.Path) -> None:
    r = subprocess.run([PY, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                       timeout=120, check=False)
    assert r.returncode == 0, r.stderr
