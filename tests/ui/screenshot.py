"""The status page (/ui) in headless Chromium, before and after a node is killed: see run.sh."""

import argparse
import base64
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = os.environ.get("GATEWAY_BIN", str(ROOT / "target/debug/gateway"))
CHROMIUM = os.environ.get("CHROMIUM", "chromium")
# The integration tests' timing (tests/common/mod.rs): a dead node is suspect within ~1 s.
TIMING = ["--lease-ms", "4000", "--sweep-ms", "250", "--election-timeout-ms", "400", "--heartbeat-ms", "100"]
# The page's palette (src/api/ui/ring_svg.rs), by a member's position among the names.
PALETTE = ["#2b7bb9", "#e4572e", "#29a36a", "#a05195", "#f0a202", "#17becf", "#8c564b", "#7f7f7f"]
WINDOW = (1400, 1000)


class Fail(Exception):
    pass


def log(msg):
    print(f"[ui] {msg}", flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what, timeout_s, probe):
    start, last = time.monotonic(), None
    while time.monotonic() - start < timeout_s:
        try:
            value = probe()
        except (OSError, ValueError, KeyError) as e:
            value, last = None, f"{type(e).__name__}: {e}"
        if value:
            return value
        last = last if value is None else value
        time.sleep(0.1)
    raise Fail(f"{what}: not within {timeout_s} s (last: {last})")


def get(port, path, auth=None, timeout=3.0):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
    if auth:
        req.add_header("Authorization", auth)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read()
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read()


class Cluster:
    def __init__(self, work):
        self.work = work
        self.secret = os.urandom(20).hex()
        (work / "cluster.secret").write_text(self.secret + "\n")
        (work / "device.secret").write_text(os.urandom(20).hex() + "\n")
        self.nodes = {}  # name -> (cluster port, public port, Popen)

    def start(self, name, join=None):
        cport, pport = free_port(), free_port()
        args = [BIN, "serve", "--name", name, "--listen", f"127.0.0.1:{pport}", "--cluster-listen",
                f"127.0.0.1:{cport}", "--data-dir", str(self.work / name), "--cluster-secret-file",
                str(self.work / "cluster.secret"), "--device-secret-file", str(self.work / "device.secret"), *TIMING]
        if join:
            args += ["--join", f"127.0.0.1:{self.nodes[join][0]}"]
        env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
        err = open(self.work / f"{name}.log", "wb")
        proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=err, stderr=err, env=env)
        self.nodes[name] = (cport, pport, proc)
        wait_for(f"{name} /healthz", 30, lambda: get(cport, "/healthz")[0] == 200)

    def status(self, name):
        code, _, body = get(self.nodes[name][0], "/cluster/status", f"Bearer {self.secret}")
        return json.loads(body) if code == 200 else None

    def stop(self):
        for _, _, proc in self.nodes.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)


def chromium(url, profile, *args, timeout=90):
    """One headless Chromium run on a fresh profile; returns stdout."""
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
           "--disable-component-update", "--disable-sync", "--hide-scrollbars", f"--user-data-dir={profile}",
           f"--window-size={WINDOW[0]},{WINDOW[1]}", *args, url]
    out = subprocess.run(cmd, capture_output=True, timeout=timeout)
    if out.returncode != 0:
        raise Fail(f"chromium exited {out.returncode}: {out.stderr.decode(errors='replace')[-2000:]}")
    return out.stdout.decode(errors="replace")


def png_pixels(path):
    """(width, height, rows of RGB tuples) of an 8-bit, non-interlaced RGB/RGBA PNG (what Chromium writes)."""
    data = Path(path).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, header = 8, b"", None
    while pos < len(data):
        (length,), kind = struct.unpack(">I", data[pos:pos + 4]), data[pos + 4:pos + 8]
        chunk = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", chunk)
        elif kind == b"IDAT":
            idat += chunk
        pos += 12 + length
    width, height, depth, colour, _, _, interlace = header
    if depth != 8 or colour not in (2, 6) or interlace:
        raise Fail(f"unexpected PNG format {header}")
    bpp = 3 if colour == 2 else 4
    raw, stride, rows, prev = zlib.decompress(idat), width * bpp, [], bytearray(width * bpp)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if kind == 1:
                line[i] = (line[i] + a) & 255
            elif kind == 2:
                line[i] = (line[i] + b) & 255
            elif kind == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append([tuple(line[x * bpp:x * bpp + 3]) for x in range(width)])
        prev = line
    return width, height, rows


def colour_counts(path):
    """Pixels of each palette colour in a screenshot."""
    wanted = {tuple(int(h[i:i + 2], 16) for i in (1, 3, 5)): h for h in PALETTE}
    counts = dict.fromkeys(PALETTE, 0)
    for row in png_pixels(path)[2]:
        for px in row:
            if px in wanted:
                counts[wanted[px]] += 1
    return counts


def arcs_by_node(dom):
    nodes = {}
    for m in re.finditer(r'<(?:path|circle) class="arc" data-node="([^"]+)"', dom):
        nodes[m.group(1)] = nodes.get(m.group(1), 0) + 1
    return nodes


