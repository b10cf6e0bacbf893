#!/usr/bin/env python3
"""Tests of glm_trace_report.py's idle attribution on hand-made traces (no GPU needed).

  python3 bench/gpu/glm_trace_report_test.py
"""
import os
import sys
import unittest
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import glm_trace_report as rep  # noqa: E402


def K(start, end, name="k", grid="1x1x1"):
    return ("K", start, end, name, grid)


class HostCausedIdle(unittest.TestCase):
    def test_gap_split_at_the_return_of_the_call(self):
        a, b = K(0, 10, "a"), K(20, 30, "b")
        corr = {a: 1, b: 2}
        # b's launch returned at 15: 5 of the 10 idle ns were the host's.
        host, total = rep.host_caused_idle([[a, b]], corr, {1: 0, 2: 15})
        self.assertEqual((host, total), (5, 10))

    def test_call_back_before_the_gap_is_the_devices(self):
        a, b = K(0, 10), K(20, 30)
        host, total = rep.host_caused_idle([[a, b]], {a: 1, b: 2}, {1: 0, 2: 4})
        self.assertEqual((host, total), (0, 10))

    def test_host_share_never_exceeds_the_gap(self):
        a, b = K(0, 10), K(20, 30)
        host, total = rep.host_caused_idle([[a, b]], {a: 1, b: 2}, {1: 0, 2: 25})
        self.assertEqual((host, total), (10, 10))

    def test_overlapping_work_is_not_idle(self):
        # b runs under a (PDL); the gap before c starts where the later of them ends.
        a, b, c = K(0, 10, "a"), K(5, 12, "b"), K(20, 25, "c")
        before = defaultdict(float)
        host, total = rep.host_caused_idle([[a, b, c]], {a: 1, b: 2, c: 3}, {3: 22}, before)
        self.assertEqual((host, total), (8, 8))
        self.assertEqual(dict(before), {"c": 8})

    def test_unknown_calls_and_copies(self):
        # No runtime record for b (traced without RING_KERNEL_TRACE_API): idle, not the host's;
        # a copy ending a gap is named [memcpy].
        a, b, c = K(0, 10), K(12, 14), ("C", 20, 21, 2, 4)
        before = defaultdict(float)
        host, total = rep.host_caused_idle([[a, b, c]], {a: 1, c: 3}, {3: 30}, before)
        self.assertEqual((host, total), (6, 8))
        self.assertEqual(dict(before), {"[memcpy]": 6})

    def test_steps_add_up(self):
        s1 = [K(0, 10), K(20, 30)]
        s2 = [K(100, 110), K(115, 120)]
        corr = {s1[0]: 1, s1[1]: 2, s2[0]: 3, s2[1]: 4}
        host, total = rep.host_caused_idle([s1, s2], corr, {2: 12, 4: 115})
        self.assertEqual((host, total), (2 + 5, 10 + 5))


class HostCalls(unittest.TestCase):
    def test_calls_of_a_step_and_the_wait_after_it(self):
        first, last = K(10, 20), ("C", 40, 41, 2, 4)
        api = [(0, 2, 9, "cudaMallocAsync"),       # before the step's first call: not counted
               (3, 8, 1, "cudaLaunchKernelExC"),   # queues `first`
               (9, 10, 7, "cudaFuncSetAttribute"),
               (11, 16, 2, "cudaLaunchKernelExC"),
               (17, 19, 3, "cudaMemcpyAsync"),     # queues `last`
               (20, 45, 8, "cudaStreamSynchronize"),
               (50, 51, 9, "cudaLaunchKernelExC")]  # the next step's
        out = rep.host_calls([[first, last]], {first: 1, last: 3}, api)
        self.assertEqual({f: tuple(v) for f, v in out.items()},
                         {"cudaLaunchKernelExC": (10, 2), "cudaFuncSetAttribute": (1, 1),
                          "cudaMemcpyAsync": (2, 1), "cudaStreamSynchronize": (25, 1)})


class LinearShare(unittest.TestCase):
    def test_linear_kernels_only_per_step(self):
        short = {"g": "void QmmGemmKernel<qdec::Mxfp4, GemmCfg<8, 16, 3, 1, true> >",
                 "a": "void AttentionMmaKernel<192, 128, 64, 64>", "x": "GatherBf16Kernel"}
        # Two steps of 3 ms of linear kernels (2.5 + 0.5) and 1 ms of attention each.
        steps = [[K(0, 2_500_000, "g"), K(2_500_000, 3_500_000, "a"), K(3_500_000, 4_000_000, "x")]] * 2
        ms, rate, frac = rep.linear_share(steps, short, 0.9, 600.0)
        self.assertAlmostEqual(ms, 3.0)
        self.assertAlmostEqual(rate, 300.0)
        self.assertAlmostEqual(frac, 0.5)

    def test_no_peak_no_fraction(self):
        ms, rate, frac = rep.linear_share([[K(0, 1_000_000, "g")]], {"g": "QgemvColKernel"}, 0.1)
        self.assertEqual((round(ms, 6), round(rate, 6), frac), (1.0, 100.0, None))

    def test_bench_line_parsed(self):
        import tempfile
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
            f.write("prefill linear FLOPs: 7.001 TFLOP (routed experts 1.237 TFLOP)\n")
        try:
            self.assertAlmostEqual(rep.parse_bench(f.name)["linear_tflop"], 7.001)
        finally:
            os.unlink(f.name)


if __name__ == "__main__":
    unittest.main()
