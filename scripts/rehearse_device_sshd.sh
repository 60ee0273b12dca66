#!/usr/bin/env bash
# Rehearse scripts/device_sshd.sh, as root on a dev machine, as if on an image that lacks what sshd needs as root:
# no `sshd` user, no /run/sshd, and the root account locked ("!" in /etc/shadow). It runs in a private mount
# namespace over a copy of /etc and an empty /run, so this machine's own /etc, /run and sshd are untouched.
# Usage: bash scripts/rehearse_device_sshd.sh [tools|notools]   (notools: no useradd/usermod on the PATH either)
# It shows (A) the refusal with DEVICE_SSHD_NO_SYSTEM_CHANGES=1, (B) the same once /run/sshd exists, (C) the start
# as the device runs it, then stops that sshd. Needs .deb/ (scripts/build_debs.sh) and util-linux's unshare.
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-tools}
[ "$(id -u)" -eq 0 ] || { echo "rehearse_device_sshd: run it as root (it mounts in a namespace of its own)" >&2; exit 1; }
if [ "${REHEARSE_IN_NAMESPACE:-}" != 1 ]; then
  etc=$(mktemp -d /tmp/rehearse-etc.XXXXXX)
  trap 'rm -rf "$etc"' EXIT
  REHEARSE_IN_NAMESPACE=1 REHEARSE_ETC=$etc unshare --mount --propagation private bash "$0" "$mode"
  exit
fi

cp -a /etc/. "$REHEARSE_ETC"
sed -i '/^sshd:/d' "$REHEARSE_ETC/passwd"
sed -i 's/^root:[^:]*:/root:!:/' "$REHEARSE_ETC/shadow"
mount --bind "$REHEARSE_ETC" /etc
mount -t tmpfs tmpfs /run
[ "$mode" = notools ] && export PATH=/usr/local/bin:/usr/bin
export DEVICE_SSHD_PREFIX=/tmp/rehearse-sshd
sshd_user=$(grep -c '^sshd:' /etc/passwd || true)
echo "== before: sshd user lines: $sshd_user, /run/sshd: $([ -d /run/sshd ] && echo yes || echo no)," \
  "root's password field: $(grep '^root:' /etc/shadow | cut -d: -f2)"
echo "== A: DEVICE_SSHD_NO_SYSTEM_CHANGES=1"
refused() { if DEVICE_SSHD_NO_SYSTEM_CHANGES=1 bash scripts/device_sshd.sh start; then exit 1; else echo "exit $?"; fi; }
refused
mkdir -p /run/sshd
echo "== B: the same, with /run/sshd made"
refused
rmdir /run/sshd
echo "== C: as scripts/gpu.sh runs it on the device"
bash scripts/device_sshd.sh start | grep -v '^export'
echo "== after: $(grep '^sshd:' /etc/passwd), /run/sshd: $(stat -c '%A %U' /run/sshd)," \
  "root's password field: $(grep '^root:' /etc/shadow | cut -d: -f2)"
bash scripts/device_sshd.sh stop
