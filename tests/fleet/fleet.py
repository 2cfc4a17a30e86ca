"""The fleet run of issue 11 (tests/fleet/run.sh starts it; read that file first).

Phases, each a check that fails the run with a `fleet: FAIL <check>: <what was seen>` line:
  form     FLEET_NODES (4) `gateway serve` processes on free 127.0.0.1 ports in a temp dir: n1
           bootstraps, the others start --standby and are added with `gateway join`.
  connect  FLEET_LOADERS `gateway bench storm --await-exit` processes, each with its own disjoint
           range of devices (--first), connect FLEET_DEVICES devices (every node's /metrics
           `gateway_connections` adds up to it).
  hold     FLEET_HOLD_SECS: every 10 s, the nodes' connections still add up to every device, and no
           loader made a single new attempt (no device reconnected). Pings: per device, the run reads
           them off the sockets (`ss -ti`): between the start and the end of the hold every
           device's own TCP connection (same ports) received ping frames (2 bytes each, nothing
           else flows) and sent pongs (6 bytes each, masked); the nodes' gateway_pings_sent_total
           and gateway_pongs_received_total must count as many.
  kill     SIGKILL the node holding the most devices. Each loader sees it exit (it polls the pids
           every 10 ms) and measures its devices' re-homing; the run merges the loaders' delays
           into 50/99/100 %, runs `gateway plan-storm` for the whole storm (the loaders' model
           command with the total of devices), and checks every device came back, no device on a
           survivor did anything (others_disturbed = 0), and measured/predicted at 99 % stays
           under FLEET_MAX_RATIO (when it was the leader, the loaders' model waits for the
           election too: --election-ms).
  wave     Every loader but the first then ends its hold at once (HOLD_AFTER_S after its storm) and
           exits: three quarters of the fleet disconnect together. The first loader keeps its
           devices WAVE_STAY_S longer. The survivors must drop every leaving device's connection,
           none of them may fence (gateway_fence_events_total, read before and after), the leader
           may not suspect a healthy member (gateway_suspicions_total: out of the ring), and the
           staying loader's devices must not notice: no new attempt, all connected throughout. The
           run prints how long the survivors took to drop the leavers and their slowest lease
           renewal in the wave (gateway_lease_renewal_seconds).

Sizing (the operator's N+1 rule): a process here may hold 20,000 open files, so a node holds at
most ~19,850 devices (--max-connections, FLEET_MAX_CONNECTIONS). After one node dies the survivors
must hold everything, so a fleet of D devices needs N nodes with D / (N - 1) under that bound:
57,000 devices on 4 nodes (~14,250 each), ~19,000 each on the 3 survivors. On 3 nodes (19,000
each) the 2 survivors would need 28,500 descriptors each.

Admission: the cluster budget (`gateway admission set`) is FLEET_CONNECT_RATE/BURST (default
3000/3000 per second for the whole cluster) while the fleet connects, then FLEET_STORM_RATE/BURST
(default 800/800: the per-node default of 200/s on 4 nodes) before the kill; the re-homing is
shaped by the latter and plan-storm models it with --cluster-rate/--cluster-burst.

Other knobs: GATEWAY_BIN, FLEET_DEVICES (57000), FLEET_HOLD_SECS (600), FLEET_NODES (4),
FLEET_LOADERS (max(4, devices / 15000 rounded up)), FLEET_SOURCES (source addresses per loader,
256), FLEET_RAMP (devices/s each loader starts, 300), FLEET_PING_MS (20000, or a quarter of a
hold shorter than 80 s, so a short run still sees pings; idle timeout 3 x ping),
FLEET_STORM_TIMEOUT_SECS (180), FLEET_MAX_RATIO (3.0), FLEET_KEEP=1 keeps the temp dir,
FLEET_VICTIM=NAME (or `leader`) kills that node instead of the one holding the most.
"""

import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
T0 = time.monotonic()
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
# Loaders keep their devices this long after their storm is measured, so that the survivors can be
# read with every device back (the loaders finish within seconds of each other).
HOLD_AFTER_S = 30
# The first loader (the one that stays through the wave) keeps its devices this much longer.
WAVE_STAY_S = 60
# The wave's baseline is read this long after every device is back (see Fleet.kill).
WAVE_BASELINE_S = 3
PROGRESS = re.compile(r"connected (\d+)/(\d+) \(ever (\d+)\), attempts (\d+), failures (\d+)")


def env_int(name, default):
    v = os.environ.get(name)
    return int(v) if v not in (None, "") else default


def env_float(name, default):
    v = os.environ.get(name)
    return float(v) if v not in (None, "") else default


class Not:
    """A falsy observation that says what was seen, for the message of a wait that times out."""

    def __init__(self, note):
        self.note = note

    def __bool__(self):
        return False

    def __repr__(self):
        return str(self.note)


class Fail(Exception):
    """A check that did not hold: its name and what was seen."""

    def __init__(self, check, seen):
        super().__init__(f"{check}: {seen}")
        self.check = check


