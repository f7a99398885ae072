"""Moved to :mod:`proctable.lineage._cgroup`; this name keeps working."""

from .lineage._cgroup import Cgroup, own_cgroup, usable_parent, v2_mount

__all__ = ["Cgroup", "own_cgroup", "usable_parent", "v2_mount"]
