"""The compose suite: a three-node cluster of the gateway image (deploy/compose.yaml) formed by
service names, then a follower killed and restarted, the leader partitioned and reconnected, a
follower paused past its lease, and a rolling restart under a device fleet. Each scenario checks
its conditions against deadlines and records what it measured; run it with tests/compose/run.sh."""

import argparse
import collections
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from harness import NODES, ROOT, Cluster, Fail, Fleet, Not, Watch, log, run, wait_for

FIGURES = []


def figure(text):
    FIGURES.append(text)
    log(f"figure: {text}")


def timing(c):
    cfg = c.status("n1")["config"]
    return cfg["lease_ms"] / 1000, cfg["sweep_ms"] / 1000, cfg["election_timeout_ms"] / 1000


def follower(c, avoid=()):
    leader, _ = wait_for("a leader every node names", 30, c.leader)
    return next(n for n in reversed(NODES) if n != leader and n not in avoid), leader


def claim_all(c, node, prefix, count):
    """Claims prefix-0..count-1 for `node` (attempt 1); every claim must be acknowledged."""
    for i in range(count):
        code, body = c.claim(node, f"{prefix}-{i}", conn=i + 1, attempt=1)
        if code != 200:
            raise Fail(f"claim {prefix}-{i} on {node}: {code} {body}")


def gone(c, observers, node, device):
    """`node` expired with no routes in every observer's view, and `device`'s route deleted there
    while its floor (attempt 1) stays."""
    for o in observers:
        view = c.member_view(o, node)
        if view != ("expired", 0):
            return Not(f"{o} sees {node} as {view}")
        code, body = c.route(o, device)
        if code != 404 or (body.get("floor") or {}).get("attempt") != 1:
            return Not(f"{o}: route of {device}: {code} {body}")
    return True


def out_of_ring(c, observers, node):
    for o in observers:
        s = c.status(o)
        if s is None or node in s["ring"]["live"]:
            return Not(f"{o}: ring {s and s['ring']['live']}")
    return True


def rejoined(c, node, what):
    """Waits until the cluster is whole again with `node` as the same member; returns seconds."""
    _, secs = wait_for(f"{node} back as the same member after {what}", 60, c.whole)
    return secs


# --- a. form --------------------------------------------------------------------------------------


def form(c, _args):
    t0 = time.monotonic()
    c.up()
    up_s = time.monotonic() - t0
    leader, _ = wait_for("3 live voters n1-n3 at <name>:7070, one leader, all ready", 90, c.whole)
    c.ids = {m["name"]: m["id"] for m in c.status("n1")["members"]}
    s = c.status("n1")
    figure(f"form: 3 live voters by service name (n1:7070, n2:7070, n3:7070), all ready "
           f"{time.monotonic() - t0:.1f} s after `docker-compose up -d` began (which took {up_s:.1f} s); "
           f"leader {leader}, commit index {s['commit_index']}")

    # The health checks the image carries: `gateway probe http://127.0.0.1:7070/readyz` inside each
    # container (no shell there), every 5 s.
    def healthy():
        states = {n: c.inspect(n, "{{.State.Health.Status}}") for n in NODES}
        return True if all(v == "healthy" for v in states.values()) else Not(f"health {states}")

    _, health_s = wait_for("Docker health checks (gateway probe /readyz) healthy on n1-n3", 60, healthy, 0.5)
    figure(f"form: Docker reports n1-n3 healthy (gateway probe of /readyz) {health_s:.1f} s after they were ready")


# --- b. kill -9 and restart -----------------------------------------------------------------------


def kill(c, _args):
    lease, sweep, _ = timing(c)
    victim, leader = follower(c)
    survivors = [n for n in NODES if n != victim]
    claim_all(c, victim, "k", 20)
    commit_before = c.status(leader)["commit_index"]
    c.docker("kill", c.container(victim))
    t0 = time.monotonic()
    code, body = c.claim(leader, "k-after", conn=1, attempt=1, timeout=10)
    claim_s = time.monotonic() - t0
    if code != 200:
        raise Fail(f"a claim through {leader} after killing {victim}: {code} {body}")
    exit_code = c.inspect(victim, "{{.State.ExitCode}}")
    times = Watch(
        suspect=lambda: out_of_ring(c, survivors, victim),
        swept=lambda: gone(c, survivors, victim, "k-0"),
    ).run(lease + sweep + 15, start=t0)
    commit_after = c.status(leader)["commit_index"]
    if commit_after <= commit_before:
        raise Fail(f"commit index did not move on {leader}: {commit_before} -> {commit_after}")
    bound = lease + sweep + 2
    if times["swept"] > bound:
        raise Fail(f"{victim} swept after {times['swept']:.1f} s, more than lease + sweep + 2 s = {bound:.1f} s")
    figure(f"kill: `docker kill {victim}` (exit {exit_code}); a claim through {leader} committed in "
           f"{claim_s * 1000:.0f} ms; commit index {commit_before} -> {commit_after}; {victim} out of the "
           f"survivors' rings after {times['suspect']:.1f} s, expired and its 20 routes swept after "
           f"{times['swept']:.1f} s (bound lease + sweep + 2 s = {bound:.0f} s), floors kept")
    t1 = time.monotonic()
    c.docker("start", c.container(victim))
    rejoined(c, victim, "docker start")
    figure(f"kill: `docker start {victim}` on its volume: back as the same member (id {c.ids[victim]}), live "
           f"and ready {time.monotonic() - t1:.1f} s after the start command, no join")
    c.killed = victim


