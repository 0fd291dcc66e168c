#!/usr/bin/env python3
"""tools/ncu_sass_hotspots.py on source pages in the form ncu writes them:
the hot instructions in order with their shares and stall reasons, opcodes
summed, the loop around the hottest half; a page without samples refused."""
import contextlib
import io
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
import ncu_sass_hotspots as hot  # noqa: E402

PAGE = '''"Kernel Name","attention_ws_kernel"
"Address","Source","Warp Stall Sampling (All Samples)","Warp Stall Sampling (Not-issued Samples)","Instructions Executed","stall_long_sb","stall_barrier"
"0x7f00","MOV R1, c[0x0][0x28]","0","0","4,096","0","0"
"0x7f10","@P0 BAR.SYNC.DEFER_BLOCKING 0x1, 0x100","1,200","1,100","2,048","0","1,150"
"0x7f20","HGMMA.64x64x16.F32 R24, gdesc[UR4], RZ, !UPT","300","250","8,192","0","0"
"0x7f30","MUFU.EX2 R40, R40","2,500","2,000","65,536","10","0"
"0x7f40","FMNMX R3, R4, R5, !PT","500","400","32,768","0","0"
"0x7f50","WARPGROUP.DEPBAR.LE gsb0, 0x1","3,000","2,900","2,048","2,800","0"
"0x7f60","MUFU.EX2 R41, R41","0","0","65,536","0","0"
"0x7f70","EXIT","0","0","128","0","0"
'''


def run(text, *flags):
    with tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False) as f:
        f.write(text)
        path = f.name
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            rc = hot.main([path, *flags])
    finally:
        os.unlink(path)
    return rc, out.getvalue()


class Hotspots(unittest.TestCase):
    def test_hot_instructions_in_order_with_shares_and_reasons(self):
        rc, out = run(PAGE, "--top", "3")
        self.assertEqual(rc, 0, out)
        self.assertIn("8 SASS instructions, 7500 warp-state samples", out)
        listed = out.split("most samples:")[1].split("samples by opcode")[0].strip().splitlines()[1:]
        self.assertEqual(len(listed), 3, out)
        self.assertIn("7f50  40.0%  40.0%", listed[0])
        self.assertIn("[stall_long_sb 2800]", listed[0])
        self.assertIn("7f30  33.3%  73.3%", listed[1])
        self.assertIn("[stall_barrier 1150]", listed[2])
        self.assertIn("@P0 BAR.SYNC", listed[2])

    def test_opcodes_are_summed_without_predicates_and_modifiers(self):
        rc, out = run(PAGE)
        self.assertEqual(rc, 0, out)
        ops = out.split("samples by opcode")[1].split("the loop")[0]
        self.assertRegex(ops, r"MUFU\s+33\.3%\s+2")  # two MUFU.EX2, one without samples
        self.assertRegex(ops, r"BAR\s+16\.0%\s+1")
        self.assertNotIn("@P0", ops)

    def test_the_loop_spans_the_hottest_half(self):
        rc, out = run(PAGE)
        self.assertEqual(rc, 0, out)
        loop = out.split("the loop around the hottest half")[1]
        self.assertIn("(3 instructions, 7f30..7f50)", loop)
        self.assertIn("FMNMX", loop)
        self.assertNotIn("EXIT", loop)

    def test_a_page_without_samples_is_refused_with_its_header(self):
        rc, out = run('"Address","Source"\n"0x10","EXIT"\n')
        self.assertEqual(rc, 1)
        self.assertIn("no instruction rows with a sample column", out)
        self.assertIn("'Source'", out)
        rc, out = run("not a table\n")
        self.assertEqual(rc, 1)
        zero = PAGE.replace('"1,200"', '"0"').replace('"300"', '"0"').replace('"2,500"', '"0"')
        rc, out = run(zero.replace('"500"', '"0"').replace('"3,000"', '"0"'))
        self.assertEqual(rc, 1)
        self.assertIn("no samples", out)


if __name__ == "__main__":
    unittest.main()
