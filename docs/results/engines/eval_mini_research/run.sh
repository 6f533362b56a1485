#!/bin/bash
# issue 13: eval_mini (research protocol, 4 minis x 50 = 200 questions) through three engines, one after another
# run from anywhere: paths are relative to the repository root (shared data and outputs sit next to the clone)
cd "$(dirname "$0")/../../../.."
export SEARCHLOOP_SHARED_DATA_DIR=../shared/data SEARCHLOOP_HOME=${SEARCHLOOP_HOME:-../runs/engines/home}
export SEARCHLOOP_MODEL_CACHE=${SEARCHLOOP_MODEL_CACHE:-.searchloop/models}
O=${O:-../runs/engines}
run() { name=$1; shift; s=$(date +%s.%N); .venv/bin/searchloop eval --preset eval_mini 'protocols=[research]' run_name=eval-mini-$name out_dir=$O/$name "$@" > $O/$name.log 2>&1; rc=$?; e=$(date +%s.%N); echo "$name rc=$rc wall_s=$(echo "$e - $s" | bc)" >> $O/times.txt; }
# run transformers  (done: see times.txt)
run vllm agent.generator.backend=vllm
.venv/bin/searchloop serve generator --engine vllm --port 8021 > $O/server.log 2>&1 &
SP=$!
for i in $(seq 1 120); do curl -sf http://127.0.0.1:8021/v1/models > /dev/null && break; sleep 5; done
echo "server ready after ~$((i*5)) s" >> $O/times.txt
run vllm_served agent.generator.backend=openai agent.generator.base_url=http://127.0.0.1:8021/v1
kill -INT $SP; sleep 10; kill -9 -$SP 2>/dev/null
echo done >> $O/times.txt
