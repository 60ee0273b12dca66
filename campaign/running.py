"""The record of a server campaign started: written to current.json, and carried by the server's own processes.

``current.json`` lives in the caller's own part of the host's state folder (``<state>/user-<uid>/``, 0700, checked
by ``campaign.ownership``), so no other user can write or replace it. The record is also exported into the launch's
environment (``CAMPAIGN_RECORD``, with ``CAMPAIGN_STATE`` naming that folder): every process of the launch carries
it, so when current.json is gone (a /tmp cleaner) or corrupt, ``recover`` finds campaign's own server in the process
table, by this user's processes that carry both, and the box can still be stopped, restored and named.

A record proves nothing by itself: ``processes.tree`` takes only processes of the caller's uid that carry the
record's token (and their group and descendants), so a record without a token, or naming a process group of 1 or
less, signals nothing.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from campaign.hosts.base import Host

#: Exported by the launch script: the caller's state folder, and the record (JSON, without the PID).
STATE_VAR = "CAMPAIGN_STATE"
RECORD_VAR = "CAMPAIGN_RECORD"


@dataclass(frozen=True)
class Running:
    """A server campaign started and believes may still run: its group, port and files on the host."""

    pid: int
    pgid: int
    port: int
    remote_dir: str
    log_path: str
    started_at: float
    spec_hash: str
    variant: str
    run_id: str
    attempt: int
    #: The CAMPAIGN_TREE value every process of this launch inherits ("" in records older than tokens: trusted
    #: with nothing, since no process can prove it belongs to such a record).
    token: str = ""
    experiment: str = ""
    workdir: str = ""
    #: On a Slurm host: the batch job that runs the script, its name (cancel matches both), node and its address.
    job_id: str = ""
    job_name: str = ""
    node: str = ""
    node_addr: str = ""
    #: How this record was read: "" from current.json, else why it came from the process table instead.
    recovered: str = ""

    def to_json(self) -> str:
        """The record written to current.json."""
        data = asdict(self)
        data.pop("recovered")
        return json.dumps(data, indent=2)

    def describe(self) -> str:
        """``variant maxb8 of experiment E (run R, pgid 123, port 30000)``."""
        exp = f" of experiment {self.experiment}" if self.experiment else ""
        where = f"Slurm job {self.job_id} on {self.node}" if self.job_id else f"pgid {self.pgid}"
        return f"{self.variant}{exp} (run {self.run_id}, {where}, port {self.port})"


def describe_stopped(running: Running) -> str:
    """``v of experiment E on port 30001``: what a stop names (a run may stop another experiment's server)."""
    exp = f" of experiment {running.experiment}" if running.experiment else ""
    return f"{running.variant}{exp} on port {running.port}"


def parse(raw: bytes | str, **extra: Any) -> Running | None:
    """The record in ``raw`` (JSON), or None when it is not one."""
    try:
        data = json.loads(raw)
        known = {f.name for f in fields(Running)} - {"recovered"}
        return Running(**{**{k: v for k, v in data.items() if k in known}, **extra})
    except (ValueError, TypeError, AttributeError):
        return None


def environment(running: Running, state: str) -> dict[str, str]:
    """What the launch script exports so its processes can be recognised without current.json."""
    return {STATE_VAR: state, RECORD_VAR: json.dumps(asdict(running), separators=(",", ":"))}


def recover(host: Host, state: str, why: str) -> Running | None:
    """campaign's own server, found in the process table when its record is gone or unreadable; None if none runs.

    Only processes of the caller's uid that carry ``CAMPAIGN_STATE=<state>`` count; the launch's leader (the
    process whose PID is its group) gives the PID and group, its ``CAMPAIGN_RECORD`` the rest.
    """
    mark = shlex.quote(f"{STATE_VAR}={state}")
    cmd = (
        f"for f in $(grep -l -a -z -x -F {mark} /proc/[0-9]*/environ 2>/dev/null); do "
        "p=${f#/proc/}; p=${p%/environ}; [ -O /proc/$p ] || continue; "
        's=$(cat /proc/$p/stat 2>/dev/null) || continue; s=${s##*) }; set -- $s; [ "$1" = Z ] && continue; '
        f'r=$(tr "\\000" "\\n" < /proc/$p/environ 2>/dev/null | grep -a -m1 "^{RECORD_VAR}=") || continue; '
        'printf "%s\\t%s\\t%s\\n" "$p" "$3" "${r#*=}"; done'
    )
    found: list[Running] = []
    for line in host.run(cmd, timeout=20).stdout.splitlines():
        pid, pgid, raw = [*line.split("\t", 2), "", ""][:3]
        if not (pid.isdigit() and pgid.isdigit()):
            continue
        rec = parse(raw, pid=int(pid), pgid=int(pgid), recovered=why)
        if rec is not None and rec.token:
            found.append(rec)
    if not found:
        return None
    # The newest launch; its script leads the group (PID == PGID) but exported the record after it started, so
    # only its children carry it: the oldest child names the group.
    newest = max(found, key=lambda r: r.started_at)
    first = min((r for r in found if r.token == newest.token), key=lambda r: r.pid)
    return replace(first, pid=first.pgid)
