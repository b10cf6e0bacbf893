#!/usr/bin/env python3
"""Tests of ring_trace_report.py's step cutting and per-stage figures on hand-made traces.

  python3 bench/gpu/ring_trace_report_test.py
"""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ring_trace_report as rep  # noqa: E402

US = 1000


def stage_step(t, kernel_us=100, offset=0):
    """One decode step of a stage from time t (ns): an upload, a graph launch, a wait."""
    api = [(t, t + 2 * US, "cudaMemcpyAsync"), (t + 3 * US, t + 5 * US, "cudaGraphLaunch"),
           (t + 6 * US, t + (20 + kernel_us) * US, "cudaStreamSynchronize")]
    gpu = [(t + 4 * US, t + 5 * US, "C"), (t + (8 + offset) * US, t + (8 + offset + kernel_us) * US, "K"),
           (t + (10 + offset + kernel_us) * US, t + (12 + offset + kernel_us) * US, "C")]
    return gpu, api


class Steps(unittest.TestCase):
    def test_a_long_gap_starts_a_step_and_figures_are_per_step(self):
        gpu, api = [], []
        for i in range(5):
            g, a = stage_step(i * 500 * US)
            gpu += g
            api += a
        steps = rep.steps_of(sorted(gpu), sorted(api), 60 * US, 3 * US)
        self.assertEqual(len(steps), 5)
        row = rep.stage_rows([rep.decode_steps(steps)])[0]
        self.assertEqual(row["start"], 8 * US)     # first call -> the kernel
        self.assertEqual(row["span"], 104 * US)    # kernel start -> the download's end
        self.assertEqual(row["busy"], 102 * US)    # kernel + download, not the upload before
        self.assertEqual(row["idle"], 2 * US)
        self.assertEqual(row["tail"], 8 * US)      # download end -> the wait returns
        self.assertEqual(row["host"], 120 * US)

    def test_a_short_gap_after_a_wait_ends_a_step_but_not_inside_one(self):
        # Two back-to-back steps 5 us apart (after a sync), launches 2 us apart inside each.
        _, a1 = stage_step(0)
        _, a2 = stage_step(125 * US)
        g1, _ = stage_step(0)
        g2, _ = stage_step(125 * US)
        steps = rep.steps_of(sorted(g1 + g2), sorted(a1 + a2), 60 * US, 3 * US)
        self.assertEqual(len(steps), 2)
        merged = rep.steps_of(sorted(g1 + g2), sorted(a1 + a2), 60 * US, 10 * US)
        self.assertEqual(len(merged), 1)

    def test_prefill_steps_are_left_out(self):
        gpu, api = [], []
        for i, k in enumerate([1000, 100, 100, 100]):
            g, a = stage_step(i * 2000 * US, kernel_us=k)
            gpu += g
            api += a
        dec = rep.decode_steps(rep.steps_of(sorted(gpu), sorted(api), 60 * US, 3 * US))
        self.assertEqual(len(dec), 3)

    def test_out_is_the_next_stages_first_call_after_this_step(self):
        s0, s1 = [], []
        for i in range(3):
            g, a = stage_step(i * 400 * US)
            s0.append((g, a))
            g, a = stage_step(i * 400 * US + 150 * US)
            s1.append((g, a))
        stages = []
        for s in (s0, s1):
            gpu = sorted(x for g, _ in s for x in g)
            api = sorted(x for _, a in s for x in a)
            stages.append(rep.decode_steps(rep.steps_of(gpu, api, 60 * US, 3 * US)))
        rows = rep.stage_rows(stages)
        self.assertEqual(rows[0]["out"], 30 * US)   # 0 ends at 120, 1 starts at 150
        self.assertEqual(rows[1]["out"], 130 * US)  # 1 ends at 270, 0 starts at 400


if __name__ == "__main__":
    unittest.main()
