"""Ownership, not location: the folders campaign creates on a host are checked for their owner, never followed.

A box is shared: another user may have made a path first, planted a symbolic link where campaign will write, or own
the folder above one of ours (and so may rename ours away and put their own in its place). Every folder campaign
creates, writes into or changes the mode of goes through one of two checks, run on the host in one shell command
(so they hold over SSH as on this machine):

- **an own folder** (the workdir, each run and attempt folder under it, the caller's part of the state folder):
  not a symbolic link, a folder, owned by the caller's uid, then set to its mode (0700). The folder above it must be
  one no other user can rename entries of, and so must every folder above it: the caller's or root's, and
  either not writable by others or sticky (as /tmp is). A folder that fails is refused, never chmodded, never
  written into.
- **the shared state folder** (where every user's CLI meets to take the box's lock): not a symbolic link, owned by
  the caller or by root; one the caller creates is made sticky and world-writable, like /tmp. A folder another
  (non-root) user made first is refused: its owner could replace anything in it.

Refusals raise ``HostError`` naming the path and the reason (exit 2 where nothing was touched yet).
"""

from __future__ import annotations

import shlex

from campaign.errors import HostError
from campaign.hosts.base import Host

q = shlex.quote

#: Shell functions, defined once per command. ``safe_parent D`` fails unless no other user can rename entries of D;
#: ``own_dir P`` creates P if missing and makes it the caller's 0700 folder, or explains on stdout why it will not.
_FUNCS = r"""
u=$(id -u)
bad() { printf '%s\n' "$*"; exit 3; }
safe_parent() {
  [ -d "$1" ] || mkdir -p -- "$1" 2>/dev/null || bad "cannot create $1"
  d=$1
  while :; do
    set -- $(stat -L -c '%u %a' -- "$d" 2>/dev/null)
    [ -n "$2" ] || bad "cannot read the owner of $d"
    if [ "$1" != "$u" ] && [ "$1" != 0 ]; then
      bad "$d belongs to uid $1, another user (who could replace what is in it)"
    fi
    if [ $(( 0$2 & 022 )) -ne 0 ] && [ $(( 0$2 & 01000 )) -eq 0 ]; then
      bad "$d is writable by other users and not sticky (mode $2): they could replace what is in it"
    fi
    [ "$d" = / ] && break
    d=$(dirname -- "$d")
  done
}
own_dir() {
  [ -L "$1" ] && bad "$1 is a symbolic link (campaign never follows one it did not make)"
  [ -e "$1" ] || mkdir -m 700 -- "$1" 2>/dev/null || [ -d "$1" ] || bad "cannot create $1"
  [ -L "$1" ] && bad "$1 is a symbolic link (campaign never follows one it did not make)"
  [ -d "$1" ] || bad "$1 is not a folder"
  o=$(stat -c '%u' -- "$1" 2>/dev/null)
  [ "$o" = "$u" ] || bad "$1 belongs to uid ${o:-?}, not to you (uid $u)"
  chmod 700 -- "$1" || bad "cannot set the mode of $1"
}
"""


def _run(host: Host, body: str, what: str) -> None:
    res = host.run(_FUNCS + body, timeout=20)
    if res.exit_code == 3:
        raise HostError(
            f"{host.name}: refusing {what}: {res.stdout.strip() or res.tail(2)}",
            hint="use a folder of your own (host.workdir, CAMPAIGN_HOST_STATE), or remove the one in the way",
        )
    if not res.ok:
        raise HostError(f"{host.name}: cannot prepare {what}: {res.tail(3)}")


def ensure_own_dirs(host: Host, base: str, *subpaths: str) -> None:
    """Make ``base`` and then each of ``base/subpath`` (in order) the caller's own 0700 folders, or raise."""
    base = base.rstrip("/") or "/"
    parent = base.rsplit("/", 1)[0] or "/"
    body = f"safe_parent {q(parent)}; own_dir {q(base)}"
    path = base
    for sub in subpaths:
        for part in sub.strip("/").split("/"):
            if part in {"", ".", ".."}:
                raise HostError(f"{host.name}: not a folder name: {sub!r}")
            path = f"{path}/{part}"
            body += f"; own_dir {q(path)}"
    _run(host, body, f"folder {path}")


def ensure_shared_dir(host: Host, path: str) -> None:
    """Make ``path`` the box's shared state folder (sticky, world-writable) or check an existing one, or raise."""
    parent = path.rstrip("/").rsplit("/", 1)[0] or "/"
    body = (
        f"p={q(path)}; safe_parent {q(parent)}; "
        '[ -L "$p" ] && bad "$p is a symbolic link (campaign never follows one it did not make)"; '
        'if [ ! -e "$p" ]; then (umask 0; mkdir -m 1777 -- "$p") 2>/dev/null || [ -d "$p" ] '
        '|| bad "cannot create $p"; fi; '
        '[ -L "$p" ] && bad "$p is a symbolic link"; '
        '[ -d "$p" ] || bad "$p is not a folder"; '
        "o=$(stat -c '%u' -- \"$p\"); "
        'if [ "$o" != "$u" ] && [ "$o" != 0 ]; then '
        'bad "$p belongs to uid $o, another user (who could replace the records in it): '
        'ask an administrator to make it root-owned with mode 1777, or set CAMPAIGN_HOST_STATE"; fi'
    )
    _run(host, body, f"state folder {path}")
