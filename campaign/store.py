"""The run store: ``runs/<run-id>/`` folders plus an SQLite index of runs, attempts and known-good per host.

Layout::

    runs/index.sqlite                  runs, attempts (kind, fingerprint), known_goods (one per host and experiment)
    runs/<run-id>/report.json          records.RunReport, rewritten atomically after every attempt
    runs/<run-id>/experiment.yaml      the resolved experiment (after --set), as it was run
    runs/<run-id>/logs/<NN>-<variant>.log   each attempt's server log, copied from the host
    runs/.known-goods/<host>~<experiment>.json   (folder 0700, files 0600) each known-good, exact (secrets included)

The run folders are the truth; the index is a cache of them. When index.sqlite is missing (with run folders
present), empty or not a database, it is moved aside and rebuilt from the report.json and known-good.json files;
rows whose folder is gone are pruned (``heal``, also run by ``campaign doctor``). The known-good records hold the
exact launch spec (secrets included, so a restore relaunches precisely what was proven); that is why they and
index.sqlite are created with mode 0600, and why reports hold only masked specs.

A run whose CLI died stays ``running`` in its report until the next command on its host finds it without the
host's lock: ``reconcile`` then records it ``interrupted``, with what was found running.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

from campaign.errors import StoreError
from campaign.records import FailureGroup, Final, Healing, LaunchSpec, RunReport, RunRow, SmokeResult
from campaign.runindex import MIGRATE, SCHEMA, index_known_good, index_report

#: A run id (or a prefix of one): the characters config.NAME_RE allows, so a reference never climbs out of the store.
_RUN_REF = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]*")
_KNOWN_GOODS = ".known-goods"


@dataclass(frozen=True)
class KnownGood:
    """The last launch spec an experiment proved on a host (readiness + smoke + gates), with where it was proven."""

    host: str
    experiment: str
    variant: str
    spec: LaunchSpec
    spec_hash: str
    run_id: str
    attempt: int
    proven_at: str


@dataclass(frozen=True)
class StoredFailure:
    """A failed attempt in the store, as the known-failure lookup finds it."""

    run_id: str
    attempt: int
    variant: str
    kind: str | None
    failed_phase: str | None
    fingerprint: str | None
    ended_at: str | None

    @property
    def ref(self) -> str:
        """``RUN#INDEX``: where to look (`campaign show RUN`, `campaign logs RUN --attempt INDEX`)."""
        return f"{self.run_id}#{self.attempt}"


def now_iso() -> str:
    """The local time as an ISO 8601 string with offset."""
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