class Stopped(Exception):
    """A signal asked the run to stop (Ctrl-C, TERM, a terminal hang-up)."""


def stop_on(signum, _frame):
    raise Stopped(signal.Signals(signum).name)


def log(msg):
    print(f"[{time.monotonic() - T0:7.1f}s] {msg}", flush=True)


def loadavg():
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss(pid):
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def open_files(pid):
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def mib(b):
    return "n/a" if b is None else f"{b / 1048576:.0f} MiB"


def metric(text, name):
    """Sum of every sample of `name` (any labels) in a Prometheus text exposition."""
    total = None
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        rest = line[len(name):]
        if rest[:1] not in (" ", "{"):
            continue
        total = (total or 0) + float(rest.rsplit(" ", 1)[1])
    return total


# Counters worth reading off each survivor after the storm: why handshakes were refused, and whether
# the cluster itself wobbled (suspicions, fencing, elections).
STORM_METRICS = ("gateway_handshakes_total", "gateway_claims_total", "gateway_suspicions_total",
                 "gateway_fence_events_total", "gateway_raft_term", "gateway_suspect_nodes",
                 "gateway_propose_lease_waits_total", "gateway_propose_abandoned_total")


def series(text, names):
    """{name{labels}: value} of every sample of `names` (a Prometheus text exposition)."""
    out = {}
    for line in text.splitlines():
        if not line.startswith("#") and line.startswith(names):
            key, _, value = line.rpartition(" ")
            if key.split("{")[0] in names:
                out[key] = float(value)
    return out


def slowest_bucket_ms(before, after, name):
    """The upper bound (ms) of the highest histogram bucket of `name` that gained samples between
    two expositions, or None if none did."""
    def buckets(text):
        out = {}
        for line in text.splitlines():
            m = re.match(re.escape(name) + r'_bucket\{le="([^"]+)"\} (\S+)$', line)
            if m:
                out[float(m.group(1))] = float(m.group(2))
        return out
    b, a = buckets(before), buckets(after)
    gained = [le for le in sorted(a) if a[le] - b.get(le, 0) > 0]
    if not gained:
        return None
    # Cumulative buckets: the first one that gained as much as +Inf did holds the slowest sample.
    total = a[max(a)] - b.get(max(a), 0)
    le = next(le for le in sorted(a) if a[le] - b.get(le, 0) >= total)
    if math.isinf(le):
        return f">{round(max(x for x in a if not math.isinf(x)) * 1000)}"
    return round(le * 1000)


def time_to_fraction(sorted_delays, total, frac):
    """As the bench's stats::time_to_fraction: the k-th delay, k = ceil(frac * total)."""
    if total == 0:
        return 0
    k = max(1, math.ceil(frac * total))
    return sorted_delays[k - 1] if k <= len(sorted_delays) else None


def wait_for(check, what, timeout_s, probe, interval_s=0.2):
    """Polls probe() until it returns something truthy; raises Fail(check) at the deadline."""
    start = time.monotonic()
    last = None
    while True:
        try:
            value = probe()
        except (OSError, ValueError, KeyError) as e:
            value = Not(f"{type(e).__name__}: {e}")
        if value:
            return value
        last = value
        if time.monotonic() - start >= timeout_s:
            raise Fail(check, f"{what} not within {timeout_s:.0f} s (last seen: {last!r})")
        time.sleep(interval_s)


