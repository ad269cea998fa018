"""Fuzz every reader for as long as asked; crashing inputs are written to a folder.

    python bench/fuzz.py --minutes 30 --out bench/out/crashes [--seed 1]

Prints the cases run, the findings by kind, and one line per distinct
finding (the last line of its traceback). Exit 1 when anything was found.
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fixtures.corpus import build_corpus  # noqa: E402
from fixtures.fuzz import corpus_seeds, fuzz, seeds  # noqa: E402
from fixtures.make_fixtures import build  # noqa: E402
from fixtures.valid_corpus import build_valid  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--cases", type=int, default=10**9)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("bench/out/crashes"))
    args = parser.parse_args()
    until = time.monotonic() + args.minutes * 60
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        fixtures = build(work / "fixtures", work / "SENTINEL")
        corpus = build_corpus(work / "corpus", work / "SENTINEL")
        valid = build_valid(work / "valid")
        all_seeds = seeds(fixtures, work / "seeds") + corpus_seeds(
            {name: case.path for name, case in corpus.items()}) + corpus_seeds(valid)
        print(f"{len(all_seeds)} seeds (fixtures, the hostile corpus, the valid encodings)",
              flush=True)
        distinct: dict[str, list[str]] = collections.defaultdict(list)
        run = 0
        for case, finding in fuzz(all_seeds, args.cases, args.out, args.seed, until):
            run = case + 1
            if finding is not None:
                signature = f"{finding.seed}: {finding.kind}: {finding.detail.splitlines()[0]}"
                distinct[signature].append(finding.saved.name)
                print(f"case {case}: {signature} -> {finding.saved}", flush=True)
            if run % 500 == 0:
                print(f"{run} cases, {sum(map(len, distinct.values()))} findings", flush=True)
        if (work / "SENTINEL").exists():
            print("SENTINEL CREATED: code from a file ran", flush=True)
            return 2
    print(f"\n{run} cases in {args.minutes:g} min (seed {args.seed}): "
          f"{sum(map(len, distinct.values()))} findings, {len(distinct)} distinct")
    for signature, files in sorted(distinct.items()):
        print(f"  {len(files):5d}  {signature}  (e.g. {files[0]})")
    return 1 if distinct else 0


if __name__ == "__main__":
    sys.exit(main())
