"""Moved to :mod:`proctable.lineage._procconn`; this name keeps working."""

from .lineage._procconn import EXIT, FORK, SID, Event, Overrun, ProcConnector

__all__ = ["EXIT", "FORK", "SID", "Event", "Overrun", "ProcConnector"]