# --- c. partition ---------------------------------------------------------------------------------


class Claimer:
    """One thread per node claims p-0..p-9 in turn through that node's published port, each claim
    with the next attempt of its device (shared by the threads); remembers the highest attempt
    acknowledged (200) per device. A node that does not answer holds up only its own thread."""

    def __init__(self, c):
        self.c = c
        self.lock = threading.Lock()
        self.attempts = collections.Counter()
        self.acked = {}
        self.acks = []  # (monotonic time of the answer, node)
        self.results = collections.Counter()
        self.halt = threading.Event()
        self.threads = [threading.Thread(target=self.run, args=(n,), daemon=True) for n in NODES]
        for t in self.threads:
            t.start()

    def run(self, node):
        i = NODES.index(node)
        while not self.halt.is_set():
            device = f"p-{i % 10}"
            with self.lock:
                self.attempts[device] += 1
                attempt = self.attempts[device]
            code, _ = self.c.claim(node, device, conn=i + 1, attempt=attempt, timeout=7)
            with self.lock:
                if code == 200:
                    self.acked[device] = max(self.acked.get(device, 0), attempt)
                    self.acks.append((time.monotonic(), node))
                self.results[(node, code or "unreachable")] += 1
            i += 3
            self.halt.wait(0.1)

    def stop(self):
        self.halt.set()
        for t in self.threads:
            t.join(timeout=30)


def floors_kept(c, acked):
    for n in NODES:
        for device, attempt in acked.items():
            code, body = c.route(n, device)
            floor = (body.get("floor") or {}) if isinstance(body, dict) else {}
            if code not in (200, 404) or floor.get("attempt", 0) < attempt:
                return Not(f"{n}: {device} acknowledged at attempt {attempt}, floor {floor} ({code})")
    return True


def partition(c, _args):
    lease, _, _ = timing(c)
    old = wait_for("a leader every node names", 30, c.leader)[0]
    majority = [n for n in NODES if n != old]
    fences_before = c.metric(old, "gateway_fence_events_total")
    pid = c.inspect(old, "{{.State.Pid}}")
    inside = c.readyz_inside(pid)
    if inside is None:
        log(f"nsenter into {old}'s network namespace failed (needs root): its /readyz is checked after the heal")
    claimer = Claimer(c)
    wait_for("a first acknowledged claim", 20, lambda: claimer.acks)
    try:
        c.docker("network", "disconnect", c.network, c.container(old))
        t0 = time.monotonic()
        probes = {
            "leader": lambda: c.leader(majority) not in (None, old),
            "commit": lambda: any(t > t0 and n in majority for t, n in claimer.acks),
            "serving": lambda: all(c.readyz(n)[0] == 200 for n in majority),
        }
        if inside is not None:
            probes["fenced"] = lambda: c.readyz_inside(pid) == (503, "fenced") or Not(c.readyz_inside(pid))
        times = Watch(**probes).run(lease + 20, start=t0)
        new = c.leader(majority)
        if "fenced" in times and times["fenced"] > lease + 0.5:
            raise Fail(f"{old} fenced after {times['fenced']:.1f} s, later than its lease ({lease:.0f} s)")
        fenced = f"/readyz 503 fenced after {times['fenced']:.1f} s" if "fenced" in times else "fencing not observed"
        figure(f"partition: leader {old} disconnected; {'/'.join(majority)} elected {new} after "
               f"{times['leader']:.1f} s, first claim committed through the majority after {times['commit']:.1f} s, "
               f"both ready; {old} {fenced} (lease {lease:.0f} s)")
    finally:
        c.docker("network", "connect", "--alias", old, c.network, c.container(old))
    t1 = time.monotonic()
    secs = rejoined(c, old, "the partition healed")
    state = c.status(old)["server_state"]
    if state != "follower":
        raise Fail(f"{old} is {state} after the heal, expected follower")
    wait_for("a claim acknowledged after the heal", 20, lambda: any(t > t1 for t, _ in claimer.acks))
    claimer.stop()
    fences = c.metric(old, "gateway_fence_events_total")
    if fences is None or fences_before is None or fences <= fences_before:
        raise Fail(f"{old} did not count a self-fence: gateway_fence_events_total {fences_before} -> {fences}")
    _, check_s = wait_for("every acknowledged claim's floor on every node", 20, lambda: floors_kept(c, claimer.acked))
    per_node = {n: f"{claimer.results[(n, 200)]}/{sum(v for (m, _), v in claimer.results.items() if m == n)}"
                for n in NODES}
    figure(f"partition: reconnected; {old} rejoined as a follower and ready after {secs:.1f} s "
           f"(fence events {fences_before:.0f} -> {fences:.0f}); claims acknowledged/sent per node {per_node}; "
           f"all {len(claimer.acked)} devices' floors >= their highest acknowledged attempt on every node "
           f"(checked in {check_s:.1f} s): no acknowledged claim lost")


