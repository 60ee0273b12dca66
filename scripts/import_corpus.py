"""Build the diagnosis corpus (tests/data/corpus/excerpts.jsonl) from the shared excerpts and gathered ones.

Sources, in order: shared/logs/real-failures.jsonl (kept whole, as the project's first corpus), then each gathered
file given. Every record gets ``repo`` (from ``source`` when absent) and ``origin`` (the file it came from). A record
is left out, with the reason printed and counted, when:

- a field is missing, the label is not one of the labels, or ``source`` is not ``owner/name#number``;
- its id or its excerpt (white space collapsed) was already taken;
- it is listed in tests/data/corpus/dropped.yaml (``id: reason``): the excerpts a reviewer read and judged not
  verbatim or wrongly labelled.

A record listed in tests/data/corpus/outside_excerpt.yaml (``id: reason``) is kept with ``evidence: outside_excerpt``
and ``evidence_reason``: a reviewer read it and found no evidence of its cause in the text (the cause is only in the
thread title, or the paste ends before the error), so the right answer of a log diagnoser is ``inconclusive``. Every
other record gets ``evidence: in_excerpt``. An id listed there that is not in the corpus is an error (exit 1).

    .venv/bin/python scripts/import_corpus.py [GATHERED.jsonl ...]
"""

from __future__ import annotations

import json
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

from campaign.diagnose import signatures

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared" / "logs" / "real-failures.jsonl"
CORPUS = ROOT / "tests" / "data" / "corpus"
# The labels a log excerpt can carry: every diagnosis kind except those only the loop gives (a knob not in effect, a
# missed gate) and the two verdicts that are no root cause (unknown, inconclusive).
LABELS = set(signatures().kinds) - {"config_not_applied", "below_gate", "bench_errors", "unknown", "inconclusive"}
_SOURCE = re.compile(r"^[\w.-]+/[\w.-]+#\d+$")
FIELDS = ("id", "category", "server", "source", "excerpt", "note")


def _problem(record: dict[str, Any]) -> str | None:
    missing = [f for f in FIELDS if not isinstance(record.get(f), str) or not record[f].strip()]
    if missing:
        return f"missing {', '.join(missing)}"
    if record["category"] not in LABELS:
        return f"label {record['category']!r} is not one of the labels"
    if not _SOURCE.match(record["source"]):
        return f"source {record['source']!r} is not owner/name#number"
    if record.get("repo") and record["repo"] != record["source"].split("#", 1)[0]:
        return f"repo {record['repo']!r} does not match source {record['source']!r}"
    return None


def main(argv: list[str] | None = None) -> int:
    """Merge, check, write; print what was left out and the counts."""
    gathered = [Path(p) for p in (sys.argv[1:] if argv is None else argv)]
    dropped_by_review: dict[str, str] = yaml.safe_load((CORPUS / "dropped.yaml").read_text(encoding="utf-8")) or {}
    outside: dict[str, str] = yaml.safe_load((CORPUS / "outside_excerpt.yaml").read_text(encoding="utf-8")) or {}
    seen_ids: set[str] = set()
    seen_text: set[str] = set()
    kept: list[dict[str, Any]] = []
    left_out: Counter[str] = Counter()
    for path in [SHARED, *gathered]:
        origin = (
            "shared/logs/real-failures.jsonl"
            if path == SHARED
            else str(path.resolve().relative_to(ROOT))
            if path.resolve().is_relative_to(ROOT)
            else f"corpus-staging/{path.name}"
        )
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                print(f"{path.name}:{n}: not JSON ({e})")
                left_out["not JSON"] += 1
                continue
            problem = _problem(record)
            text = " ".join(str(record.get("excerpt", "")).split())
            if problem is None and record["id"] in seen_ids:
                problem = "duplicate id"
            elif problem is None and text in seen_text:
                problem = "duplicate excerpt"
            elif problem is None and record["id"] in dropped_by_review:
                problem = f"review: {dropped_by_review[record['id']]}"
            if problem is not None:
                print(f"{path.name}:{n}: {record.get('id', '?')}: {problem}")
                left_out[problem.split(":")[0]] += 1
                continue
            seen_ids.add(record["id"])
            seen_text.add(text)
            record["repo"] = record["source"].split("#", 1)[0]
            record["origin"] = origin
            record["evidence"] = "outside_excerpt" if record["id"] in outside else "in_excerpt"
            if record["id"] in outside:
                record["evidence_reason"] = outside[record["id"]]
            kept.append(record)
    unknown = sorted(set(outside) - seen_ids)
    if unknown:
        print(f"outside_excerpt.yaml names ids that are not in the corpus: {', '.join(unknown)}", file=sys.stderr)
        return 1
    out = CORPUS / "excerpts.jsonl"
    out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in kept), encoding="utf-8")
    labels = Counter(r["category"] for r in kept)
    servers = Counter(r["server"] for r in kept)
    print(
        f"\nwrote {len(kept)} excerpts to {out.relative_to(ROOT)}; left out {sum(left_out.values())}: {dict(left_out)}"
    )
    print(f"repositories: {len({r['repo'] for r in kept})}; servers: {dict(servers.most_common())}")
    print(f"labels: {dict(sorted(labels.items()))}")
    print(f"evidence outside the excerpt (tests/data/corpus/outside_excerpt.yaml): {len(outside)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
