#!/usr/bin/env python3
"""One line per test label after a ctest run: how many tests ran, passed, failed and were skipped.

ctest's own summary counts a skipped test as passed ("100% tests passed"), so a CUDA build on a
machine without a GPU looks like a green GPU run. This line says it: "cuda: 193 tests, 0 ran,
193 skipped (no usable GPU: the CUDA kernels were not checked)".

Usage: ctest_summary.py BUILD_DIR JUNIT_XML (the file ctest --output-junit wrote).
"""
import collections
import json
import subprocess
import sys
import xml.etree.ElementTree as ET


def labels_by_test(build_dir):
    listing = subprocess.run(["ctest", "--show-only=json-v1"], cwd=build_dir, check=True,
                             capture_output=True, text=True).stdout
    labels = {}
    for test in json.loads(listing)["tests"]:
        for prop in test.get("properties", []):
            if prop["name"] == "LABELS":
                labels[test["name"]] = prop["value"]
    return labels


def outcomes(junit_path):
    result = {}
    for case in ET.parse(junit_path).getroot().iter("testcase"):
        if case.find("skipped") is not None:
            result[case.get("name")] = "skipped"
        elif case.find("failure") is not None or case.get("status") == "fail":
            result[case.get("name")] = "failed"
        elif case.get("status") == "run":
            result[case.get("name")] = "passed"
        else:
            result[case.get("name")] = "not run"
    return result


def summarize(labels, results):
    """Lines "<label>: N tests, R ran (P passed, F failed), S skipped, X not run" by label."""
    counts = collections.defaultdict(collections.Counter)
    for name, outcome in results.items():
        for label in labels.get(name, ["(none)"]):
            counts[label][outcome] += 1
    lines = []
    for label in sorted(counts):
        c = counts[label]
        total = sum(c.values())
        ran = c["passed"] + c["failed"]
        line = (f"{label}: {total} tests, {ran} ran ({c['passed']} passed, {c['failed']} failed), "
                f"{c['skipped']} skipped, {c['not run']} not run")
        if label == "cuda" and ran == 0:
            line += " -- no usable GPU: the CUDA kernels were not checked"
        lines.append(line)
    return lines


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    for line in summarize(labels_by_test(sys.argv[1]), outcomes(sys.argv[2])):
        print(line)


if __name__ == "__main__":
    main()