# --- d. pause -------------------------------------------------------------------------------------


def pause(c, _args):
    lease, sweep, _ = timing(c)
    node, leader = follower(c, avoid=(getattr(c, "killed", None),))
    others = [n for n in NODES if n != node]
    claim_all(c, node, "s", 10)
    fences_before = c.metric(node, "gateway_fence_events_total")
    c.docker("pause", c.container(node))
    t0 = time.monotonic()
    try:
        times = Watch(
            suspect=lambda: out_of_ring(c, others, node),
            swept=lambda: gone(c, others, node, "s-0"),
            commits=lambda: c.claim(leader, "s-live", conn=1, attempt=int(time.time() * 1000))[0] == 200,
        ).run(lease + sweep + 15, start=t0)
    finally:
        c.docker("unpause", c.container(node))
    bound = lease + sweep + 2
    if times["swept"] > bound:
        raise Fail(f"{node} swept after {times['swept']:.1f} s, more than lease + sweep + 2 s = {bound:.1f} s")
    figure(f"pause: `docker pause {node}`; out of the others' rings after {times['suspect']:.1f} s, expired "
           f"and its 10 routes swept after {times['swept']:.1f} s (bound {bound:.0f} s); {leader} kept committing")
    seen = []

    def ready():
        code, mode = c.readyz(node)
        if not seen or seen[-1] != (code, mode):
            seen.append((code, mode))
        return code == 200

    _, ready_s = wait_for(f"{node} ready after unpause", 60, ready, interval_s=0.05)
    secs = rejoined(c, node, "docker unpause")
    fences = c.metric(node, "gateway_fence_events_total")
    if fences is None or fences_before is None or fences <= fences_before:
        raise Fail(f"{node} did not fence after the pause: gateway_fence_events_total {fences_before} -> {fences}")
    figure(f"pause: unpaused; {node}'s /readyz went {' -> '.join(f'{a} {b}' for a, b in seen)} "
           f"(200 after {ready_s:.1f} s), fence events {fences_before:.0f} -> {fences:.0f}; same member, "
           f"live in every view after {secs:.1f} s")


# --- e. rolling restart ---------------------------------------------------------------------------


def served(c, nodes, devices):
    """The nodes' gateway_connections add up to `devices`."""
    total = sum(int(c.metric(n, "gateway_connections") or 0) for n in nodes)
    return total == devices or Not(f"{total} connections on {nodes}")


