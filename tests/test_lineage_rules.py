"""The membership rules, pure: over synthetic tables and events, without processes.

``scan_members`` is the first round's whole-table function (now on the new core);
``Membership`` is the core itself, fed rows, events and what is held.
"""

from __future__ import annotations

from typing import NamedTuple

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import proctable
from proctable.lineage import scan_members
from proctable.lineage._core import Membership
from proctable.lineage._core import Row as CoreRow


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


def rules(table, members, groups=None, sessions=None, covered=()):
    return scan_members(table, members, groups or {}, sessions or {}, covered)


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
    table = [INIT, SUP, ROOT, Row(211, 1, 211, 210, 30)]
    later = rules(table, first.members, first.groups, first.sessions)
    # No recorded member is left in session 210: its number may have been freed and
    # reused by an unrelated process, so 211 is a suspect (the first round claimed it).
    assert 211 not in later.members and later.suspects == (211,)
    assert 210 in later.dropped
    assert later.sessions == {210: 21}  # still populated: still recorded
    assert later.groups == {}  # 210's group is empty now
    # Where an unbroken event stream covers the number, 211 is a member (and leads
    # its own group).
    covered = rules(table, first.members, first.groups, first.sessions, covered={210})
    assert 211 in covered.members and covered.groups == {211: 30}
    # So it is where another recorded member is still in the session.
    sibling = rules([*table, Row(212, 1, 212, 210, 25)], {**first.members, 212: 25},
                    first.groups, first.sessions)
    assert 211 in sibling.members and sibling.suspects == ()


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


# --- the core: proofs, anchors, events -------------------------------------------------

L = CoreRow(300, 200, 300, 100, 30)  # a member that leads group 300 (in the root's session)


def core_with(*rows, floor=20, exclude=()):
    core = Membership(floor, exclude)
    for r in rows:
        core.add(r)
    return core


def test_group_reuse_is_a_suspect_unless_proven():
    # L leads group 300 and exits; the group empties; an unrelated X gets pid 300,
    # makes group 300, forks Y and exits. Y must never be claimed through 300.
    y = CoreRow(301, 1, 300, 100, 40)
    core = core_with(CoreRow(200, 100, 100, 100, 20), L)
    core.end(300)
    core.reaped(300)
    d = core.decide([y], held={200})
    assert d.claims == () and [(c.pid, c.via, c.ident) for c in d.suspects] == [
        (301, "group", 300)]
    assert 300 not in d.groups


def test_group_proven_by_a_held_member_or_anchor():
    y = CoreRow(301, 1, 300, 100, 40)
    live = core_with(CoreRow(200, 100, 100, 100, 20), L)
    d = live.decide([y], held={200, 300})
    assert [(c.pid, c.via) for c in d.claims] == [(301, "group")] and 300 in d.groups
    # An unreaped zombie leader (an anchor, held by its pidfd) holds the number too.
    anchor = core_with(CoreRow(200, 100, 100, 100, 20), L)
    anchor.end(300)
    assert [c.pid for c in anchor.decide([y], held={300}).claims] == [301]
    # Not held (its pidfd says reaped, or there is none): no proof.
    assert anchor.decide([y], held=set()).claims == ()


def test_a_held_member_proves_only_the_group_its_row_is_in():
    y = CoreRow(301, 1, 300, 100, 40)
    core = core_with(CoreRow(200, 100, 100, 100, 20), L)
    core.observe(L._replace(pgid=200))  # L left its group (setpgid): it proves nothing there
    d = core.decide([y], held={200, 300})
    assert d.claims == () and [c.pid for c in d.suspects] == [301]


