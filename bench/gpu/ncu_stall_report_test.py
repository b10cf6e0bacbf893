#!/usr/bin/env python3
"""Tests of ncu_stall_report.py on hand-made Nsight Compute output (no GPU needed).

  python3 bench/gpu/ncu_stall_report_test.py
"""
import io
import os
import sys
import unittest
from contextlib import redirect_stdout

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ncu_stall_report as rep  # noqa: E402

DETAILS = """\
==PROF== Disconnected from process 1704
  void unnamed>::MlaDecodeMmaKernel<512, 64>(unnamed>::MlaDecodeParams) (32, 4, 1)x(256, 1, 1), Context 1, Stream 13, Device 0, CC 9.0
    Section: GPU Speed Of Light Throughput
    ----------------------- ----------- ------------
    Metric Name             Metric Unit Metric Value
    ----------------------- ----------- ------------
    Elapsed Cycles                cycle       29,386
    Duration                         us        15.81
    SM Active Cycles              cycle    22,339.84
    Section: Warp State Statistics
    Warp Cycles Per Issued Instruction             cycle        14.00
    Section: Instruction Statistics
    Executed Instructions                           inst    1,572,864
    Section: Launch Statistics
    Registers Per Thread             register/thread             208
    Section: Scheduler Statistics
    Eligible Warps Per Scheduler        warp         0.17
  unnamed>::SplitCombineKernel(const float *, int, long, int, cpu::ActDType, float *, unsigned short *) (64, 4, 1)x(128, 1, 1), Context 1, Stream 13, Device 0, CC 9.0
    Duration                         ns       5700
    Executed Instructions                           inst      729,088
    Warp Cycles Per Issued Instruction             cycle         9.00
"""

HDR = ('"Address","Source","Warp Stall Sampling (All Samples)","Instructions Executed",'
       '"stall_barrier","stall_long_sb","stall_barrier (Not Issued)"')
SASS = "\n".join([
    '"Kernel Name","void ring::cuda::<unnamed>::MlaDecodeMmaKernel<(int)512, (int)64>(ring::cuda::<unnamed>::MlaDecodeParams)",',
    HDR,
    '"0x7f00000000a0","      FMUL R1, R1, UR4","30","1024","0","30","0"',
    '"0x7f00000000b0","      BAR.SYNC.DEFER_BLOCKING 0x0","10","2048","10","0","10"',
    '"0x7f00000000c0","      NOP","0","0","0","0","0"',
    '"Kernel Name","ring::cuda::<unnamed>::TopKRowsClusterKernel(const float *, long, long, const int *, int *)",',
    HDR,
    '"0x7f00000001a0","      UCGABAR_WAIT","3","512","3","0","3"',
])


class Names(unittest.TestCase):
    def test_namespaces_casts_and_parameters_go(self):
        self.assertEqual(rep.short_name(
            "void ring::cuda::<unnamed>::MlaDecodeMmaKernel<(int)512, (int)64>(ring::cuda::<unnamed>::MlaDecodeParams)"),
            "MlaDecodeMmaKernel<512, 64>")
        self.assertEqual(rep.short_name("unnamed>::SplitCombineKernel(const float *, int)"), "SplitCombineKernel")


class Details(unittest.TestCase):
    def test_launches_and_their_figures(self):
        ls = rep.parse_details(DETAILS)
        self.assertEqual([l["name"] for l in ls], ["MlaDecodeMmaKernel<512, 64>", "SplitCombineKernel"])
        self.assertEqual(ls[0]["grid"], (32, 4, 1))
        self.assertEqual(ls[0]["block"], (256, 1, 1))
        r = rep.launch_row(ls[0])
        # 128 blocks x 8 warps = 1024 warps; 1572864 / 1024 = 1536 instructions a warp.
        self.assertAlmostEqual(r["per_warp"], 1536.0)
        self.assertAlmostEqual(r["warp_cycles"], 1536.0 * 14.0)
        self.assertAlmostEqual(r["dur_us"], 15.81)
        self.assertEqual(r["regs"], 208)
        # A duration in ns is converted; 256 blocks x 4 warps.
        r2 = rep.launch_row(ls[1])
        self.assertAlmostEqual(r2["dur_us"], 5.7)
        self.assertAlmostEqual(r2["per_warp"], 729088 / 1024)


class Sass(unittest.TestCase):
    def test_stall_shares_leave_out_the_not_issued_columns(self):
        ks = rep.parse_sass(SASS)
        self.assertEqual([k[0] for k in ks], ["MlaDecodeMmaKernel<512, 64>", "TopKRowsClusterKernel"])
        n, shares = rep.stall_shares(ks[0][1])
        self.assertEqual(n, 40)
        self.assertEqual(list(shares.items()), [("long_sb", 0.75), ("barrier", 0.25)])

    def test_top_instructions_by_samples_with_their_main_reason(self):
        ks = rep.parse_sass(SASS)
        top = rep.top_instructions(ks[0][1], 5)
        self.assertEqual([(t[1], t[2], t[3]) for t in top],
                         [("FMUL R1, R1, UR4", 30, "long_sb"), ("BAR.SYNC.DEFER_BLOCKING 0x0", 10, "barrier")])

    def test_main_prints_both_tables(self):
        d = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"ncu_report_test_{os.getpid()}")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "d.txt"), "w") as f:
            f.write(DETAILS)
        with open(os.path.join(d, "s.csv"), "w") as f:
            f.write(SASS)
        out = io.StringIO()
        with redirect_stdout(out):
            rc = rep.main(["x", "--details", os.path.join(d, "d.txt"), "--sass", os.path.join(d, "s.csv")])
        self.assertEqual(rc, 0)
        text = out.getvalue()
        self.assertIn("| `MlaDecodeMmaKernel<512, 64>` | 32x4x1 | 256 | 208 | 15.81 |", text)
        self.assertIn("`TopKRowsClusterKernel`: 3 samples; stall reasons: barrier 100.0%", text)

    def test_no_input_is_a_usage_error(self):
        with redirect_stdout(io.StringIO()):
            self.assertEqual(rep.main(["x"]), 2)


if __name__ == "__main__":
    unittest.main()
