#!/usr/bin/env bash
# Build the whole C extension with AddressSanitizer and UndefinedBehaviorSanitizer,
# then run test files against that build.
#
#   bash scripts/asan_tests.sh                 # the core test files (a few minutes)
#   bash scripts/asan_tests.sh tests           # the whole suite
#   bash scripts/asan_tests.sh tests/test_scanner.py -k refresh
#
# The build goes into a throwaway venv (made with --system-site-packages, so that
# pytest, cffi and hypothesis come from this Python; its own site-packages comes
# first, so the sanitized proctable wins over any editable install). CPython itself
# is not instrumented, so libasan is LD_PRELOADed and leak checking is off (the
# interpreter keeps memory until exit on purpose). Every process the tests start
# inherits the preload; sanitizer reports, from any of them, go to log files, and
# any report fails the run. Needs gcc (or CC=clang with its shared ASan runtime).
# Not part of .ci/run: it is slow.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
PY="${PYTHON:-python3}"
CC="${CC:-gcc}"

if [ "$#" -eq 0 ]; then
    set -- tests/test_table.py tests/test_exit_probe.py tests/test_parse_stat.py \
        tests/test_scanner.py tests/test_watcher.py tests/test_terminate.py \
        tests/test_reliability_churn.py tests/test_reliability_concurrency.py \
        tests/test_reliability_badinput.py tests/test_reliability_fuzz.py
fi

if [ "$CC" = "gcc" ] || [ "${CC##*/}" = "gcc" ]; then
    RUNTIME="$("$CC" -print-file-name=libasan.so)"
else
    RUNTIME="$("$CC" -print-file-name=libclang_rt.asan-"$(uname -m)".so)"
fi
if [ ! -f "$RUNTIME" ]; then
    echo "asan_tests.sh: no shared ASan runtime for $CC ($RUNTIME)" >&2
    exit 2
fi

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
# Tests run steps as uid 65534 and in fresh interpreters: they must reach the build.
chmod 755 "$WORK"
mkdir -m 1777 "$WORK/logs"

echo "== building the extension with -fsanitize=address,undefined ($CC)"
# --without-pip: pip and setuptools then come from this Python too, not from
# the (older) copies a venv bundles.
"$PY" -m venv --system-site-packages --without-pip "$WORK/venv"
mkdir "$WORK/src"
cp -r pyproject.toml setup.py README.md LICENSE MANIFEST.in csrc src "$WORK/src/"
rm -rf "$WORK/src/src/proctable/"_native*.so "$WORK/src/src/proctable/"_native.c
SAN="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g -O1"
if [ "$CC" != "gcc" ] && [ "${CC##*/}" != "gcc" ]; then
    SAN="$SAN -shared-libasan"
fi
CC="$CC" CFLAGS="$SAN" LDFLAGS="$SAN" \
    "$WORK/venv/bin/python" -m pip install --quiet --no-deps --no-build-isolation \
    "$WORK/src" >"$WORK/build.log" 2>&1 || { cat "$WORK/build.log" >&2; exit 1; }

NATIVE="$(LD_PRELOAD="$RUNTIME" ASAN_OPTIONS=detect_leaks=0 "$WORK/venv/bin/python" \
    -c 'import proctable._native as n; print(n.__file__)' || true)"
case "$NATIVE" in
    "$WORK"/*) ;;
    *) echo "asan_tests.sh: the sanitized build is not the one imported ($NATIVE)" >&2; exit 1 ;;
esac
if ! grep -q __asan_init "$NATIVE" || ! grep -q __ubsan_handle "$NATIVE"; then
    echo "asan_tests.sh: $NATIVE is not instrumented" >&2
    exit 1
fi
echo "   $NATIVE"

echo "== pytest $* (under ASan/UBSan)"
rc=0
# From the repository root: its src/ is not on sys.path (src layout).
# PYTHONMALLOC=malloc: Python's own objects (the bytes handed to the parser, the
# row buffers cffi allocates) then come from malloc, so ASan guards them too.
PYTHONMALLOC=malloc LD_PRELOAD="$RUNTIME" \
ASAN_OPTIONS="detect_leaks=0:log_path=$WORK/logs/asan:strict_string_checks=1:detect_stack_use_after_return=1" \
UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:log_path=$WORK/logs/ubsan" \
    "$WORK/venv/bin/python" -m pytest -p no:cacheprovider -q "$@" || rc=$?

reports=$(find "$WORK/logs" -type f | wc -l)
if [ "$reports" -ne 0 ]; then
    echo "== $reports sanitizer report(s):" >&2
    find "$WORK/logs" -type f -exec sh -c 'echo "--- $1"; cat "$1"' _ {} \; >&2
    exit 1
fi
echo "== no sanitizer report; pytest exit $rc"
exit "$rc"
