"""The process table of a host, read from /proc through ``Host.run``: the tree campaign started, who holds a port.

Two questions decide whether campaign may touch a process:

- **Is it ours?** Every launch script exports ``CAMPAIGN_TREE=<token>`` (a random token per launch, recorded in
  current.json), and every descendant inherits it, including one that calls ``setsid`` or double-forks out of the
  process group. The tree of a launch is: the processes whose environment holds the token, the members of the
  launch's group and session when one of them holds it, and every descendant (by parent PID) of those, for a child
  that scrubbed its environment. A process outside that set is never signalled.
- **Who holds this port?** The listening sockets of ``/proc/net/tcp{,6}`` give the socket inodes; ``find -lname``
  over ``/proc/*/fd`` gives the processes holding them, and ``/proc/PID/cmdline`` their command lines. A socket
  whose holder cannot be seen (another user's process) is reported with no PID.

Both run one shell command on the host (``cat``, ``awk``, ``grep -z`` and ``find``: no Python needed there), so they
work the same over SSH as on this machine.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from campaign.hosts.base import Host

#: The environment variable every process of a launch inherits (its value is the launch's token).
TREE_VAR = "CAMPAIGN_TREE"
_TOKEN = re.compile(r"[A-Za-z0-9._:-]+")


@dataclass(frozen=True)
class Proc:
    """One live process: its PID and command line (arguments joined by spaces, cut to 300 characters)."""

    pid: int
    command: str

    def describe(self) -> str:
        """``PID 123 (python3 -m http.server 38102)``."""
        return f"PID {self.pid} ({self.command or '?'})"


@dataclass(frozen=True)
class PortHolders:
    """What listens on a port: nothing, or sockets with the processes holding them (none seen: another user's)."""

    port: int
    listening: bool
    procs: tuple[Proc, ...] = ()

    def describe(self) -> str:
        """A message fragment naming the holders."""
        if not self.listening:
            return f"port {self.port} is free"
        if not self.procs:
            return f"port {self.port} is held by a process this user cannot see (another user's?)"
        return f"port {self.port} is held by " + ", ".join(p.describe() for p in self.procs)


_CMDLINES = (
    'for p in $pids; do [ -r /proc/$p/cmdline ] || continue; printf "%s\\t" "$p"; '
    "tr '\\000\\n\\t' '   ' < /proc/$p/cmdline 2>/dev/null | cut -c1-300; echo; done"
)


def _parse(stdout: str) -> list[Proc]:
    out: list[Proc] = []
    for line in stdout.splitlines():
        pid, _, command = line.partition("\t")
        if pid.strip().isdigit():
            out.append(Proc(int(pid), command.strip()))
    return out


def tree(host: Host, token: str, pgid: int | None = None) -> list[Proc]:
    """The live (not zombie) processes of the caller's uid in the launch marked ``token``; ``pgid`` adds its group
    and session when a marked process is in them.

    A process proves it is ours by its token (read from its own environment) and its owner, never by a record
    alone: without a token (a record older than tokens, or one another user forged) the tree is empty, and a
    group of 1 or less is never taken.
    """
    if not token:
        return []
    if not _TOKEN.fullmatch(token):
        raise ValueError(f"not a launch token: {token!r}")
    pg = int(pgid) if pgid is not None and int(pgid) > 1 else -1
    need_mark = 1
    marked = (
        f"marked=$(for f in $(grep -l -a -z -x -F {shlex.quote(f'{TREE_VAR}={token}')} /proc/[0-9]*/environ "
        "2>/dev/null); do p=${f#/proc/}; p=${p%/environ}; [ -O /proc/$p ] && printf '%s ' $p; done)"
    )
    awk = (
        "awk -v pg=" + str(pg) + " -v need=" + str(need_mark) + ' -v marked="$marked" '
        '\'BEGIN { n = split(marked, a, " "); for (i = 1; i <= n; i++) mk[a[i]] = 1 } '
        '{ pid = $1; sub(/^.*\\) /, ""); if ($1 == "Z") next; P[pid] = $2; G[pid] = $3; S[pid] = $4 } '
        "END { for (p in mk) if (p in P) { t[p] = 1; if (G[p] == pg || S[p] == pg) hit = 1 } "
        "if (pg > 0 && (hit || !need)) for (p in P) if (G[p] == pg || S[p] == pg) t[p] = 1; "
        "c = 1; while (c) { c = 0; for (p in P) if (!(p in t) && (P[p] in t)) { t[p] = 1; c = 1 } } "
        "for (p in t) print p }'"
    )
    # Descendants and group members must be the caller's too (a setuid child is not ours to signal).
    cmd = (
        f"{marked}; pids=$(cat /proc/[0-9]*/stat 2>/dev/null | {awk}); "
        "mine=''; for p in $pids; do [ -O /proc/$p ] && mine=\"$mine $p\"; done; pids=$mine; "
        f"{_CMDLINES}"
    )
    return _parse(host.run(cmd, timeout=20).stdout)


def port_holders(host: Host, port: int) -> PortHolders:
    """Who listens on ``port`` on the host (IPv4 and IPv6), with PIDs and command lines where visible."""
    p = int(port)
    cmd = (
        f"inodes=$(awk -v p=:$(printf '%04X' {p}) "
        "'FNR > 1 && $4 == \"0A\" && substr($2, length($2) - 4) == p { print $10 }' "
        "/proc/net/tcp /proc/net/tcp6 2>/dev/null | sort -u); "
        '[ -n "$inodes" ] || exit 1; '
        'expr=""; for i in $inodes; do [ -n "$expr" ] && expr="$expr -o"; expr="$expr -lname socket:\\[$i\\]"; done; '
        "pids=$(find /proc/[0-9]*/fd -mindepth 1 -maxdepth 1 \\( $expr \\) 2>/dev/null | cut -d/ -f3 | sort -un); "
        f"{_CMDLINES}"
    )
    res = host.run(cmd, timeout=20)
    if res.exit_code == 1 and not res.stdout.strip():
        return PortHolders(port=p, listening=False)
    return PortHolders(port=p, listening=True, procs=tuple(_parse(res.stdout)))


def marked_anywhere(host: Host) -> list[Proc]:
    """Every live process of the caller's uid that carries any launch token: what campaign started, tracked or not."""
    cmd = (
        f"pids=$(grep -l -a -z '^{TREE_VAR}=' /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3 | sort -un); "
        "live=''; for p in $pids; do s=$(cat /proc/$p/stat 2>/dev/null) || continue; "
        's=${s##*) }; [ "${s%% *}" = Z ] || { [ -O /proc/$p ] && live="$live $p"; }; done; pids=$live; '
        f"{_CMDLINES}"
    )
    return _parse(host.run(cmd, timeout=20).stdout)
