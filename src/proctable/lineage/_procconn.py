"""The netlink proc connector: fork, exit and setsid events, as they happen.

One socket, read by the shared hub (:mod:`._hub`), never one per lineage. The
events are a hint about pids, never the only truth: the socket can overflow
(``ENOBUFS``, :class:`Overrun`), and then every lineage looks at /proc in full.

A socket filter (classic BPF) keeps the kernel from queueing what no lineage
asked for. It is attached *before* the subscription, so that nothing unfiltered
is ever queued (events between subscribing and filtering were what made the
filter test flaky).
"""

from __future__ import annotations

import ctypes
import errno
import os
import socket
import struct
from collections.abc import Iterable
from typing import Optional

from .._pidfd import disabled

__all__ = ["EXIT", "FORK", "MAX_FILTER_PIDS", "SID", "Event", "Overrun", "ProcConnector",
           "filter_program", "switched_off"]

NETLINK_CONNECTOR = 11
CN_IDX_PROC = 1
CN_VAL_PROC = 1
PROC_CN_MCAST_LISTEN = 1
PROC_CN_MCAST_IGNORE = 2
NLMSG_DONE = 3

FORK = 0x00000001
SID = 0x00000080
EXIT = 0x80000000
_WANTED = FORK | SID | EXIT  # the event filter of Linux 6.6+; older kernels send all

_NLMSG = struct.Struct("=IHHII")
_CNMSG = struct.Struct("=IIIIHH")
_OP = struct.Struct("=II")  # struct proc_input: mcast_op, event_type
# After nlmsghdr (16) and cn_msg (20): what, cpu, timestamp; then the event data.
_HEAD = struct.Struct("=IIQ")
_DATA = struct.Struct("=IIII")
_OFF_WHAT = 16 + 20
_OFF_DATA = _OFF_WHAT + _HEAD.size
# In fork, exit and setsid events alike, the u32 at this offset is the tgid the
# event is about (the parent's, for a fork); a fork's child pid and tgid follow.
_OFF_TGID = _OFF_DATA + 4
_OFF_CHILD_PID = _OFF_DATA + 8
_OFF_CHILD_TGID = _OFF_DATA + 12

SO_ATTACH_FILTER = 26
SO_DETACH_FILTER = 27
MAX_FILTER_PIDS = 250  # one classic BPF jump spans at most 255 instructions
RCVBUF = 4 << 20

# classic BPF opcodes
_LD_ABS_W = 0x20
_JEQ_K = 0x15
_JEQ_X = 0x1D
_TAX = 0x07
_RET_K = 0x06
_DROP, _ACCEPT = 0, 0xFFFFFFFF


