"""cffi builder for proctable._native (out-of-line API mode).

The cdef is the part of csrc/proctable.h between the cdef-begin and cdef-end
markers, so the header stays the single C contract.

On Linux the BPF reader's program (csrc/pt_iter.bpf.c) is compiled here too:
clang -target bpf, then ``bpftool gen skeleton -L`` turns the object into a
header (build/pt_bpf/pt_iter.lskel.h) that csrc/pt_bpf.c includes, so the
program is embedded in the extension and nothing extra ships. Where clang,
bpftool or the libbpf headers are missing (or PROCTABLE_BUILD_BPF=0), the
extension is built with the /proc reader only, and says so at build time and
in ``proctable.reader()``; PROCTABLE_REQUIRE_BPF=1 (the release wheels) makes
that an error instead. CLANG and BPFTOOL name other binaries.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import sysconfig
from typing import Optional

from cffi import FFI

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
BPF_OUT = ROOT / "build" / "pt_bpf"


def _cdef() -> str:
    text = (HERE / "proctable.h").read_text()
    start = text.index("/* cdef-begin */") + len("/* cdef-begin */")
    end = text.index("/* cdef-end */")
    return text[start:end]


def _sources() -> list[str]:
    names = ["pt_stat.c"]
    if sys.platform.startswith("linux"):
        names += ["pt_linux.c", "pt_bpf.c"]
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


def _tool(env: str, name: str) -> Optional[str]:
    """The binary named by $env, else name on PATH or in the sbin dirs."""
    chosen = os.environ.get(env)
    if chosen:
        return shutil.which(chosen) or (chosen if os.access(chosen, os.X_OK) else None)
    path = os.environ.get("PATH", "") + os.pathsep + "/usr/sbin:/sbin:/usr/local/sbin"
    return shutil.which(name, path=path)


def _run(args: list[str], out: Optional[pathlib.Path] = None) -> Optional[str]:
    """Run a build step; None when it worked, else the reason it did not."""
    try:
        r = subprocess.run(args, capture_output=True, timeout=300, check=False)
    except OSError as exc:
        return f"{args[0]}: {exc}"
    except subprocess.TimeoutExpired:
        return f"{args[0]} timed out"
    if r.returncode != 0:
        lines = r.stderr.decode("utf-8", "replace").strip().splitlines()
        last = next((x for x in reversed(lines) if "error" in x), lines[-1] if lines else "")
        return f"{pathlib.Path(args[0]).name} failed: {last.strip()[:200]}"
    if out is not None:
        out.write_bytes(r.stdout)
    return None


# setup.py commands that compile (pip's metadata and requirement hooks run
# setup.py too: the note is told once, by the build itself).
_BUILDS = {"build", "build_ext", "bdist_wheel", "editable_wheel", "install", "develop"}


def _tell_the_terminal(note: str) -> None:
    """Write note on the terminal of the person who runs the build, where stderr
    is not it: pip shows a build's output only with -v or when the build fails.
    Without a terminal (CI), stderr, in the build log, is where it is."""
    if not _BUILDS & set(sys.argv[1:]) or sys.stderr.isatty():
        return
    try:
        fd = os.open("/dev/tty", os.O_WRONLY | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.write(fd, f"\n{note}\n".encode())
    except OSError:
        pass
    finally:
        os.close(fd)


def build_bpf() -> tuple[list[tuple[str, Optional[str]]], list[str], str]:
    """Compile the BPF program into its light skeleton.

    Returns (define_macros, include_dirs, note): PT_HAVE_BPF and the directory
    of the generated header when it worked, else PT_BPF_BUILD_NOTE with the
    reason. The note is also printed, so that a build log says which readers
    the extension has.
    """
    if not sys.platform.startswith("linux"):
        return [], [], ""
    reason: Optional[str] = None
    if os.environ.get("PROCTABLE_BUILD_BPF", "1") == "0":
        reason = "PROCTABLE_BUILD_BPF=0"
    clang = _tool("CLANG", "clang")
    bpftool = _tool("BPFTOOL", "bpftool")
    if reason is None and clang is None:
        reason = "no clang"
    if reason is None and bpftool is None:
        reason = "no bpftool"
    if reason is None:
        BPF_OUT.mkdir(parents=True, exist_ok=True)
        obj = BPF_OUT / "pt_iter.bpf.o"
        header = BPF_OUT / "pt_iter.lskel.h"
        # -g: the BTF and CO-RE records the kernel relocates the program with.
        reason = _run([clang, "-g", "-O2", "-target", "bpf", "-mcpu=v3", "-Wall",
                       "-I", str(HERE), "-c", str(HERE / "pt_iter.bpf.c"), "-o", str(obj)])
        if reason is None:
            reason = _run([bpftool, "gen", "skeleton", "-L", str(obj), "name", "pt_iter"],
                          out=header)
        if reason is None and b"pt_iter__load" not in header.read_bytes():
            reason = "bpftool made no light skeleton"
    if reason is not None:
        if os.environ.get("PROCTABLE_REQUIRE_BPF") == "1":
            raise RuntimeError(f"proctable: PROCTABLE_REQUIRE_BPF=1, but the BPF reader "
                               f"cannot be built: {reason}")
        note = (f"proctable: building without the BPF reader ({reason}); the /proc reader "
                "only. The README's 'Building from source' names the packages that give "
                "the fast reader; proctable.reader() tells which one a build has.")
        print(note, file=sys.stderr)
        _tell_the_terminal(note)
        escaped = reason.replace("\\", "\\\\").replace('"', '\\"')
        return [("PT_BPF_BUILD_NOTE", f'"{escaped}"')], [], note
    note = "proctable: building with the BPF reader (csrc/pt_iter.bpf.c, light skeleton)"
    print(note, file=sys.stderr)
    return [("PT_HAVE_BPF", "1")], [str(BPF_OUT.relative_to(ROOT))], note


def make_ffi(extra_compile_args: list[str] | None = None,
             extra_link_args: list[str] | None = None) -> FFI:
    ffi = FFI()
    ffi.cdef(_cdef())
    macros, bpf_dirs, _note = build_bpf()
    ffi.set_source(
        "proctable._native",
        '#include "proctable.h"\n',
        sources=_sources(),
        include_dirs=[str(HERE.relative_to(HERE.parent)), *bpf_dirs],
        define_macros=macros,
        # Rebuild the C core when the program or its records change.
        depends=[str((HERE / n).relative_to(ROOT)) for n in
                 ("proctable.h", "pt_internal.h", "pt_bpf_abi.h", "pt_iter.bpf.c")],
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
