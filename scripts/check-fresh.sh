#!/usr/bin/env bash
# Proves that a fresh machine can build and test Tessera with nothing installed by hand: removes
# the Debian packages scripts/install-deps.sh installs (so they must be installed again by the
# project's own files), clones the committed HEAD into a temporary directory, and runs .ci/run
# there, exactly as CI does. Run it whenever the build's system dependencies change.
#
#   scripts/check-fresh.sh            # remove packages, fresh clone, .ci/run
#   KEEP_PACKAGES=1 scripts/check-fresh.sh   # fresh clone only (packages stay)
#
# Needs root (apt-get). Uses pip's and cargo's download caches, as CI on this machine does;
# rustup's toolchain and Python are part of the machine image, not of the project.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ "$(id -u)" -ne 0 ]; then
  echo "error: check-fresh.sh removes apt packages and needs root" >&2
  exit 1
fi
if [ -n "$(git -C "$repo" status --porcelain --untracked-files=no)" ]; then
  echo "warning: uncommitted changes are not part of the check (it clones HEAD)" >&2
fi

if [ -z "${KEEP_PACKAGES:-}" ]; then
  mapfile -t packages < <("$repo/scripts/install-deps.sh" --list)
  # iproute2 and procps are part of every Debian image and removing them breaks the machine;
  # the build's own packages are the ones that hid a missing install step before.
  removable=()
  for p in "${packages[@]}"; do
    case "$p" in iproute2 | procps) ;; *) removable+=("$p") ;; esac
  done
  echo "removing: ${removable[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get remove -y -qq "${removable[@]}" >/dev/null
  # libclang-dev pulls libclang1-N, which owns the libclang.so bindgen loads: remove it too.
  mapfile -t libclang < <(dpkg-query -W -f='${Package}\n' 'libclang1-*' 2>/dev/null || true)
  if [ ${#libclang[@]} -gt 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get remove -y -qq "${libclang[@]}" >/dev/null
  fi
  for f in /usr/lib/llvm-*/lib/libclang.so /usr/lib/llvm-*/lib/libclang-*.so.1; do
    case "$f" in *libclang-cpp*) continue ;; esac
    if [ -e "$f" ]; then
      echo "error: $f is still present after removing the packages; the check would prove nothing" >&2
      exit 1
    fi
  done
fi

work="$(mktemp -d /tmp/tessera-fresh.XXXXXX)"
trap 'rm -rf "$work"' EXIT
git clone -q "$repo" "$work/tessera"
if [ -d "$repo/../shared" ]; then
  ln -s "$(cd "$repo/../shared" && pwd)" "$work/shared"
fi
cd "$work/tessera"
echo "running .ci/run in a fresh clone at $work/tessera"
start=$(date +%s)
bash .ci/run
echo "check-fresh: .ci/run passed on a fresh clone in $(($(date +%s) - start)) s"
