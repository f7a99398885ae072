"""Build wiring only: the cffi extension and the abi3 wheel tag.

Everything else (metadata, dependencies, tools) lives in pyproject.toml.
"""

import sys
import sysconfig

try:
    import cffi  # noqa: F401  (fail loudly: a wheel without the C core is useless)
except ImportError as exc:  # pragma: no cover
    sys.exit(f"proctable needs cffi to build its C core: {exc}. pip install cffi")

from setuptools import setup

# abi3 wheels, except on free-threaded builds, which have no stable ABI.
free_threaded = bool(sysconfig.get_config_var("Py_GIL_DISABLED"))
options = {} if free_threaded else {"bdist_wheel": {"py_limited_api": "cp39"}}

setup(
    cffi_modules=["csrc/build_ffi.py:ffibuilder"],
    options=options,
)
