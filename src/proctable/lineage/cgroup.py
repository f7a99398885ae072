"""The cgroup backend: every process in the lineage's own cgroup v2 is a member.

The lineage's reaper (the subreaper backend's, so orphans stay below it as well)
makes a child cgroup and forks the command into it (``clone3(CLONE_INTO_CGROUP)``:
born inside, before it execs; where clone3 is refused, the reaper moves in, forks
and moves back out); it removes the cgroup again if this process dies, so no
directory is left whatever moment the caller is killed at. No process leaves a
cgroup short of being moved by someone allowed to write ``cgroup.procs``, so a
sample is one read of ``cgroup.procs``, ``cgroup.freeze`` stops every fork at
once, ``cgroup.kill`` kills them all at once, and ``populated 0`` in
``cgroup.events`` proves the lineage gone.

It needs a writable (delegated) cgroup v2: root, or one delegated to the user
(``cgroup_parent=``). ``auto`` falls back to the subreaper backend without one.
"""

from __future__ import annotations

import errno
import logging
import select
from typing import Any, Optional

from ..errors import ProctableError
from ..table import Proc
from ._cgroup import Cgroup, own_cgroup, usable_parent
from ._members import read_safe
from .subreaper import SubreaperBackend

__all__ = ["CgroupBackend"]

log = logging.getLogger("proctable.lineage")


