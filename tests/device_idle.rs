//! Idle sessions (`--ping-ms 100 --idle-ms 600`): a device that sends nothing and does not answer
//! pings is closed 1000 "idle timeout" within idle + ping; a device that keeps talking (JSON pings,
//! pongs to the server's pings, or WebSocket pings) stays open well past the idle limit, and its
//! route is released once the idle one is closed.

mod common;

use std::time::{Duration, Instant};

use common::ws::{Dial, Event, Ws};
use common::{wait_until, Cluster, SLACK};

const PING_MS: u64 = 100;
const IDLE_MS: u64 = 600;
const TALK_EVERY: Duration = Duration::from_millis(200);

/// Keeps `ws` talking with `talk` every 200 ms for `window` (the window IS the scenario) and
/// panics if the server closes it meanwhile. Returns how many server pings were seen.
fn stays_open(ws: &mut Ws, window: Duration, what: &str, talk: impl Fn(&Ws)) -> usize {
    let started = Instant::now();
    let mut pings = 0;
    while started.elapsed() < window {
        talk(ws);
        let until = Instant::now() + TALK_EVERY;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            match ws.next_event(left) {
                Event::Timeout => break,
                Event::Ping => pings += 1,
                Event::Pong | Event::Text(_) => {}
                other => panic!("{what}: closed after {:?} (idle limit {IDLE_MS} ms): {other:?}", started.elapsed()),
            }
        }
    }
    pings
}

#[test]
fn silent_devices_are_closed_and_talking_devices_stay() {
    let (c, _) = Cluster::form(1, &["--ping-ms", "100", "--idle-ms", "600"]);
    let open = |device: &str, how: fn(&str) -> Dial| {
        let t = c.token(device, 0);
        let mut ws = c.dial(0, "/ws?attempt=1", &how(&t)).open(device);
        let hello = ws.hello();
        (ws, Instant::now(), hello)
    };

    // Silent, and deaf to pings.
    let (mut silent, since, _) = open("d-silent", |t| Dial::token(t).no_auto_pong());
    let bound = Duration::from_millis(IDLE_MS + PING_MS) + SLACK;
    let mut pings = 0;
    let (at, code, reason) = loop {
        match silent.next_timed(bound.saturating_sub(since.elapsed())) {
            (_, Event::Ping) => pings += 1,
            (at, Event::Close { code, reason }) => break (at, code, reason),
            (_, other) => panic!("silent device: expected pings then a close within {bound:?}, got {other:?}"),
        }
    };
    let took = at.duration_since(since);
    println!(
        "[device_idle] silent device closed {code} {reason:?} after {took:?} ({pings} pings seen; idle {IDLE_MS} ms)"
    );
    assert_eq!((code, reason.as_str()), (1000, "idle timeout"));
    // The server's idle clock starts when the session does, a moment before this client has read
    // `hello`: allow one ping period for that, no more.
    assert!(took >= Duration::from_millis(IDLE_MS - PING_MS), "closed before the idle limit: {took:?}");
    assert!(pings >= 3, "the server pings every {PING_MS} ms: only {pings} pings in {took:?}");
    // The node counts what it sent; a deaf device sent no pong.
    let sent = c.metric(0, "gateway_pings_sent_total").unwrap_or_default();
    assert!(sent >= pings as f64, "gateway_pings_sent_total {sent} < the {pings} pings seen");
    assert_eq!(c.metric(0, "gateway_pongs_received_total"), Some(0.0));
    wait_until(SLACK, "the idle device's route released", || match c.try_route(0, "d-silent") {
        Ok((404, v)) if v["floor"]["attempt"] == 1 => Ok(()),
        other => Err(format!("{other:?}")),
    });

    let window = Duration::from_millis(2 * IDLE_MS);
    // A device that sends `{"t":"ping"}` every 200 ms (and ignores the server's pings).
    let (mut chatty, _, _) = open("d-json-ping", |t| Dial::token(t).no_auto_pong());
    let pings = stays_open(&mut chatty, window, "JSON-pinging device", |ws| ws.send_text(r#"{"t":"ping"}"#).unwrap());
    println!("[device_idle] JSON-pinging device open after {window:?} ({pings} server pings)");

    // A device that only answers the server's pings (what every WebSocket library does).
    let (mut ponger, _, _) = open("d-ponger", Dial::token);
    stays_open(&mut ponger, window, "device answering pings", |_| {});
    println!("[device_idle] pong-answering device open after {window:?}");
    // Its pongs are the only ones: at least half of the window's pings, counted by the node.
    let want = (window.as_millis() as u64 / PING_MS / 2) as f64;
    wait_until(SLACK, "the pongs counted", || match c.metric(0, "gateway_pongs_received_total") {
        Some(n) if n >= want => Ok(()),
        other => Err(format!("{other:?} pongs counted, want >= {want}")),
    });

    // A device that sends WebSocket ping frames every 200 ms: frames from the device, so not idle.
    let (mut ws_pinger, _, _) = open("d-ws-ping", |t| Dial::token(t).no_auto_pong());
    stays_open(&mut ws_pinger, window, "device sending WebSocket pings", |ws| ws.send_ping().unwrap());
    println!("[device_idle] WebSocket-pinging device open after {window:?}");
}
