#!/usr/bin/env bash
# The web console's object listing of a large prefix (issue 14: "The console's object list of a
# prefix with 10,000 objects renders in under a second (paginated)"): a fresh local 6-node 4+2
# cluster, one gateway serving S3 and the console (`--console-listen`), OBJECTS small objects
# under data/ (data/part-00000.bin...) put through S3 by boto3 threads; then bench/console_list.py
# logs in to the console and times, client-side to the last byte of the HTML, the first page of
# /objects?bucket=B&prefix=data/ (500 rows; FETCHES fetches after WARMUPS) and walks of every
# page (checking they list exactly the OBJECTS keys), against the baseline measured in the same
# run: S3 ListObjectsV2 of the same prefix through the same gateway (first page of 1000 keys, and
# the whole prefix by paginator), with boto3 and as raw HTTP. When /usr/bin/chromium,
# /usr/bin/chromedriver and selenium (in .venv) exist it also renders the first page in headless
# Chromium (BROWSER=off skips it). Node n1's /metrics counts the listings each page asks of it.
# Prints the timings and the ratios console / ListObjectsV2.
# Usage: bench/console-list.sh   (env: OBJECTS=10000 SIZE=100 PUT_THREADS=16 FETCHES=20
#                                 WARMUPS=2 WALKS=3 BROWSER=auto BASE_PORT=27601)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
objects="${OBJECTS:-10000}"
size="${SIZE:-100}"
put_threads="${PUT_THREADS:-16}"
fetches="${FETCHES:-20}"
warmups="${WARMUPS:-2}"
walks="${WALKS:-3}"
browser="${BROWSER:-auto}"
bench_name=console-list
python="$root/.venv/bin/python"
[ -x "$python" ] || python=python3
"$python" -c 'import boto3' 2>/dev/null || { echo "error: $python has no boto3 (pip install -r e2e/requirements.txt)" >&2; exit 1; }

# 13 free ports from BASE_PORT up (nodes at +0..+5, the gateway's S3 at +10, its console at +11,
# n1's metrics at +12: how many listings each page asks the nodes for):
# a port that accepts a connection is taken.
port_taken() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
base_port="${BASE_PORT:-27601}"
for _ in $(seq 50); do
    free=1
    for off in $(seq 0 12); do port_taken $((base_port + off)) && { free=0; break; }; done
    ((free)) && break
    base_port=$((base_port + 20))
done
((free)) || { echo "error: no 13 free ports from ${BASE_PORT:-27601} up" >&2; exit 1; }
# shellcheck source=bench/local-cluster.sh
. "$root/bench/local-cluster.sh"

export TESSERA_ACCESS_KEY=BENCHCONSOLE TESSERA_SECRET_KEY="bench-console-$(head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \n')"
s3_port=$((base_port + 10)) console_port=$((base_port + 11)) metrics_port=$((base_port + 12))
start_node 1 --metrics-listen "127.0.0.1:$metrics_port"
for i in 2 3 4 5 6; do start_node "$i"; done
"$tessera" gateway --config "$TESSERA_CONFIG" --listen "127.0.0.1:$s3_port" --relayout-rate 0 \
    --console-listen "127.0.0.1:$console_port" >>"$work/gateway.log" 2>&1 &
pids+=($!)
for port in "$s3_port" "$console_port"; do
    for _ in $(seq 200); do port_taken "$port" && continue 2; sleep 0.05; done
    echo "error: the gateway did not listen on $port" >&2; cat "$work/gateway.log" >&2; exit 1
done

# Which code ran: the commit, and whether the working tree changed it (the binary may be newer).
commit="$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)"
git -C "$root" diff --quiet HEAD -- crates 2>/dev/null || commit="$commit + uncommitted changes in crates/"
echo "# console listing: $objects objects of $size B under data/, $fetches fetches after $warmups warm-ups, $walks walks ($(date -u +%F), $(nproc) cores, $(lscpu | sed -n 's/^Model name: *//p' | head -1))"
echo "# tessera binary built $(date -u -r "$tessera" '+%F %H:%M UTC'), tree at $commit"
# Bounded: the whole run takes a few minutes on 2 cores.
timeout 900 "$python" "$root/bench/console_list.py" --s3 "http://127.0.0.1:$s3_port" --console "http://127.0.0.1:$console_port" \
    --node-metrics "http://127.0.0.1:$metrics_port/metrics" \
    --bucket console-list --prefix data/ --count "$objects" --size "$size" --put-threads "$put_threads" \
    --fetches "$fetches" --warmups "$warmups" --walks "$walks" --browser "$browser" "$@"
