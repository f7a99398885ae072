"""Moved to :mod:`proctable.lineage._reaper` (run by path as a fresh interpreter);
this name keeps working."""

from .lineage._reaper import main

__all__ = ["main"]

if __name__ == "__main__":  # pragma: no cover
    import sys

    sys.exit(main())