def rolling(c, args, binary):
    leader = wait_for("a leader every node names", 30, c.leader)[0]
    order = [n for n in NODES if n != leader] + [leader]
    grace_s = float(c.inspect("n1", "{{.Config.StopTimeout}}") or 10)
    fleet = Fleet(c, binary, args.devices, args.hold)
    c.fleet = fleet
    _, up_s = wait_for(f"{args.devices} devices connected", 90, fleet.all_connected)
    figure(f"rolling: {args.devices} devices connected through the published ports in {up_s:.1f} s")
    drained = 0
    for node in order:
        conns = int(c.metric(node, "gateway_connections") or 0)
        t0 = time.monotonic()
        c.docker("stop", c.container(node), timeout=grace_s + 30)
        stop_s = time.monotonic() - t0
        code = c.inspect(node, "{{.State.ExitCode}}")
        if code != "0" or stop_s >= grace_s:
            raise Fail(f"docker stop {node}: exit {code} after {stop_s:.1f} s (grace {grace_s:.0f} s)")
        running = [n for n in NODES if n != node]
        back = Watch(served=lambda: served(c, running, args.devices),
                     fleet=lambda: fleet.all_connected(since=t0 + stop_s)).run(60, start=t0)
        t1 = time.monotonic()
        c.docker("start", c.container(node))
        rejoined(c, node, "docker start")
        drained += conns
        role = "leader" if node == leader else "follower"
        figure(f"rolling: {node} ({role}, {conns} devices): `docker stop` drained it, exit 0 after {stop_s:.1f} s "
               f"(grace {grace_s:.0f} s); the others held all {args.devices} devices {back['served']:.1f} s after the stop "
               f"began (the fleet's next progress line agreed at {back['fleet']:.1f} s); "
               f"`docker start`: same member, live and ready {time.monotonic() - t1:.1f} s later")
    if fleet.proc.poll() is not None:
        raise Fail("the fleet's hold ended before the rolling restart did: raise --hold")
    left = args.hold + 60
    log(f"waiting for the fleet's hold of {args.hold} s to end")
    report = fleet.report(left)
    outcomes = report["outcomes"]
    reconnects = report["accepts"] - args.devices
    closes = {k: v for k, v in outcomes.items() if k.startswith("closed")}
    figure(f"rolling: fleet report: {report['accepts']} connects for {args.devices} devices "
           f"({reconnects} reconnects), closes {closes}, {report['connected_at_end']} connected at the end, "
           f"outcomes {outcomes}")
    if report["connected_at_end"] != args.devices:
        raise Fail(f"{report['connected_at_end']}/{args.devices} devices connected at the end")
    if closes != ({"closed 1001": drained} if drained else {}):
        raise Fail(f"closes {closes}: expected exactly one 1001 per drained device ({drained})")
    if reconnects != drained:
        raise Fail(f"{reconnects} reconnects for {drained} drained devices: some device reconnected more than once")
    figure(f"rolling: {drained} devices drained over 3 restarts, each reconnected exactly once "
           f"(reconnects = 1001 closes = devices on the stopped nodes); no other device was disturbed")


# --- main -----------------------------------------------------------------------------------------


def build_image(args):
    if args.image:
        run(["docker", "image", "inspect", args.image])
        log(f"using the image {args.image} as it is")
        return args.image
    t0 = time.monotonic()
    log("building the image: deploy/build-image.sh (cargo and docker reuse what is up to date)")
    p = subprocess.run([ROOT / "deploy" / "build-image.sh", "gateway:dev"], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        print(p.stdout[-5000:])
        raise Fail("deploy/build-image.sh failed")
    log(f"image gateway:dev ready in {time.monotonic() - t0:.0f} s")
    return "gateway:dev"


def extract_binary(image, workdir):
    """The CLI and load tool the suite runs on the host: the very binary in the image (static)."""
    cid = run(["docker", "create", image]).stdout.strip()
    try:
        run(["docker", "cp", f"{cid}:/gateway", workdir / "gateway"])
    finally:
        run(["docker", "rm", "-v", cid], check=False)
    return workdir / "gateway"


def interrupted(_signum, _frame):
    raise KeyboardInterrupt


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--image", default=os.environ.get("COMPOSE_SUITE_IMAGE"),
                    help="use this image as it is instead of running deploy/build-image.sh")
    ap.add_argument("--devices", type=int, default=int(os.environ.get("COMPOSE_SUITE_DEVICES", 300)))
    ap.add_argument("--hold", type=int, default=int(os.environ.get("COMPOSE_SUITE_HOLD_S", 40)),
                    help="seconds the fleet is held once connected; the rolling restart must fit in it")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, interrupted)
    started = time.monotonic()
    passed, failed = [], None
    work = Path(tempfile.mkdtemp(prefix="gwsuite-"))
    c = None
    try:
        image = build_image(args)
        binary = extract_binary(image, work)
        c = Cluster(image, work)
        c.fleet = None
        log(f"compose project {c.project}: ports {c.ports}")
        scenarios = [("form", form), ("kill", kill), ("partition", partition), ("pause", pause),
                     ("rolling", lambda c, a: rolling(c, a, binary))]
        for name, scenario in scenarios:
            log(f"--- {name}")
            t0 = time.monotonic()
            scenario(c, args)
            passed.append(name)
            log(f"--- {name}: passed in {time.monotonic() - t0:.1f} s")
    except (Fail, subprocess.TimeoutExpired) as e:
        failed = e
        log(f"FAILED: {e}")
        if c is not None:
            c.dump_logs()
    except KeyboardInterrupt:
        failed = Fail("interrupted")
        log("interrupted")
    finally:
        if c is not None:
            if c.fleet is not None:
                c.fleet.stop()
            c.down()
        shutil.rmtree(work, ignore_errors=True)
    print("\nfigures:")
    for f in FIGURES:
        print(f"  {f}")
    print(f"wall time {time.monotonic() - started:.0f} s")
    print(f"compose: {len(passed)} passed, {1 if failed else 0} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
