"""The scan backend's membership rules, as a pure function over synthetic tables."""

from __future__ import annotations

from typing import NamedTuple

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import proctable
from proctable.lineage import scan_members


class Row(NamedTuple):
    pid: int
    ppid: int
    pgid: int
    sid: int
    start_time: int


# The supervisor (pid 100) leads session and group 100; it starts the root (200)
# in its own session and group, the way a plain Popen does.
SUP = Row(100, 1, 100, 100, 10)
ROOT = Row(200, 100, 100, 100, 20)
INIT = Row(1, 0, 1, 1, 0)


def rules(table, members, groups=None, sessions=None):
    return scan_members(table, members, groups or {}, sessions or {})


CASES = [
    # (name, table, recorded members, expected members)
    ("root alone", [INIT, SUP, ROOT], {200: 20}, {200}),
    ("child of a member",
     [INIT, SUP, ROOT, Row(201, 200, 100, 100, 21)], {200: 20}, {200, 201}),
    ("grandchild, found in one pass",
     [INIT, SUP, ROOT, Row(201, 200, 100, 100, 21), Row(202, 201, 100, 100, 22)],
     {200: 20}, {200, 201, 202}),
    ("a child older than its parent is a reused ppid, not a child",
     [INIT, SUP, ROOT, Row(150, 200, 100, 100, 15)], {200: 20}, {200}),
    ("the supervisor's own session and group are never claimed",
     [INIT, SUP, ROOT, Row(300, 100, 100, 100, 30), Row(301, 1, 100, 100, 31)],
     {200: 20}, {200}),
    ("a session a member leads: its orphans are members",
     [INIT, SUP, ROOT, Row(210, 200, 210, 210, 21), Row(211, 1, 211, 210, 22)],
     {200: 20}, {200, 210, 211}),
    ("a group a member leads: its orphans are members",
     [INIT, SUP, ROOT, Row(210, 200, 210, 100, 21), Row(211, 1, 210, 100, 22)],
     {200: 20}, {200, 210, 211}),
    ("in a member-led group but older than the leader: not claimed",
     [INIT, SUP, ROOT, Row(210, 200, 210, 100, 21), Row(190, 100, 210, 100, 19)],
     {200: 20}, {200, 210}),
    ("a recorded member whose pid names another process is dropped",
     [INIT, SUP, Row(200, 100, 100, 100, 99)], {200: 20}, set()),
    ("a recorded member that is gone is dropped",
     [INIT, SUP], {200: 20}, set()),
    ("an orphan of a recorded member stays a member (re-parented to init)",
     [INIT, SUP, ROOT, Row(220, 1, 100, 100, 25)], {200: 20, 220: 25}, {200, 220}),
    ("a pid reused within the same table by an unrelated process is not claimed",
     [INIT, SUP, ROOT, Row(201, 100, 100, 100, 40)], {200: 20}, {200}),
]


@pytest.mark.parametrize(("name", "table", "members", "expected"), CASES,
                         ids=[c[0] for c in CASES])
def test_rules(name, table, members, expected):
    res = rules(table, members)
    assert set(res.members) == expected
    assert set(res.new) == expected - set(members)
    assert set(res.dropped) == set(members) - {p for p in expected if p in members}


def test_recorded_session_claims_after_its_leader_exits():
    # First sighting: 210 leads session 210. Later it exited; 211 (a job that left
    # its group: pgid 211) is re-parented to init and still in session 210.
    first = rules([INIT, SUP, ROOT, Row(210, 200, 210, 210, 21)], {200: 20})
    assert first.sessions == {210: 21} and first.groups == {210: 21}
    later = rules([INIT, SUP, ROOT, Row(211, 1, 211, 210, 30)],
                  first.members, first.groups, first.sessions)
    assert 211 in later.members
    assert 210 in later.dropped
    assert later.sessions == {210: 21}  # still populated: still recorded
    assert later.groups == {211: 30}  # 210's group is empty now; 211 leads its own


