#!/usr/bin/env bash
# Build .deb/, the OpenSSH server and client the GPU machine lacks, as Debian packages (see docs/gpu.md).
#
# The device has no network and an image whose distribution we do not know exactly, so scripts/device_sshd.sh
# unpacks these packages into a private prefix there and runs sshd with LD_LIBRARY_PATH pointing into it. Every
# shared library the OpenSSH programs link, other than glibc's own, travels too: the image may lack one (libwrap,
# libsystemd, Kerberos) or have another version of it.
# Usage (on a Debian machine with apt lists; no root needed, nothing is installed): bash scripts/build_debs.sh
# Result: .deb/*.deb, .deb/MANIFEST (packages, the newest glibc symbol version the programs need); about 8 MB.
set -euo pipefail
cd "$(dirname "$0")/.."

roots=(openssh-server openssh-client openssh-sftp-server)
# Packages of the dependency tree that hold no library the programs load: glibc itself (the image has its own,
# and a second one cannot be mixed in), PAM's modules and configuration (sshd runs with UsePAM no), data-only
# packages.
skip='^(libc6|libc-bin|libgcc-s1|libpam-modules|libpam-modules-bin|libpam-runtime|libaudit-common|libtirpc-common|libkrb5-dbg)$'
# glibc's own objects: resolved from the image, never bundled.
glibc_libs='^(linux-vdso\.so\.1|ld-linux-x86-64\.so\.2|libc\.so\.6|libm\.so\.6|libresolv\.so\.2|libpthread\.so\.0|libdl\.so\.2|librt\.so\.1|libutil\.so\.1|libanl\.so\.1)$'

for p in "${roots[@]}"; do
  if ! apt-cache show "$p" >/dev/null 2>&1; then
    echo "build_debs: apt knows no package $p: run \`apt-get update\` first (a Debian machine is needed)" >&2
    exit 1
  fi
done

# The closure of Depends/Pre-Depends, following only library packages (a package such as adduser or debconf is a
# maintainer-script need of the installed package, not something the programs load).
declare -A seen=()
queue=("${roots[@]}")
while [ ${#queue[@]} -gt 0 ]; do
  p=${queue[0]}; queue=("${queue[@]:1}")
  [ -n "${seen[$p]:-}" ] && continue
  seen[$p]=1
  while read -r dep; do
    if [[ $dep =~ ^(lib|zlib1g) ]] && ! [[ $dep =~ $skip ]] && [ -z "${seen[$dep]:-}" ]; then
      queue+=("$dep")
    fi
  done < <(apt-cache depends --important "$p" | awk '$1 ~ /^\|?(Pre)?Depends:$/ && $2 !~ /^</ {print $2}' | sed 's/:any$//')
done
mapfile -t pkgs < <(printf '%s\n' "${!seen[@]}" | sort)
echo "packages (${#pkgs[@]}): ${pkgs[*]}"

rm -rf .deb && mkdir -p .deb
# As root, apt warns that it cannot drop to its sandbox user for a folder that user cannot write: harmless here.
(cd .deb && apt-get download -q "${pkgs[@]}" >/dev/null 2> >(grep -v 'unsandboxed as root' >&2))

# Check, here, what device_sshd.sh relies on there: unpacked, each program finds every library but glibc's in the
# prefix. A library that resolves outside it is missing from the bundle.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for d in .deb/*.deb; do dpkg-deb -x "$d" "$work"; done
libpath="$work/lib/x86_64-linux-gnu:$work/usr/lib/x86_64-linux-gnu"
programs=(usr/sbin/sshd usr/bin/ssh usr/bin/ssh-keygen usr/lib/openssh/sftp-server)
bad=0
for prog in "${programs[@]}"; do
  [ -x "$work/$prog" ] || { echo "build_debs: $prog is not in the packages" >&2; bad=1; continue; }
  # ldd lines: "name => path (addr)", "name => not found", or "path (addr)" for the loader and the vDSO.
  while read -r name path; do
    [[ ${name##*/} =~ $glibc_libs ]] && continue
    case "$path" in
      "$work"/*) ;;
      *) echo "build_debs: $prog needs $name, which resolves to $path (not bundled)" >&2; bad=1 ;;
    esac
  done < <(LD_LIBRARY_PATH=$libpath ldd "$work/$prog" | awk '$2 == "=>" {print $1, ($3 == "not" ? "not-found" : $3); next} {print $1, $1}')
done
[ "$bad" -eq 0 ] || { echo "build_debs: add the missing packages (or remove them from skip) and run again" >&2; exit 1; }

# The newest glibc symbol version any bundled object asks for: an image with an older glibc cannot run them.
glibc_need=$(find "$work" -type f \( -name '*.so*' -o -perm -u+x \) -print0 \
  | { xargs -0 objdump -T 2>/dev/null || true; } | grep -o 'GLIBC_2\.[0-9]*' | sort -t. -k2,2n -u | tail -1 | sed 's/GLIBC_//')
{
  echo "# .deb/ from scripts/build_debs.sh on $(date -u +%Y-%m-%dT%H:%MZ), $(sed -n 's/^PRETTY_NAME="\(.*\)"$/\1/p' /etc/os-release)"
  echo "glibc_min=$glibc_need"
  # shellcheck disable=SC2016  # dpkg-deb's own ${field} syntax
  for d in .deb/*.deb; do dpkg-deb -W --showformat='${Package} ${Version}\n' "$d"; done
} > .deb/MANIFEST
echo "newest glibc symbol version needed: $glibc_need"
for d in .deb/*; do echo "  ${d#.deb/} $(du -k "$d" | cut -f1) KiB"; done
du -sh .deb | awk '{print "total", $1, "(carried with .whl and the working tree: at most 64 MiB in all)"}'
