"""The backend half of a profile-guided build's training load (deploy/pgo-train.sh).

    python3 deploy/pgo-load.py --secret-file F --secs S --threads T CLUSTER_ADDR...

T threads, each on keep-alive connections to every cluster listener given (host:port), send in
turn: two claims of new devices (`POST /v1/devices/{id}/claim`), a publish to the last device the
thread claimed (`POST /v1/devices/{id}/messages`) and a lookup of its route (`GET
/v1/devices/{id}/route`), for S seconds. Prints one JSON object: requests by answer status, and
by error name for requests that got none. Exits 1 when fewer than 90 % of the requests were
answered 2xx (a training run that mostly met refusals would profile the refusals).
"""

import argparse
import http.client
import json
import sys
import threading
import time


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--secret-file", required=True)
    p.add_argument("--secs", type=float, default=30.0)
    p.add_argument("--threads", type=int, default=16)
    p.add_argument("targets", nargs="+", help="cluster listeners, host:port")
    a = p.parse_args()
    for target in a.targets:
        host, _, port = target.rpartition(":")
        if not host or not port.isdigit():
            p.error("a target is host:port, got %r" % target)
    with open(a.secret_file) as f:
        secret = f.read().strip()
    headers = {"Authorization": "Bearer " + secret, "Content-Type": "application/json"}
    counts = {}
    lock = threading.Lock()
    deadline = time.monotonic() + a.secs

    def connect(target):
        host, port = target.rsplit(":", 1)
        return http.client.HTTPConnection(host, int(port), timeout=10)

    def worker(t):
        seen = {}
        try:
            run(t, seen)
        finally:
            with lock:
                for key, v in seen.items():
                    counts[key] = counts.get(key, 0) + v

    def run(t, seen):
        conns = [connect(x) for x in a.targets]
        mine, n = None, 0
        while time.monotonic() < deadline:
            k = (t + n) % len(conns)
            step = n % 4
            try:
                if step < 2 or mine is None:
                    device = "pgo-%d-%d" % (t, n)
                    body = json.dumps({"conn": (t << 40) | n, "epoch": 0, "attempt": 1})
                    conns[k].request("POST", "/v1/devices/%s/claim" % device, body, headers)
                elif step == 2:
                    conns[k].request("POST", "/v1/devices/%s/messages" % mine, json.dumps({"n": n}), headers)
                else:
                    conns[k].request("GET", "/v1/devices/%s/route" % mine, headers=headers)
                r = conns[k].getresponse()
                r.read()
                key = str(r.status)
                if step < 2 or mine is None:
                    mine = device if r.status == 200 else mine
            except (OSError, http.client.HTTPException) as e:
                key = type(e).__name__
                conns[k].close()
                conns[k] = connect(a.targets[k])
            seen[key] = seen.get(key, 0) + 1
            n += 1

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(a.threads)]
    for x in threads:
        x.start()
    for x in threads:
        x.join()
    total = sum(counts.values())
    ok = sum(v for key, v in counts.items() if key.startswith("2"))
    print(json.dumps({"requests": total, "by_answer": counts}))
    if total == 0 or ok < 0.9 * total:
        print("pgo-load: only %d of %d requests answered 2xx" % (ok, total), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