class Store:
    """A run store rooted at a folder (``runs/`` by default)."""

    def __init__(self, root: Path | str = "runs") -> None:
        self.root = Path(root)
        self._healed: Healing | None = None

    # -- index ------------------------------------------------------------------------------------

    @property
    def index_path(self) -> Path:
        """The SQLite index of the store."""
        return self.root / "index.sqlite"

    def _connect(self, path: Path) -> sqlite3.Connection:
        fresh = not path.exists()
        con = sqlite3.connect(path, timeout=10)
        if fresh:
            os.chmod(path, 0o600)
        con.executescript(SCHEMA)
        if con.execute("SELECT 1 FROM sqlite_master WHERE name = 'known_good'").fetchone():
            with con:
                con.executescript(MIGRATE)
        return con

    def _db(self) -> sqlite3.Connection:
        if self.root.exists() and not self.root.is_dir():
            raise StoreError(f"the run store {self.root} is not a folder", hint="pass another --runs-dir")
        if self._healed is None:
            self.heal()
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            return self._connect(self.index_path)
        except (OSError, sqlite3.Error) as e:
            raise StoreError(f"cannot open the run index in {self.root}: {e}") from e

    def _run_folders(self) -> list[Path]:
        if not self.root.is_dir():
            return []
        return sorted(p for p in self.root.iterdir() if p.is_dir() and (p / "report.json").is_file())

    def heal(self, *, rebuild: bool = False) -> Healing:
        """Make the index agree with the run folders: rebuild it when missing, empty or corrupt (or asked), prune.

        A corrupt index is kept beside the new one as ``index.sqlite.corrupt-<time>``.
        """
        healing = Healing()
        self._healed = healing
        if not self.root.is_dir():
            return healing
        path = self.index_path
        why: str | None = "asked" if rebuild else None
        if why is None:
            if not path.exists():
                why = "missing" if self._run_folders() else None
            elif path.stat().st_size == 0:
                why = "empty"
            else:
                try:
                    con = self._connect(path)
                    con.execute("SELECT COUNT(*) FROM runs").fetchone()
                    con.close()
                except sqlite3.OperationalError as e:
                    # Busy or unreadable by this user: not corrupt, so never rebuilt over.
                    raise StoreError(f"cannot open the run index in {self.root}: {e}") from e
                except sqlite3.DatabaseError as e:
                    why = f"unreadable ({e})"
        if why is not None:
            self._rebuild(healing, why)
        if not path.exists():
            return healing
        try:
            con = self._connect(path)
            rows = [r[0] for r in con.execute("SELECT run_id FROM runs").fetchall()]
            gone = [r for r in rows if not (self.root / r / "report.json").is_file()]
            with con:
                for run_id in gone:
                    con.execute("DELETE FROM runs WHERE run_id = ?", (run_id,))
                    con.execute("DELETE FROM attempts WHERE run_id = ?", (run_id,))
            con.close()
        except (OSError, sqlite3.Error) as e:
            raise StoreError(f"cannot open the run index in {self.root}: {e}") from e
        healing.pruned = gone
        return healing

    def _rebuild(self, healing: Healing, why: str) -> None:
        path = self.index_path
        tmp = path.with_name(f"index.sqlite.rebuild-{secrets.token_hex(3)}")
        try:
            con = self._connect(tmp)
            for folder in self._run_folders():
                try:
                    report = RunReport.model_validate_json((folder / "report.json").read_bytes())
                except (OSError, ValueError):
                    healing.unreadable.append(folder.name)
                    continue
                index_report(con, report)
                healing.reports += 1
            kgs = []
            folder = self.root / _KNOWN_GOODS
            for raw in sorted(folder.glob("*.json")) if folder.is_dir() else []:
                try:
                    kgs.append(json.loads(raw.read_text()))
                except (OSError, ValueError):
                    healing.unreadable.append(f"{_KNOWN_GOODS}/{raw.name}")
            for row in sorted(kgs, key=lambda r: str(r.get("proven_at", ""))):
                try:
                    index_known_good(con, row)
                    healing.known_goods += 1
                except (KeyError, TypeError, ValueError):
                    healing.unreadable.append(f"{_KNOWN_GOODS}: the record of run {row.get('run_id', '?')}")
            con.commit()
            con.close()
            if path.exists() and why not in {"missing", "asked"} and path.stat().st_size:
                aside = path.with_name(f"index.sqlite.corrupt-{time.strftime('%Y%m%d-%H%M%S')}")
                os.replace(path, aside)
                healing.moved_aside = str(aside)
            os.replace(tmp, path)
        except (OSError, sqlite3.Error) as e:
            with contextlib.suppress(OSError):  # a read-only store cannot even lose the file it could not make
                tmp.unlink(missing_ok=True)
            raise StoreError(f"cannot rebuild the run index in {self.root}: {e}") from e
        healing.rebuilt = why

    # -- runs ------------------------------------------------------------------------------------

    def new_run_id(self, experiment: str) -> str:
        """A sortable, unique run id: date-time, experiment, 4 random hex digits."""
        return f"{time.strftime('%Y%m%d-%H%M%S')}-{experiment}-{secrets.token_hex(2)}"

    def run_dir(self, run_id: str) -> Path:
        """The folder of a run (created)."""
        d = self.root / run_id
        try:
            d.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise StoreError(f"cannot create {d}: {e.strerror or e}", hint="pass another --runs-dir") from e
        return d

    def check(self) -> None:
        """Raise ``StoreError`` unless runs can be written here (before a run takes a host's lock)."""
        probe = self.root
        while not probe.exists() and probe != probe.parent:
            probe = probe.parent
        if not probe.is_dir():
            raise StoreError(
                f"the run store {self.root} is not a folder ({probe} is a file)", hint="pass another --runs-dir"
            )
        if not os.access(probe, os.W_OK | os.X_OK):
            raise StoreError(f"the run store {self.root} is not writable ({probe})", hint="pass another --runs-dir")

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
        con = self._db()
        with con:
            index_report(con, report)
        con.close()

    def resolve(self, ref: str) -> str:
        """A run id from a full id, a unique prefix, or ``last``; anything else that could name a path is refused."""
        if ref != "last" and not _RUN_REF.fullmatch(ref):
            raise StoreError(
                f"{ref!r} is not a run id (letters, digits and . _ - only)", hint="`campaign runs` lists them"
            )
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
        if self._healed is None and self.root.is_dir():
            self.heal()
        return self.index_path.is_file()

    def list_runs(self, limit: int | None = None) -> list[RunRow]:
        """Runs, newest first."""
        if not self._exists():
            return []
        con = self._db()
        sql = "SELECT * FROM runs ORDER BY started_at DESC, run_id DESC"
        rows = con.execute(sql + (f" LIMIT {int(limit)}" if limit else "")).fetchall()
        con.close()
        # The runs table's columns are RunRow's fields, in the same order.
        return [RunRow(**dict(zip(RunRow.model_fields, r, strict=True))) for r in rows]

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

    def reports_of(self, recipe: str, host: str, *, limit: int = 20) -> list[RunReport]:
        """The newest stored reports of ``recipe`` on ``host`` (what a plan's estimate is made from)."""
        if not self._exists():
            return []
        con = self._db()
        rows = con.execute(
            "SELECT run_id FROM runs WHERE recipe = ? AND host = ? ORDER BY started_at DESC, run_id DESC LIMIT ?",
            (recipe, host, int(limit)),
        ).fetchall()
        con.close()
        out = []
        for (run_id,) in rows:
            try:
                out.append(self.load_report(run_id))
            except StoreError:
                continue  # a folder removed or unreadable: the estimate goes by the others
        return out

    def stored_failures(self, host: str, spec_hash: str, *, exclude_run: str | None = None) -> list[StoredFailure]:
        """Failed attempts of exactly ``spec_hash`` on ``host``, newest first (the known-failure lookup)."""
        if not self._exists():
            return []
        con = self._db()
        rows = con.execute(
            "SELECT a.run_id, a.idx, a.variant, a.kind, a.failed_phase, a.fingerprint, a.ended_at FROM attempts a "
            "JOIN runs r ON r.run_id = a.run_id WHERE r.host = ? AND a.spec_hash = ? AND a.outcome = 'failed' "
            "AND a.role != 'restore' AND a.run_id != ? ORDER BY a.ended_at DESC, a.run_id DESC",
            (host, spec_hash, exclude_run or ""),
        ).fetchall()
        con.close()
        return [StoredFailure(*r) for r in rows]

    # -- known-good ------------------------------------------------------------------------------------

    def known_good(self, host: str, experiment: str) -> KnownGood | None:
        """The known-good of ``experiment`` on ``host``, or None when it never proved one there."""
        if not self._exists():
            return None
        con = self._db()
        row = con.execute("SELECT * FROM known_goods WHERE host = ? AND experiment = ?", (host, experiment)).fetchone()
        con.close()
        if row is None:
            return None
        try:
            spec = LaunchSpec.model_validate(json.loads(row[3]))
        except ValueError as e:
            raise StoreError(f"the known-good record of {experiment} on {host} is unreadable: {e}") from e
        return KnownGood(
            host=row[0],
            experiment=row[1],
            variant=row[2],
            spec=spec,
            spec_hash=row[4],
            run_id=row[5],
            attempt=row[6],
            proven_at=row[7],
        )

    def proven_smoke(self, known: KnownGood) -> SmokeResult | None:
        """The smoke result of the attempt that proved ``known`` (its stored outputs), or None where there is none."""
        try:
            attempts = self.load_report(known.run_id).attempts
        except StoreError:
            return None  # the run folder was removed: the known-good spec still restores, it just has no outputs
        match = [a for a in attempts if a.index == known.attempt]
        return match[0].smoke if match else None

    def set_known_good(
        self, host: str, experiment: str, variant: str, spec: LaunchSpec, run_id: str, attempt: int
    ) -> None:
        """Record ``spec`` as ``experiment``'s known-good on ``host``; called only after it was proven."""
        row = {
            "host": host,
            "experiment": experiment,
            "variant": variant,
            "spec": spec.model_dump(mode="json"),
            "run_id": run_id,
            "attempt": attempt,
            "proven_at": now_iso(),
        }
        # In a file too (0600 in a 0700 folder: the exact spec holds secrets), so a rebuilt index keeps it.
        folder = self.root / _KNOWN_GOODS
        try:
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as e:
            raise StoreError(f"cannot create {folder}: {e.strerror}") from e
        name = re.sub(r"[^A-Za-z0-9._-]", "_", host) + "~" + experiment + ".json"
        _atomic_write(folder / name, json.dumps(row, indent=2).encode(), mode=0o600)
        con = self._db()
        with con:
            index_known_good(con, row)
        con.close()

    # -- reconciling ------------------------------------------------------------------------------------

    def running_on(self, host: str) -> list[str]:
        """Run ids the index shows as ``running`` on ``host``."""
        if not self._exists():
            return []
        con = self._db()
        rows = con.execute("SELECT run_id FROM runs WHERE host = ? AND status = 'running'", (host,)).fetchall()
        con.close()
        return [r[0] for r in rows]

    def reconcile(self, host: str, found: str, *, keep: str | None = None) -> list[str]:
        """Record every run still ``running`` on ``host`` (but ``keep``, a live one) as ``interrupted``.

        Called when the host's lock shows those runs' CLIs are gone; ``found`` says what was running on the box
        then. The attempt in flight, if any, is marked ``interrupted`` too. Returns the run ids reconciled.
        """
        done = []
        for run_id in self.running_on(host):
            if run_id == keep:
                continue
            try:
                report = self.load_report(run_id)
            except StoreError:
                continue
            if report.status != "running":
                self.save_report(report)  # the index lagged behind the report
                continue
            for att in report.attempts:
                if att.outcome == "skipped" and att.ended_at is None:
                    att.outcome = "interrupted"
                    att.note = "its CLI died during this attempt"
            report.status = "interrupted"
            report.ended_at = report.ended_at or now_iso()
            report.final = Final(
                healthy=False, detail=f"the CLI of this run died without cleaning up; found afterwards: {found}"
            )
            self.save_report(report)
            done.append(run_id)
        return done


def _atomic_write(path: Path, data: bytes, *, mode: int | None = None) -> None:
    """Write via a temporary file and rename, so a crash never leaves half a report (``mode``: set at creation)."""
    tmp = path.with_name(path.name + f".tmp-{secrets.token_hex(3)}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644 if mode is None else mode)
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(tmp, path)
    except OSError as e:
        raise StoreError(f"cannot write {path}: {e.strerror}") from e
