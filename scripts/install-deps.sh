#!/usr/bin/env bash
# Installs the Debian packages the build and the tests need, and nothing when they are there.
#
# - ISA-L is built from source by erasure-isa-l-sys: nasm, autotools (autoconf, automake,
#   libtool), pkg-config; help2man so its `make` does not print errors for the man pages.
# - erasure-isa-l-sys runs bindgen, which dlopens libclang: the check looks for the files
#   clang-sys actually loads (libclang.so, libclang-N.so, libclang.so.N), not libclang-cpp.
# - Tests: iproute2 (network namespaces for the fault checker), procps (ps, used by benches),
#   faketime (clients with skewed clocks in the fault checker), nftables (lossy links and
#   partitions in the checker: this kernel has no netem), chromium and chromium-driver (the
#   console's test in a real headless browser, e2e/test_console_browser.py: Selenium is given
#   both paths, so no browser is ever downloaded).
#
# `scripts/check-fresh.sh` removes these packages and runs .ci/run on a fresh clone: run it
# whenever this list changes.
set -euo pipefail

# The packages, in one list: check-fresh.sh removes exactly these.
PACKAGES=(nasm autoconf automake libtool pkg-config help2man libclang-dev iproute2 procps faketime nftables chromium chromium-driver)

if [ "${1:-}" = "--list" ]; then
  printf '%s\n' "${PACKAGES[@]}"
  exit 0
fi

# True when a libclang that clang-sys can dlopen is on the system (libclang-cpp does not count).
have_libclang() {
  local f
  for f in /usr/lib/llvm-*/lib/libclang.so /usr/lib/llvm-*/lib/libclang-*.so* \
    /usr/lib/llvm-*/lib/libclang.so.* /usr/lib/x86_64-linux-gnu/libclang.so \
    /usr/lib/x86_64-linux-gnu/libclang-[0-9]*.so* /usr/lib/x86_64-linux-gnu/libclang.so.*; do
    case "$f" in *libclang-cpp*) continue ;; esac
    [ -e "$f" ] && return 0
  done
  return 1
}

missing=()
command -v nasm >/dev/null || missing+=(nasm)
command -v autoreconf >/dev/null || missing+=(autoconf)
command -v automake >/dev/null || missing+=(automake)
command -v libtoolize >/dev/null || missing+=(libtool)
command -v pkg-config >/dev/null || missing+=(pkg-config)
command -v help2man >/dev/null || missing+=(help2man)
command -v ip >/dev/null || missing+=(iproute2)
command -v ps >/dev/null || missing+=(procps)
command -v faketime >/dev/null || missing+=(faketime)
command -v nft >/dev/null || missing+=(nftables)
command -v chromium >/dev/null || missing+=(chromium)
command -v chromedriver >/dev/null || missing+=(chromium-driver)
have_libclang || missing+=(libclang-dev)

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "installing build dependencies: ${missing[*]}"
if [ "$(id -u)" -ne 0 ]; then
  echo "error: need root to install ${missing[*]} (run: sudo apt-get install -y ${missing[*]})" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
if ! have_libclang; then
  echo "error: libclang-dev is installed but no libclang.so was found for bindgen" >&2
  exit 1
fi
