#!/usr/bin/env bash
# A private OpenSSH sshd on 127.0.0.1, unpacked from the carried .deb/ (scripts/build_debs.sh), for running a
# campaign over SSH on a machine that has no sshd and no network (the GPU machine; see docs/gpu.md).
#
# Usage: bash scripts/device_sshd.sh start|stop|status
#   start   unpack .deb/ into $PREFIX/root (never into /), make throwaway host and client keys, write an
#           sshd_config (127.0.0.1 only, a free port, public keys only), start sshd as a daemon (its own session,
#           so it outlives the calling shell), log in once with the bundled ssh client with the host key checked,
#           and write what a campaign needs:
#             $PREFIX/ssh_config   Host alias `h200-loopback` (HostName, Port, User, IdentityFile, UserKnownHostsFile)
#             $PREFIX/known_hosts  the real host key, as [127.0.0.1]:PORT
#             $PREFIX/env.sh       DEVICE_SSHD_PORT, _USER, _KEY, _KNOWN_HOSTS, _SSH_CONFIG, _PID (source it)
#   stop    end the sshd that `start` started (checked by its pid file and its program), and only that one
#   status  say whether it runs
# Environment: DEVICE_SSHD_PREFIX (default /tmp/campaign-sshd), DEVICE_SSHD_DEBS (default .deb of this checkout),
#   DEVICE_SSHD_ENV (more variable names to hand to the SSH sessions), DEVICE_SSHD_NO_SYSTEM_CHANGES=1 (as root:
#   fail instead of creating /run/sshd or the `sshd` user, or unlocking a locked account), DEVICE_SSHD_UNPACK=python
#   (unpack with Python's tarfile, as on an image without dpkg-deb, even where dpkg-deb exists).
#
# Sessions get a fresh environment from sshd, so the caller's PATH, PYTHONPATH, LD_LIBRARY_PATH (without the
# bundle's folders) and the CUDA/NVIDIA/NCCL/TORCH/TRITON/HF variables are handed to them with SetEnv: a remote
# `python3` is then the caller's. Names that look like secrets are never written.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
PREFIX=${DEVICE_SSHD_PREFIX:-/tmp/campaign-sshd}
DEBS=${DEVICE_SSHD_DEBS:-$repo/.deb}
ALIAS=h200-loopback
root=$PREFIX/root
sshd=$root/usr/sbin/sshd
libpath=$root/lib/x86_64-linux-gnu:$root/usr/lib/x86_64-linux-gnu

die() { echo "device_sshd: $*" >&2; exit 1; }
say() { echo "device_sshd: $*"; }

# The pid in $PREFIX/sshd.pid, when it is alive and is our sshd (its program is the unpacked one); else nothing.
our_pid() {
  local pid exe
  [ -f "$PREFIX/sshd.pid" ] || return 0
  pid=$(head -1 "$PREFIX/sshd.pid")
  [[ $pid =~ ^[0-9]+$ ]] || return 0
  exe=$(readlink "/proc/$pid/exe" 2>/dev/null || true)
  [ "$exe" = "$sshd" ] && echo "$pid"
  return 0
}

stop() {
  local pid
  pid=$(our_pid)
  if [ -z "$pid" ]; then say "no sshd of ours runs (prefix $PREFIX)"; return 0; fi
  kill -TERM "$pid"
  for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$pid" 2>/dev/null; then die "sshd (pid $pid) did not end within 5 s of SIGTERM"; fi
  say "stopped sshd (pid $pid)"
}

status() {
  local pid
  pid=$(our_pid)
  if [ -n "$pid" ]; then say "sshd runs (pid $pid; $PREFIX/env.sh)"; else say "no sshd of ours runs"; return 3; fi
}

