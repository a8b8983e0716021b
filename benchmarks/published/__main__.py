"""``python -m benchmarks.published [--only ID ...] [--no-write]``: replay the published rows,
print the error table and write it into benchmarks/RESULTS.md (section "published validation")."""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time

from benchmarks.published.replay import load_rows, replay, table, write_results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.published", description=__doc__)
    ap.add_argument("--only", nargs="*", help="replay only these row ids (the table is not written)")
    ap.add_argument("--no-write", action="store_true", help="print the table, leave RESULTS.md alone")
    args = ap.parse_args(argv)
    data = load_rows()
    rows = data["rows"]
    if args.only:
        unknown = sorted(set(args.only) - {r["id"] for r in rows})
        if unknown:
            print(f"--only {unknown[0]}: no such row; rows: {', '.join(r['id'] for r in rows)}", file=sys.stderr)
            return 2
        rows = [r for r in rows if r["id"] in args.only]
    section = table(replay(rows, data), data)
    # when and where: the replay is deterministic (seed 1), the line says what produced this copy
    section += (f"\nReplayed {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC on {platform.machine()} "
                f"({os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}): `python -m benchmarks.published`.\n")
    print(section)
    if not args.only and not args.no_write:
        write_results(section)
        print("wrote benchmarks/RESULTS.md (section 'published validation')")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