def test_stream_cover_holds_until_a_fork_of_that_pid_or_an_overrun():
    y = CoreRow(301, 1, 300, 100, 40)

    def covered_core():
        core = core_with(CoreRow(200, 100, 100, 100, 20), L)
        assert core.watch_ids() == {300}
        core.watch(core.watch_ids())  # the stream reports every fork of pid 300 from now
        core.cover(held={300})  # ... and L held it after that: covered
        core.end(300)
        core.reaped(300)
        return core

    core = covered_core()
    assert [c.pid for c in core.decide([y], held=set()).claims] == [301]
    core = covered_core()
    core.watched(300)  # a process was forked with pid 300: a new group 300 may exist
    assert core.decide([y], held=set()).claims == ()
    core = covered_core()
    core.fork(200, 300)  # the same, reported as a member's fork
    assert core.decide([y], held=set()).claims == ()
    core = covered_core()
    core.overrun()
    assert core.decide([y], held=set()).claims == ()
    # cover() proves nothing without a held member in the group at that moment,
    core = core_with(CoreRow(200, 100, 100, 100, 20), L)
    core.watch(core.watch_ids())
    core.cover(held=set())
    core.end(300)
    core.reaped(300)
    assert core.decide([y], held=set()).claims == ()
    # nor for a number the stream was not told to watch (forks of its pid would
    # not be reported), nor once the stream stops watching it.
    core = core_with(CoreRow(200, 100, 100, 100, 20), L)
    core.cover(held={300})
    assert not core.groups[300].covered
    core.watch({300})
    core.cover(held={300})
    assert core.groups[300].covered
    core.watch(set())
    assert not core.groups[300].covered
    core.watch({300})
    core.end(300)
    core.reaped(300)
    assert core.decide([y], held=set()).claims == ()


S = CoreRow(400, 200, 400, 400, 40)  # a member that leads session 400


def test_session_born_inside_a_proven_session():
    core = core_with(CoreRow(200, 100, 100, 100, 20), S)
    d = core.decide([], held={400}, now=50)
    assert 400 in d.sessions and core.sessions[400].proven_at == 50
    core.end(400)
    core.reaped(400)
    old = CoreRow(401, 1, 401, 400, 45)  # started before tick 50: born in that session
    new = CoreRow(402, 1, 402, 400, 50)  # not provably
    d = core.decide([old, new], held=set())
    assert [c.pid for c in d.claims] == [401]
    assert [c.pid for c in d.suspects] == [402]
    # A newer process holding 400 as its pid: the number was free, the session is over
    # (seen in any rows, complete or not), and its new session is nobody's.
    leader = CoreRow(400, 1, 400, 400, 60)
    d = core.decide([leader, CoreRow(403, 400, 400, 400, 61)], held=set())
    assert 400 not in core.sessions and d.claims == () and d.suspects == ()


def test_forgotten_when_empty_or_its_number_is_a_newer_pid():
    core = core_with(CoreRow(200, 100, 100, 100, 20), L)
    core.end(300)
    core.reaped(300)
    core.decide([CoreRow(500, 1, 500, 100, 50)], held=set(), complete=True)
    assert 300 not in core.groups
    core = core_with(CoreRow(200, 100, 100, 100, 20), L)
    core.end(300)
    core.reaped(300)
    core.decide([CoreRow(300, 1, 300, 300, 99), CoreRow(301, 300, 300, 300, 99)],
                held=set(), complete=True)
    assert 300 not in core.groups
    # Not complete: nothing is concluded from absence.
    core = core_with(CoreRow(200, 100, 100, 100, 20), L)
    core.decide([], held=set())
    assert 300 in core.groups


def test_fork_events():
    core = core_with(CoreRow(200, 100, 100, 100, 20), exclude={999})
    c = core.fork(200, 201)
    assert c is not None and (c.pid, c.floor, c.via, c.ident) == (201, 20, "parent", 200)
    assert core.fork(200, 999) is None  # the caller's own, never
    core.add(CoreRow(201, 200, 100, 100, 21))
    assert core.fork(200, 201) is None  # a member already
    core.end(201)
    c = core.fork(201, 202)  # an ended member's fork (reported late): its start is the floor
    assert c is not None and c.floor == 21
    c = core.fork(777, 203)  # a fork the stream followed through an unrecorded link
    assert c is not None and c.floor == 20


