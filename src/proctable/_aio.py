"""asyncio, only where the caller uses it: ``import proctable`` does not import it.

An ``asyncio.subprocess.Process`` can only exist once asyncio was imported, so the
type test looks at ``sys.modules`` instead of importing asyncio to ask.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import asyncio.subprocess
    from typing import TypeGuard

__all__ = ["is_asyncio_process"]


def is_asyncio_process(obj: object) -> TypeGuard[asyncio.subprocess.Process]:
    """Is obj an ``asyncio.subprocess.Process`` (without importing asyncio)?"""
    mod = sys.modules.get("asyncio.subprocess")
    return mod is not None and isinstance(obj, mod.Process)
