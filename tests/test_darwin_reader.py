"""The macOS reader (csrc/pt_darwin.c, with csrc/pt_portable.c), built and run
on any POSIX host.

It is compiled against the stand-in headers in tests/darwin_stub/ and linked with
fake_libproc.c, which serves a scripted process table; test_darwin.c checks every
row field against that script. This keeps pt_darwin.c compiling and correct where
no Mac is at hand.
"""

from __future__ import annotations

import pathlib
import shutil
import subprocess

import pytest

TESTS = pathlib.Path(__file__).resolve().parent
ROOT = TESTS.parent
CSRC = ROOT / "csrc"
STUB = TESTS / "darwin_stub"

SOURCES = [
    CSRC / "pt_darwin.c",
    CSRC / "pt_portable.c",
    CSRC / "pt_stat.c",
    STUB / "fake_libproc.c",
    STUB / "test_darwin.c",
]

pytestmark = [
    pytest.mark.skipif(
        not (CSRC / "pt_darwin.c").is_file(),
        reason="csrc/ is not next to tests/ (tests run outside a source checkout)",
    ),
    pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc) on PATH"),
]


def test_darwin_reader_against_fake_libproc(tmp_path: pathlib.Path) -> None:
    exe = tmp_path / "test_darwin"
    cmd = [
        "cc",
        "-std=c99",
        "-Wall",
        "-Wextra",
        "-Werror",
        "-I",
        str(STUB),
        "-I",
        str(CSRC),
        *(str(s) for s in SOURCES),
        "-o",
        str(exe),
    ]
    built = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert built.returncode == 0, f"compile failed:\n{built.stderr}"

    ran = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60, check=False)
    assert ran.returncode == 0, f"darwin reader checks failed:\n{ran.stderr}{ran.stdout}"
    assert "checks passed" in ran.stdout
    assert ran.stdout.startswith("darwin reader: ")
