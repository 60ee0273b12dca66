"""The run index: the SQLite tables that cache the run folders (runs, attempts, known-goods), and how a report or a
known-good record becomes their rows. The store (``campaign/store.py``) opens, heals and queries it; the folders stay
the truth.
"""

from __future__ import annotations

import sqlite3

from campaign.records import LaunchSpec, RunReport

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
  run_id TEXT PRIMARY KEY, experiment TEXT, host TEXT, recipe TEXT, started_at TEXT, ended_at TEXT,
  status TEXT, attempts INTEGER, passed INTEGER, failed INTEGER, final_variant TEXT
);
CREATE TABLE IF NOT EXISTS attempts (
  run_id TEXT, idx INTEGER, variant TEXT, role TEXT, outcome TEXT, failed_phase TEXT, kind TEXT,
  fingerprint TEXT, ended_at TEXT, spec_hash TEXT, PRIMARY KEY (run_id, idx)
);
CREATE TABLE IF NOT EXISTS known_goods (
  host TEXT, experiment TEXT, variant TEXT, spec_json TEXT, spec_hash TEXT, run_id TEXT, attempt INTEGER,
  proven_at TEXT, PRIMARY KEY (host, experiment)
);
"""
#: Stores made before known-goods were per experiment: their rows move over, with the experiment of their run.
MIGRATE = """
INSERT OR IGNORE INTO known_goods
  SELECT k.host, r.experiment, k.variant, k.spec_json, k.spec_hash, k.run_id, k.attempt, k.proven_at
  FROM known_good k JOIN runs r ON r.run_id = k.run_id;
DROP TABLE known_good;
"""


def index_report(con: sqlite3.Connection, report: RunReport) -> None:
    """Write one report's row and its attempts' rows (replacing what the index held of that run)."""
    passed = sum(1 for a in report.attempts if a.outcome == "passed" and a.role != "restore")
    failed = sum(1 for a in report.attempts if a.outcome == "failed" and a.role != "restore")
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


def index_known_good(con: sqlite3.Connection, row: dict[str, object]) -> None:
    """Write one known-good record (a ``.known-goods/`` file's content) as the row of its host and experiment."""
    spec = LaunchSpec.model_validate(row["spec"])
    con.execute(
        "INSERT OR REPLACE INTO known_goods VALUES (?,?,?,?,?,?,?,?)",
        (
            row["host"],
            row["experiment"],
            row["variant"],
            spec.model_dump_json(),
            spec.spec_hash(),
            row["run_id"],
            row["attempt"],
            row["proven_at"],
        ),
    )