# A .deb is an ar archive holding data.tar.*; without dpkg-deb (a non-Debian image) Python unpacks it.
unpack() {
  local deb=$1
  if [ "${DEVICE_SSHD_UNPACK:-}" != python ] && command -v dpkg-deb >/dev/null 2>&1; then
    dpkg-deb -x "$deb" "$root"; return
  fi
  python3 - "$deb" "$root" <<'PY'
import io, sys, tarfile
deb, dest = sys.argv[1], sys.argv[2]
with open(deb, "rb") as f:
    if f.read(8) != b"!<arch>\n":
        sys.exit(f"{deb}: not a Debian package")
    while header := f.read(60):
        name, size = header[:16].decode().strip().rstrip("/"), int(header[48:58])
        body = f.read(size + size % 2)[:size]
        if name.startswith("data.tar"):
            with tarfile.open(fileobj=io.BytesIO(body)) as t:
                t.extractall(dest, filter="tar")
            break
    else:
        sys.exit(f"{deb}: no data.tar member")
PY
}

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' 2>/dev/null \
    || echo $((20000 + RANDOM % 20000))
}

# SetEnv words for the sessions: NAME=value, quoted; values sshd_config cannot hold ("\ or a newline) are left out.
session_env() {
  local name value names
  names="PATH LD_LIBRARY_PATH LIBRARY_PATH CPATH PYTHONPATH PYTHONUNBUFFERED VIRTUAL_ENV LANG LC_ALL TMPDIR"
  names+=" XDG_CACHE_HOME ${DEVICE_SSHD_ENV:-}"
  # TORCH also covers TORCHINDUCTOR_*, so a compile cache set by the caller is the one the servers use.
  names+=" $(compgen -e | grep -E '^(CUDA|NVIDIA|NCCL|NVSHMEM|TORCH|PYTORCH|TRITON|HF_|TRANSFORMERS|OMP_)' | tr '\n' ' ')"
  for name in $names; do
    [ -n "${!name+x}" ] || continue
    if [[ $name =~ (TOKEN|KEY|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTHORIZATION|COOKIE) ]]; then continue; fi
    value=${!name}
    if [[ $value == *'"'* || $value == *\\* || $value == *$'\n'* ]]; then
      echo "device_sshd: not handing $name to the sessions (its value has a quote, backslash or newline)" >&2
      continue
    fi
    printf ' "%s=%s"' "$name" "$value"
  done
}

# As root, sshd needs its privilege-separation folder and user; it also refuses a locked account ("!" in shadow)
# when PAM is off. Each fix is printed; DEVICE_SSHD_NO_SYSTEM_CHANGES=1 turns them into errors.
system_prerequisites() {
  local user=$1 field uid
  [ "$(id -u)" -eq 0 ] || return 0
  local forbid=${DEVICE_SSHD_NO_SYSTEM_CHANGES:-}
  if [ ! -d /run/sshd ]; then
    [ -z "$forbid" ] || die "sshd as root needs the folder /run/sshd, which is missing (DEVICE_SSHD_NO_SYSTEM_CHANGES is set)"
    mkdir -p /run/sshd && chmod 0755 /run/sshd
    say "created /run/sshd (sshd's privilege-separation folder)"
  fi
  if ! grep -q '^sshd:' /etc/passwd && ! { command -v getent >/dev/null && getent passwd sshd >/dev/null; }; then
    [ -z "$forbid" ] || die "sshd as root needs the user \`sshd\`, which is missing (DEVICE_SSHD_NO_SYSTEM_CHANGES is set)"
    if command -v useradd >/dev/null 2>&1; then
      useradd --system --no-create-home --home-dir /run/sshd --shell /usr/sbin/nologin sshd \
        || die "useradd could not create the privilege-separation user sshd (above)"
    else
      uid=100; while cut -d: -f3 /etc/passwd | grep -qx "$uid"; do uid=$((uid + 1)); done
      echo "sshd:x:$uid:65534::/run/sshd:/usr/sbin/nologin" >> /etc/passwd
    fi
    say "created the privilege-separation user sshd ($(grep '^sshd:' /etc/passwd))"
  fi
  if [ -r /etc/shadow ]; then
    field=$(awk -F: -v u="$user" '$1 == u {print $2}' /etc/shadow)
    if [[ $field == '!'* ]]; then
      [ -z "$forbid" ] || die "the account $user is locked (\"!\" in /etc/shadow), and sshd refuses it without PAM"
      if command -v usermod >/dev/null 2>&1; then usermod -p '*' "$user" || die "usermod could not unlock $user"
      else sed -i "s/^$user:[^:]*:/$user:*:/" /etc/shadow || die "cannot unlock $user in /etc/shadow"; fi
      say "unlocked the account $user for key logins (its password field in /etc/shadow is now *: no password works)"
    fi
  fi
}

