"""The compose suite's harness: one docker-compose project of deploy/compose.yaml on free 127.0.0.1
ports, what the scenarios observe of it and what they do to it, and a device fleet held by
`gateway bench steady`. Traffic goes only to the project's published 127.0.0.1 ports, and, while a
node is cut off from the others, to 127.0.0.1 inside that node's own network namespace (nsenter).
Every wait polls a condition against a deadline; nothing sleeps and then asserts."""

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "deploy" / "compose.yaml"
NODES = ("n1", "n2", "n3")
T0 = time.monotonic()
# Requests to 127.0.0.1 never go through a proxy from the environment.
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class Fail(Exception):
    """A check that did not hold, or a step that could not be done."""


class Abort(Fail):
    """A failure that no wait should retry (the fleet process ended)."""


class Not:
    """A falsy observation that says what was seen, for the message of a wait that times out."""

    def __init__(self, note):
        self.note = note

    def __bool__(self):
        return False

    def __repr__(self):
        return str(self.note)


def log(msg):
    print(f"[{time.monotonic() - T0:7.1f}s] {msg}", flush=True)


def run(args, *, check=True, timeout=120, env=None):
    p = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=timeout, env=env)
    if check and p.returncode != 0:
        raise Fail(f"`{' '.join(map(str, args))}` exited {p.returncode}: {p.stderr.strip()[-2000:]}")
    return p


def wait_for(what, timeout_s, probe, interval_s=0.1):
    """Polls probe() until it returns something truthy; returns (value, seconds waited)."""
    start = time.monotonic()
    last = None
    while True:
        try:
            value = probe()
        except Abort:
            raise
        except (OSError, ValueError, KeyError, TypeError, Fail) as e:
            value = Not(f"{type(e).__name__}: {e}")
        if value:
            return value, time.monotonic() - start
        last = value
        if time.monotonic() - start >= timeout_s:
            raise Fail(f"{what}: not within {timeout_s:.0f} s (last seen: {last!r})")
        time.sleep(interval_s)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(port, path, *, method="GET", body=None, token=None, timeout=2.0):
    """(status, JSON or text) from 127.0.0.1:port; (None, reason) when it cannot be reached."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with OPENER.open(req, timeout=timeout) as r:
            return r.status, _parse(r.read())
    except urllib.error.HTTPError as e:
        return e.code, _parse(e.read())
    except (urllib.error.URLError, OSError) as e:
        return None, str(getattr(e, "reason", e))


def _parse(raw):
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode(errors="replace")


# Run inside a node's network namespace: GET its /readyz on 127.0.0.1 and print "code mode".
READYZ_INSIDE = """
import json, urllib.error, urllib.request
o = urllib.request.build_opener(urllib.request.ProxyHandler({}))
try:
    r = o.open("http://127.0.0.1:7070/readyz", timeout=1); code, body = r.status, r.read()
except urllib.error.HTTPError as e:
    code, body = e.code, e.read()
except OSError as e:
    code, body = 0, b"{}"
