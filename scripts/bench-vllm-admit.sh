#!/usr/bin/env bash
# scripts/bench-vllm-admit.sh: admission by probe on real vLLM (docs/BENCHMARKS.md, "Admission by
# probe: pod ready to KV-exact"). Two engines of the pinned CPU build (cmd/vllmpool; tiny llama3,
# dummy weights, PYTHONHASHSEED=0, 96 KV blocks each): vllm-0 is certified by `ctk certify --admit
# probe` and is the rule's only endpoint when the gateway starts; the other engine is not in the
# certificate. Each round (BENCH_ROUNDS, default 3) restarts that engine (a fresh process, an empty
# cache), waits for its /health, then at once adds it through the admin API (PUT /admin/rules/pool)
# under a new name and times until /admin/status says KV-exact is eligible on it (admitted by
# probe); in the same round, the baseline variant removes and re-adds vllm-0, which the certificate
# lists (rule application alone). The probe's cost is read from the engine: vLLM's request and
# prompt-token counters (/metrics) and the blocks its events left in the gateway's mirror.
# A third variant, config-reload, adds the same engine under another name by rewriting the
# gateway's configuration and sending SIGHUP (--reload-rules); that engine has just served the
# admit-probe variant, so its cache is not empty (the probe's prompts carry their own nonces).
# The real engines hold the machine-wide engine lock while they run.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-$PWD/bin}
LOCK=$PWD/.cache/py/.engines.lock
if [ -z "${BENCH_VLLM_LOCKED:-}" ]; then
  echo "bench-vllm-admit: waiting for the engine lock ($LOCK)"
  exec env BENCH_VLLM_LOCKED=1 flock "$LOCK" "$PWD/scripts/$(basename "$0")" "$@"
fi
WORK=$(mktemp -d "${TMPDIR:-/tmp}/kvexact-bench-admit.XXXXXX")
GW_PID=
cleanup() {
  [ -n "$GW_PID" ] && { kill "$GW_PID" 2>/dev/null || true; wait "$GW_PID" 2>/dev/null || true; }
  [ -f "$WORK/pool/pids" ] && "$BIN/vllmpool" down -dir "$WORK/pool" || true
  rm -rf "$WORK"
}
trap cleanup EXIT INT TERM
free_port() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
for _ in $(seq 1 50); do
  BASE=$((12000 + RANDOM % 20000))
  ok=1
  for o in $(seq 0 12); do free_port $((BASE + o)) || { ok=0; break; }; done
  [ "$ok" = 1 ] && break
done
LISTEN=$((BASE + 5)) ADMIN=$((BASE + 6))
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) cores"
"$BIN/vllmpool" up -dir "$WORK/pool" -n 2 -seeds 0 -kv-blocks 96 -binding engine -port "$BASE" -timeout "${BENCH_ENGINE_TIMEOUT:-15m}"
# The certificate is proven on vllm-0 alone: the pool file without the second engine.
python3 - "$WORK/pool/pool.yaml" "$WORK/pool0.yaml" <<'EOF'
import re, sys
src, dst = sys.argv[1:]
out, skip = [], None
for line in open(src).read().splitlines(keepends=True):
    indent = len(line) - len(line.lstrip())
    if skip is not None:
        if line.strip() and indent <= skip:
            skip = None
        else:
            continue
    if re.match(r'\s*- name: "?vllm-1"?\s*$', line):
        skip = indent  # the item's own lines are indented past its dash
        continue
    out.append(line)
open(dst, "w").write("".join(out))
EOF
"$BIN/ctk" certify --pool "$WORK/pool0.yaml" --admit probe --out "$WORK/cert" >"$WORK/certify.out" 2>&1 || {
  echo "bench-vllm-admit: vllm-0 is not certified" >&2; cat "$WORK/certify.out" >&2; exit 1; }
python3 - "$WORK/pool/engines.json" "$WORK/gateway.yaml" "$LISTEN" "$ADMIN" "$WORK/pool" <<'EOF'
import json, sys
engines, out, listen, admin, root = sys.argv[1:]
e = json.load(open(engines))[0]
s = e["Spec"]
open(out, "w").write(f'''listen: 127.0.0.1:{listen}
admin: {{listen: "127.0.0.1:{admin}", token: "bench-admit"}}
tokenizers: {{root: "{root}"}}
rules:
  - name: pool
    models: [llama3]
    engine: {{family: vllm, release: v0.31.0}}
    blockSize: 32
    kvExactMode: 3
    seed: "0"
    binding: engine
    selector: least-load
    endpoints:
      - name: vllm-0
        address: "http://127.0.0.1:{s["Port"]}"
        events: {{zmq: ["tcp://127.0.0.1:{s["EventsPort"]}"], replay: ["tcp://127.0.0.1:{s["ReplayPort"]}"], topic: kv}}
''')
EOF
"$BIN/gateway" --config "$WORK/gateway.yaml" --certificate "$WORK/cert/certificate.json" \
  --reprobe-interval 0 --reload-rules --log-level warn >"$WORK/gateway.out" 2>"$WORK/gateway.log" &
GW_PID=$!
for _ in $(seq 1 600); do grep -q "gateway ready" "$WORK/gateway.out" 2>/dev/null && break; kill -0 "$GW_PID" 2>/dev/null || break; sleep 0.1; done
grep -q "gateway ready" "$WORK/gateway.out" || { echo "bench-vllm-admit: the gateway did not start" >&2; cat "$WORK/gateway.log" >&2; exit 1; }
python3 - "$WORK/pool/engines.json" "http://127.0.0.1:$ADMIN" "${BENCH_ROUNDS:-3}" "$BIN/vllmpool" "$WORK/pool" "$WORK/gateway.yaml" "$GW_PID" <<'EOF'
import json, os, signal, subprocess, sys, time, urllib.request
engines, admin, rounds, vllmpool, pooldir = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
config, gw_pid = sys.argv[6], int(sys.argv[7])
config_text = open(config).read()  # the rule's endpoints are the file's last lines
es = json.load(open(engines))
TOKEN = {"Authorization": "Bearer bench-admit"}

