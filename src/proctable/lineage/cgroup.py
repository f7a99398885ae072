"""The cgroup backend: every process in the lineage's own cgroup v2 is a member.

The lineage creates a child cgroup; its reaper (the subreaper backend's, so
orphans stay below it as well) moves itself in, starts the command there (the
child is born inside, before it execs) and moves back out. No process leaves a
cgroup short of being moved by someone allowed to write ``cgroup.procs``, so a
sample is one read of ``cgroup.procs``, ``cgroup.freeze`` stops every fork at
once, ``cgroup.kill`` kills them all at once, and ``populated 0`` in
``cgroup.events`` proves the lineage gone.

It needs a writable (delegated) cgroup v2: root, or one delegated to the user
(``cgroup_parent=``). ``auto`` falls back to the subreaper backend without one.
"""

from __future__ import annotations

import logging
import select
from typing import Any, Optional

from ..errors import ProctableError
from ..table import Proc
from ._cgroup import Cgroup, usable_parent
from ._members import read_safe
from .subreaper import SubreaperBackend

__all__ = ["CgroupBackend"]

log = logging.getLogger("proctable.lineage")


class CgroupBackend(SubreaperBackend):
    mode = "cgroup"

    def __init__(self, engine: Any) -> None:
        super().__init__(engine)
        self.cg: Optional[Cgroup] = None

    @classmethod
    def usable(cls, cgroup_parent: Optional[str]) -> Optional[Any]:
        """A fresh child cgroup, or None where there is no writable cgroup v2 (or
        the reaper cannot become a subreaper here)."""
        if SubreaperBackend.usable(cgroup_parent) is None:
            return None
        path = usable_parent(cgroup_parent)
        if path is None:
            return None
        try:
            return Cgroup.create(path)
        except OSError as e:
            log.debug("no lineage cgroup under %s: %s", path, e)
            return None

    @classmethod
    def refusal(cls, cgroup_parent: Optional[str]) -> Exception:
        denied = SubreaperBackend.refusal(cgroup_parent)
        if SubreaperBackend.usable(cgroup_parent) is None:
            return ProctableError(str(denied).replace("'subreaper'", "'cgroup'", 1))
        where = f" under {cgroup_parent}" if cgroup_parent else ""
        return ProctableError("mode='cgroup' needs a writable cgroup v2 (root, or a delegated "
                              f"one); none here{where}")

    def adopt(self, prepared: Any) -> None:
        assert isinstance(prepared, Cgroup)
        self.cg = prepared
        self.cgroup_path = prepared.path

    # -- the interface --------------------------------------------------------------------

    def _frozen_ok(self) -> bool:
        # The reaper stayed inside: freezing or killing the cgroup would hit it too.
        return self.cg is not None and not self.inside

    def sample(self, full: bool) -> bool:
        cg = self.cg
        if cg is None:
            return True
        reg = self.e.reg
        for pid in cg.procs():  # cgroup.procs is the truth here: no parent or age test
            if pid not in reg.live:
                reg.record(pid, 0)
        return True

    def stop_forks(self) -> None:
        if not self._frozen_ok():
            super().stop_forks()
            return
        assert self.cg is not None
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
        if self.inside:
            return set(cg.procs()) <= self.e.core.exclude
        return not cg.populated()

    def wait_fds(self) -> list[tuple[int, int]]:
        cg = self.cg
        if cg is None or cg.events_fd < 0:
            return []
        return [(cg.events_fd, select.POLLPRI)]  # cgroup.events changed: populated 0?

    def strays(self) -> list[Proc]:
        cg = self.cg
        if cg is None:
            return []
        out = []
        for pid in cg.procs():
            row = read_safe(pid)
            if row is not None and pid not in self.e.core.exclude and pid not in self.e.reg.live:
                out.append(row)
        return out

    def close(self) -> None:
        super().close()
        cg, self.cg = self.cg, None
        if cg is None:
            return
        if cg.populated():
            if self.e.spawn_failed:
                cg.kill()  # only after a failed spawn: nothing of ours may stay in it
                cg.wait_empty(2.0)
            else:
                log.warning("lineage: cgroup %s still holds processes; left in place", cg.path)
                cg.close_fds()
                return
        if not cg.remove(timeout=2.0):
            log.warning("lineage: could not remove cgroup %s", cg.path)

    @property
    def path(self) -> Optional[str]:
        return None if self.cg is None else self.cg.path
