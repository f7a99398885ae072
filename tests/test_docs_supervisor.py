"""The supervisor page's examples run as written, and do what the page says.

Each block runs alone, in a fresh namespace, as a reader would paste it, in a fresh
interpreter whose leftovers are a failure (tests/test_docs.py's runner, which runs
every other page's blocks in sequence); this test checks what they print too: a
command that cannot start raises and emits nothing, a restart that cannot start
gives up."""

from __future__ import annotations

import pathlib
import re

import pytest

from .test_docs import run_examples

PAGE = pathlib.Path(__file__).resolve().parent.parent / "docs" / "supervisor.md"


@pytest.mark.skipif(not PAGE.exists(), reason="needs docs/ beside tests/")
def test_the_supervisor_examples_run_as_written(tmp_path: pathlib.Path) -> None:
    blocks = re.findall(r"```python\n(.*?)```", PAGE.read_text(), flags=re.S)
    assert len(blocks) == 11  # (the durable example, and wait/signal and typed events)
    out = run_examples(PAGE, tmp_path, alone=True).splitlines()
    assert "created agent 1 " in out and "exited agent 1 killed" in out
    assert "deleted agent 2 " in out and "created job 1 " in out
    # A command that cannot start: raised by start(), no event for the key...
    assert any(line.startswith("cannot start: ") for line in out)
    tool = [line for line in out if " tool " in line]
    assert [line.split()[0] for line in tool] == ["created", "exited", "restarting", "gave_up"]
    # ...and a restart that cannot start: gave_up, with the reason.
    assert "could not start ['no-such-tool']" in tool[-1]
    assert not any(line.startswith("still there:") for line in out)  # sleep obeys SIGTERM
    assert "created agent 1" in out and "exited agent 1" in out  # the asyncio example
    # The output example: its bytes, tagged by stream, between created and exited.
    job = [line for line in out if " job " in line]
    assert job[0] == "created job 1 " and job[-1] == "exited job 1 exited", job
    assert "output job 1 stdout b'hello\\n'" in job and "output job 1 stderr b'oops\\n'" in job
    assert "b'hello\\noops\\n'" in out
    assert "resized: True" in out  # the pty example: stty size followed the resize
    # The asyncio example with output and a pty: the build's bytes, the shell's answer.
    assert "build wrote stdout b'compiled\\n'" in out and "shell showed: True" in out
    # health: a timeout no timer holds is refused at the call; the threads all run.
    assert any(line.startswith("timeout must be at most 1e+09 seconds") for line in out)
    assert "()" in out
