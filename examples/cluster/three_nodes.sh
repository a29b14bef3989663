#!/usr/bin/env bash
# Three troupe nodes on loopback, one script: a starts the cluster, b and c join through a;
# a fourth node, the driver (pool_spread.cpp), spreads 8 jobs over b and c through a cluster
# pool; c is killed with SIGKILL while its jobs run, b is stopped with SIGTERM; then what the
# driver's jobs did and each survivor's timeline.
#
#   examples/cluster/three_nodes.sh [path/to/troupe-node] [path/to/cluster_pool_spread]
#
# Every wait is bounded (the script gives up after 20 s and says what it waited for; a
# process that does not exit in time: all logs to stderr).
set -euo pipefail
node_bin=${1:-build/troupe-node}
driver_bin=${2:-build/examples/cluster_pool_spread}
dir=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  rm -rf "$dir"
}
trap cleanup EXIT

# wait_for FILE PATTERN: until a line of FILE matches PATTERN (at most 20 s).
wait_for() {
  for _ in $(seq 1 200); do
    grep -qE "$2" "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  echo "gave up waiting for '$2' in $(basename "$1")" >&2
  exit 1
}

# wait_exit PID NAME: until the process ends (at most 20 s; then its logs, and give up).
wait_exit() {
  for _ in $(seq 1 200); do
    local state
    state=$(sed -n 's/^[^)]*) \(.\).*/\1/p' "/proc/$1/stat" 2>/dev/null || true)
    if [[ -z $state || $state == Z ]]; then # gone, or ended and not yet reaped
      { wait "$1"; } 2>/dev/null || true
      return 0
    fi
    sleep 0.1
  done
  echo "gave up waiting for $2 to exit" >&2
  for f in "$dir"/*.log; do echo "--- $(basename "$f")" >&2; cat "$f" >&2; done
  exit 1
}

start() { # start NAME [SEED_PORT]
  local seeds="[]"
  [[ $# -gt 1 ]] && seeds="[\"127.0.0.1:$2\"]"
  "$node_bin" --json "{\"threads\": 1, \"cluster\": {\"node\": \"$1\", \"seeds\": $seeds,
    \"heartbeat_ms\": 100, \"failure_timeout_ms\": 1000, \"insecure\": true}}" \
    >"$dir/$1.log" 2>/dev/null &
  pids+=($!)
  wait_for "$dir/$1.log" "listening on"
}

start a
port=$(sed -n 's/.*listening on 127.0.0.1:\([0-9]*\).*/\1/p' "$dir/a.log")
start b "$port"
start c "$port"
wait_for "$dir/a.log" "member_up c"
wait_for "$dir/b.log" "member_up c"
echo "three nodes up: a on port $port"

"$driver_bin" "$port" >"$dir/driver.log" 2>&1 &
driver=$!
pids+=($driver)
wait_for "$dir/driver.log" "submitted"
kill -9 "${pids[2]}"   # c, while it runs two of the driver's jobs
wait_exit "${pids[2]}" c
wait_for "$dir/a.log" "member_down c"
wait_for "$dir/b.log" "member_down c"
echo "c killed: a and b saw it down"
wait_exit "$driver" driver
echo "--- the driver's pool (jobs 1-4 start at once: 2 and 4 on b, 1 and 3 on c)"
cat "$dir/driver.log"

kill -TERM "${pids[1]}" # b: its stop choreography says goodbye
wait_for "$dir/a.log" "member_left b"
wait_exit "${pids[1]}" b
echo "b stopped: a saw it leave"

kill -TERM "${pids[0]}"
wait_exit "${pids[0]}" a
for n in a b; do
  echo "--- timeline of $n"
  grep -E "^event|stopped" "$dir/$n.log"
done
