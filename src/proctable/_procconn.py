"""The netlink proc connector: fork, exit and setsid events, as they happen.

A lineage uses them to sample at once instead of at the next tick, and (in scan
mode) to follow a fork chain whose middle link has exited already. The events
are a hint, never the only truth: the socket can overflow, and then the lineage
simply samples.
"""

from __future__ import annotations

import ctypes
import errno
import os
import socket
import struct
from typing import Optional

from ._pidfd import disabled

__all__ = ["EXIT", "FORK", "SID", "ProcConnector", "available"]

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
# event is about (the parent's, for a fork).
_OFF_TGID = _OFF_DATA + 4

SO_ATTACH_FILTER = 26
SO_DETACH_FILTER = 27
MAX_FILTER_PIDS = 250  # one classic BPF jump spans at most 255 instructions


class _Insn(ctypes.Structure):
    _fields_ = (("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8),
                ("k", ctypes.c_uint32))


class _Prog(ctypes.Structure):
    _fields_ = (("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_Insn)))


def _be32(value: int) -> int:
    # BPF loads words in network order; the event is in host order.
    return int.from_bytes(value.to_bytes(4, "little" if _LITTLE else "big"), "big")


_LITTLE = struct.pack("=I", 1)[0] == 1

Event = tuple[int, int, int, int, int]
"""(what, a, b, c, d): fork (parent pid, parent tgid, child pid, child tgid); exit
(pid, tgid, wait status, exit signal); sid (pid, tgid, 0, 0)."""


class Overrun(Exception):
    """Events were lost (the socket's queue overflowed): sample in full."""


class ProcConnector:
    """One subscription to the kernel's proc events. Close it: the kernel keeps a
    global listener count that only an explicit unsubscribe lowers."""

    def __init__(self) -> None:
        self._sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC,
                                   NETLINK_CONNECTOR)
        try:
            self._sock.bind((0, CN_IDX_PROC))
            for opt in (getattr(socket, "SO_RCVBUFFORCE", 33), socket.SO_RCVBUF):
                try:
                    self._sock.setsockopt(socket.SOL_SOCKET, opt, 4 << 20)
                    break
                except OSError:
                    continue
            self._send(PROC_CN_MCAST_LISTEN)
            self._sock.setblocking(False)
        except BaseException:
            self._sock.close()
            raise
        self._listening = True
        self._buf = bytearray(4096)

    def _send(self, op: int) -> None:
        data = _OP.pack(op, _WANTED)
        cn = _CNMSG.pack(CN_IDX_PROC, CN_VAL_PROC, 0, 0, len(data), 0) + data
        self._sock.send(_NLMSG.pack(_NLMSG.size + len(cn), NLMSG_DONE, 0, 0, 0) + cn)

    def fileno(self) -> int:
        return self._sock.fileno()

    def only_about(self, pids: Optional[set[int]]) -> None:
        """Let the kernel drop every event not about one of pids (a socket filter),
        so that a busy host does not wake us; None (or too many pids) lets all in."""
        if pids is None or len(pids) > MAX_FILTER_PIDS:
            try:
                self._sock.setsockopt(socket.SOL_SOCKET, SO_DETACH_FILTER, 0)
            except OSError:
                pass
            return
        order = sorted(pids)
        n = len(order)
        insns = [(0x20, 0, 0, _OFF_TGID)]  # ld [tgid]
        insns += [(0x15, n - i, 0, _be32(p)) for i, p in enumerate(order)]  # jeq -> accept
        insns += [(0x06, 0, 0, 0), (0x06, 0, 0, 0xFFFFFFFF)]  # ret drop; ret accept
        arr = (_Insn * len(insns))(*[_Insn(*x) for x in insns])
        prog = _Prog(len(insns), ctypes.cast(arr, ctypes.POINTER(_Insn)))
        self._sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER,
                              ctypes.string_at(ctypes.addressof(prog), ctypes.sizeof(prog)))

    def read(self) -> list[Event]:
        """Every event queued now (never blocks). Raises Overrun when some were lost."""
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

    def close(self) -> None:
        if self._listening:
            self._listening = False
            try:
                self._sock.setblocking(True)
                self._send(PROC_CN_MCAST_IGNORE)
            except OSError:
                pass
        self._sock.close()


_available: Optional[bool] = None


def available() -> bool:
    """Can this process subscribe to proc events? Checked once (the switches each time)."""
    global _available
    if os.environ.get("PROCTABLE_NO_PROC_CONNECTOR") or "proc_connector" in disabled():
        return False
    if _available is None:
        try:
            ProcConnector().close()
            _available = True
        except OSError:
            _available = False
    return _available


def open_connector() -> Optional[ProcConnector]:
    """A new subscription, or None where the kernel does not allow it."""
    if not available():
        return None
    try:
        return ProcConnector()
    except OSError:
        return None
