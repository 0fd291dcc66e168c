#!/usr/bin/env bash
# One launch of the warp-specialised attention kernel under Nsight Compute's
# source counters and warp-state sampling, then its source page as CSV (a
# row per SASS instruction, with the samples taken at it) and the hot spots
# (tools/ncu_sass_hotspots.py). The GPU check's `ncu_sass` stage runs it;
# there is no disassembler on the build machine, so this is where the
# kernel's SASS comes from.
#
#   bash tools/ncu_sass.sh NCU REPORT_DIR CSV COMMAND...
#
# REPORT_DIR gets the report (REPORT_DIR/ws-sass.ncu-rep), CSV the page.
set -u
if [ $# -lt 4 ]; then
  echo "usage: $0 NCU REPORT_DIR CSV COMMAND..." >&2
  exit 2
fi
ncu=$1 dir=$2 csv=$3
shift 3
here=$(cd "$(dirname "$0")" && pwd)
"$ncu" --clock-control none -k regex:attention_ws --launch-skip 2 --launch-count 1 \
  --section SourceCounters --section WarpStateStats -f -o "$dir/ws-sass" "$@" || exit $?
# --print-source names the SASS view; a version of ncu that does not know the flag prints SASS anyway
"$ncu" --import "$dir/ws-sass.ncu-rep" --page source --csv --print-source sass > "$csv" 2> "$dir/ws-sass.err" ||
  "$ncu" --import "$dir/ws-sass.ncu-rep" --page source --csv > "$csv" 2>> "$dir/ws-sass.err" || {
    cat "$dir/ws-sass.err"
    exit 1
  }
echo "$(wc -l < "$csv") lines of the source page in $(basename "$csv")"
python3 "$here/ncu_sass_hotspots.py" "$csv"
