#!/usr/bin/env bash
# Serve the small demo on two GPUs (TP=2 over NCCL) and measure HTTP decode tok/s at 1 and 4 streams. Run on the
# lent H200 machine with the server wheels carried in .wheels/ (no network there); results under $OUT.
set -u
python -m pip install -q --no-deps --no-index .wheels/*.whl 2>&1 | tail -3; python -c "import uvicorn, fastapi; print(\"server deps ok\")"
export PYTHONPATH=.
python -m engine make-demo /tmp/small --size small >/dev/null
for r in 0 1; do python -m engine serve /tmp/small --tp 2 --rank $r --master 127.0.0.1:29555 --port 8899 --device cuda --parallel 4 --context 4096 --kv bf16 > $OUT/rank$r.log 2>&1 & echo $! > /tmp/pid$r; done
for i in $(seq 1 120); do curl -sf http://127.0.0.1:8899/health >/dev/null && break; kill -0 $(cat /tmp/pid0) 2>/dev/null || break; sleep 1; done
curl -s http://127.0.0.1:8899/health; echo
curl -s http://127.0.0.1:8899/v1/chat/completions -H 'content-type: application/json' -d '{"model":"GLM-5.3-Flash","messages":[{"role":"user","content":"Reply with OK."}],"max_tokens":24,"temperature":0}' | head -c 800; echo
python - <<'PY'
import json, time, urllib.request, concurrent.futures as cf
def req(i):
    body = json.dumps({"model":"GLM-5.3-Flash","prompt":"hello world %d" % i,"max_tokens":64,"temperature":0,"ignore_eos":True}).encode()
    t=time.time(); r=json.load(urllib.request.urlopen(urllib.request.Request("http://127.0.0.1:8899/v1/completions", body, {"content-type":"application/json"})))
    return r["usage"]["completion_tokens"], time.time()-t
for n in (1,4):
    t=time.time()
    with cf.ThreadPoolExecutor(n) as ex: res=list(ex.map(req, range(n)))
    el=time.time()-t; print(f"concurrency {n}: {sum(r[0] for r in res)/el:.1f} tok/s aggregate over HTTP, tp=2 on 2 H200")
PY
kill $(cat /tmp/pid0) $(cat /tmp/pid1); sleep 3; tail -5 $OUT/rank0.log
