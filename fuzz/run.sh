#!/usr/bin/env bash
# Fuzz pt_parse_stat with libFuzzer, AddressSanitizer and UndefinedBehaviorSanitizer.
#
#   bash fuzz/run.sh                 # the long run: 20,000,000 inputs (about 95 s on 2 vCPUs)
#   bash fuzz/run.sh -runs=20000     # a short one (the test suite runs this)
#   bash fuzz/run.sh -max_total_time=600
#
# Needs clang with the libFuzzer and sanitizer runtimes (Debian: apt-get install
# clang; the runtimes come with libclang-rt-dev / libclang-common-dev). Arguments
# are passed to the fuzzer and replace the default -runs. The checked-in seed corpus
# (fuzz/corpus/, real stat lines; fuzz/make_corpus.py collects them) is copied to a
# scratch directory first, so a run never writes into the repository; crash inputs
# land in $FUZZ_OUT (default: a temp dir), which is kept when the run fails.
set -euo pipefail
# The fuzzer links clang's own sanitizer runtime: never another one preloaded.
unset LD_PRELOAD
HERE="$(cd "$(dirname "$0")" && pwd)"
CC="${CC:-clang}"
OUT="${FUZZ_OUT:-$(mktemp -d)}"
mkdir -p "$OUT/corpus"
cp "$HERE"/corpus/* "$OUT/corpus/"

"$CC" -g -O1 -fno-omit-frame-pointer \
    -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
    -I"$HERE/../csrc" "$HERE/fuzz_stat.c" "$HERE/../csrc/pt_stat.c" \
    -o "$OUT/fuzz_stat"

args=("$@")
if [ "${#args[@]}" -eq 0 ]; then
    args=(-runs=20000000)
fi
cd "$OUT"
set +e
ASAN_OPTIONS="${ASAN_OPTIONS:-abort_on_error=1}" \
UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}" \
    ./fuzz_stat -dict="$HERE/stat.dict" -max_len=4096 -print_final_stats=1 \
    -artifact_prefix="$OUT/" "${args[@]}" corpus
rc=$?
set -e
if [ "$rc" -ne 0 ]; then
    echo "fuzz/run.sh: the fuzzer failed (exit $rc); inputs and crash files are in $OUT" >&2
    exit "$rc"
fi
if [ -z "${FUZZ_OUT:-}" ]; then
    rm -rf "$OUT"
fi