def test_recorded_session_is_forgotten_when_empty_or_reused():
    first = rules([INIT, SUP, ROOT, Row(210, 200, 210, 210, 21)], {200: 20})
    empty = rules([INIT, SUP, ROOT], first.members, first.groups, first.sessions)
    assert 210 not in empty.sessions
    # The id 210 held as a pid by a newer process: the old session is over, and a
    # process in a (new) session 210 that no member leads is not claimed.
    reused = rules([INIT, SUP, ROOT, Row(210, 100, 210, 210, 50), Row(211, 210, 210, 210, 51)],
                   first.members, first.groups, first.sessions)
    assert 210 not in reused.sessions
    assert set(reused.members) == {200}


def test_session_created_after_first_sighting():
    t1 = [INIT, SUP, ROOT, Row(201, 200, 100, 100, 21)]
    r1 = rules(t1, {200: 20})
    assert r1.sessions == {}
    # 201 calls setsid() later: the session it now leads is recorded, and what it
    # starts there is claimed even once 201 is gone.
    t2 = [INIT, SUP, ROOT, Row(201, 200, 201, 201, 21), Row(202, 201, 201, 201, 22)]
    r2 = rules(t2, r1.members, r1.groups, r1.sessions)
    assert r2.sessions == {201: 21}
    t3 = [INIT, SUP, ROOT, Row(202, 1, 201, 201, 22), Row(203, 1, 203, 201, 23)]
    r3 = rules(t3, r2.members, r2.groups, r2.sessions)
    assert {202, 203} <= set(r3.members)


def test_accepts_proc_rows_and_plain_tuples():
    p = proctable.read(1)
    assert p is not None
    res = scan_members([p, (5, 1, 5, 5, p.start_time + 1)], {1: p.start_time})
    assert set(res.members) == {1, 5}


def test_inputs_are_not_mutated():
    members = {200: 20}
    groups: dict[int, int] = {}
    rules([INIT, SUP, ROOT, Row(210, 200, 210, 210, 21)], members, groups)
    assert members == {200: 20} and groups == {}


# --- properties ---------------------------------------------------------------------

@st.composite
def tables(draw):
    """Random forests of processes with consistent start times (a child starts no
    earlier than its parent), random group/session ids drawn from existing pids."""
    n = draw(st.integers(2, 25))
    rows = [Row(1, 0, 1, 1, 0)]
    for pid in range(2, n + 2):
        parent = draw(st.sampled_from(rows))
        start = draw(st.integers(parent.start_time, parent.start_time + 5))
        leader = draw(st.sampled_from([*rows, None]))
        pgid = pid if leader is None else leader.pgid
        sid = draw(st.sampled_from([parent.sid, pid]))
        rows.append(Row(pid, parent.pid, pgid, sid, start))
    return rows


@settings(max_examples=200, deadline=None)
@given(tables(), st.data())
def test_property_descendants_are_members_and_non_descendants_need_a_led_group(rows, data):
    root = data.draw(st.sampled_from(rows[1:]))
    res = scan_members(rows, {root.pid: root.start_time})
    by_pid = {r.pid: r for r in rows}
    # Every descendant (by ppid, with start times in order) is a member.
    todo, desc = [root.pid], {root.pid}
    while todo:
        p = todo.pop()
        for r in rows:
            if r.ppid == p and r.pid not in desc and r.start_time >= by_pid[p].start_time:
                desc.add(r.pid)
                todo.append(r.pid)
    assert desc <= set(res.members)
    # Every member is the root, a child of a member, or in a group/session led by a member.
    for pid in res.members:
        r = by_pid[pid]
        assert (pid == root.pid or r.ppid in res.members
                or (r.pgid in res.groups and r.pgid in res.members)
                or (r.sid in res.sessions and r.sid in res.members))
    # Applying the rules again to the same table changes nothing (a fixpoint).
    again = scan_members(rows, res.members, res.groups, res.sessions)
    assert again.members == res.members and again.new == [] and again.dropped == []


@settings(max_examples=100, deadline=None)
@given(tables())
def test_property_groups_and_sessions_never_led_by_a_member_are_never_claimed(rows):
    # The root is pid 1's first child; anything only in init's group/session that is
    # not a descendant must stay out.
    root = rows[1]
    res = scan_members(rows, {root.pid: root.start_time})
    for pid in res.members:
        r = next(x for x in rows if x.pid == pid)
        if r.pid != root.pid and r.ppid not in res.members:
            assert r.pgid in res.groups or r.sid in res.sessions