print(code, json.loads(body or b"{}").get("mode", "-"))
"""


class Cluster:
    """The compose project: n1 bootstraps, n2 and n3 join it, every port published on 127.0.0.1."""

    def __init__(self, image, workdir):
        self.project = f"gwsuite{os.getpid()}"
        self.ports = {n: {"device": free_port(), "cluster": free_port()} for n in NODES}
        self.secrets = workdir / "secrets"
        run([ROOT / "deploy" / "compose-secrets.sh", self.secrets])
        self.token = (self.secrets / "cluster.secret").read_text().strip()
        env = {
            "GATEWAY_IMAGE": image,
            "GATEWAY_SECRETS_DIR": str(self.secrets),
            "GATEWAY_RESTART": "no",
            "GATEWAY_PUBLIC_HOST": "127.0.0.1",
        }
        for n in NODES:
            env[f"GATEWAY_{n.upper()}_DEVICE_PORT"] = str(self.ports[n]["device"])
            env[f"GATEWAY_{n.upper()}_CLUSTER_PORT"] = str(self.ports[n]["cluster"])
        self.env = {**os.environ, **env}
        self.ids = {}
        self._containers = {}
        self.network = None

    # --- docker and compose ---

    def compose(self, *args, timeout=180, check=True):
        return run(["docker-compose", "-p", self.project, "-f", COMPOSE_FILE, *args], env=self.env, timeout=timeout,
                   check=check)

    def container(self, node):
        if node not in self._containers:
            cid = self.compose("ps", "-q", node).stdout.strip()
            if not cid:
                raise Fail(f"no container for {node}")
            self._containers[node] = cid
        return self._containers[node]

    def inspect(self, node, fmt):
        return run(["docker", "inspect", "-f", fmt, self.container(node)]).stdout.strip()

    def docker(self, *args, timeout=120):
        return run(["docker", *args], timeout=timeout)

    def up(self):
        self.compose("up", "-d", "--no-build")
        networks = json.loads(self.inspect("n1", "{{json .NetworkSettings.Networks}}"))
        if len(networks) != 1:
            raise Fail(f"n1 is on {sorted(networks)}; expected the project's one network")
        self.network = next(iter(networks))

    def down(self):
        """Removes containers, network and volumes, whatever state the scenarios left them in."""
        for cid in self._containers.values():
            run(["docker", "unpause", cid], check=False, timeout=30)
        p = self.compose("down", "-v", "--remove-orphans", "-t", "10", timeout=300, check=False)
        log(f"compose down -v: exit {p.returncode}")

    def dump_logs(self, lines=40):
        p = self.compose("logs", "--no-color", check=False, timeout=60)
        # Whole-run lines about what closes sessions or moves leases, then each node's tail.
        marks = ("swept", "reconciled", "lagged", "fenced", "drain", "expired", "leader", "snapshot", "ERROR")
        noted = [l for l in p.stdout.splitlines() if any(m in l for m in marks)]
        print("\n".join(noted[-300:]), file=sys.stderr)
        p = self.compose("logs", "--no-color", "--tail", str(lines), check=False, timeout=60)
        print(p.stdout[-20000:], file=sys.stderr)

    # --- observing ---

    def port(self, node, kind="cluster"):
        return self.ports[node][kind]

    def status(self, node, timeout=2.0):
        code, body = http(self.port(node), "/cluster/status", token=self.token, timeout=timeout)
        return body if code == 200 and isinstance(body, dict) else None

    def readyz(self, node, timeout=1.0):
        """(code, mode); code None when the published port does not answer."""
        code, body = http(self.port(node), "/readyz", timeout=timeout)
        return code, body.get("mode") if isinstance(body, dict) else None

    def readyz_inside(self, pid):
        """/readyz from inside the node's network namespace (root only): (code, mode) or None."""
        p = subprocess.run(["nsenter", "-t", str(pid), "-n", sys.executable, "-S", "-c", READYZ_INSIDE],
                           capture_output=True, text=True, timeout=10)
        if p.returncode != 0:
            return None
        code, mode = p.stdout.split()
        return int(code), mode

    def metric(self, node, name):
        code, body = http(self.port(node), "/metrics")
        if code != 200 or not isinstance(body, str):
            return None
        m = re.search(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? (\S+)$", body, re.M)
        return float(m.group(1)) if m else None

    def claim(self, node, device, conn, attempt, timeout=3.0):
        return http(self.port(node), f"/v1/devices/{device}/claim", method="POST", token=self.token,
                    body={"conn": conn, "epoch": 0, "attempt": attempt}, timeout=timeout)

    def route(self, node, device):
        return http(self.port(node), f"/v1/devices/{device}/route", token=self.token)

    def leader(self, nodes=NODES):
        """The leader's name if every node in `nodes` answers and names the same one, else None."""
        names = set()
        for n in nodes:
            s = self.status(n)
            if s is None or s.get("leader") is None:
                return None
            names.add(s["leader"]["name"])
        return names.pop() if len(names) == 1 else None

    def member_view(self, observer, node):
        """(state, routes) of `node` in `observer`'s status, or None."""
        s = self.status(observer)
        if s is None:
            return None
        for m in s["members"]:
            if m["name"] == node:
                return m["state"], m["routes"]
        return ("absent", 0)

    def whole(self, nodes=NODES):
        """Every node answers: the same leader, three voters n1-n3 at <name>:7070 with the ids first
        seen, all live and in the ring, and /readyz 200. The leader's name, or a Not saying what is missing."""
        leaders = set()
        for n in nodes:
            s = self.status(n)
            if s is None:
                return Not(f"{n}: no status")
            members = {m["name"]: m for m in s["members"]}
            if sorted(members) != list(NODES):
                return Not(f"{n}: members {sorted(members)}")
            for name, m in members.items():
                if m["role"] != "voter" or m["state"] != "live" or m["cluster_addr"] != f"{name}:7070":
                    return Not(f"{n} sees {name} {m['role']} {m['state']} at {m['cluster_addr']}")
                if self.ids and self.ids.get(name) != m["id"]:
                    return Not(f"{n} sees {name} with id {m['id']}, not {self.ids.get(name)}")
            if sorted(s["ring"]["live"]) != list(NODES):
                return Not(f"{n}: ring {s['ring']['live']}")
            if s.get("leader") is None:
                return Not(f"{n}: no leader")
            leaders.add(s["leader"]["name"])
            code, mode = self.readyz(n)
            if code != 200:
                return Not(f"{n}: /readyz {code} {mode}")
        if len(leaders) != 1:
            return Not(f"leaders {leaders}")
        return leaders.pop()


class Watch:
    """Several conditions polled together: the first time (s since start) each one held."""

    def __init__(self, **probes):
        self.probes = probes
        self.first = {}
        self.last = {}

    def run(self, timeout_s, start=None, interval_s=0.1):
        """Polls until every condition has held once; returns when each first held, in seconds
        since `start` (a time.monotonic() value; default now)."""
        self.start = time.monotonic() if start is None else start
        wanted = set(self.probes)
        while True:
            for name, probe in self.probes.items():
                if name in self.first:
                    continue
                try:
                    value = probe()
                except Abort:
                    raise
                except (OSError, ValueError, KeyError, TypeError, Fail) as e:
                    value = Not(f"{type(e).__name__}: {e}")
                if value:
                    self.first[name] = time.monotonic() - self.start
                else:
                    self.last[name] = value
            if wanted <= set(self.first):
                return self.first
            if time.monotonic() - self.start >= timeout_s:
                missing = {k: self.last.get(k) for k in wanted - set(self.first)}
                raise Fail(f"not within {timeout_s:.0f} s: {missing} (held: {self.first})")
            time.sleep(interval_s)


class Fleet:
    """`gateway bench steady` on the host: devices dial the nodes' published ports (and follow
    redirects to the public URLs, which are those ports too) and are held for hold_s seconds."""

    PROGRESS = re.compile(r"connected (\d+)/(\d+) \(ever (\d+)\), attempts (\d+), failures (\d+)")

    def __init__(self, cluster, binary, devices, hold_s):
        nodes = ",".join(f"ws://127.0.0.1:{cluster.port(n, 'device')}" for n in NODES)
        self.devices = devices
        self.proc = subprocess.Popen(
            [binary, "bench", "steady", "--nodes", nodes, "--devices", str(devices), "--secs", str(hold_s),
             "--prefix", "fleet", "--device-secret-file", cluster.secrets / "device.secret", "--json"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.connected = 0
        self.progress_at = 0.0  # when the last progress line (one a second) arrived
        self.stderr = []
        self.stdout = []
        self._threads = [threading.Thread(target=self._read, daemon=True),
                         threading.Thread(target=lambda: self.stdout.extend(self.proc.stdout), daemon=True)]
        for t in self._threads:
            t.start()

    def _read(self):
        for line in self.proc.stderr:
            m = self.PROGRESS.search(line)
            if m:
                self.connected = int(m.group(1))
                self.progress_at = time.monotonic()
            else:
                self.stderr.append(line.rstrip())

    def all_connected(self, since=0.0):
        """Every device connected, as a progress line printed after `since` (monotonic) says."""
        if self.proc.poll() is not None:
            raise Abort(f"the fleet ended early (exit {self.proc.returncode}): {self.stderr[-5:]}")
        if self.progress_at <= since:
            return Not("no progress line yet")
        return self.connected == self.devices or Not(f"{self.connected}/{self.devices} connected")

    def report(self, timeout_s):
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise Fail(f"the fleet did not end within {timeout_s} s") from None
        for t in self._threads:
            t.join(timeout=10)
        if self.proc.returncode != 0:
            raise Fail(f"gateway bench exited {self.proc.returncode}: {self.stderr[-10:]}")
        return json.loads("".join(self.stdout))

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)
