#!/usr/bin/env python3
"""Load test of tessera serve on loopback, bounded in count and time: VALID image requests and
MALFORMED ones from CLIENTS concurrent clients against a server with a small queue. Checks that
every valid request gets its image, byte-identical to `tessera generate` for its prompt and seed
(retrying on 503 as Retry-After asks, scaled down), every malformed one gets a 4xx, the server
survives, and its resident memory after the run is within 10% of after the first request.
Usage: serve_load.py TESSERA_CLI [--valid 200 --malformed 50 --clients 8 --max-queue 4 --steps 4]
Prints one JSON line of results; exit 1 if any check fails."""
import argparse, base64, json, os, random, subprocess, sys, tempfile, threading, time
import urllib.error, urllib.request

ap = argparse.ArgumentParser()
ap.add_argument("cli")
ap.add_argument("--valid", type=int, default=200)
ap.add_argument("--malformed", type=int, default=50)
ap.add_argument("--clients", type=int, default=8)
ap.add_argument("--max-queue", type=int, default=4)
ap.add_argument("--steps", type=int, default=4)
ap.add_argument("--time-limit", type=float, default=600)
a = ap.parse_args()

PROMPTS = ["a red circle", "a blue square", "a green triangle", "a yellow star", "a purple circle"]
SEEDS = [1, 2]
MALFORMED = ['{"prompt":', '{"prompt":"x","size":"65x64"}', '{"prompt":"x","steps":0}',
             '{"prompt":"x","n":99}', '{"prompt":"x","bogus":1}', '{"prompt":5}', '[]',
             '{"prompt":"x","seed":"one"}', ' ' * (2 << 20)]


def rss_kib(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])


def post(url, body):
    req = urllib.request.Request(url, data=body.encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.status, r.read(), r.headers
    except urllib.error.HTTPError as e:
        return e.code, e.read(), e.headers


tmp = tempfile.mkdtemp(prefix="tessera_load_")
ref = {}
for p in PROMPTS:
    for s in SEEDS:
        out = os.path.join(tmp, f"{len(ref)}.png")
        subprocess.run([a.cli, "generate", "--prompt", p, "--seed", str(s), "--steps",
                        str(a.steps), "-o", out], check=True, stderr=subprocess.DEVNULL)
        ref[(p, s)] = open(out, "rb").read()

server = subprocess.Popen([a.cli, "serve", "--port", "0", "--max-queue", str(a.max_queue)],
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
base = server.stdout.readline().strip().split(" on ")[-1]
url = base + "/v1/images/generations"
first = post(url, json.dumps({"prompt": PROMPTS[0], "seed": SEEDS[0], "steps": a.steps}))
assert first[0] == 200, first
rss_first = rss_kib(server.pid)

work = [("valid", i) for i in range(a.valid)] + [("bad", i) for i in range(a.malformed)]
random.Random(0).shuffle(work)
lock = threading.Lock()
stats = {"images_ok": 0, "images_wrong": 0, "bad_4xx": 0, "bad_other": 0, "retries_503": 0,
         "errors": 0, "latencies": []}
deadline = time.time() + a.time_limit


def client():
    while time.time() < deadline:
        with lock:
            if not work:
                return
            kind, i = work.pop()
        if kind == "bad":
            code, _, _ = post(url, MALFORMED[i % len(MALFORMED)])
            with lock:
                stats["bad_4xx" if 400 <= code < 500 else "bad_other"] += 1
            continue
        p, s = PROMPTS[i % len(PROMPTS)], SEEDS[(i // len(PROMPTS)) % len(SEEDS)]
        body = json.dumps({"prompt": p, "seed": s, "steps": a.steps})
        t0 = time.time()
        while time.time() < deadline:
            code, data, headers = post(url, body)
            if code == 503:
                with lock:
                    stats["retries_503"] += 1
                time.sleep(float(headers.get("Retry-After", "1")) / 50)
                continue
            with lock:
                if code != 200:
                    stats["errors"] += 1
                else:
                    png = base64.b64decode(json.loads(data)["data"][0]["b64_json"])
                    stats["images_ok" if png == ref[(p, s)] else "images_wrong"] += 1
                    stats["latencies"].append(time.time() - t0)
            break


t0 = time.time()
threads = [threading.Thread(target=client) for _ in range(a.clients)]
for t in threads:
    t.start()
for t in threads:
    t.join()
wall = time.time() - t0
alive = server.poll() is None
rss_end = rss_kib(server.pid) if alive else 0
server.kill()
server.wait()
lat = sorted(stats.pop("latencies"))
res = dict(stats, valid=a.valid, malformed=a.malformed, clients=a.clients,
           max_queue=a.max_queue, steps=a.steps, wall_s=round(wall, 1),
           images_per_s=round(stats["images_ok"] / wall, 2),
           latency_p50_s=round(lat[len(lat) // 2], 3) if lat else None,
           latency_p95_s=round(lat[int(len(lat) * 0.95)], 3) if lat else None,
           rss_after_first_mib=round(rss_first / 1024, 1), rss_end_mib=round(rss_end / 1024, 1),
           server_alive=alive)
print(json.dumps(res))
ok = (alive and stats["images_ok"] == a.valid and stats["bad_4xx"] == a.malformed
      and stats["errors"] == 0 and rss_end <= rss_first * 1.10)
sys.exit(0 if ok else 1)
