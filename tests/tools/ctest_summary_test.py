#!/usr/bin/env python3
"""tools/ctest_summary.py: the per-label counts, the no-GPU warning, and the labels the build
really gives its tests (SPECULA_BUILD_DIR)."""
import importlib.util
import os
import tempfile
import unittest

_TOOLS = os.path.join(os.path.dirname(__file__), "..", "..", "tools")
_spec = importlib.util.spec_from_file_location("ctest_summary",
                                               os.path.join(_TOOLS, "ctest_summary.py"))
summary = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(summary)

JUNIT = """<?xml version="1.0" encoding="UTF-8"?>
<testsuite name="(empty)" tests="4">
  <testcase name="K.Skipped" status="notrun"><skipped message="SKIP_REGULAR_EXPRESSION_MATCHED"/></testcase>
  <testcase name="K.Passed" status="run"/>
  <testcase name="C.Failed" status="fail"><failure message="Failed"/></testcase>
  <testcase name="C.Passed" status="run"/>
</testsuite>
"""


class CtestSummaryTest(unittest.TestCase):
    def outcomes(self):
        with tempfile.NamedTemporaryFile("w", suffix=".xml", delete=False) as f:
            f.write(JUNIT)
        try:
            return summary.outcomes(f.name)
        finally:
            os.unlink(f.name)

    def test_outcomes_read_from_junit(self):
        self.assertEqual(self.outcomes(), {"K.Skipped": "skipped", "K.Passed": "passed",
                                           "C.Failed": "failed", "C.Passed": "passed"})

    def test_all_cuda_skipped_says_no_gpu(self):
        labels = {"K.Skipped": ["gtest", "cuda"], "K.Passed": ["gtest"], "C.Failed": ["gtest"],
                  "C.Passed": ["gtest", "e2e"]}
        lines = summary.summarize(labels, self.outcomes())
        self.assertIn("cuda: 1 tests, 0 ran (0 passed, 0 failed), 1 skipped, 0 not run -- no "
                      "usable GPU: the CUDA kernels were not checked", lines)
        self.assertIn("gtest: 4 tests, 3 ran (2 passed, 1 failed), 1 skipped, 0 not run", lines)
        self.assertIn("e2e: 1 tests, 1 ran (1 passed, 0 failed), 0 skipped, 0 not run", lines)

    def test_cuda_that_ran_has_no_warning(self):
        labels = {"K.Passed": ["cuda"]}
        lines = summary.summarize(labels, {"K.Passed": "passed"})
        self.assertEqual(lines, ["cuda: 1 tests, 1 ran (1 passed, 0 failed), 0 skipped, 0 not run"])

    def test_the_build_labels_its_tests(self):
        labels = summary.labels_by_test(os.environ["SPECULA_BUILD_DIR"])
        self.assertIn("e2e", labels["LifecycleE2eTest.DaemonHelpListsEveryFlagWithDashes"])
        self.assertIn("gtest", labels["LifecycleE2eTest.DaemonHelpListsEveryFlagWithDashes"])
        self.assertNotIn("cuda", labels["ConfigTest.DefaultsAreTheDocumentedOnes"])
        cuda = [name for name in labels if name.startswith("CudaBackendTest.")]
        for name in cuda:  # built only with the CUDA backend
            self.assertCountEqual(labels[name], ["gtest", "cuda"], name)


if __name__ == "__main__":
    unittest.main()
