"""cffi builder for proctable._native (out-of-line API mode).

The cdef is the part of csrc/proctable.h between the cdef-begin and cdef-end
markers, so the header stays the single C contract.
"""

from __future__ import annotations

import pathlib
import sys
import sysconfig

from cffi import FFI

HERE = pathlib.Path(__file__).resolve().parent


def _cdef() -> str:
    text = (HERE / "proctable.h").read_text()
    start = text.index("/* cdef-begin */") + len("/* cdef-begin */")
    end = text.index("/* cdef-end */")
    return text[start:end]


def _sources() -> list[str]:
    names = ["pt_stat.c"]
    if sys.platform.startswith("linux"):
        names.append("pt_linux.c")
    elif sys.platform == "darwin":
        # The threaded scan and the fd-keeping scanner are Linux-only; this
        # file gives them portable forms over the reader's pt_snapshot().
        names += ["pt_darwin.c", "pt_portable.c"]
    else:
        raise RuntimeError(f"proctable supports Linux and macOS, not {sys.platform}")
    # process_iter's extra reads (the parsers everywhere, the reader on Linux).
    names.append("pt_extra.c")
    # cffi wants paths relative to the project root (where setup.py runs).
    return [str((HERE / n).relative_to(HERE.parent)) for n in names]


def make_ffi(extra_compile_args: list[str] | None = None,
             extra_link_args: list[str] | None = None) -> FFI:
    ffi = FFI()
    ffi.cdef(_cdef())
    ffi.set_source(
        "proctable._native",
        '#include "proctable.h"\n',
        sources=_sources(),
        include_dirs=[str(HERE.relative_to(HERE.parent))],
        extra_compile_args=["-std=c99", "-O2", "-Wall", "-Wextra"]
        + (extra_compile_args or []),
        extra_link_args=extra_link_args or [],
        libraries=["pthread"] if sys.platform.startswith("linux") else [],
        # The stable ABI does not exist on free-threaded builds.
        py_limited_api=not sysconfig.get_config_var("Py_GIL_DISABLED"),
    )
    return ffi


ffibuilder = make_ffi()

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
