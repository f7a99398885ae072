"""The README's supervisor section runs as written (its examples are tests)."""

from __future__ import annotations

import pathlib
import re

import pytest

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"


def _section_blocks(title: str) -> list[str]:
    text = README.read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    section = text[start:end if end >= 0 else None]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


@pytest.mark.skipif(not README.exists(), reason="needs the source tree (README.md beside tests/)")
def test_the_supervisor_examples_run_as_written(capsys: pytest.CaptureFixture[str]) -> None:
    blocks = _section_blocks("Supervisor")
    assert len(blocks) == 4
    namespace: dict[str, object] = {"__name__": "readme"}
    for block in blocks:
        exec(compile(block, str(README), "exec"), namespace)  # the README's own code
    out = capsys.readouterr().out.splitlines()
    assert "created agent 1 " in out and "exited agent 1 killed" in out
    assert "deleted agent 2 " in out and "created job 1 " in out
    # A command that cannot start: raised by start(), no event for the key...
    assert any(line.startswith("cannot start: ") for line in out)
    tool = [line for line in out if " tool " in line]
    assert [line.split()[0] for line in tool] == ["created", "exited", "restarting", "gave_up"]
    # ...and a restart that cannot start: gave_up, with the reason.
    assert "could not start ['no-such-tool']" in tool[-1]
    assert not any(line.startswith("still there:") for line in out)  # sleep obeys SIGTERM
    assert out[-2:] == ["created agent 1", "exited agent 1"]  # the asyncio example's events
