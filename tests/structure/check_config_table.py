#!/usr/bin/env python3
"""README's configuration table must be what `cudalloc-replay --print-config-table` prints
from config/'s key table, so that a key added there cannot be missing here.

Usage: check_config_table.py CUDALLOC_REPLAY README.md
Regenerate the table with: build/tools/cudalloc-replay --print-config-table
"""

import subprocess
import sys


def readme_table(text, header):
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line == header:
            table = []
            for row in lines[i:]:
                if not row.startswith("|"):
                    break
                table.append(row)
            return table
    return None


def main():
    replay, readme = sys.argv[1], sys.argv[2]
    generated = subprocess.run([replay, "--print-config-table"], check=True, capture_output=True,
                               text=True).stdout.splitlines()
    with open(readme, encoding="utf-8") as f:
        found = readme_table(f.read(), generated[0])
    if found is None:
        print(f"{readme}: no table starting with {generated[0]!r}")
        return 1
    if found != generated:
        print(f"{readme}: the configuration table differs from {replay} --print-config-table:")
        for want, have in zip(generated, found + [""] * len(generated)):
            if want != have:
                print(f"  expected: {want}\n  found:    {have}")
        if len(found) > len(generated):
            print("  extra rows:\n    " + "\n    ".join(found[len(generated):]))
        return 1
    print(f"README's configuration table matches ({len(generated) - 2} keys)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
