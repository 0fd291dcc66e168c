#!/usr/bin/env bash
# The server under ThreadSanitizer: wmserve, the client library and the
# tests built with -fsanitize=thread, the server's unit and integration
# tests run, and every race report whose two accesses are both in our code
# printed. Debian's gRPC, protobuf and Abseil are not instrumented, so the
# order gRPC itself establishes (a reactor's constructor before its
# callbacks, a callback before OnDone) is invisible to the tool: reports
# whose accesses sit in those libraries are dropped, and tools/tsan.supp
# names the few of ours that only gRPC orders, with the reason. The
# emulator's fibers overflow the tool's stack depot, so the --device cuda
# tests are left out; the engine's OpenMP runtime is not instrumented
# either, so the server runs with one engine thread. The tests run 5-15x
# slower than usual: a timing-bound one (the slow reader's exact drop count)
# can fail for that alone.
#
#   bash tools/tsan.sh [BUILD_DIR]     (default build-tsan; ~15 minutes on 2 cores)
# Exit 0 when no report of ours remains and every test passed.
set -uo pipefail
cd "$(dirname "$0")/.."
src=$(pwd)
build=${1:-build-tsan}
tsan="-fsanitize=thread -fno-omit-frame-pointer"
mkdir -p "$build"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DWM_BUILD_CUDA=OFF -DCMAKE_CXX_FLAGS="$tsan" \
  -DCMAKE_C_FLAGS=-fsanitize=thread -DCMAKE_EXE_LINKER_FLAGS=-fsanitize=thread \
  -DCMAKE_SHARED_LINKER_FLAGS=-fsanitize=thread > "$build/configure.log" || exit 1
cmake --build "$build" -j"$(nproc)" --target server_unit_tests server_integration_tests wmplay wmckpt || exit 1
logs="$build/tsan-logs"
rm -rf "$logs" && mkdir -p "$logs"
# exitcode=0: a test passes or fails on its behaviour; the reports are read below
export TSAN_OPTIONS="halt_on_error=0 exitcode=0 history_size=4 log_path=$logs/log suppressions=$src/tools/tsan.supp"
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
rc=0
"$build/tests/server/server_unit_tests" --gtest_brief=1 || rc=1
"$build/tests/server/server_integration_tests" --gtest_brief=1 --gtest_filter=-*Device* || rc=1
/usr/bin/python3 tests/server/web_player_test.py "$build/server/wmserve" "$build/tools/wmckpt" \
  "$build/clients/wmplay" "$src" 2>&1 | tail -3 || rc=1
/usr/bin/python3 - "$logs" <<'EOF' || rc=1
"""Prints the race reports whose accesses are both in our code; exit 1 if any."""
import collections, glob, re, sys

# not instrumented either: what they do on their own threads (OpenSSL's,
# called by gRPC's TLS) shows only the frame of ours that started gRPC
LIBS = ("grpc", "gpr_", "protobuf", "absl", "civetweb", "prometheus", "libssl", "libcrypto", "SSL_", "CRYPTO_")
found = collections.OrderedDict()
for path in sorted(glob.glob(sys.argv[1] + "/log.*")):
    for block in open(path, errors="replace").read().split("==================")[1:]:
        if "WARNING: ThreadSanitizer" not in block:
            continue
        sections = re.split(r"\n  (?=(?:Write|Read|Previous|Atomic))", block)[1:3]
        stacks = [re.findall(r"#\d+ (.*)", s)[:3] for s in sections]
        if len(stacks) < 2 or any(any(l in f for l in LIBS for f in s) for s in stacks):
            continue
        if not any("wm::" in f or "/server/" in f or "/clients/" in f for s in stacks for f in s):
            continue
        key = tuple(s[0] if s else "" for s in stacks)
        found.setdefault(key, (path, block))
for key, (path, block) in found.items():
    print("=" * 18, path)
    print(block.strip()[:6000])
print("tsan: %d report(s) of ours" % len(found))
sys.exit(1 if found else 0)
EOF
exit $rc