def test_a_zombie_leader_with_live_threads_is_claimable_a_zombie_is_not():
    core = core_with(CoreRow(200, 100, 100, 100, 20))
    leader_exited = CoreRow(201, 200, 100, 100, 21, "Z", 2)
    zombie = CoreRow(202, 200, 100, 100, 21, "Z", 1)
    d = core.decide([leader_exited, zombie], held={200})
    assert [c.pid for c in d.claims] == [201]


def test_excluded_and_extra_parents():
    core = core_with(CoreRow(200, 100, 100, 100, 20), exclude={50})
    rows = [CoreRow(50, 200, 100, 100, 25), CoreRow(60, 50, 100, 100, 26),
            CoreRow(70, 900, 100, 100, 30), CoreRow(71, 70, 100, 100, 31)]
    d = core.decide(rows, held={200})
    assert [c.pid for c in d.claims] == []  # 60's parent is excluded, 70's unknown
    d = core.decide(rows, held={200}, parents={900: 10})  # 900: the lineage's reaper
    assert sorted(c.pid for c in d.claims) == [70, 71]


# --- properties of the core ----------------------------------------------------------------

@settings(max_examples=200, deadline=None)
@given(tables(), st.data())
def test_property_every_claim_through_a_number_is_proven(rows, data):
    rows = [CoreRow(*r) for r in rows]
    root = data.draw(st.sampled_from(rows[1:]))
    recorded = data.draw(st.sets(st.sampled_from(rows[1:]), max_size=6)) | {root}
    core = Membership(root.start_time)
    for r in recorded:
        if r.start_time >= root.start_time:
            core.add(r)
    held = data.draw(st.sets(st.sampled_from(sorted(core.members)), max_size=6))
    now = data.draw(st.one_of(st.none(), st.integers(0, 60)))
    d = core.decide(rows, held, now=now, complete=data.draw(st.booleans()))
    by_pid = {r.pid: r for r in rows}
    claimed = {c.pid for c in d.claims}
    assert not claimed & {c.pid for c in d.suspects}
    assert not claimed & set(core.members)
    for c in d.claims:
        r = by_pid[c.pid]
        assert r.start_time >= c.floor
        if c.via == "parent":
            assert r.ppid == c.ident
        elif c.via == "group":
            assert r.pgid == c.ident and c.ident in d.groups
            assert c.ident in core.groups
            assert any(core.rows[p].pgid == c.ident for p in held) or core.groups[c.ident].covered
        else:
            led = core.sessions[c.ident]
            assert r.sid == c.ident
            assert (c.ident in d.sessions or (led.proven_at is not None
                                              and r.start_time < led.proven_at))
    for c in d.suspects:
        table = core.groups if c.via == "group" else core.sessions
        assert c.ident in table  # only through a recorded number


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["cover", "cover_unheld", "fork_it", "fork_other",
                                 "overrun"]), max_size=12))
def test_property_stream_cover_is_exactly_since_the_last_proof(ops):
    # Model: covered iff a cover() with a held member came after every fork of
    # the number and every overrun.
    core = core_with(CoreRow(200, 100, 100, 100, 20), L)
    core.watch(core.watch_ids())
    model = False
    for op in ops:
        if op == "cover":
            core.cover(held={300})
            model = True
        elif op == "cover_unheld":
            core.cover(held=set())
        elif op == "fork_it":
            core.watched(300)
            model = False
        elif op == "fork_other":
            core.watched(301)
        else:
            core.overrun()
            model = False
    assert core.groups[300].covered is model


def test_parent_rule_only_through_a_parent_proven_alive_after_the_rows():
    # Member 200 may have died and its pid been reused between the start of a look
    # and the rows: a row's parent pid 200 names the member only while it is
    # proven unreaped after the rows were read (``alive``).
    core = core_with(CoreRow(200, 100, 150, 100, 20))
    kid = CoreRow(201, 200, 201, 201, 30)
    assert core.decide([kid], held=set(), alive=set()).claims == ()
    assert [c.pid for c in core.decide([kid], held={200}, alive={200}).claims] == [201]
    assert [c.pid for c in core.decide([kid], held=set()).claims] == [201]  # None: all
