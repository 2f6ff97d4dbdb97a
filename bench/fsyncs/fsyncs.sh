#!/bin/bash
# usage: bench/fsyncs/fsyncs.sh BIN N  -- fsync-family syscalls per journaled POST /sandbox/exec (wasm, local store)
# Starts BIN (a triad binary) under strace with --sandbox wasm and the local
# store, warms a run up with two journaled POST /sandbox/exec calls, then
# counts the fsync-family syscalls of N more (each step settled by GET /cel).
# See docs/benchmarks.md, "Issue 28: fsyncs per journaled step".
set -u
BIN=$1; N=${2:-30}
D=$(mktemp -d ${TMPDIR:-/tmp}/fsyncs.XXXX); LOG=$D/strace.log
PORT=$((20000 + RANDOM % 20000))
strace -f -qq -e trace=fsync,fdatasync,sync_file_range,syncfs,sync -o $LOG \
  $BIN serve --addr 127.0.0.1:$PORT --data $D/data --sandbox wasm --auth none >$D/serve.log 2>&1 &
SP=$!
for i in $(seq 300); do curl -sf http://127.0.0.1:$PORT/healthz >/dev/null 2>&1 && break; sleep 0.2; done
ex() { curl -sf -X POST -H 'X-Run-Id: r-fsync' -H 'Content-Type: application/json' -d '{"code":"1+1"}' http://127.0.0.1:$PORT/sandbox/exec >/dev/null; }
cnt() { grep -c -E '(fsync|fdatasync|sync_file_range|syncfs)\(' $LOG; }  # a call strace splits (unfinished, resumed) counts once
ex; ex; curl -sf -H 'X-Run-Id: r-fsync' http://127.0.0.1:$PORT/cel >/dev/null
sleep 1; A=$(cnt)
for i in $(seq $N); do ex; done
curl -sf -H 'X-Run-Id: r-fsync' http://127.0.0.1:$PORT/cel > $D/cel.md
sleep 1; B=$(cnt)
echo "steps_in_cel=$(grep -c '^## Step' $D/cel.md) N=$N fsyncs_during=$((B-A)) per_step=$(echo "scale=2; ($B-$A)/$N" | bc)"
kill $(pgrep -P $SP) 2>/dev/null; sleep 1; kill $SP 2>/dev/null; rm -rf $D
