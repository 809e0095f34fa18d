# Sourced by bench/pools.sh and bench/decommission.sh: starting the nodes of a local cluster
# and growing it by a second pool. Expects `bin` (the tessera binary), `work` and `pids` (from
# bench/work-dir.sh); `start_node` appends to the caller's `node_pids` too (bash scoping).

# start_node CONFIG I: runs node nI of CONFIG in the background.
start_node() {
    TESSERA_LOG=warn "$bin" node --config "$1" --id "n$2" 2>>"$work/nodes.log" &
    node_pids+=($!)
    pids+=($!)
}

# wait_port PORT: waits (10 s at most) until a node listens on 127.0.0.1:PORT.
wait_port() {
    for _ in $(seq 200); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return; sleep 0.05; done
    echo "error: no node on port $1" >&2
    exit 1
}

# add_second_pool CONFIG PORT: adds six nodes (n7..n12 on PORT+6..PORT+11, one drive each) as
# pool 2, formats and starts them, and activates the pool once they hold the buckets.
add_second_pool() {
    local config="$1" port="$2" add=()
    for i in $(seq 6 11); do add+=(--node "127.0.0.1:$((port + i))=1"); done
    "$bin" pool add --config "$config" "${add[@]}" >/dev/null
    for i in $(seq 7 12); do
        "$bin" drive format --config "$config" --node "n$i" >/dev/null
        start_node "$config" "$i"
    done
    for i in $(seq 6 11); do wait_port $((port + i)); done
    # The new nodes take the buckets from the first pool's nodes within moments of starting.
    for _ in $(seq 50); do "$bin" pool activate --config "$config" 2 >/dev/null 2>&1 && break; sleep 0.2; done
    "$bin" pool status --config "$config" | grep -q "^pool 2	active" || { echo "error: pool 2 not active" >&2; exit 1; }
}
