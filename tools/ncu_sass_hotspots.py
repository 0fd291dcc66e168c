#!/usr/bin/env python3
"""Where a kernel's warps wait, instruction by instruction.

Reads the source page of an Nsight Compute report as CSV, one row per SASS
instruction (made on the GPU machine by tools/gpu-run.sh's `ncu_sass`
stage:

    ncu --section SourceCounters --section WarpStateStats -o R ...
    ncu --import R.ncu-rep --page source --csv --print-source sass > R.csv

) and prints: the total of the warp-state samples, the instructions that
hold the most of them (address, share, running share, SASS, and the
columns that split a sample by stall reason, where the page has them), the
shares by opcode, and the loop the hottest instructions sit in (the SASS
between the lowest and the highest hot address), so that a kernel's
critical path can be read without a disassembler here.

    python3 tools/ncu_sass_hotspots.py R.csv [--top N] [--loop-lines N]

Exit status: 0, or 1 when the CSV has no instruction rows or no sample
column (its header is printed, so that the next run can name the column).
"""
import argparse
import csv
import re
import sys


def number(text):
    """A cell as a float: '1,234' and '12.5 %' read as 1234 and 12.5; other text as None."""
    t = (text or "").strip().replace(",", "").rstrip("%").strip()
    if not t:
        return None
    try:
        return float(t)
    except ValueError:
        return None


def find_column(header, *patterns):
    """The first header cell matching one of the patterns (regular expressions, case-insensitive), in order."""
    for p in patterns:
        for name in header:
            if re.search(p, name, re.IGNORECASE):
                return name
    return None


def load(path):
    """(header, rows) of the source page: the rows whose address parses, as dicts."""
    with open(path, newline="", encoding="utf-8", errors="replace") as f:
        lines = f.read().splitlines()
    # ncu may print lines before the table (its own notes, a kernel's name):
    # the table starts at the first line that names an address column
    start = next((i for i, l in enumerate(lines) if re.search(r'"?(Address|PC)"?\s*,', l)), None)
    if start is None:
        return [], []
    reader = csv.DictReader(lines[start:])
    header = reader.fieldnames or []
    addr = find_column(header, r"^address$", r"^pc$", r"address")
    rows = []
    for r in reader:
        a = (r.get(addr) or "").strip()
        try:
            r["_addr"] = int(a, 16) if a.lower().startswith("0x") else int(a, 16 if re.search("[a-f]", a, re.I) else 10)
        except ValueError:
            continue  # a repeated header or a kernel's name between tables
        rows.append(r)
    return header, rows


def opcode(sass):
    """The instruction's opcode without its predicate and modifiers: '@P0 HMMA.16816.F32' -> 'HMMA'."""
    words = sass.strip().split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0].split(".")[0] if words else "?"


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=40, help="hot instructions to list")
    ap.add_argument("--loop-lines", type=int, default=400, help="most SASS lines of the hot loop to print")
    args = ap.parse_args(argv)

    header, rows = load(args.csv)
    samples_col = find_column(header, r"warp stall sampling \(all", r"stall sampling.*all", r"sampling.*all samples",
                              r"samples")
    sass_col = find_column(header, r"^source$", r"sass", r"source")
    if not rows or samples_col is None or sass_col is None:
        print(f"{args.csv}: no instruction rows with a sample column; header: {header}")
        return 1
    not_issued_col = find_column(header, r"not.issued")
    executed_col = find_column(header, r"instructions executed")
    known = {samples_col, sass_col, not_issued_col, executed_col}
    # per-reason columns, where the page splits samples by stall reason
    reasons = [h for h in header if h not in known and re.search(r"stall|wait|barrier|throttle|dispatch|branch|"
                                                                  r"membar|sleeping|selected|mio|lg_|tex|math|"
                                                                  r"short_scoreboard|long_scoreboard|no_instruction",
                                                                  h, re.IGNORECASE)
               and any(number(r.get(h)) for r in rows)]

    for r in rows:
        r["_samples"] = number(r.get(samples_col)) or 0.0
        r["_sass"] = (r.get(sass_col) or "").strip()
    total = sum(r["_samples"] for r in rows)
    print(f"{len(rows)} SASS instructions, {total:.0f} warp-state samples ({samples_col})")
    if total <= 0:
        print("no samples: was the report made with --section WarpStateStats / SourceCounters?")
        return 1

    hot = sorted(rows, key=lambda r: -r["_samples"])[: args.top]
    print(f"\nthe {len(hot)} instructions with the most samples:")
    print(f"{'address':>8} {'share':>6} {'cum':>6} {'samples':>8}  SASS  [top reasons]")
    cum = 0.0
    for r in hot:
        cum += r["_samples"]
        why = ""
        if reasons:
            split = sorted(((number(r.get(h)) or 0.0, h) for h in reasons), reverse=True)[:3]
            named = ", ".join(f"{h} {v:.0f}" for v, h in split if v > 0)
            why = f"  [{named}]" if named else ""
        print(f"{r['_addr']:>8x} {100 * r['_samples'] / total:5.1f}% {100 * cum / total:5.1f}% "
              f"{r['_samples']:8.0f}  {r['_sass']}{why}")

    by_op = {}
    for r in rows:
        op = opcode(r["_sass"])
        s, n = by_op.get(op, (0.0, 0))
        by_op[op] = (s + r["_samples"], n + 1)
    print("\nsamples by opcode (share, instructions of that opcode):")
    for op, (s, n) in sorted(by_op.items(), key=lambda kv: -kv[1][0])[:25]:
        if s <= 0:
            break
        print(f"  {op:<12} {100 * s / total:5.1f}%  {n}")

    # the hot loop: from the lowest to the highest address of the instructions that hold
    # half of the samples, in address order, each with its share
    half, acc = [], 0.0
    for r in sorted(rows, key=lambda r: -r["_samples"]):
        if acc >= total / 2:
            break
        half.append(r)
        acc += r["_samples"]
    lo, hi = min(r["_addr"] for r in half), max(r["_addr"] for r in half)
    body = [r for r in sorted(rows, key=lambda r: r["_addr"]) if lo <= r["_addr"] <= hi]
    print(f"\nthe loop around the hottest half of the samples ({len(body)} instructions, {lo:x}..{hi:x}"
          f"{', first ' + str(args.loop_lines) if len(body) > args.loop_lines else ''}):")
    for r in body[: args.loop_lines]:
        share = 100 * r["_samples"] / total
        print(f"{r['_addr']:>8x} {share:5.1f}%  {r['_sass']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