def shoot(c, out, label, viewer):
    """Screenshot and DOM of `viewer`'s /ui, after the page's own refresh ran at least once."""
    url = f"http://ui:{c.secret}@127.0.0.1:{c.nodes[viewer][0]}/ui"
    png = out / f"{label}.png"
    with tempfile.TemporaryDirectory() as p1, tempfile.TemporaryDirectory() as p2:
        # Virtual time runs the 2 s refresh (and waits for its fetch) before the capture.
        chromium(url, p1, f"--screenshot={png}", "--virtual-time-budget=5000")
        dom = chromium(url, p2, "--dump-dom", "--virtual-time-budget=5000")
    (out / f"{label}.html").write_text(dom)
    if c.secret in dom:
        raise Fail("the page shows the cluster secret")
    m = re.search(r'id="updated"[^>]*>([^<]*)', dom)
    if not m or not m.group(1).startswith("updated "):
        raise Fail(f"{label}: the page's refresh of /ui/live did not succeed: {m and m.group(1)!r}")
    return png, dom


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(ROOT / "tests/ui/out"))
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="gateway-ui-"))
    c = Cluster(work)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    ok = False
    try:
        c.start("n1")
        c.start("n2", join="n1")
        c.start("n3", join="n1")
        names = ["n1", "n2", "n3"]
        wait_for("3 live members in one ring", 60, lambda: (s := c.status("n1")) and s["ring"]["live"] == names
                 and all(m["state"] == "live" for m in s["members"]) and len(s["members"]) == 3)
        leader = c.status("n1")["leader"]["name"]
        viewer = "n1"
        victim = next(n for n in ["n3", "n2"] if n != leader)
        log(f"cluster formed; leader {leader}; the page is n1's; {victim} will be killed")

        # Auth: refused without the secret (with a Basic challenge), refused with a wrong one.
        code, headers, _ = get(c.nodes[viewer][0], "/ui")
        if code != 401 or "Basic" not in headers.get("www-authenticate", ""):
            raise Fail(f"/ui without credentials: {code} {headers}")
        wrong = "Basic " + base64.b64encode(b"ui:" + os.urandom(16).hex().encode()).decode()
        if get(c.nodes[viewer][0], "/ui", wrong)[0] != 401:
            raise Fail("/ui with a wrong password was served")

        before_png, before = shoot(c, out, "before", viewer)
        arcs = arcs_by_node(before)
        log(f"before: arcs per node {arcs}")
        if sorted(arcs) != names:
            raise Fail(f"before: expected arcs of n1, n2, n3, found {arcs}")

        c.nodes[victim][2].kill()
        c.nodes[victim][2].wait(timeout=10)
        t0 = time.monotonic()
        wait_for(f"{victim} out of n1's ring", 30, lambda: victim not in c.status(viewer)["ring"]["live"])
        log(f"{victim} killed (-9); out of n1's ring after {time.monotonic() - t0:.1f} s")

        after_png, after = shoot(c, out, "after", viewer)
        arcs_after = arcs_by_node(after)
        log(f"after: arcs per node {arcs_after}")
        survivors = [n for n in names if n != victim]
        if sorted(arcs_after) != survivors:
            raise Fail(f"after: expected arcs of {survivors}, found {arcs_after}")
        row = re.search(rf'<tr class="member" data-node="{victim}" data-state="([a-z]+)"', after)
        if not row or row.group(1) not in ("suspect", "expired"):
            raise Fail(f"after: {victim}'s row: {row and row.group(1)}")
        if f"{victim}: live →" not in after:
            raise Fail(f"after: no event of {victim} leaving live")

        # The pictures: the victim's colour is on the ring before and gone after.
        if before_png.read_bytes() == after_png.read_bytes():
            raise Fail("the screenshots are identical")
        colour = PALETTE[names.index(victim)]
        cb, ca = colour_counts(before_png), colour_counts(after_png)
        log(f"pixels of {victim}'s colour {colour}: before {cb[colour]}, after {ca[colour]}; "
            f"survivors' before {[cb[PALETTE[names.index(n)]] for n in survivors]} "
            f"after {[ca[PALETTE[names.index(n)]] for n in survivors]}")
        # After, the colour is left only in the member table's small swatch (about 10x10 px).
        if cb[colour] < 2000 or ca[colour] > 400:
            raise Fail(f"{victim}'s colour: {cb[colour]} px before, {ca[colour]} px after")
        for n in survivors:
            if ca[PALETTE[names.index(n)]] <= cb[PALETTE[names.index(n)]]:
                raise Fail(f"{n}'s arcs did not grow")
        log(f"ok: screenshots {before_png} and {after_png}; DOM dumps next to them")
        ok = True
    finally:
        c.stop()
        if ok:
            shutil.rmtree(work, ignore_errors=True)
        else:
            log(f"failed; node logs kept in {work}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (Fail, subprocess.TimeoutExpired) as e:
        print(f"[ui] FAILED: {e}", file=sys.stderr)
        sys.exit(1)
