#!/usr/bin/env python3
"""Reads `ctest --show-only=json-v1` on stdin; prints, one per line and escaped for a ctest
regular expression, the name of every test that needs one of the project's test clusters:
it requires, sets up or takes down a fixture named *_cluster (slurm_cluster, yarn_cluster,
spark_cluster, kubernetes_cluster), or one that itself needs such a cluster (kubernetes_kwok).

sanitize/run.sh leaves these out of the ASan suite (docs/design/0011-sanitizers.md). Read from
ctest's own listing, so a new cluster test is left out by the fixture it names, not by a list
kept by hand.
"""
import json
import sys

# CMake's regular expressions give these a meaning; gtest's names hold some ("(", ")", ".").
SPECIAL = set("^$.[]()*+?|\\")


def escaped(name: str) -> str:
    return "".join("\\" + c if c in SPECIAL else c for c in name)


def as_list(value) -> list:
    if value is None:
        return []
    return value if isinstance(value, list) else [value]


def main() -> int:
    listing = json.load(sys.stdin)
    tests = []
    for test in listing.get("tests", []):
        props = {p["name"]: p["value"] for p in test.get("properties", [])}
        tests.append((test["name"], as_list(props.get("FIXTURES_REQUIRED")),
                      as_list(props.get("FIXTURES_SETUP")) + as_list(props.get("FIXTURES_CLEANUP"))))
    cluster_fixtures = {f for _, _, own in tests for f in own if f.endswith("_cluster")}
    # A fixture set up by a test that needs a cluster is a cluster fixture too (kwok's nodes).
    for _, required, own in tests:
        if set(required) & cluster_fixtures:
            cluster_fixtures.update(own)
    for name, required, own in tests:
        if (set(required) | set(own)) & cluster_fixtures:
            print(escaped(name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