# What a failed start said, with the cause named where it is a known one.
explain() {
  local text=$1
  local line
  while IFS= read -r line; do echo "  | $line" >&2; done <<<"$text"
  case "$text" in
    *"error while loading shared libraries"*)
      echo "device_sshd: a library sshd needs is not in the bundle: rebuild .deb/ with scripts/build_debs.sh" >&2 ;;
    *"GLIBC_"*"not found"*)
      echo "device_sshd: this image's glibc ($(getconf GNU_LIBC_VERSION 2>/dev/null)) is older than the packages'" >&2 ;;
    *"Privilege separation user"*)
      echo "device_sshd: the user sshd is missing (see DEVICE_SSHD_NO_SYSTEM_CHANGES)" >&2 ;;
    *"privilege separation directory"*)
      echo "device_sshd: /run/sshd is missing (see DEVICE_SSHD_NO_SYSTEM_CHANGES)" >&2 ;;
    *"Address already in use"*)
      echo "device_sshd: the port was taken between choosing and binding it" >&2 ;;
  esac
}

start() {
  local user pid port host_key_pub cfg log out ok
  [ -n "$(our_pid)" ] && die "an sshd of ours already runs (pid $(our_pid)): \`$0 stop\` first"
  compgen -G "$DEBS/*.deb" >/dev/null || die "no packages in $DEBS: run scripts/build_debs.sh and carry .deb"
  command -v python3 >/dev/null || command -v dpkg-deb >/dev/null || die "neither dpkg-deb nor python3 to unpack with"
  # Wipe only a prefix this script made (it leaves a marker), never another folder that happens to be there.
  if [ -e "$PREFIX" ]; then
    [ -f "$PREFIX/.device-sshd" ] || die "$PREFIX exists and is not ours: set DEVICE_SSHD_PREFIX to another folder"
    rm -rf "$PREFIX"
  fi
  mkdir -p "$root" && chmod 0700 "$PREFIX" && touch "$PREFIX/.device-sshd"
  for deb in "$DEBS"/*.deb; do unpack "$deb" || die "cannot unpack $deb"; done
  [ -x "$sshd" ] || die "the packages in $DEBS hold no usr/sbin/sshd"

  local need have
  need=$(sed -n 's/^glibc_min=//p' "$DEBS/MANIFEST" 2>/dev/null || true)
  have=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}')
  say "image: $(sed -n 's/^PRETTY_NAME="\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' /etc/os-release 2>/dev/null), glibc ${have:-?}; the packages need glibc ${need:-?}"
  if [ -n "$need" ] && [ -n "$have" ] && [ "$(printf '%s\n%s\n' "$need" "$have" | sort -V | head -1)" != "$need" ]; then
    die "the packages need glibc $need or newer; this machine has $have (build .deb/ on an older Debian)"
  fi

  # The bundle's libraries for our programs only (this shell's LD_LIBRARY_PATH, which the sessions get, stays).
  run() { LD_LIBRARY_PATH=$libpath${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} OPENSSL_CONF=$PREFIX/openssl.cnf "$@"; }
  : > "$PREFIX/openssl.cnf"   # the image's OpenSSL configuration (or none) must not steer the bundled libcrypto

  user=$(id -un)
  system_prerequisites "$user"
  run "$root/usr/bin/ssh-keygen" -q -t ed25519 -N '' -C device-sshd-host -f "$PREFIX/host_ed25519" \
    || die "the bundled ssh-keygen does not run (see above)"
  run "$root/usr/bin/ssh-keygen" -q -t ed25519 -N '' -C device-sshd-client -f "$PREFIX/client_ed25519"
  cp "$PREFIX/client_ed25519.pub" "$PREFIX/authorized_keys"
  host_key_pub=$(cut -d' ' -f1-2 "$PREFIX/host_ed25519.pub")
  cfg=$PREFIX/sshd_config
  log=$PREFIX/sshd.log

  ok=
  for _ in 1 2 3; do
    port=$(free_port)
    cat > "$cfg" <<EOF
# Written by scripts/device_sshd.sh: loopback only, public keys only, everything under $PREFIX.
Port $port
ListenAddress 127.0.0.1
AddressFamily inet
HostKey $PREFIX/host_ed25519
PidFile $PREFIX/sshd.pid
AuthorizedKeysFile $PREFIX/authorized_keys
ModuliFile $root/etc/ssh/moduli
AllowUsers $user
PermitRootLogin prohibit-password
AuthenticationMethods publickey
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
AllowTcpForwarding local
AllowAgentForwarding no
X11Forwarding no
PermitTunnel no
Subsystem sftp internal-sftp
PrintMotd no
PrintLastLog no
UseDNS no
LogLevel VERBOSE
SetEnv$(session_env)
EOF
    out=$(run "$sshd" -t -f "$cfg" 2>&1) || { explain "$out"; die "sshd rejects its configuration or cannot run (above)"; }
    : > "$log"
    # Without -D sshd forks into the background in a session of its own (daemon(3)) and writes its pid file.
    out=$(run "$sshd" -f "$cfg" -E "$log" 2>&1) || { explain "$out"; die "sshd did not start (above)"; }
    for _ in $(seq 100); do
      pid=$(our_pid)
      if [ -n "$pid" ] && python3 - "$port" <<'PY' 2>/dev/null; then ok=1; break; fi
import socket, sys
with socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=1) as s:
    sys.exit(0 if s.recv(64).startswith(b"SSH-") else 1)
PY
      sleep 0.1
    done
    [ -n "$ok" ] && break
    pid=$(our_pid); [ -z "$pid" ] || kill -TERM "$pid"
    grep -q 'Address already in use' "$log" || break
  done
  [ -n "$ok" ] || { explain "$(cat "$log")"; die "sshd did not answer on 127.0.0.1:$port within 10 s (its log above)"; }

  echo "[127.0.0.1]:$port $host_key_pub" > "$PREFIX/known_hosts"
  cat > "$PREFIX/ssh_config" <<EOF
Host $ALIAS
    HostName 127.0.0.1
    Port $port
    User $user
    IdentityFile $PREFIX/client_ed25519
    IdentitiesOnly yes
    UserKnownHostsFile $PREFIX/known_hosts
    StrictHostKeyChecking yes
EOF
  # One login with the bundled client, host key checked: what the sessions will see (expanded there, not here).
  # shellcheck disable=SC2016
  out=$(run "$root/usr/bin/ssh" -F "$PREFIX/ssh_config" -o BatchMode=yes -o ConnectTimeout=10 "$ALIAS" \
      'echo "user=$(id -un) home=$HOME python3=$(command -v python3 || echo MISSING)"' 2>&1) \
    || { explain "$out"; explain "$(tail -20 "$log")"; stop >/dev/null; die "a test login to 127.0.0.1:$port failed (above)"; }
  say "login checked: $out"
  {
    printf 'export DEVICE_SSHD_PORT=%q\n' "$port"
    printf 'export DEVICE_SSHD_USER=%q\n' "$user"
    printf 'export DEVICE_SSHD_KEY=%q\n' "$PREFIX/client_ed25519"
    printf 'export DEVICE_SSHD_KNOWN_HOSTS=%q\n' "$PREFIX/known_hosts"
    printf 'export DEVICE_SSHD_SSH_CONFIG=%q\n' "$PREFIX/ssh_config"
    printf 'export DEVICE_SSHD_PID=%q\n' "$(our_pid)"
  } > "$PREFIX/env.sh"
  say "$(run "$root/usr/bin/ssh" -V 2>&1 | head -1) sshd runs as pid $(our_pid) on 127.0.0.1:$port (log $log)"
  cat "$PREFIX/env.sh"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) status ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
