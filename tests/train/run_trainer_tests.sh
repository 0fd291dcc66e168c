#!/usr/bin/env bash
# The trainer's unittest suite (train/tests), run by ctest. It needs a python
# with torch and numpy (Debian's python3-torch is not part of the install
# script: it is large and only the trainer uses it); without one the test is
# reported as skipped (exit 77). The engine side of the contract is tested
# without torch by the golden parity test.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
for py in /usr/bin/python3 python3; do
  if "$py" -c "import torch, numpy" 2>/dev/null; then
    cd "$root/train" && exec "$py" -m unittest discover -s tests
  fi
done
echo "skipped: no python with torch and numpy (apt-get install python3-torch)"
exit 77
