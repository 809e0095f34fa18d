#!/usr/bin/env bash
# Installs the system packages the build needs (ISA-L is built from source: nasm, autotools;
# bindgen needs libclang). Does nothing when they are already there.
set -euo pipefail

missing=()
command -v nasm >/dev/null || missing+=(nasm)
command -v autoreconf >/dev/null || missing+=(autoconf)
command -v automake >/dev/null || missing+=(automake)
command -v libtoolize >/dev/null || missing+=(libtool)
command -v pkg-config >/dev/null || missing+=(pkg-config)
ls /usr/lib/llvm-*/lib/libclang*.so* >/dev/null 2>&1 || ls /usr/lib/x86_64-linux-gnu/libclang*.so* >/dev/null 2>&1 || missing+=(libclang-dev)

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
apt-get install -y -qq "${missing[@]}" >/dev/null