class Fleet:
    def __init__(self):
        self.bin = Path(os.environ.get("GATEWAY_BIN") or ROOT / "target" / "release" / "gateway").resolve()
        self.devices = env_int("FLEET_DEVICES", 57000)
        self.hold_s = env_int("FLEET_HOLD_SECS", 600)
        self.n_nodes = env_int("FLEET_NODES", 4)
        self.n_loaders = env_int("FLEET_LOADERS", max(4, math.ceil(self.devices / 15000)))
        self.sources = env_int("FLEET_SOURCES", 256)
        self.ramp = env_int("FLEET_RAMP", 300)
        default_ping = 20000 if self.hold_s >= 80 else max(1000, self.hold_s * 1000 // 4)
        self.ping_ms = env_int("FLEET_PING_MS", default_ping)
        self.connect_rate = env_int("FLEET_CONNECT_RATE", 3000)
        self.connect_burst = env_int("FLEET_CONNECT_BURST", 3000)
        self.storm_rate = env_int("FLEET_STORM_RATE", 800)
        self.storm_burst = env_int("FLEET_STORM_BURST", 800)
        self.storm_timeout_s = env_int("FLEET_STORM_TIMEOUT_SECS", 180)
        self.max_ratio = env_float("FLEET_MAX_RATIO", 3.0)
        hard = int(subprocess.run(["sh", "-c", "ulimit -Hn"], capture_output=True, text=True).stdout.strip() or 20000)
        self.max_conns = env_int("FLEET_MAX_CONNECTIONS", hard - 150)
        self.keep = os.environ.get("FLEET_KEEP") == "1"
        self.dir = Path(tempfile.mkdtemp(prefix="gateway-fleet-"))
        self.procs = []  # every child, for cleanup
        self.nodes = []  # dicts: name, public, cluster, proc, log
        self.loaders = []  # dicts: first, devices, proc, out, err
        self.result = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "devices": self.devices,
                       "hold_s": self.hold_s, "nodes": self.n_nodes, "loaders": self.n_loaders,
                       "max_connections": self.max_conns, "ping_ms": self.ping_ms}

    # ---- processes -------------------------------------------------------------------------------

    def spawn(self, args, out, err=None):
        p = subprocess.Popen([str(a) for a in args], stdout=open(out, "wb"),
                             stderr=open(err or out, "ab" if err is None else "wb"),
                             stdin=subprocess.DEVNULL, start_new_session=True)
        self.procs.append(p)
        return p

    def cli(self, args, timeout=60):
        p = subprocess.run([str(self.bin)] + [str(a) for a in args], capture_output=True, text=True, timeout=timeout)
        if p.returncode != 0:
            raise Fail("cli", f"`gateway {' '.join(map(str, args))}` exited {p.returncode}: {p.stderr.strip()[-1500:]}")
        return p.stdout

    def cleanup(self, failed):
        for p in self.procs:
            if p.poll() is None:
                try:
                    p.kill()
                except OSError:
                    pass
        for p in self.procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                log(f"pid {p.pid} did not exit after SIGKILL")
        if failed:
            for f in sorted(self.dir.glob("*.log")):
                lines = f.read_text(errors="replace").splitlines()[-6:]
                print(f"--- {f.name} (last lines)\n" + "\n".join(lines), flush=True)
        if self.keep:
            log(f"kept {self.dir}")
        else:
            shutil.rmtree(self.dir, ignore_errors=True)

    # ---- observations ---------------------------------------------------------------------------

    def get(self, node, path, timeout=3.0):
        req = urllib.request.Request(f"http://127.0.0.1:{node['cluster']}{path}")
        req.add_header("Authorization", f"Bearer {self.secret}")
        with OPENER.open(req, timeout=timeout) as r:
            return r.read().decode()

    def metrics(self, node):
        return self.get(node, "/metrics")

    def conns(self, nodes=None):
        """Live connections per node name (None for a node that did not answer)."""
        out = {}
        for n in nodes or self.nodes:
            try:
                out[n["name"]] = int(metric(self.metrics(n), "gateway_connections") or 0)
            except (OSError, ValueError):
                out[n["name"]] = None
        return out

    def ping_counters(self):
        """[pings sent, pongs received] summed over the nodes' /metrics."""
        texts = [self.metrics(n) for n in self.nodes]
        return [sum(metric(t, name) or 0 for t in texts)
                for name in ("gateway_pings_sent_total", "gateway_pongs_received_total")]

    def status(self, node):
        return json.loads(self.get(node, "/cluster/status"))

    def loader_progress(self, ld):
        """(connected now, devices, ever, attempts, failures) from the loader's last progress line."""
        try:
            with open(ld["err"], "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - 4096))
                tail = f.read().decode(errors="replace")
        except OSError:
            return None
        found = PROGRESS.findall(tail)
        return tuple(int(x) for x in found[-1]) if found else None

    def sockets(self):
        """Per device TCP connection (local, peer) -> (bytes received, bytes sent), device side."""
        ports = [n["public"] for n in self.nodes]
        listeners = {f"127.0.0.1:{p}" for p in ports}
        filt = "( " + " or ".join(f"dport = :{p}" for p in ports) + " )"
        out = subprocess.run(["ss", "-Htin", "state", "established", filt],
                             capture_output=True, text=True, timeout=300).stdout
        socks, key = {}, None
        for line in out.splitlines():
            if not line.startswith(("\t", " ")):
                f = line.split()
                # The device's end: towards a node's listener, not from one (a node's own end of a
                # connection can have an ephemeral port that is another node's public port).
                ok = len(f) >= 4 and f[-1] in listeners and f[-2] not in listeners
                key = (f[-2], f[-1]) if ok else None
                continue
            if key is None:
                continue
            rx = re.search(r"bytes_received:(\d+)", line)
            tx = re.search(r"bytes_sent:(\d+)", line)
            socks[key] = (int(rx.group(1)) if rx else 0, int(tx.group(1)) if tx else 0)
            key = None
        return socks

    # ---- phases ---------------------------------------------------------------------------------

    def form(self):
        if not os.access(self.bin, os.X_OK):
            raise Fail("setup", f"no executable at {self.bin}: set GATEWAY_BIN or run `cargo build --release`")
        old = os.umask(0o077)
        self.secret = os.urandom(16).hex()
        (self.dir / "cluster.secret").write_text(self.secret)
        (self.dir / "device.secret").write_text(os.urandom(32).hex())
        os.umask(old)
        idle_ms = 3 * self.ping_ms
        for k in range(self.n_nodes):
            name = f"n{k + 1}"
            node = {"name": name, "public": free_port(), "cluster": free_port(), "log": self.dir / f"{name}.log"}
            args = [self.bin, "serve", "--name", name,
                    "--listen", f"127.0.0.1:{node['public']}", "--cluster-listen", f"127.0.0.1:{node['cluster']}",
                    "--public-url", f"ws://127.0.0.1:{node['public']}", "--data-dir", self.dir / name,
                    "--cluster-secret-file", self.dir / "cluster.secret",
                    "--device-secret-file", self.dir / "device.secret",
                    "--max-connections", self.max_conns, "--ping-ms", self.ping_ms, "--idle-ms", idle_ms]
            if k == 0:
                args += ["--cluster-admit-rate", self.connect_rate, "--cluster-admit-burst", self.connect_burst]
            else:
                args += ["--standby"]
            node["proc"] = self.spawn(args, node["log"])
            self.nodes.append(node)
        for n in self.nodes:
            wait_for("form", f"{n['name']} /healthz", 30, lambda n=n: self.get(n, "/healthz") is not None)
        n1 = self.nodes[0]
        for n in self.nodes[1:]:
            self.cli(["join", "--cluster", f"127.0.0.1:{n1['cluster']}", "--node", f"127.0.0.1:{n['cluster']}",
                      "--cluster-secret-file", self.dir / "cluster.secret"], timeout=120)

        def formed():
            st = self.status(n1)
            live = st.get("ring", {}).get("live", [])
            return len(live) == self.n_nodes or Not(f"ring {live}")
        wait_for("form", f"{self.n_nodes} nodes in the ring", 60, formed)
        (self.dir / "pids").write_text("".join(f"{n['name']} {n['proc'].pid}\n" for n in self.nodes))
        st = self.status(n1)
        self.result["leader_at_start"] = (st.get("leader") or {}).get("name")
        self.rss_idle = {n["name"]: rss(n["proc"].pid) for n in self.nodes}
        log(f"formed: {self.n_nodes} nodes, leader {self.result['leader_at_start']}, --max-connections "
            f"{self.max_conns}, ping {self.ping_ms} ms; idle RSS "
            + ", ".join(f"{k} {mib(v)}" for k, v in self.rss_idle.items()) + f"; loadavg {loadavg()}")

    def connect(self):
        urls = ",".join(f"ws://127.0.0.1:{n['public']}" for n in self.nodes)
        chunk = math.ceil(self.devices / self.n_loaders)
        connect_timeout = max(120, self.devices // 200)
        t_start = time.monotonic()
        for j in range(self.n_loaders):
            first = j * chunk
            count = min(chunk, self.devices - first)
            if count <= 0:
                break
            ld = {"first": first, "devices": count, "out": self.dir / f"loader{j}.json",
                  "err": self.dir / f"loader{j}.log"}
            args = [self.bin, "bench", "storm", "--await-exit", "--await-secs",
                    connect_timeout + self.hold_s + 600, "--timeout-secs", self.storm_timeout_s,
                    "--hold-after-secs", HOLD_AFTER_S + (WAVE_STAY_S if j == 0 else 0),
                    "--nodes", urls, "--cluster", f"127.0.0.1:{self.nodes[0]['cluster']}",
                    "--devices", count, "--first", first, "--prefix", "fleet", "--sources", self.sources,
                    "--ramp", self.ramp, "--connect-timeout-secs", connect_timeout,
                    "--device-secret-file", self.dir / "device.secret",
                    "--cluster-secret-file", self.dir / "cluster.secret",
                    "--pid-file", self.dir / "pids", "--json"]
            ld["proc"] = self.spawn(args, ld["out"], ld["err"])
            self.loaders.append(ld)
        log(f"connect: {len(self.loaders)} loaders x ~{chunk} devices, ramp {self.ramp}/s each, "
            f"{self.sources} source addresses each; cluster admission {self.connect_rate}/s burst {self.connect_burst}")
        last_print = [0.0]

        def all_in():
            self.check_loaders_alive("connect")
            c = self.conns()
            total = sum(v or 0 for v in c.values())
            if time.monotonic() - last_print[0] >= 10:
                last_print[0] = time.monotonic()
                log(f"connect: {total}/{self.devices} connected {c}; loadavg {loadavg()}")
            return total == self.devices or Not(f"{total} {c}")
        wait_for("connect", f"all {self.devices} devices connected", connect_timeout + 30, all_in, 0.5)
        secs = time.monotonic() - t_start
        c = self.conns()
        self.result.update(connect_s=round(secs, 1), connect_rate_per_s=round(self.devices / secs),
                           per_node_after_connect=c, loadavg_connect=loadavg())
        log(f"connect: all {self.devices} devices connected in {secs:.1f} s "
            f"({self.devices / secs:.0f}/s) {c}; loadavg {loadavg()}")

    def check_loaders_alive(self, check):
        for j, ld in enumerate(self.loaders):
            if ld["proc"].poll() is not None:
                raise Fail(check, f"loader {j} exited {ld['proc'].returncode} early (see loader{j}.log)")
        for n in self.nodes:
            if n["proc"].poll() is not None and not n.get("killed"):
                raise Fail(check, f"node {n['name']} exited {n['proc'].returncode} (see {n['name']}.log)")

    def hold(self):
        # Every loader's last progress line must show its devices all connected and stay put.
        def settled():
            ps = [self.loader_progress(ld) for ld in self.loaders]
            ok = all(p and p[0] == p[1] == ld["devices"] for p, ld in zip(ps, self.loaders))
            return ps if ok else Not(ps)
        base = wait_for("connect", "every loader reports all its devices connected", 30, settled, 0.5)
        base_attempts = [p[3] for p in base]
        counted_before = self.ping_counters()
        t_ss = time.monotonic()
        before = self.sockets()
        ss_s = time.monotonic() - t_ss
        if len(before) != self.devices:
            raise Fail("hold", f"{len(before)} device TCP connections at the start of the hold, want {self.devices}")
        log(f"hold: {self.hold_s} s; {len(before)} device sockets seen by ss ({ss_s:.1f} s to read)")
        t_hold = time.monotonic()
        next_print = 0.0
        rss_max = {}
        while True:
            elapsed = time.monotonic() - t_hold
            self.check_loaders_alive("hold")
            c = self.conns()
            total = sum(v or 0 for v in c.values())
            if total != self.devices:
                raise Fail("hold", f"at {elapsed:.0f} s the nodes hold {total} connections, want {self.devices}: {c}")
            for ld, b in zip(self.loaders, base_attempts):
                p = self.loader_progress(ld)
                if p is None or p[0] != ld["devices"] or p[3] != b:
                    raise Fail("hold", f"at {elapsed:.0f} s loader --first {ld['first']} reports {p} "
                                       f"(connected, devices, ever, attempts, failures); attempts at start {b}")
            for n in self.nodes:
                r = rss(n["proc"].pid)
                rss_max[n["name"]] = max(rss_max.get(n["name"], 0), r or 0)
            if elapsed >= next_print:
                next_print += 30
                log(f"hold {elapsed:4.0f}/{self.hold_s} s: {total}/{self.devices} connected {c}, no reconnects; "
                    "RSS " + ", ".join(f"{n['name']} {mib(rss(n['proc'].pid))}" for n in self.nodes)
                    + f"; loadavg {loadavg()}")
            if elapsed >= self.hold_s:
                break
            time.sleep(min(10, max(0.1, self.hold_s - elapsed)))
        held_s = time.monotonic() - t_hold
        after = self.sockets()
        counted = [a - b for a, b in zip(self.ping_counters(), counted_before)]
        kept = [k for k in before if k in after]
        if len(kept) != self.devices:
            raise Fail("hold", f"{len(kept)} of {self.devices} device TCP connections survived the hold unchanged")
        pings = sorted((after[k][0] - before[k][0]) // 2 for k in kept)
        pongs = sorted((after[k][1] - before[k][1]) // 6 for k in kept)
        # A connection is pinged every ping_ms from its own start: at least floor(held / ping) pings.
        want = max(1, int(held_s * 1000 // self.ping_ms))
        if pings[0] < want or pongs[0] < want:
            starved = sum(1 for p in pings if p < want)
            raise Fail("pings", f"{starved} devices received fewer than {want} pings in {held_s:.0f} s "
                                f"(min pings {pings[0]}, min pongs {pongs[0]})")
        # The nodes' own counters (gateway_pings_sent_total, gateway_pongs_received_total) over the
        # same span must agree: at least `want` per device.
        if min(counted) < self.devices * want:
            raise Fail("pings", f"the nodes counted {counted[0]:.0f} pings sent and {counted[1]:.0f} pongs received "
                                f"in the hold, want >= {self.devices * want}")
        mem = {}
        for n in self.nodes:
            r, c0 = rss(n["proc"].pid), c[n["name"]]
            per = (r - self.rss_idle[n["name"]]) / c0 if r and c0 else None
            mem[n["name"]] = {"rss_idle": self.rss_idle[n["name"]], "rss_held": r, "rss_max": rss_max[n["name"]],
                              "connections": c0, "bytes_per_connection": round(per) if per else None}
        loaders_rss = [rss(ld["proc"].pid) for ld in self.loaders]
        self.result.update(held_s=round(held_s), pings_total=sum(pings), pongs_total=sum(pongs),
                           pings_counted=counted[0], pongs_counted=counted[1],
                           pings_per_device_min=pings[0], pings_per_device_max=pings[-1], pings_want=want,
                           memory=mem, loaders_rss=loaders_rss, loadavg_hold_end=loadavg(), ss_read_s=round(ss_s, 1))
        log(f"hold: done, {held_s:.0f} s, every device on its own TCP connection throughout, 0 reconnects; "
            f"pings per device {pings[0]}..{pings[-1]} (want >= {want}; {sum(pings)} in all), "
            f"pongs {pongs[0]}..{pongs[-1]}; the nodes counted {counted[0]:.0f} pings sent, "
            f"{counted[1]:.0f} pongs received; loadavg {loadavg()}")
        for name, m in mem.items():
            log(f"  {name}: {m['connections']} connections, RSS {mib(m['rss_idle'])} idle -> {mib(m['rss_held'])} "
                f"held ({m['bytes_per_connection']} B/conn), max {mib(m['rss_max'])}")
        log("  loaders RSS " + ", ".join(mib(r) for r in loaders_rss))

    def kill(self):
        n1 = f"127.0.0.1:{self.nodes[0]['cluster']}"
        if self.storm_rate:
            self.cli(["admission", "set", "--cluster", n1, "--rate", self.storm_rate, "--burst", self.storm_burst,
                      "--cluster-secret-file", self.dir / "cluster.secret"])
            # Each loader re-reads the cluster's status every 5 s: let them see the budget.
            want = float(self.storm_rate)

            def budget_applied():
                vals = [metric(self.metrics(n), "gateway_admission_rate_per_s") for n in self.nodes]
                return all(v is not None and abs(v - want / self.n_nodes) < 0.01 for v in vals) or Not(vals)
            wait_for("kill", "the storm admission budget on every node", 20, budget_applied)
            time.sleep(6)  # one status refresh of every loader (every 5 s); nothing is asserted on it
        c = self.conns()
        leader = (self.status(self.nodes[0]).get("leader") or {}).get("name")
        want = os.environ.get("FLEET_VICTIM") or ""
        victim = next((n for n in self.nodes if n["name"] == (leader if want == "leader" else want)), None)
        if want and victim is None:
            raise Fail("kill", f"FLEET_VICTIM={want}: no such node (leader {leader})")
        victim = victim or max(self.nodes, key=lambda n: c[n["name"]] or 0)
        survivors = [n for n in self.nodes if n is not victim]
        role = "leader" if leader == victim["name"] else "follower"
        log(f"kill: SIGKILL {victim['name']} ({role}, {c[victim['name']]} devices) of {c}; "
            f"admission {self.storm_rate}/s burst {self.storm_burst} for the cluster; loadavg {loadavg()}")
        self.result.update(victim=victim["name"], victim_role=role, victim_devices=c[victim["name"]],
                           per_node_before_kill=c, loadavg_kill=loadavg())
        victim["killed"] = True
        t_kill = time.monotonic()
        victim["proc"].send_signal(signal.SIGKILL)
        victim["proc"].wait()
        back = None  # the survivors once they hold every device (loaders hold them HOLD_AFTER_S more)
        # The survivors' counters and the staying loader's progress, read WAVE_BASELINE_S after `back`:
        # a loader prints its progress once a second, so a line read at `back` may predate the
        # attempt that brought its last device back.
        before_wave = None
        stayer, leavers = self.loaders[0], self.loaders[1:]
        first_exit = None  # when the first leaving loader was seen gone: the wave's start
        next_print = 0.0
        deadline = t_kill + self.storm_timeout_s + HOLD_AFTER_S + 120
        while any(ld["proc"].poll() is None for ld in leavers):
            el = time.monotonic() - t_kill
            if first_exit is None and any(ld["proc"].poll() is not None for ld in leavers):
                first_exit = time.monotonic()
            if before_wave is None and back is not None and (first_exit or el >= back["after_s"] + WAVE_BASELINE_S):
                before_wave = ({n["name"]: self.metrics(n) for n in survivors}, self.loader_progress(stayer))
            c = self.conns(survivors)
            if back is None and sum(v or 0 for v in c.values()) == self.devices:
                back = {"after_s": round(el, 1), "connections": c, "loadavg": loadavg(),
                        "rss": {n["name"]: rss(n["proc"].pid) for n in survivors},
                        "open_files": {n["name"]: open_files(n["proc"].pid) for n in survivors}}
                log(f"kill +{el:4.1f} s: the survivors hold all {self.devices} devices {c}, RSS "
                    + ", ".join(f"{k} {mib(v)}" for k, v in back["rss"].items())
                    + f", open files {back['open_files']}; loadavg {loadavg()}")
            elif el >= next_print:
                next_print += 5
                log(f"kill +{el:4.1f} s: survivors {c}; loadavg {loadavg()}")
            if time.monotonic() > deadline:
                raise Fail("storm", f"loaders still running {deadline - t_kill:.0f} s after the kill")
            time.sleep(0.2)
        if before_wave is None and back is not None:  # every leaver went within one poll
            before_wave = ({n["name"]: self.metrics(n) for n in survivors}, self.loader_progress(stayer))
        wave = self.wave(survivors, stayer, before_wave, first_exit or time.monotonic())
        counters = {}
        for n in survivors:
            try:
                counters[n["name"]] = series(self.metrics(n), STORM_METRICS)
            except OSError as e:
                counters[n["name"]] = str(e)
        self.result["survivor_counters"] = counters
        for name, cs in counters.items():
            log(f"  {name}: " + (", ".join(f"{k} {v:g}" for k, v in sorted(cs.items())) if isinstance(cs, dict) else cs))
        reports = []
        for j, ld in enumerate(self.loaders):
            if ld["proc"].returncode != 0:
                raise Fail("storm", f"loader {j} exited {ld['proc'].returncode} (see loader{j}.log)")
            reports.append(json.loads(Path(ld["out"]).read_text()))
        self.storm(reports, back)
        self.check_wave(wave)

    def wave(self, survivors, stayer, before, t0):
        """Watches the leaving loaders' devices go (they have exited, the first at `t0`) while the
        first loader stays, until it exits too; what was seen, for check_wave."""
        left = self.devices - stayer["devices"]
        log(f"wave: {len(self.loaders) - 1} loaders exited (the first {time.monotonic() - t0:.1f} s ago), "
            f"{left} devices disconnecting at once; "
            f"{stayer['devices']} devices of loader --first {stayer['first']} stay; loadavg {loadavg()}")
        seen = {"leaving": left, "staying": stayer["devices"], "drained_s": None, "disturbed": None}
        if before is None:
            seen["disturbed"] = "the survivors never held every device, so the wave had no baseline"
            stayer["proc"].wait()
            return seen
        base_attempts = before[1][3] if before[1] else None
        deadline = t0 + WAVE_STAY_S + HOLD_AFTER_S + 60
        next_print = 0.0
        while stayer["proc"].poll() is None:
            el = time.monotonic() - t0
            c = self.conns(survivors)
            total = sum(v or 0 for v in c.values())
            p = self.loader_progress(stayer)
            if seen["disturbed"] is None and (p is None or p[0] != stayer["devices"] or p[3] != base_attempts):
                seen["disturbed"] = f"at +{el:.1f} s the staying loader reports {p} (connected, devices, ever, " \
                                    f"attempts, failures); attempts when every device was back {base_attempts}"
                log(f"wave: {seen['disturbed']}")
            if seen["drained_s"] is None and total == stayer["devices"]:
                seen["drained_s"] = round(el, 1)
                log(f"wave +{el:4.1f} s: the survivors dropped every leaving device {c}; loadavg {loadavg()}")
            elif el >= next_print:
                next_print += 5
                log(f"wave +{el:4.1f} s: survivors {c}; loadavg {loadavg()}")
            if time.monotonic() > deadline:
                raise Fail("wave", f"the staying loader still running {deadline - t0:.0f} s after the others exited")
            time.sleep(0.2)
        after = {n["name"]: self.metrics(n) for n in survivors}
        def delta(name):
            return {k: (metric(after[k], name) or 0) - (metric(before[0][k], name) or 0) for k in after}
        seen["fences"] = delta("gateway_fence_events_total")
        seen["suspicions"] = delta("gateway_suspicions_total")
        seen["slowest_renewal_le_ms"] = {k: slowest_bucket_ms(before[0][k], after[k], "gateway_lease_renewal_seconds")
                                         for k in after}
        log(f"wave: the staying loader exited after {time.monotonic() - t0:.1f} s; fences during the wave "
            f"{seen['fences']}, suspicions {seen['suspicions']}; slowest lease renewal (bucket upper bound, ms) "
            f"{seen['slowest_renewal_le_ms']}")
        self.result["wave"] = seen
        return seen

    def check_wave(self, seen):
        if seen["disturbed"]:
            raise Fail("wave", f"devices that stayed were disturbed while {seen['leaving']} others left: "
                               f"{seen['disturbed']}")
        if seen["drained_s"] is None:
            raise Fail("wave", f"the survivors never dropped the {seen['leaving']} leaving devices' connections")
        fenced = {k: v for k, v in seen["fences"].items() if v}
        if fenced:
            raise Fail("wave", f"survivors fenced while {seen['leaving']} devices disconnected at once: {fenced}")
        suspected = {k: v for k, v in seen["suspicions"].items() if v}
        if suspected:
            raise Fail("wave", f"the leader took healthy members out of the ring while {seen['leaving']} devices "
                               f"disconnected at once (gateway_suspicions_total): {suspected}")

    def storm(self, reports, back):
        storms = [r["storm"] for r in reports]
        if any(s is None or s["node"] != self.result["victim"] for s in storms):
            raise Fail("storm", f"a loader saw another node exit: {[s and s['node'] for s in storms]}")
        affected = sum(s["affected"] for s in storms)
        rehomed = sum(s["rehomed"] for s in storms)
        delays = sorted(d for s in storms for d in s["delays_ms"])
        t = {f: time_to_fraction(delays, affected, f) for f in (0.5, 0.99, 1.0)}
        others = sum(s["others"] for s in storms)
        disturbed = sum(s["others_disturbed"] for s in storms)
        outcomes = {}
        for s in storms:
            for k, v in s["outcomes"].items():
                outcomes[k] = outcomes.get(k, 0) + v
        rings = [s["ring_converged_ms"] for s in storms if s["ring_converged_ms"] is not None]
        model_cmd = next((s["model"]["command"] for s in storms if s.get("model")), None)
        plan = None
        if model_cmd:
            cmd = re.sub(r"--devices \d+", f"--devices {affected}", model_cmd).split()
            plan = json.loads(self.cli(cmd + ["--json"], timeout=300))
            model_cmd = " ".join(cmd)
        pred = plan and {0.5: plan["p50_connected_ms"], 0.99: plan["p99_connected_ms"], 1.0: plan["all_connected_ms"]}
        ratio = {f: (round(t[f] / pred[f], 2) if pred and t[f] is not None and pred[f] else None) for f in t}
        self.result.update(
            affected=affected, rehomed=rehomed, t50_ms=t[0.5], t99_ms=t[0.99], t100_ms=t[1.0],
            plan_storm=model_cmd, plan_t50_ms=pred and pred[0.5], plan_t99_ms=pred and pred[0.99],
            plan_t100_ms=pred and pred[1.0], ratio_t50=ratio[0.5], ratio_t99=ratio[0.99], ratio_t100=ratio[1.0],
            ring_converged_ms=max(rings) if rings else None, others=others, others_disturbed=disturbed,
            storm_outcomes=outcomes, survivors_all_back=back, loadavg_storm_end=loadavg(),
            max_wait_ms=max(s["max_wait_ms"] for s in storms), waits_at_cap=sum(s["waits_at_cap"] for s in storms))
        log(f"storm: {affected} devices on {self.result['victim']} ({self.result['victim_role']}); re-homed "
            f"{rehomed}; 50/99/100 % after {t[0.5]} / {t[0.99]} / {t[1.0]} ms")
        if plan:
            log(f"storm: `gateway {model_cmd}` predicts {pred[0.5]} / {pred[0.99]} / {pred[1.0]} ms; "
                f"measured/predicted {ratio[0.5]} / {ratio[0.99]} / {ratio[1.0]}")
        log(f"storm: every survivor's ring without it after {self.result['ring_converged_ms']} ms; "
            f"other devices disturbed {disturbed} of {others}; loadavg {loadavg()}")
        log(f"storm: outcomes after the kill {outcomes}")
        if rehomed != affected or t[1.0] is None or any(s["timed_out"] for s in storms):
            raise Fail("storm", f"{rehomed} of {affected} devices re-homed within {self.storm_timeout_s} s")
        if disturbed:
            raise Fail("survivors", f"{disturbed} of {others} devices on surviving nodes were disturbed by the kill")
        if any(r["connected_at_end"] != r["devices"] for r in reports):
            raise Fail("storm", "a loader ended with devices not connected: "
                       + str([(r["first"], r["connected_at_end"], r["devices"]) for r in reports]))
        if back is None:
            raise Fail("storm", f"the survivors never held all {self.devices} devices at once")
        if pred is None:
            raise Fail("plan-storm", "no loader reported the cluster's admission to model the storm with")
        # When the leader died nothing commits until the survivors elected one: the loaders saw it
        # lead and gave the model that election (--election-ms), so the bound is the model's.
        if self.result["victim_role"] == "leader" and "--election-ms" not in model_cmd:
            raise Fail("plan-storm", f"the leader died but the model waits for no election: {model_cmd}")
        bound_ms = self.max_ratio * pred[0.99]
        self.result["bound_t99_ms"] = round(bound_ms)
        if t[0.99] is None or t[0.99] > bound_ms:
            raise Fail("plan-storm", f"99 % re-homed after {t[0.99]} ms, {ratio[0.99]} x the model's "
                                     f"{pred[0.99]} ms (bound {self.max_ratio} x)")


def main():
    fleet = Fleet()
    # Ctrl-C, a terminal hang-up or a TERM unwind through the cleanup below (set explicitly: a
    # shell starts a background job with SIGINT ignored).
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, stop_on)
    failed = True
    try:
        log(f"fleet: {fleet.devices} devices, {fleet.n_nodes} nodes, hold {fleet.hold_s} s, binary {fleet.bin}, "
            f"temp dir {fleet.dir}, open files {subprocess.run(['sh', '-c', 'ulimit -n'], capture_output=True, text=True).stdout.strip()}, "
            f"loadavg {loadavg()}")
        fleet.form()
        fleet.connect()
        fleet.hold()
        fleet.kill()
        failed = False
    except Fail as e:
        print(f"fleet: FAIL {e}", flush=True)
    except Stopped as e:
        print(f"fleet: stopped by {e}: cleaning up", flush=True)
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)  # a second Ctrl-C must not cut the cleanup short
        fleet.cleanup(failed)
        print("fleet: result " + json.dumps(fleet.result, sort_keys=True), flush=True)
    if failed:
        sys.exit(1)
    print("fleet: ok", flush=True)


if __name__ == "__main__":
    main()
