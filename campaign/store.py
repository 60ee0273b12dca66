"""The run store: ``runs/<run-id>/`` folders plus an SQLite index of runs, attempts and known-good per host.

Layout::

    runs/index.sqlite                  runs, attempts (kind, fingerprint), known_good (one row per host)
    runs/<run-id>/report.json          records.RunReport, rewritten atomically after every attempt
    runs/<run-id>/experiment.yaml      the resolved experiment (after --set), as it was run
    runs/<run-id>/logs/<NN>-<variant>.log   each attempt's server log, copied from the host

The report is the truth; the index is derived from it and can be rebuilt. The known-good row holds the exact
launch spec (secrets included, so a restore relaunches precisely what was proven); that is why index.sqlite is
created with mode 0600, and why reports hold only masked specs.
"""

from __future__ import annotations

import json
import os
import secrets
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

from campaign.errors import StoreError
from campaign.records import LaunchSpec, RunReport

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
  run_id TEXT PRIMARY KEY, experiment TEXT, host TEXT, recipe TEXT, started_at TEXT, ended_at TEXT,
  status TEXT, attempts INTEGER, passed INTEGER, failed INTEGER, final_variant TEXT
);
CREATE TABLE IF NOT EXISTS attempts (
  run_id TEXT, idx INTEGER, variant TEXT, role TEXT, outcome TEXT, failed_phase TEXT, kind TEXT,
  fingerprint TEXT, ended_at TEXT, spec_hash TEXT, PRIMARY KEY (run_id, idx)
);
CREATE TABLE IF NOT EXISTS known_good (
  host TEXT PRIMARY KEY, variant TEXT, spec_json TEXT, spec_hash TEXT, run_id TEXT, attempt INTEGER, proven_at TEXT
);
"""


@dataclass(frozen=True)
class KnownGood:
    """The last launch spec proven on a host (readiness + smoke + gates), with where it was proven."""

    host: str
    variant: str
    spec: LaunchSpec
    spec_hash: str
    run_id: str
    attempt: int
    proven_at: str


@dataclass(frozen=True)
class RunRow:
    """One line of `campaign runs`."""

    run_id: str
    experiment: str
    host: str
    recipe: str
    started_at: str
    ended_at: str | None
    status: str
    attempts: int
    passed: int
    failed: int
    final_variant: str | None


@dataclass(frozen=True)
class FailureGroup:
    """Failures that share a fingerprint: the same cause seen again."""

    fingerprint: str
    kind: str
    count: int
    first_seen: str
    last_seen: str
    variants: list[str]
    runs: list[str]


def now_iso() -> str:
    """The local time as an ISO 8601 string with offset."""
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


class Store:
    """A run store rooted at a folder (``runs/`` by default)."""

    def __init__(self, root: Path | str = "runs") -> None:
        self.root = Path(root)

    # -- index ------------------------------------------------------------------------------------

    def _db(self) -> sqlite3.Connection:
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            path = self.root / "index.sqlite"
            fresh = not path.exists()
            con = sqlite3.connect(path, timeout=10)
            if fresh:
                os.chmod(path, 0o600)
            con.executescript(_SCHEMA)
            return con
        except (OSError, sqlite3.Error) as e:
            raise StoreError(f"cannot open the run index in {self.root}: {e}") from e

    # -- runs ------------------------------------------------------------------------------------

    def new_run_id(self, experiment: str) -> str:
        """A sortable, unique run id: date-time, experiment, 4 random hex digits."""
        return f"{time.strftime('%Y%m%d-%H%M%S')}-{experiment}-{secrets.token_hex(2)}"

    def run_dir(self, run_id: str) -> Path:
        """The folder of a run (created)."""
        d = self.root / run_id
        d.mkdir(parents=True, exist_ok=True)
        return d

    def save_text(self, run_id: str, name: str, text: str) -> str:
        """Write a file into the run folder; returns its path relative to the folder."""
        path = self.run_dir(run_id) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        _atomic_write(path, text.encode())
        return name

    def save_log(self, run_id: str, attempt: int, variant: str, data: bytes) -> str:
        """Copy an attempt's server log into the run folder; returns its relative path."""
        rel = f"logs/{attempt:02d}-{variant}.log"
        path = self.run_dir(run_id) / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        _atomic_write(path, data)
        return rel

    def save_report(self, report: RunReport) -> None:
        """Write report.json atomically and refresh the index rows of the run and its attempts."""
        _atomic_write(self.run_dir(report.run_id) / "report.json", report.model_dump_json(indent=2).encode())
        passed = sum(1 for a in report.attempts if a.outcome == "passed" and a.role != "restore")
        failed = sum(1 for a in report.attempts if a.outcome == "failed" and a.role != "restore")
        with self._db() as con:
            con.execute(
                "INSERT OR REPLACE INTO runs VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                (
                    report.run_id,
                    report.experiment,
                    report.host,
                    report.recipe,
                    report.started_at,
                    report.ended_at,
                    report.status,
                    len(report.attempts),
                    passed,
                    failed,
                    report.final.variant,
                ),
            )
            for a in report.attempts:
                con.execute(
                    "INSERT OR REPLACE INTO attempts VALUES (?,?,?,?,?,?,?,?,?,?)",
                    (
                        report.run_id,
                        a.index,
                        a.variant,
                        a.role,
                        a.outcome,
                        a.failed_phase,
                        a.diagnosis.kind if a.diagnosis else None,
                        a.diagnosis.fingerprint if a.diagnosis and a.outcome == "failed" else None,
                        a.ended_at,
                        a.spec_hash,
                    ),
                )
        con.close()

    def resolve(self, ref: str) -> str:
        """A run id from a full id, a unique prefix, or ``last``."""
        if ref == "last":
            rows = self.list_runs(limit=1)
            if not rows:
                raise StoreError(f"no runs in {self.root}", hint="run an experiment first: campaign run quickstart")
            return rows[0].run_id
        if (self.root / ref / "report.json").is_file():
            return ref
        matches = sorted(p.name for p in self.root.glob(f"{ref}*") if (p / "report.json").is_file())
        if len(matches) == 1:
            return matches[0]
        if not matches:
            raise StoreError(f"no run {ref!r} in {self.root}", hint="`campaign runs` lists them")
        raise StoreError(f"{ref!r} matches {len(matches)} runs: {', '.join(matches[:5])}", hint="give more of the id")

    def load_report(self, ref: str) -> RunReport:
        """The report of a run (id, prefix or ``last``)."""
        run_id = self.resolve(ref)
        path = self.root / run_id / "report.json"
        try:
            return RunReport.model_validate_json(path.read_bytes())
        except (OSError, ValueError) as e:
            raise StoreError(f"cannot read {path}: {e}") from e

    def _exists(self) -> bool:
        # Reading never creates a store: a dry run or `campaign runs` in a fresh checkout leaves no trace.
        return (self.root / "index.sqlite").is_file()

    def list_runs(self, limit: int | None = None) -> list[RunRow]:
        """Runs, newest first."""
        if not self._exists():
            return []
        con = self._db()
        sql = "SELECT * FROM runs ORDER BY started_at DESC, run_id DESC"
        rows = con.execute(sql + (f" LIMIT {int(limit)}" if limit else "")).fetchall()
        con.close()
        return [RunRow(*r) for r in rows]

    def failures(self) -> list[FailureGroup]:
        """Failed attempts grouped by fingerprint, most frequent first."""
        if not self._exists():
            return []
        con = self._db()
        rows = con.execute(
            "SELECT fingerprint, kind, COUNT(*), MIN(ended_at), MAX(ended_at), "
            "GROUP_CONCAT(DISTINCT variant), GROUP_CONCAT(DISTINCT run_id) FROM attempts "
            "WHERE outcome = 'failed' AND fingerprint IS NOT NULL GROUP BY fingerprint, kind "
            "ORDER BY COUNT(*) DESC, MAX(ended_at) DESC"
        ).fetchall()
        con.close()
        return [
            FailureGroup(
                fingerprint=r[0],
                kind=r[1] or "unknown",
                count=r[2],
                first_seen=r[3] or "",
                last_seen=r[4] or "",
                variants=sorted((r[5] or "").split(",")),
                runs=sorted((r[6] or "").split(",")),
            )
            for r in rows
        ]

    # -- known-good ------------------------------------------------------------------------------------

    def known_good(self, host: str) -> KnownGood | None:
        """The host's known-good, or None when nothing was ever proven there."""
        if not self._exists():
            return None
        con = self._db()
        row = con.execute("SELECT * FROM known_good WHERE host = ?", (host,)).fetchone()
        con.close()
        if row is None:
            return None
        try:
            spec = LaunchSpec.model_validate(json.loads(row[2]))
        except ValueError as e:
            raise StoreError(f"the known-good record of {host} is unreadable: {e}") from e
        return KnownGood(
            host=row[0], variant=row[1], spec=spec, spec_hash=row[3], run_id=row[4], attempt=row[5], proven_at=row[6]
        )

    def set_known_good(self, host: str, variant: str, spec: LaunchSpec, run_id: str, attempt: int) -> None:
        """Record ``spec`` as the host's known-good; called only after it was proven."""
        with self._db() as con:
            con.execute(
                "INSERT OR REPLACE INTO known_good VALUES (?,?,?,?,?,?,?)",
                (host, variant, spec.model_dump_json(), spec.spec_hash(), run_id, attempt, now_iso()),
            )
        con.close()


def _atomic_write(path: Path, data: bytes) -> None:
    """Write via a temporary file and rename, so a crash never leaves half a report."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except OSError as e:
        raise StoreError(f"cannot write {path}: {e.strerror}") from e
