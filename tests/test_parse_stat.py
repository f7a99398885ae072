"""The C stat-line parser, through proctable.parse_stat: tables and properties."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import proctable
from proctable import _lowlevel

# Real lines: a sleeping shell, a kernel thread with a long name, a zombie.
SHELL = (b"1106 (bash) S 1105 1106 1106 34816 3136 4194560 4370 22123 0 4 6 8 40 12 20 0 1 0 "
         b"1540 8962048 1231 18446744073709551615 94171539070976 94171540044981 "
         b"140722525669936 0 0 0 65536 3686404 1266761467 1 0 0 17 1 0 0 0 0 0 "
         b"94171540290128 94171540337780 94171563122688 140722525675367 140722525675372 "
         b"140722525675372 140722525675502 0\n")
KTHREAD = (b"12 (kworker/u8:0-events_unbound_with_a_much_longer_name_of_64_bytes_) I 2 0 0 0 "
           b"-1 69238880 0 0 0 0 0 13 0 0 0 -20 1 0 26 0 0 18446744073709551615 0 0 0 0 0 0 0 "
           b"2147483647 0 0 0 0 17 0 0 0 0 0 0 0 0 0 0 0 0 0\n")
ZOMBIE = (b"4242 (py) Z 4000 4000 1106 0 -1 4227084 10 0 0 0 1 2 0 0 20 0 1 0 9999 0 0 "
          b"18446744073709551615 0 0 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0 0 0 0 0 0 0 0 1792\n")


def test_shell_line() -> None:
    p = proctable.parse_stat(SHELL)
    assert (p.pid, p.ppid, p.pgid, p.sid, p.tty_nr) == (1106, 1105, 1106, 1106, 34816)
    assert (p.state, p.name, p.num_threads, p.start_time) == ("S", "bash", 1, 1540)
    hz = os.sysconf("SC_CLK_TCK")
    assert p.utime == pytest.approx(6 / hz) and p.stime == pytest.approx(8 / hz)
    # Field 24 (1231 pages) is the kernel's per-CPU estimate: the exact rss comes
    # from statm, which a stat line does not carry.
    assert p.rss is None and p.vms is None
    assert p.raw_exit_code == 0
    assert p.uid is None  # the line does not carry it
    assert p.exit is None


def test_kernel_thread_with_64_byte_comm() -> None:
    p = proctable.parse_stat(KTHREAD)
    assert len(p.name.encode()) == 64
    assert (p.pid, p.ppid, p.state, p.tty_nr) == (12, 2, "I", 0)


def test_zombie_line_decodes_field_52() -> None:
    p = proctable.parse_stat(ZOMBIE)
    assert p.state == "Z"
    assert p.exit == proctable.ExitStatus(7, None, False, 1792)


@pytest.mark.parametrize(
    "name", [b"a b", b"a) Z 1 (", b")", b"((", b"", b"x)y) S 1", "\u00e9t\u00e9".encode()]
)
def test_names_with_spaces_and_parens(name: bytes) -> None:
    line = SHELL.replace(b"(bash)", b"(" + name + b")")
    p = proctable.parse_stat(line)
    assert p.name.encode("utf-8", "surrogateescape") == name
    assert (p.pid, p.ppid, p.state, p.start_time) == (1106, 1105, "S", 1540)


def test_name_of_65_bytes_is_refused() -> None:
    with pytest.raises(ValueError, match="comm"):
        proctable.parse_stat(SHELL.replace(b"(bash)", b"(" + b"x" * 65 + b")"))


def test_old_kernel_line_without_field_52() -> None:
    fields = SHELL.rstrip(b"\n").split(b" ")
    p = proctable.parse_stat(b" ".join(fields[:44]))  # Linux 2.6: 44 fields
    assert p.raw_exit_code is None
    assert p.start_time == 1540


def test_extra_trailing_fields_are_accepted() -> None:
    p = proctable.parse_stat(SHELL.rstrip(b"\n") + b" 5 6 7\n")
    assert p.pid == 1106


@pytest.mark.parametrize(
    "line",
    [
        b"",
        b"\n",
        b"garbage",
        b"1106",
        b"1106 (bash",
        b"1106 bash) S 1",
        b"-5 (x) S 1 1 1 0",
        b"0 (x) S 1 1 1 0",
        b"99999999999 (x) S 1 1 1 0",
        SHELL[:40],                                  # truncated before field 24
        SHELL.replace(b") S ", b") SS "),            # two-letter state
        SHELL.replace(b") S ", b") 5 "),             # digit state
        SHELL.replace(b" 1105 ", b" 11x5 "),         # letters in a number
        SHELL.replace(b" 1105 ", b" -1105 "),        # negative ppid
        SHELL.replace(b" 1540 ", b" 99999999999999999999999 "),  # overflow
        SHELL.replace(b" 1105 ", b"  1105 "),        # double space
        SHELL.rstrip(b"\n") + b" \n",                # trailing space
        SHELL + b"more",                             # data after the newline
        SHELL.replace(b"\n", b"\x00"),
    ],
)
def test_malformed_lines_raise_value_error(line: bytes) -> None:
    with pytest.raises(ValueError, match="malformed stat line"):
        proctable.parse_stat(line)


def test_parse_stat_wants_bytes() -> None:
    with pytest.raises(TypeError):
        proctable.parse_stat(SHELL.decode())  # type: ignore[arg-type]


def test_every_truncation_of_real_lines_is_safe() -> None:
    for line in (SHELL, KTHREAD, ZOMBIE):
        for n in range(len(line) + 1):
            try:
                p = proctable.parse_stat(line[:n])
            except ValueError:
                continue
            # A prefix that parses must agree with the whole line on what it has.
            full = proctable.parse_stat(line)
            assert (p.pid, p.name, p.state, p.ppid) == (full.pid, full.name, full.state, full.ppid)


def test_real_lines_of_this_machine_parse() -> None:
    n = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                line = f.read()
        except OSError:
            continue
        p = proctable.parse_stat(line)
        assert p.pid == int(entry)
        n += 1
    assert n > 0


mutation = st.tuples(st.integers(min_value=0, max_value=400), st.binary(max_size=8),
                     st.integers(min_value=0, max_value=8))


@settings(max_examples=500, deadline=None)
@given(base=st.sampled_from([SHELL, KTHREAD, ZOMBIE]), edits=st.lists(mutation, max_size=6))
def test_random_mutations_never_crash(base: bytes, edits: list[tuple[int, bytes, int]]) -> None:
    line = bytearray(base)
    for where, data, cut in edits:
        pos = min(where, len(line))
        line[pos:pos + cut] = data
    try:
        p = proctable.parse_stat(bytes(line))
    except ValueError:
        return
    assert p.pid > 0
    assert len(p.name.encode("utf-8", "surrogateescape")) <= 64
    assert len(p.state) == 1 and p.state.isalpha()


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2048))
def test_random_bytes_never_crash(data: bytes) -> None:
    try:
        proctable.parse_stat(data)
    except ValueError:
        pass


# --- statm: the exact memory figures ------------------------------------------

@pytest.mark.parametrize(("line", "want"), [
    (b"10388 441 380 5 0 85 0\n", (10388, 441)),
    (b"0 0 0 0 0 0 0\n", (0, 0)),            # a kernel thread or a zombie: no mm
    (b"5 3", (5, 3)),                        # no newline, only the two we keep
    (b"18446744073709551615 1 0 0 0 0 0\n", None),  # beyond int64: refused
])
def test_statm_lines(line: bytes, want: object) -> None:
    if want is None:
        with pytest.raises(ValueError, match="malformed statm"):
            _lowlevel.parse_statm(line)
    else:
        assert _lowlevel.parse_statm(line) == want


@pytest.mark.parametrize("line", [
    b"", b"\n", b"12", b"12\n", b"12 ", b"-1 2 3\n", b"1 -2 3\n", b"1  2\n", b"a 2\n", b"1 2x\n",
])
def test_malformed_statm_lines(line: bytes) -> None:
    with pytest.raises(ValueError, match="malformed statm"):
        _lowlevel.parse_statm(line)
    with pytest.raises(TypeError):
        _lowlevel.parse_statm("1 2")  # type: ignore[arg-type]
