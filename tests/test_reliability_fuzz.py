"""The stat-line parser under fuzzing.

A short libFuzzer run of fuzz/fuzz_stat.c (ASan + UBSan, seeded with the real
stat lines of fuzz/corpus/) when clang has libFuzzer; the long run is
``bash fuzz/run.sh`` (see fuzz/run.sh and the README). Everywhere, the same
invariants are checked from Python over the seed corpus and over random
mutations of it through ``proctable.parse_stat``.
"""

from __future__ import annotations

import os
import pathlib
import random
import shutil
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import proctable

from ._reliability import SLOW

ROOT = pathlib.Path(__file__).resolve().parent.parent
FUZZ = ROOT / "fuzz"
CORPUS = FUZZ / "corpus"


def _seeds() -> list[bytes]:
    if not CORPUS.is_dir():
        return []
    return [p.read_bytes() for p in sorted(CORPUS.iterdir())]


SEEDS = _seeds()
needs_corpus = pytest.mark.skipif(not SEEDS, reason="fuzz/corpus/ is not in this checkout")


def check_parsed(line: bytes, p: proctable.Proc) -> None:
    """The contract of a line the parser accepted (as fuzz/fuzz_stat.c checks it in C)."""
    assert 0 < p.pid <= 2**31 - 1
    assert len(p.state) == 1 and p.state.isascii() and p.state.isalpha()
    assert 0 <= p.ppid <= 2**31 - 1 and 0 <= p.pgid <= 2**31 - 1 and 0 <= p.sid <= 2**31 - 1
    assert -(2**31) <= p.tty_nr <= 2**31 - 1
    assert p.start_time >= 0 and p.utime >= 0 and p.stime >= 0
    assert p.rss is None and p.vms is None  # a stat line's rss is an estimate: not kept
    assert 0 <= p.num_threads <= 2**31 - 1
    assert p.uid is None  # a stat line carries no uid
    comm = line[line.index(b"(") + 1:line.rindex(b")")]
    assert p.name.encode("utf-8", "surrogateescape") == comm
    assert len(comm) <= 64


def parse_or_none(line: bytes) -> proctable.Proc | None:
    try:
        p = proctable.parse_stat(line)
    except ValueError:
        return None
    check_parsed(line, p)
    return p


# --- the seed corpus ------------------------------------------------------------


@needs_corpus
@pytest.mark.parametrize("name", sorted(p.name for p in CORPUS.iterdir()) if SEEDS else [])
def test_seed_lines_parse(name: str) -> None:
    """Every real line of the corpus parses, except the 65-byte comm (one too many)."""
    line = (CORPUS / name).read_bytes()
    if name == "comm_65_bytes":
        with pytest.raises(ValueError, match="comm"):
            proctable.parse_stat(line)
        return
    p = proctable.parse_stat(line)
    check_parsed(line, p)
    if name.startswith("zombie_"):
        assert p.state == "Z" and p.exit is not None
        if name == "zombie_exit7":
            assert p.exit.code == 7
        else:
            assert p.exit.signal == 9
    if name == "comm_64_bytes":
        assert len(p.name) == 64
    if name == "pre_3_5_fields":
        assert p.raw_exit_code is None
    if name == "comm_newline":
        assert "\n" in p.name


# --- mutations through the Python API (runs everywhere) ---------------------------


def _mutate(rng: random.Random, line: bytes) -> bytes:
    b = bytearray(line)
    for _ in range(rng.randint(1, 6)):
        op = rng.randrange(6)
        i = rng.randrange(len(b) + 1) if b else 0
        if op == 0 and b:
            b[min(i, len(b) - 1)] = rng.randrange(256)
        elif op == 1:
            b[i:i] = rng.choice([b")", b"(", b" ", b"-", b"\n", b"9" * rng.randint(1, 25), b"\0"])
        elif op == 2 and b:
            del b[i:i + rng.randint(1, 8)]
        elif op == 3:
            b = b[:i]
        elif op == 4:
            b[i:i] = b[rng.randrange(len(b) + 1):][:rng.randint(1, 40)]
        else:
            b += b" " + str(rng.choice([0, -1, 2**31, 2**63, 2**64 - 1, 2**64])).encode()
    return bytes(b)


@needs_corpus
def test_random_mutations_never_crash() -> None:
    """Mutated real lines: ValueError, or a row that keeps every invariant."""
    rng = random.Random(8)
    count = 200_000 if SLOW else 20_000
    accepted = 0
    for _ in range(count):
        if parse_or_none(_mutate(rng, rng.choice(SEEDS))) is not None:
            accepted += 1
    assert 0 < accepted < count  # the mutations reach both outcomes


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.binary(max_size=512))
def test_arbitrary_bytes_never_crash(data: bytes) -> None:
    parse_or_none(data)


# --- libFuzzer ------------------------------------------------------------------


def _libfuzzer_missing(tmp: pathlib.Path) -> str | None:
    """Why a libFuzzer build with ASan/UBSan cannot run here, or None when it can."""
    if not sys.platform.startswith("linux"):
        return "the libFuzzer run is set up for Linux"
    if not (FUZZ / "run.sh").is_file() or not SEEDS:
        return "fuzz/ is not in this checkout"
    cc = shutil.which("clang")
    if cc is None:
        return "clang is not installed (libFuzzer needs it: apt-get install clang)"
    probe = tmp / "probe.c"
    probe.write_text(
        "#include <stddef.h>\n#include <stdint.h>\n"
        "int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { (void)d; (void)n; return 0; }\n"
    )
    r = subprocess.run(
        [cc, "-fsanitize=fuzzer,address,undefined", str(probe), "-o", str(tmp / "probe")],
        capture_output=True, timeout=120, check=False,
    )
    if r.returncode != 0:
        return ("clang cannot link -fsanitize=fuzzer,address,undefined (no libFuzzer or "
                "sanitizer runtime): " + r.stderr.decode(errors="replace").strip()[-200:])
    return None


def _fuzz_env(out: pathlib.Path) -> dict[str, str]:
    # Not the sanitizer setup of scripts/asan_tests.sh (gcc's libasan preloaded):
    # the fuzzer brings clang's own runtime.
    drop = {"LD_PRELOAD", "ASAN_OPTIONS", "UBSAN_OPTIONS", "PYTHONMALLOC"}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    return {**env, "FUZZ_OUT": str(out), "CC": "clang"}


def test_libfuzzer_short_run(tmp_path: pathlib.Path) -> None:
    """A few seconds of fuzz/run.sh: libFuzzer + ASan + UBSan over pt_parse_stat."""
    why = _libfuzzer_missing(tmp_path)
    if why is not None:
        pytest.skip(why)
    runs = 2_000_000 if SLOW else 20_000
    out = tmp_path / "out"
    r = subprocess.run(
        ["bash", str(FUZZ / "run.sh"), f"-runs={runs}"],
        env=_fuzz_env(out),
        capture_output=True, timeout=600, check=False,
    )
    log = r.stderr.decode(errors="replace")
    assert r.returncode == 0, log[-3000:]
    assert f"stat::number_of_executed_units: {runs}" in log
    assert not list(out.glob("crash-*")) and not list(out.glob("leak-*"))