class _Insn(ctypes.Structure):
    _fields_ = (("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8),
                ("k", ctypes.c_uint32))


class _Prog(ctypes.Structure):
    _fields_ = (("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_Insn)))


_LITTLE = struct.pack("=I", 1)[0] == 1


def _be32(value: int) -> int:
    # BPF loads words in network order; the event is in host order.
    return int.from_bytes(value.to_bytes(4, "little" if _LITTLE else "big"), "big")


Event = tuple[int, int, int, int, int]
"""(what, a, b, c, d): fork (parent pid, parent tgid, child pid, child tgid); exit
(pid, tgid, wait status, exit signal); sid (pid, tgid, 0, 0)."""


class Overrun(Exception):
    """Events were lost (the socket's queue overflowed): look at /proc in full."""


def filter_program(pids: Optional[Iterable[int]], follow_forks: bool) -> list[tuple[int, int,
                                                                                  int, int]]:
    """The classic BPF program that lets in only what was asked for.

    ``pids``: events about these tgids (a fork by one, an exit or setsid of one);
    None lets every event in. ``follow_forks``: also every process fork on the
    host (a new thread is not one), which is how a scan follows a chain of forks
    whose links exit before the filter could name them; and so also every exit of
    a thread-group leader: a followed child may exit before the filter names it,
    and a lost exit would leave its pid followed after the kernel reused it (the
    forks of the unrelated process that gets the pid then taken for ours).
    """
    order = None if pids is None else sorted(set(pids))
    if order is not None and len(order) > MAX_FILTER_PIDS:
        order = None
    tail: list[tuple[int, int, int, int]] = []
    if order is None:
        tail = [(_RET_K, 0, 0, _ACCEPT)]
    else:
        n = len(order)
        tail.append((_LD_ABS_W, 0, 0, _OFF_TGID))
        tail += [(_JEQ_K, n - i, 0, _be32(p)) for i, p in enumerate(order)]
        tail += [(_RET_K, 0, 0, _DROP), (_RET_K, 0, 0, _ACCEPT)]
    if not follow_forks:
        return tail
    if order is None:
        return tail  # every event is let in anyway
    head = [
        (_LD_ABS_W, 0, 0, _OFF_WHAT),              # 0
        (_JEQ_K, 0, 4, _be32(FORK)),               # 1: not a fork: on to 6
        (_LD_ABS_W, 0, 0, _OFF_CHILD_TGID),        # 2
        (_TAX, 0, 0, 0),                           # 3
        (_LD_ABS_W, 0, 0, _OFF_CHILD_PID),         # 4
        (_JEQ_X, 5, 6, 0),                         # 5: a process (not a thread): 11, else 12
        (_JEQ_K, 0, 6, _be32(EXIT)),               # 6: not an exit: the tgid test (13)
        (_LD_ABS_W, 0, 0, _OFF_TGID),              # 7
        (_TAX, 0, 0, 0),                           # 8
        (_LD_ABS_W, 0, 0, _OFF_DATA),              # 9
        (_JEQ_X, 0, 1, 0),                         # 10: pid == tgid, a leader: 11, else 12
        (_RET_K, 0, 0, _ACCEPT),                   # 11
        (_RET_K, 0, 0, _DROP),                     # 12
    ]
    return head + tail


class ProcConnector:
    """One subscription to the kernel's proc events, filtered from the start.

    Close it: the kernel keeps a global listener count that only an explicit
    unsubscribe lowers.
    """

    def __init__(self, pids: Optional[Iterable[int]] = None, follow_forks: bool = False) -> None:
        self._sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC,
                                   NETLINK_CONNECTOR)
        self._listening = False
        try:
            if pids is not None or follow_forks:
                self.only_about(pids, follow_forks)  # before any event can be queued
            self._sock.bind((0, CN_IDX_PROC))
            for opt in (getattr(socket, "SO_RCVBUFFORCE", 33), socket.SO_RCVBUF):
                try:
                    self._sock.setsockopt(socket.SOL_SOCKET, opt, RCVBUF)
                    break
                except OSError:
                    continue
            self._send(PROC_CN_MCAST_LISTEN)
            self._listening = True
            self._sock.setblocking(False)
        except BaseException:
            self._sock.close()
            raise
        self._buf = bytearray(4096)

    def _send(self, op: int) -> None:
        data = _OP.pack(op, _WANTED)
        cn = _CNMSG.pack(CN_IDX_PROC, CN_VAL_PROC, 0, 0, len(data), 0) + data
        self._sock.send(_NLMSG.pack(_NLMSG.size + len(cn), NLMSG_DONE, 0, 0, 0) + cn)

    def fileno(self) -> int:
        return self._sock.fileno()

    def only_about(self, pids: Optional[Iterable[int]], follow_forks: bool = False) -> None:
        """Let the kernel drop every event not asked for (see :func:`filter_program`);
        events queued before the call stay queued."""
        insns = filter_program(pids, follow_forks)
        if insns == [(_RET_K, 0, 0, _ACCEPT)]:
            try:
                self._sock.setsockopt(socket.SOL_SOCKET, SO_DETACH_FILTER, 0)
            except OSError:
                pass  # no filter was attached
            return
        arr = (_Insn * len(insns))(*[_Insn(*x) for x in insns])
        prog = _Prog(len(insns), ctypes.cast(arr, ctypes.POINTER(_Insn)))
        self._sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER,
                              ctypes.string_at(ctypes.addressof(prog), ctypes.sizeof(prog)))

    def read(self) -> list[Event]:
        """Every event queued now (never blocks). Raises Overrun when some were lost
        (the events read before the overrun are lost with it: look in full)."""
        out: list[Event] = []
        buf = self._buf
        recv_into = self._sock.recv_into
        unpack_what = _HEAD.unpack_from
        unpack_data = _DATA.unpack_from
        while True:
            try:
                n = recv_into(buf)
            except BlockingIOError:
                return out
            except OSError as e:
                if e.errno == errno.ENOBUFS:
                    raise Overrun() from None
                raise
            if n < _OFF_DATA + _DATA.size:
                continue  # an ack, or something we did not ask for
            what = unpack_what(buf, _OFF_WHAT)[0]
            if what & _WANTED:
                a, b, c, d = unpack_data(buf, _OFF_DATA)
                out.append((what, a, b, c, d))

    def forget(self) -> None:
        """Close this process's copy of the socket without unsubscribing: a forked
        child's copy, where the parent still listens on the same socket (an
        unsubscribe from the child would lower the kernel's count for it)."""
        self._listening = False
        self._sock.close()

    def close(self) -> None:
        if self._listening:
            self._listening = False
            try:
                self._sock.setblocking(True)
                self._send(PROC_CN_MCAST_IGNORE)
            except OSError:
                pass
        self._sock.close()


def switched_off() -> bool:
    """PROCTABLE_DISABLE=proc_connector (or the older PROCTABLE_NO_PROC_CONNECTOR)."""
    return bool(os.environ.get("PROCTABLE_NO_PROC_CONNECTOR")) or "proc_connector" in disabled()
