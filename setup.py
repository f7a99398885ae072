"""Build wiring only: the cffi extension, the row type, and the abi3 wheel tag.

Everything else (metadata, dependencies, tools) lives in pyproject.toml.
"""

import sys
import sysconfig

try:
    import cffi  # noqa: F401  (fail loudly: a wheel without the C core is useless)
except ImportError as exc:  # pragma: no cover
    sys.exit(f"proctable needs cffi to build its C core: {exc}. pip install cffi")

from setuptools import Extension, setup

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
)
