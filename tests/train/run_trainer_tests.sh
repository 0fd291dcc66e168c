#!/usr/bin/env bash
# The trainer's unittest suite (train/tests), run by ctest.
#   run_trainer_tests.sh numpy   the modules that need numpy only (data
#                                loading, config limits, safetensors, noise)
#   run_trainer_tests.sh torch   every module; it needs a python with torch
#                                (Debian's python3-torch is not part of the
#                                install script: it is large and only the
#                                trainer uses it)
# Without the python it needs the test is reported as skipped (exit 77). The
# engine side of the contract is tested without torch by the golden parity test.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
mode=${1:-torch}
case "$mode" in
  numpy) need="numpy"; tests=(tests.test_config_limits tests.test_data tests.test_safetensors tests.test_noise) ;;
  torch) need="torch, numpy"; tests=() ;;
  *) echo "usage: run_trainer_tests.sh numpy|torch" >&2; exit 2 ;;
esac
for py in /usr/bin/python3 python3; do
  if "$py" -c "import $need" 2>/dev/null; then
    cd "$root/train" || exit 1
    if [ ${#tests[@]} -eq 0 ]; then exec "$py" -m unittest discover -s tests; fi
    exec "$py" -m unittest "${tests[@]}"
  fi
done
echo "skipped: no python with $need (apt-get install python3-${need%%,*})"
exit 77
