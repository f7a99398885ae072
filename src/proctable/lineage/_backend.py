"""The one small interface every lineage backend implements.

A backend is one way of knowing which processes belong to a run: being in a
cgroup (:mod:`.cgroup`), being below a subreaper (:mod:`.subreaper`), or the
membership rules over what /proc shows (:mod:`.scan`). :class:`Lineage` drives
any of them the same way; a new backend is one more module with one class.

``start``   the classmethods ``spawn`` (and, for a backend that can, ``attach``)
``sample``  look for new members (cheaply, or in full)
``stop_forks`` / ``resume``   keep members from starting new ones while signals go out
``kill_all``  SIGKILL every member at once, where the backend can
``proven_empty``  the backend's own proof that no member is left
``close``   free what the backend holds
"""

from __future__ import annotations

import signal
from typing import TYPE_CHECKING, Any, ClassVar, Optional

from ..errors import ProctableError
from ..table import Proc

if TYPE_CHECKING:
    from ._engine import Engine
    from ._members import Member

__all__ = ["Backend", "BackendUnavailable"]


class BackendUnavailable(ProctableError):
    """This host refuses what the backend rests on (found only by trying, before the
    command started): ``auto`` goes on with the next backend."""


class Backend:
    """Base class: the behaviour shared by backends that have no structure to
    freeze or kill (subreaper, scan)."""

    mode: ClassVar[str]
    """The name ``Lineage.mode`` shows."""
    attachable: ClassVar[bool] = False
    """Can it track a process that is running already (``Lineage(root)``)?"""
    follows_forks: ClassVar[bool] = False
    """Does it need every fork of its members' children from the event stream at once
    (a scan has no structure that keeps an orphan in sight)?"""
    sampler: ClassVar[bool] = True
    """Does a spawned lineage need a sampler thread (and the event stream) between the
    looks its callers make? Without one, a member is recorded at the next look
    (``members()``, teardown, which look in full), so the backend must keep every
    member in sight meanwhile, whatever its parents do."""

    def __init__(self, engine: Engine) -> None:
        self.e = engine

    # -- start ------------------------------------------------------------------------

    @classmethod
    def usable(cls, cgroup_parent: Optional[str]) -> Optional[Any]:
        """What the backend needs to spawn here (handed to :meth:`adopt`), or None
        where this host cannot give it (``auto`` then tries the next one)."""
        return True

    @classmethod
    def refusal(cls, cgroup_parent: Optional[str]) -> Exception:
        """The error for a mode asked for by name where :meth:`usable` said None."""
        return ProctableError(f"mode={cls.mode!r} is not available here")

    @classmethod
    def attach_refusal(cls) -> Exception:
        return ValueError(
            f"mode={cls.mode!r} needs Lineage.spawn (the command must start inside it); "
            "attaching to a running process scans (mode='scan' or 'auto')")

    def adopt(self, prepared: Any) -> None:
        """Take what :meth:`usable` made (and free it in :meth:`close`)."""

    def spawn(self, args: list[Any], popen_kwargs: dict[str, Any]) -> Member:
        """Start args inside the tracking; the root member."""
        raise NotImplementedError

    def attach(self, pid: int, start: Optional[int], handle: Optional[int]) -> Member:
        """Track the running process pid (and what it starts); the root member."""
        raise self.attach_refusal()

    # -- the interface --------------------------------------------------------------------

    def sample(self, full: bool) -> bool:
        """Look for new members; ``full`` reconciles everything (teardown, members(),
        a lost event). False when the look could not be made."""
        raise NotImplementedError

    def stop_forks(self) -> None:
        """Stop new forks: SIGSTOP every member, again for each one a look finds."""
        e = self.e
        for _ in range(20):
            fresh = [m for m in e.reg.live.values() if not m.stopped]
            if not fresh:
                break
            for m in fresh:
                m.stopped = True
                e.reg.send(m, signal.SIGSTOP)
            e.look(full=True)

    def resume(self) -> None:
        """Undo stop_forks (the members got SIGCONT with their SIGTERM already)."""

    def kill_all(self) -> bool:
        """SIGKILL every member at once; False where only one by one is possible."""
        return False

    def proven_empty(self) -> bool:
        """The backend's own proof that nothing of the lineage is left (asked only
        once no recorded member is left)."""
        return True

    def wait_fds(self) -> list[tuple[int, int]]:
        """(fd, poll events) that tell teardown's wait something changed."""
        return []

    def rearm(self) -> None:
        """Teardown's wait woke up: take in what made :meth:`wait_fds` ready, so that
        the next wait sleeps until the next change (instead of returning at once)."""

    def health(self) -> list[str]:
        """What this backend can no longer do (its helper killed, its structure
        taken away from outside), as sentences for people; [] when all is well."""
        return []

    def strays(self) -> list[Proc]:
        """Processes the backend holds but never recorded, for the report of a
        failed teardown."""
        return []

    def finish(self, timeout: float) -> None:
        """Every member is gone: let the backend's own helpers end (bounded)."""

    def close(self) -> None:
        """Free everything the backend holds."""
