"""Mutation check of the test suite: break one production line at a time and run the tests that
must catch it; every mutant must make them fail.

    python scripts/mutation_check.py                       # every mutation of scripts/mutations.jsonl
    python scripts/mutation_check.py --only M5,M6 --tests-rev 1c0dcf8   # with another revision's tests
    python scripts/mutation_check.py --named-tests         # only the tests each mutation names

Each line of the mutations file names a production file, an exact piece of one line (``old``,
found exactly once) and its replacement (``new``), and the tests that must catch it. The whole
test *files* of those tests run (with the suite's own options from pyproject.toml: the same
processes, ordering and shared fixtures as ``python -m pytest``); a mutant is caught when pytest
exits 1 (tests failed), survives when it exits 0, and anything else (a collection error, an
interrupted run) is reported as an error. The file is restored after each mutant, also on
Ctrl-C. Run it on a clean work tree: it refuses to touch a production file with uncommitted
changes. With ``--tests-rev`` the test files come from that git revision for the run (the suite as
it was), and are restored afterwards.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True, text=True).stdout


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mutations", default=str(ROOT / "scripts" / "mutations.jsonl"))
    p.add_argument("--only", default="", help="comma-separated mutation ids")
    p.add_argument("--tests-rev", default=None, help="run the tests as they were at this git revision")
    p.add_argument("--pytest-args", default="-q -p no:cacheprovider", help="extra pytest arguments")
    p.add_argument("--named-tests", action="store_true",
                   help="run only the tests each mutation names, not their whole files (faster)")
    args = p.parse_args(argv)
    mutations = [json.loads(ln) for ln in Path(args.mutations).read_text().splitlines() if ln.strip()]
    if args.only:
        keep = set(args.only.split(","))
        mutations = [m for m in mutations if m["id"] in keep]
    results = []
    for m in mutations:
        path = ROOT / m["file"]
        if git("status", "--porcelain", "--", m["file"]).strip():
            print(f"{m['id']}: {m['file']} has uncommitted changes; refusing to mutate it", file=sys.stderr)
            return 2
        text = path.read_text()
        if text.count(m["old"]) != 1:
            print(f"{m['id']}: {m['old']!r} occurs {text.count(m['old'])} times in {m['file']}", file=sys.stderr)
            return 2
        files = sorted({t.split("::")[0] for t in m["tests"]})
        targets = sorted(set(m["tests"])) if args.named_tests else files
        swapped = []
        try:
            path.write_text(text.replace(m["old"], m["new"]))
            if args.tests_rev:
                for f in files:
                    (ROOT / f).write_text(git("show", f"{args.tests_rev}:{f}"))
                    swapped.append(f)
            t0 = time.monotonic()
            proc = subprocess.run([sys.executable, "-m", "pytest", *args.pytest_args.split(), *targets],
                                  cwd=ROOT, capture_output=True, text=True)
            took = time.monotonic() - t0
        finally:
            path.write_text(text)
            if swapped:
                git("checkout", "--", *swapped)
        failed = [ln.split(" ", 1)[1].split(" - ")[0] for ln in proc.stdout.splitlines() if ln.startswith("FAILED ")]
        verdict = {1: "caught", 0: "SURVIVED"}.get(proc.returncode, f"error (pytest exit {proc.returncode})")
        results.append((m, verdict, failed, took))
        print(f"{m['id']} {m['file']}: {verdict} in {took:.0f} s; failed: {', '.join(failed) or '-'}", flush=True)
        if verdict.startswith("error"):
            print(proc.stdout[-3000:], proc.stderr[-3000:], sep="\n", file=sys.stderr)
    print("\n| id | module | mutation | test files run | verdict | failing tests |")
    print("| --- | --- | --- | --- | --- | --- |")
    for m, verdict, failed, took in results:
        mutation = f"`{m['old']}` -> `{m['new']}`".replace("|", "\\|")
        shown = "<br>".join(f"`{f.split('::', 1)[1]}`" if "::" in f else f"`{f}`" for f in failed[:4])
        more = f" (+{len(failed) - 4})" if len(failed) > 4 else ""
        print(f"| {m['id']} | `{m['file']}` | {mutation} | {len({t.split('::')[0] for t in m['tests']})} | "
              f"{verdict} ({took:.0f} s) | {shown}{more} |")
    return 0 if all(v == "caught" for _, v, _, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
