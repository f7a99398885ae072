"""Build wiring only: the cffi extension, the row type, the lineage's native
helper (an executable shipped inside the package), and the abi3 wheel tag.

Everything else (metadata, dependencies, tools) lives in pyproject.toml.
"""

import hashlib
import os
import sys
import sysconfig

try:
    import cffi  # noqa: F401  (fail loudly: a wheel without the C core is useless)
except ImportError as exc:  # pragma: no cover
    sys.exit(f"proctable needs cffi to build its C core: {exc}. pip install cffi")

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HELPER = "proctable-lineage"


class build_ext_proctable(build_ext):
    """build_ext that never reuses an object or a module built with other options
    (a build without the BPF reader, no clang say, must not decide the reader of
    the next build: objects go to a directory named by a hash of the extension's
    options, and a module built with other options is built again), then builds
    csrc/pt_lineage.c, pt_session.c and pt_helper.c as the executable
    proctable/proctable-lineage (Linux): the helper Lineage.spawn runs beside
    each command. Linked statically where the C
    library allows it (a few hundred KiB of memory per process instead of a
    dynamic libc's mappings), dynamically elsewhere."""

    def build_extension(self, ext: Extension) -> None:
        options = repr((sorted(ext.define_macros or []), ext.undef_macros, ext.include_dirs,
                        ext.extra_compile_args, ext.extra_link_args, ext.libraries))
        key = hashlib.sha256(options.encode()).hexdigest()[:16]
        os.makedirs(self.build_temp, exist_ok=True)
        stamp = os.path.join(self.build_temp, f"{ext.name}.options")
        try:
            with open(stamp) as f:
                same = f.read() == key
        except OSError:
            same = False
        temp, force = self.build_temp, self.force
        self.build_temp = os.path.join(temp, f"options-{key}")
        self.force = force or not same
        try:
            super().build_extension(ext)
        finally:
            self.build_temp, self.force = temp, force
        with open(stamp, "w") as f:
            f.write(key)

    def run(self) -> None:
        super().run()
        if sys.platform.startswith("linux"):
            self._build_helper()

    def _build_helper(self) -> None:
        out_dir = os.path.dirname(self.get_ext_fullpath("proctable._rows"))
        os.makedirs(out_dir, exist_ok=True)
        objects = self.compiler.compile(
            ["csrc/pt_lineage.c", "csrc/pt_session.c", "csrc/pt_helper.c"],
            output_dir=self.build_temp,
            extra_postargs=["-O2", "-Wall", "-Wextra", "-ffunction-sections",
                            "-fdata-sections"])
        try:
            self.compiler.link_executable(objects, HELPER, output_dir=out_dir,
                                          extra_postargs=["-static", "-Wl,--gc-sections", "-s"])
        except Exception as exc:  # no static C library here (glibc-static missing)
            print(f"proctable: static link of {HELPER} failed ({exc}); linking it "
                  "dynamically", file=sys.stderr)
            self.compiler.link_executable(objects, HELPER, output_dir=out_dir)
        os.chmod(os.path.join(out_dir, HELPER), 0o755)


# abi3 wheels, except on free-threaded builds, which have no stable ABI.
free_threaded = bool(sysconfig.get_config_var("Py_GIL_DISABLED"))
options = {} if free_threaded else {"bdist_wheel": {"py_limited_api": "cp39"}}

# proctable._rows: the Python row type, built straight from the C rows (cffi
# cannot create Python objects; see csrc/pt_rows.c for why it pays).
rows = Extension(
    "proctable._rows",
    sources=["csrc/pt_rows.c"],
    include_dirs=["csrc"],
    extra_compile_args=["-O2", "-Wall", "-Wextra"],
    py_limited_api=not free_threaded,
    define_macros=[] if free_threaded else [("Py_LIMITED_API", "0x03090000")],
)

setup(
    cffi_modules=["csrc/build_ffi.py:ffibuilder"],
    ext_modules=[rows],
    options=options,
    cmdclass={"build_ext": build_ext_proctable},
)
