#!/usr/bin/env python3
"""Checks that src/serve's folders include only the layers below them (docs/design/0005).

  frontends/  ->  repository/  ->  scheduling/, runtime/  ->  core/

A file may include its own folder and any folder of a lower layer; scheduling/ and runtime/
are one layer and do not include each other. serve_command.{h,cc}, at the top, may include
anything. Prints each include that breaks the rule as FILE:LINE: and exits 1; 0 when clean.

  check_serve_layers.py [--source-dir DIR]
"""

import argparse
import os
import re
import sys

LAYER = {"core": 0, "runtime": 1, "scheduling": 1, "repository": 2, "frontends": 3}
INCLUDE = re.compile(r'^\s*#\s*include\s+"serve/([a-z_]+)/')


def violations(source_dir):
    serve = os.path.join(source_dir, "src", "serve")
    found = []
    for folder in sorted(LAYER):
        directory = os.path.join(serve, folder)
        if not os.path.isdir(directory):
            found.append(f"src/serve/{folder}/: missing")
            continue
        for name in sorted(os.listdir(directory)):
            path = os.path.join(directory, name)
            with open(path, encoding="utf-8") as f:
                for number, line in enumerate(f, 1):
                    match = INCLUDE.match(line)
                    if not match or match.group(1) == folder:
                        continue
                    target = match.group(1)
                    if target not in LAYER or LAYER[target] >= LAYER[folder]:
                        found.append(f"src/serve/{folder}/{name}:{number}: {folder}/ may not "
                                     f"include serve/{target}/ (layers: docs/design/0005)")
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source-dir",
                        default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    args = parser.parse_args()
    found = violations(args.source_dir)
    for line in found:
        print(line)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