class CgroupBackend(SubreaperBackend):
    mode = "cgroup"
    # The cgroup holds every member until teardown reads it (no process leaves a
    # cgroup unless moved): nothing needs looking at in between, so a spawned
    # lineage starts no sampler thread and takes no events until changes() asks.
    sampler = False

    def __init__(self, engine: Any) -> None:
        super().__init__(engine)
        self.cg: Optional[Cgroup] = None
        self.lost = False  # removed from outside
        self.frozen_outside = False  # found frozen when teardown began

    @classmethod
    def usable(cls, cgroup_parent: Optional[str]) -> Optional[Any]:
        """The writable cgroup v2 directory to make the lineage's cgroup in, or
        None where there is none (or the reaper cannot become a subreaper here)."""
        if SubreaperBackend.usable(cgroup_parent) is None:
            return None
        path = usable_parent(cgroup_parent)
        if path is None:
            return None
        # By default the parent is this process's own cgroup: the reaper's way home too.
        return path, path if cgroup_parent is None else own_cgroup()

    @classmethod
    def refusal(cls, cgroup_parent: Optional[str]) -> Exception:
        denied = SubreaperBackend.refusal(cgroup_parent)
        if SubreaperBackend.usable(cgroup_parent) is None:
            return ProctableError(str(denied).replace("'subreaper'", "'cgroup'", 1))
        where = f" under {cgroup_parent}" if cgroup_parent else ""
        return ProctableError("mode='cgroup' needs a writable cgroup v2 (root, or a delegated "
                              f"one); none here{where}")

    def adopt(self, prepared: Any) -> None:
        self.cgroup_parent, self.home = prepared

    def spawned_cgroup(self) -> None:
        if self.made_cgroup is None:
            raise ProctableError("the lineage's reaper made no cgroup")
        self.cg = Cgroup(self.made_cgroup)

    @property
    def cgroup_path(self) -> Optional[str]:
        return self.made_cgroup

    # -- the interface --------------------------------------------------------------------

    def _frozen_ok(self) -> bool:
        # The reaper stayed inside: freezing or killing the cgroup would hit it too.
        return self.cg is not None and not self.inside and not self.lost

    def _lose(self, e: OSError) -> None:
        """The cgroup was removed under us (ENODEV, ENOENT: emptied and rmdir'd from
        outside): from now on the reaper's structure is the truth, as in subreaper mode."""
        if not self.lost:
            self.lost = True
            log.warning("lineage: its cgroup %s is gone (%s): following the reaper's "
                        "tree instead", self.cgroup_path, e.strerror or e)

    def _procs(self) -> Optional[list[int]]:
        cg = self.cg
        if cg is None or self.lost:
            return None
        try:
            return cg.procs()
        except OSError as e:
            if e.errno not in (errno.ENODEV, errno.ENOENT):
                raise
            self._lose(e)
            return None

    def walks_past_reaper(self) -> bool:
        return self.lost

    def health(self) -> list[str]:
        if self.lost:
            out = super().health()
            out.append(f"the lineage's cgroup {self.cgroup_path} was removed from outside: "
                       "it follows the reaper's tree instead (a process moved to another "
                       "cgroup before that is still a member if it was recorded)")
            return out
        out = []
        if self.reaper is not None and self._reaper_lost():
            out.append(f"the lineage's reaper (pid {self.reaper.pid}) died while members "
                       "ran: the command's status is lost; the cgroup still holds every "
                       "member, and teardown ends them")
        if self.frozen_outside:
            out.append(f"the lineage's cgroup {self.cgroup_path} was frozen from outside "
                       "when teardown began: teardown thawed it")
        elif self.cg is not None and not self.e.tearing_down():
            try:
                frozen = self.cg.events().get("frozen") == 1
            except OSError:
                frozen = False
            if frozen:
                out.append(f"the lineage's cgroup {self.cgroup_path} is frozen from outside: "
                           "its members can neither run nor exit until it is thawed "
                           "(teardown thaws it)")
        return out

    def sample(self, full: bool) -> bool:
        pids = self._procs()
        if pids is None:
            return True if self.cg is None else super().sample(full)
        reg = self.e.reg
        for pid in pids:  # cgroup.procs is the truth here: no parent or age test
            if pid not in reg.live:
                reg.record(pid, 0)
        return True

    def stop_forks(self) -> None:
        if not self._frozen_ok():
            super().stop_forks()
            return
        assert self.cg is not None
        try:
            self.frozen_outside = self.cg.events().get("frozen") == 1
        except OSError:
            pass
        self.cg.freeze(timeout=0.5)
        self.e.look(full=True)

    def resume(self) -> None:
        if self._frozen_ok():
            assert self.cg is not None
            self.cg.thaw()

    def kill_all(self) -> bool:
        return self._frozen_ok() and self.cg is not None and self.cg.kill()

    def proven_empty(self) -> bool:
        cg = self.cg
        if cg is None:
            return True
        if self.lost:
            return super().proven_empty()
        try:
            if self.inside:
                return set(cg.procs()) <= self.e.core.exclude
            return not cg.populated()
        except OSError as e:
            if e.errno not in (errno.ENODEV, errno.ENOENT):
                raise
            self._lose(e)
            return super().proven_empty()

    def wait_fds(self) -> list[tuple[int, int]]:
        cg = self.cg
        if cg is None or cg.events_fd < 0 or self.lost:
            return []
        return [(cg.events_fd, select.POLLPRI)]  # cgroup.events changed: populated 0?

    def rearm(self) -> None:
        # kernfs keeps the fd ready for POLLPRI from a change (the freeze and thaw of
        # teardown make two) until the file is read again through it: unread, every
        # wait of the grace returned at once and spun a CPU.
        cg = self.cg
        if cg is not None and cg.events_fd >= 0 and not self.lost:
            try:
                cg.events()
            except OSError:
                pass  # removed from outside: the next look says so

    def strays(self) -> list[Proc]:
        pids = self._procs()
        if pids is None:
            return []
        out = []
        for pid in pids:
            row = read_safe(pid)
            if row is not None and pid not in self.e.core.exclude and pid not in self.e.reg.live:
                out.append(row)
        return out

    def finish(self, timeout: float) -> None:
        # Remove the cgroup before the reaper is released: were this process killed
        # after, the reaper (still waiting for its release) removes it instead.
        cg = self.cg
        if cg is not None and not self.lost:
            try:
                empty = not cg.populated()
            except OSError:
                empty = False
            if empty and cg.remove(timeout=min(timeout, 2.0)):
                self.cg = None
        super().finish(timeout)

    def close(self) -> None:
        cg, self.cg = self.cg, None
        if cg is not None:
            self._drop(cg)
        super().close()  # releases the reaper, which removes the cgroup once empty

    def _drop(self, cg: Cgroup) -> None:
        if self.lost or self.let_go:  # (let go: a durable session's, left to its keeper)
            cg.close_fds()  # removed by someone else already
            return
        try:
            populated = cg.populated()
        except OSError:
            cg.close_fds()  # gone already
            return
        if populated:
            if self.e.spawn_failed:
                cg.kill()  # only after a failed spawn: nothing of ours may stay in it
                cg.wait_empty(2.0)
            else:
                log.warning("lineage: cgroup %s still holds processes; left in place (its "
                            "reaper removes it once they are gone)", cg.path)
                cg.close_fds()
                return
        if not cg.remove(timeout=2.0):
            log.warning("lineage: could not remove cgroup %s", cg.path)

    @property
    def path(self) -> Optional[str]:
        return None if self.cg is None else self.cg.path
