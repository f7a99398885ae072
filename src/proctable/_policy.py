"""The old import path of the restart policy; it lives in ``proctable.supervise._policy``."""

from __future__ import annotations

from .supervise._policy import Counters, Decision, RestartPolicy, decide

__all__ = ["Counters", "Decision", "RestartPolicy", "decide"]
