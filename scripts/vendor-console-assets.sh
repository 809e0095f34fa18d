#!/usr/bin/env bash
# Vendors the web console's third-party assets from npm, pinned by version and by the registry's
# sha512 integrity: the files land in crates/console/assets/vendor/ and are committed, so the
# build (include_str! in crates/console) never reaches the network. Run it only to change a pin;
# `--check` fetches again and fails if the committed files differ from the package's.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="$repo/crates/console/assets/vendor"

# uPlot (MIT): the cluster page's throughput and latency charts.
UPLOT_VERSION=1.6.32
UPLOT_INTEGRITY="sha512-KIMVnG68zvu5XXUbC4LQEPnhwOxBuLyW1AHtpm6IKTXImkbLgkMy+jabjLgSLMasNuGGzQm/ep3tOkyTxpiQIw=="

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
url="https://registry.npmjs.org/uplot/-/uplot-$UPLOT_VERSION.tgz"
curl -fsS --max-time 120 -o "$work/uplot.tgz" "$url"
got="sha512-$(openssl dgst -sha512 -binary "$work/uplot.tgz" | base64 -w0)"
if [ "$got" != "$UPLOT_INTEGRITY" ]; then
  echo "error: $url is not the pinned package (integrity $got, want $UPLOT_INTEGRITY)" >&2
  exit 1
fi
tar -xzf "$work/uplot.tgz" -C "$work"
files=(dist/uPlot.iife.min.js dist/uPlot.min.css LICENSE)
if [ "${1:-}" = "--check" ]; then
  for f in "${files[@]}"; do
    cmp "$work/package/$f" "$out/uplot/$(basename "$f")"
  done
  echo "vendored uPlot $UPLOT_VERSION matches npm"
  exit 0
fi
mkdir -p "$out/uplot"
for f in "${files[@]}"; do
  cp "$work/package/$f" "$out/uplot/$(basename "$f")"
done
echo "$UPLOT_VERSION $UPLOT_INTEGRITY" >"$out/uplot/VERSION"
echo "vendored uPlot $UPLOT_VERSION into $out/uplot"