def ep(e, name):
    s = e["Spec"]
    return {"name": name, "address": f"http://127.0.0.1:{s['Port']}",
            "events": {"zmq": [f"tcp://127.0.0.1:{s['EventsPort']}"], "replay": [f"tcp://127.0.0.1:{s['ReplayPort']}"], "topic": "kv"}}

def call(method, url, body=None, headers=TOKEN):
    req = urllib.request.Request(url, data=None if body is None else json.dumps(body).encode(), method=method, headers=dict(headers, **{"Content-Type": "application/json"}))
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.read()

def rule():
    return json.loads(call("GET", admin + "/admin/rules/pool"))

def put(endpoints):
    r = rule()
    r["endpoints"] = endpoints
    call("PUT", admin + "/admin/rules/pool", r)

def status(name):
    st = json.loads(call("GET", admin + "/admin/status"))
    for r in st["rules"]:
        if r["name"] == "pool":
            for e in r["endpoints"]:
                if e["name"] == name:
                    return e
    return None

def eligible(e):
    return e is not None and (e.get("exact") or {}).get("state") == "eligible"

def wait_eligible(name, t0, limit=300):
    while time.monotonic() - t0 < limit:
        e = status(name)
        if eligible(e):
            return time.monotonic() - t0, e
        time.sleep(0.02)
    raise SystemExit(f"{name}: not eligible within {limit}s: {json.dumps(status(name))}")

def counters(port):
    """vLLM's own counters: finished requests and prompt tokens (sums over labels)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode()
    req = tok = 0.0
    for line in text.splitlines():
        if line.startswith("vllm:request_success_total"):
            req += float(line.rsplit(" ", 1)[1])
        elif line.startswith("vllm:prompt_tokens_total"):
            tok += float(line.rsplit(" ", 1)[1])
    return req, tok

e0, e1 = es[0], es[1]
port1 = e1["Spec"]["Port"]
print(f"{'round':<6} {'variant':<12} {'ready→exact ms':>15} {'probe HTTP requests':>20} {'engine requests':>16} {'prompt tokens':>14} {'blocks left':>12}  load")
for k in range(1, rounds + 1):
    # admit-probe: a fresh engine process (empty cache), added the moment its /health answers.
    put([ep(e0, "vllm-0")])
    p = subprocess.Popen([vllmpool, "restart", "-dir", pooldir, "-name", e1["Name"], "-timeout", "15m"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(5)  # the old process is gone before /health is polled
    while True:
        try:
            if urllib.request.urlopen(f"http://127.0.0.1:{port1}/health", timeout=2).status == 200:
                break
        except Exception:
            pass
        if p.poll() not in (None, 0):
            raise SystemExit("vllmpool restart failed: " + p.stderr.read().decode())
        time.sleep(0.05)
    t0 = time.monotonic()
    base_req, base_tok = counters(port1)
    name = f"new-{k}"
    put([ep(e0, "vllm-0"), ep(e1, name)])
    dt, e = wait_eligible(name, t0)
    time.sleep(1)  # the probe's last events reach the mirror
    e = status(name)
    req, tok = counters(port1)
    adm = e.get("admission") or {}
    load = open("/proc/loadavg").read().split()[:3]
    print(f"{k:<6} {'admit-probe':<12} {dt*1000:>15.0f} {adm.get('probe_requests', 0):>20} {req-base_req:>16.0f} {tok-base_tok:>14.0f} {e.get('resident_blocks', 0):>12}  {' '.join(load)}  ({e.get('certified')})")
    p.wait()
    # listed: the certificate's own endpoint removed and added again.
    put([ep(e1, name)])
    t0 = time.monotonic()
    put([ep(e0, "vllm-0"), ep(e1, name)])
    dt, e = wait_eligible("vllm-0", t0)
    print(f"{k:<6} {'listed':<12} {dt*1000:>15.0f} {'-':>20} {'-':>16} {'-':>14} {'-':>12}  {' '.join(open('/proc/loadavg').read().split()[:3])}")
    # config-reload: the same engine under another name, from the configuration file and SIGHUP.
    put([ep(e0, "vllm-0")])
    s1 = e1["Spec"]
    name = f"reload-{k}"
    with open(config, "w") as f:
        f.write(config_text + f'''      - name: {name}
        address: "http://127.0.0.1:{s1["Port"]}"
        events: {{zmq: ["tcp://127.0.0.1:{s1["EventsPort"]}"], replay: ["tcp://127.0.0.1:{s1["ReplayPort"]}"], topic: kv}}
''')
    base_req, base_tok = counters(port1)
    t0 = time.monotonic()
    os.kill(gw_pid, signal.SIGHUP)
    dt, e = wait_eligible(name, t0)
    time.sleep(1)
    e = status(name)
    req, tok = counters(port1)
    adm = e.get("admission") or {}
    print(f"{k:<6} {'reload':<12} {dt*1000:>15.0f} {adm.get('probe_requests', 0):>20} {req-base_req:>16.0f} {tok-base_tok:>14.0f} {e.get('resident_blocks', 0):>12}  {' '.join(open('/proc/loadavg').read().split()[:3])}  ({e.get('certified')})")
    with open(config, "w") as f:
        f.write(config_text)
EOF
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
