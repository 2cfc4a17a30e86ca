//! The reconnect decision (design §4, issue 4), pure: given how the last dial or connection ended,
//! where to dial next, after how long, and why — or stop. No I/O and no clock: durations come in
//! as values, randomness from the seeded [`Backoff`], so every rule is unit-tested exactly.

use std::time::Duration;

use super::backoff::Backoff;
use super::dial::Target;
use crate::protocol::close;

/// 307s followed in a row before backing off and starting again from the seed URL.
pub const MAX_REDIRECTS: u32 = 3;

/// Why a device stopped for good.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopReason {
    /// Close 4001: a newer claim won, another instance of this device took over.
    Superseded,
    /// 409 with a newer install epoch than ours: a newer install owns the device.
    StaleEpoch { floor_epoch: u64 },
    /// 401: the token is refused; retrying cannot help.
    Unauthorized,
    /// The caller cancelled.
    Shutdown,
}

/// How the last dial or connection ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// A connection (101 + hello) ended after `lasted`, with close `code` (1006 when the
    /// transport dropped without a close frame); `goaway` when the server announced it.
    Ended { code: u16, goaway: bool, lasted: Duration },
    /// A refusal other than 307/409 (429, 503, 401, 400, ...).
    Refused { status: u16, retry_after: Option<Duration> },
    /// A 429 that names the token this node holds for us (`retry_after_ms` in its body: the
    /// node spaces the waits of the devices it refuses at its admission rate).
    Paced { wait: Duration },
    /// 307 to `location` (None if it could not be parsed); `node` is the body's node name.
    Redirected { location: Option<Target>, node: String },
    /// 409 `stale_attempt`.
    Stale { floor_epoch: u64, floor_attempt: u64 },
    /// No answer: connect error, deadline, or a broken handshake.
    Unreachable,
}

/// What to do next.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Raise the stored attempt to at least `raise_to` (if any), wait `wait`, then dial `target`.
    Dial {
        target: Target,
        wait: Duration,
        why: &'static str,
        raise_to: Option<u64>,
    },
    Stop(StopReason),
}

/// The reconnect state of one device.
#[derive(Debug, Clone)]
pub struct Policy {
    seeds: Vec<Target>,
    seed: usize,
    epoch: u64,
    stable_after: Duration,
    backoff: Backoff,
    current: Target,
    /// The node named by the 307 that `current` came from.
    redirected_to: Option<String>,
    hops: u32,
    /// A redirect target we could not reach: sent as `?fallback=` until a connection succeeds.
    fallback: Option<String>,
    stale_streak: u32,
    /// Seed URLs found unreachable in a row: the next one is dialled at once until all were.
    unreachable_streak: usize,
    /// The node of the current connection, and where its `hello` said to go if it is lost.
    connected_to: Option<(String, Option<Target>)>,
    /// Connections in a row that ended before they were stable.
    early_drops: u32,
}

impl Policy {
    /// `seeds` must not be empty: the URLs the device may start from (any node; the first is
    /// used until it refuses with 503 or cannot be reached, then the next).
    pub fn new(seeds: Vec<Target>, epoch: u64, stable_after: Duration, backoff: Backoff) -> Policy {
        assert!(!seeds.is_empty(), "a device needs at least one URL");
        let current = seeds[0].clone();
        Policy {
            seeds,
            seed: 0,
            epoch,
            stable_after,
            backoff,
            current,
            redirected_to: None,
            hops: 0,
            fallback: None,
            stale_streak: 0,
            unreachable_streak: 0,
            connected_to: None,
            early_drops: 0,
        }
    }

    /// A connection opened to `node`; `next` is the `hello`'s `next_url`.
    pub fn connected(&mut self, node: &str, next: Option<Target>) {
        self.connected_to = Some((node.to_string(), next));
    }

    /// Where the next dial goes.
    pub fn current(&self) -> &Target {
        &self.current
    }

    pub fn backoff(&self) -> &Backoff {
        &self.backoff
    }

    fn origin(&self) -> Target {
        let t = self.seeds[self.seed].clone();
        match &self.fallback {
            Some(node) => t.with_param("fallback", node),
            None => t,
        }
    }

    fn rotate(&mut self) {
        self.seed = (self.seed + 1) % self.seeds.len();
    }

    fn dial(&mut self, target: Target, wait: Duration, why: &'static str, raise_to: Option<u64>) -> Step {
        self.current = target.clone();
        Step::Dial { target, wait, why, raise_to }
    }

    fn origin_after(&mut self, wait: Duration, why: &'static str) -> Step {
        self.redirected_to = None;
        let origin = self.origin();
        self.dial(origin, wait, why, None)
    }

    fn refusal(&mut self, retry_after: Option<Duration>, why: &'static str) -> Step {
        let wait = self.backoff.after_refusal(retry_after);
        self.origin_after(wait, why)
    }

    /// The decision for `outcome` (of a dial to [`Policy::current`]).
    pub fn next(&mut self, outcome: Outcome) -> Step {
        if !matches!(outcome, Outcome::Redirected { .. }) {
            self.hops = 0;
        }
        if !matches!(outcome, Outcome::Stale { .. }) {
            self.stale_streak = 0;
        }
        if !matches!(outcome, Outcome::Unreachable) {
            self.unreachable_streak = 0;
        }
        match outcome {
            Outcome::Ended { code, goaway, lasted } => {
                self.fallback = None;
                let (node, next) = self.connected_to.take().unzip();
                let stable = lasted >= self.stable_after;
                let served = stable || (code == close::ABNORMAL && lasted >= self.backoff.base());
                let early = !served;
                self.early_drops = if early { self.early_drops + 1 } else { 0 };
                if stable {
                    self.backoff.reset();
                }
                match code {
                    close::SUPERSEDED => Step::Stop(StopReason::Superseded),
                    // Straight to where placement sends us now that node is going away.
                    _ if goaway || code == close::GOING_AWAY => match next.flatten() {
                        Some(next) => self.dial(next, Duration::ZERO, "goaway", None),
                        None => self.origin_after(Duration::ZERO, "goaway"),
                    },
                    close::ROUTE_LOST => self.refusal(None, "route_lost"),
                    close::TRY_AGAIN_LATER => self.refusal(None, "no_quorum"),
                    // The node (or the path to it) went away after serving us a while: not an
                    // overload signal, and refusals before this connection are history. The
                    // fleet it held comes back within one jittered `base` window, from n = 0.
                    // First to the node its `hello` named for this case, saying which node is gone
                    // (`?fallback=`) so placement there does not send us back before the cluster
                    // has suspected it.
                    close::ABNORMAL if lasted >= self.backoff.base() => {
                        self.backoff.reset();
                        let wait = self.backoff.first_reconnect();
                        match (node, next.flatten()) {
                            (Some(node), Some(next)) => {
                                let target = next.with_param("fallback", &node);
                                // Should that node be unreachable too, the seeds are asked, still
                                // leaving the dead one out.
                                (self.fallback, self.redirected_to) = (Some(node.clone()), Some(node));
                                self.dial(target, wait, "dropped", None)
                            }
                            _ => self.origin_after(wait, "dropped"),
                        }
                    }
                    _ if stable => {
                        let wait = self.backoff.first_reconnect();
                        self.origin_after(wait, "dropped")
                    }
                    // A connection that keeps dropping early is treated like a refusal, so a
                    // node that accepts and closes at once is not hammered at `base` forever:
                    // the backoff grows with the early drops in a row (refusals before the
                    // connection opened are history: the cluster did admit us).
                    _ => {
                        self.backoff.set_failures(self.early_drops - 1);
                        let wait = self.backoff.after_refusal(None);
                        match (code, node, next.flatten()) {
                            // Its node went away abruptly soon after admitting us (it died, say,
                            // as a storm reached it): after the refusal's wait, still to the node
                            // its `hello` named, saying which one is gone, not to a seed that may
                            // be the dead node or redirect us (2 % of a killed node's devices
                            // connected in the last second before the kill in a measured storm).
                            (close::ABNORMAL, Some(node), Some(next)) => {
                                let target = next.with_param("fallback", &node);
                                (self.fallback, self.redirected_to) = (Some(node.clone()), Some(node));
                                self.dial(target, wait, "dropped_early", None)
                            }
                            _ => self.origin_after(wait, "dropped_early"),
                        }
                    }
                }
            }
            Outcome::Refused { status: 401, .. } => Step::Stop(StopReason::Unauthorized),
            // Rate limited: that node answered, and admission runs before placement, so it is
            // as good a target as it was (the node its `hello` named, or where a redirect sent
            // us): try it again. Going back to the seed would cost a redirect, and a redirect
            // spends a token of the cluster's admission budget, in the storm that is short of them.
            Outcome::Refused { status: 429, retry_after } => {
                let wait = self.backoff.after_refusal(retry_after);
                let target = self.current.clone();
                self.dial(target, wait, "rate_limited", None)
            }
            // The node's own schedule: come back when our token is there, no earlier (we would be
            // refused again) and no later (the token would wait for us, or go to someone else).
            // Jitter would only move us off it; the node already spread us from the others.
            Outcome::Paced { wait } => {
                let wait = self.backoff.after_paced_refusal(wait);
                let target = self.current.clone();
                self.dial(target, wait, "rate_limited", None)
            }
            Outcome::Refused { status: 503, retry_after } => {
                self.rotate();
                self.refusal(retry_after, "unavailable")
            }
            Outcome::Refused { retry_after, .. } => self.refusal(retry_after, "refused"),
            Outcome::Redirected { location, node } => {
                self.hops += 1;
                match location {
                    Some(target) if self.hops <= MAX_REDIRECTS => {
                        self.redirected_to = Some(node);
                        self.dial(target, Duration::ZERO, "redirect", None)
                    }
                    Some(_) => {
                        self.hops = 0;
                        self.refusal(None, "too_many_redirects")
                    }
                    None => self.refusal(None, "bad_redirect"),
                }
            }
            Outcome::Unreachable => match self.redirected_to.take() {
                // The node placement chose is unreachable from here: say so, and ask again.
                Some(node) => {
                    self.fallback = Some(node);
                    self.origin_after(Duration::ZERO, "redirect_unreachable")
                }
                // Another seed may well answer: try it at once, without counting a refusal, until
                // every seed failed in a row.
                None => {
                    self.rotate();
                    self.unreachable_streak += 1;
                    if self.unreachable_streak < self.seeds.len() {
                        return self.origin_after(Duration::ZERO, "unreachable_next");
                    }
                    self.unreachable_streak = 0;
                    self.refusal(None, "unreachable")
                }
            },
            Outcome::Stale { floor_epoch, floor_attempt } => {
                if floor_epoch > self.epoch {
                    return Step::Stop(StopReason::StaleEpoch { floor_epoch });
                }
                if floor_epoch < self.epoch {
                    // Cannot be stale with a newer epoch: the server and we disagree; back off.
                    return self.refusal(None, "stale_epoch_mismatch");
                }
                self.stale_streak += 1;
                // The first 409 is prompt (not overload); a 409 again right after jumping past the
                // floor means another instance is racing us, and that is backed off.
                let (wait, why) = if self.stale_streak == 1 {
                    (Duration::ZERO, "stale_attempt")
                } else {
                    (self.backoff.after_refusal(None), "stale_again")
                };
                let target = self.current.clone();
                self.dial(target, wait, why, Some(floor_attempt))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: Duration = Duration::from_millis(500);
    const CAP: Duration = Duration::from_secs(8);
    const STABLE: Duration = Duration::from_secs(10);

    fn seeds() -> Vec<Target> {
        vec![Target::parse("ws://a:1").unwrap(), Target::parse("ws://b:2").unwrap()]
    }

    /// A policy and a twin backoff drawing the same stream, to predict each wait exactly.
    fn policy(seed: u64) -> (Policy, Backoff) {
        (Policy::new(seeds(), 4, STABLE, Backoff::new(BASE, CAP, seed)), Backoff::new(BASE, CAP, seed))
    }

    fn dial(step: Step) -> (String, Duration, &'static str, Option<u64>) {
        match step {
            Step::Dial { target, wait, why, raise_to } => (target.url(1), wait, why, raise_to),
            Step::Stop(r) => panic!("expected a dial, got Stop({r:?})"),
        }
    }

    const A: &str = "ws://a:1/ws?attempt=1";
    const B: &str = "ws://b:2/ws?attempt=1";

    #[test]
    fn refusals_use_full_jitter_with_retry_after_as_a_floor() {
        let (mut p, mut twin) = policy(1);
        let ra = Some(Duration::from_secs(2));
        for n in 0..6 {
            let (url, wait, why, _) = dial(p.next(Outcome::Refused { status: 429, retry_after: ra }));
            assert_eq!((url.as_str(), why), (A, "rate_limited"));
            assert_eq!(wait, twin.after_refusal(ra), "refusal {n}");
            assert!(wait >= Duration::from_secs(2));
        }
        assert_eq!(p.backoff().failures(), 6);
        // 503 also backs off, and moves on to the next seed URL.
        let (url, wait, why, _) =
            dial(p.next(Outcome::Refused { status: 503, retry_after: Some(Duration::from_secs(1)) }));
        assert_eq!((url.as_str(), why, wait), (B, "unavailable", twin.after_refusal(Some(Duration::from_secs(1)))));
        assert_eq!(p.next(Outcome::Refused { status: 401, retry_after: None }), Step::Stop(StopReason::Unauthorized));
    }

    #[test]
    fn a_paced_refusal_waits_exactly_the_turn_it_was_told_at_the_same_node() {
        let (mut p, mut twin) = policy(3);
        for (n, ms) in [1u64, 1730, 250].into_iter().enumerate() {
            let turn = Duration::from_millis(ms);
            let (url, wait, why, _) = dial(p.next(Outcome::Paced { wait: turn }));
            assert_eq!((url.as_str(), wait, why), (A, turn, "rate_limited"), "refusal {n}");
        }
        // Counted like any refusal: a later unpaced one backs off from n = 3.
        assert_eq!(p.backoff().failures(), 3);
        twin.set_failures(3);
        let (_, wait, _, _) = dial(p.next(Outcome::Refused { status: 429, retry_after: None }));
        assert_eq!(wait, twin.after_refusal(None));
        // A turn of 0 (no node of ours sends one) still waits a millisecond.
        let (_, wait, _, _) = dial(p.next(Outcome::Paced { wait: Duration::ZERO }));
        assert_eq!(wait, Duration::from_millis(1));
    }

    #[test]
    fn an_unreachable_seed_moves_to_the_next_at_once_until_every_seed_failed() {
        let (mut p, mut twin) = policy(7);
        p.next(Outcome::Refused { status: 429, retry_after: None });
        twin.after_refusal(None);
        let (url, wait, why, _) = dial(p.next(Outcome::Unreachable));
        assert_eq!((url.as_str(), wait, why), (B, Duration::ZERO, "unreachable_next"));
        assert_eq!(p.backoff().failures(), 1, "an unreachable node is not a refusal");
        // Both seeds failed in a row: back off.
        let (url, wait, why, _) = dial(p.next(Outcome::Unreachable));
        assert_eq!((url.as_str(), why, wait), (A, "unreachable", twin.after_refusal(None)));
        // The streak starts again after any other outcome.
        p.next(Outcome::Refused { status: 429, retry_after: None });
        assert_eq!(dial(p.next(Outcome::Unreachable)).2, "unreachable_next");
    }

    #[test]
    fn a_lost_connection_goes_first_where_its_hello_said() {
        let (mut p, mut twin) = policy(9);
        let next = Target::parse("ws://c:3/ws").unwrap();
        p.connected("n2", Some(next.clone()));
        let dropped = Outcome::Ended { code: close::ABNORMAL, goaway: false, lasted: STABLE };
        let (url, wait, why, _) = dial(p.next(dropped.clone()));
        assert_eq!((url.as_str(), why, wait), ("ws://c:3/ws?attempt=1&fallback=n2", "dropped", twin.first_reconnect()));
        // Rate limited there (the storm): the same node again after the backoff, not the seed
        // (whose redirect would spend another admission token).
        let (url, wait, why, _) = dial(p.next(Outcome::Refused { status: 429, retry_after: None }));
        assert_eq!(
            (url.as_str(), why, wait),
            ("ws://c:3/ws?attempt=1&fallback=n2", "rate_limited", twin.after_refusal(None))
        );
        // That node unreachable as well: the seeds, still without the dead node.
        let (url, wait, why, _) = dial(p.next(Outcome::Unreachable));
        assert_eq!(
            (url.as_str(), wait, why),
            ("ws://a:1/ws?attempt=1&fallback=n2", Duration::ZERO, "redirect_unreachable")
        );
        // A drain's goaway also goes there, at once; without a hint, to the seeds.
        p.connected("n2", Some(next));
        let goaway = Outcome::Ended { code: close::GOING_AWAY, goaway: true, lasted: STABLE };
        assert_eq!(dial(p.next(goaway.clone())), ("ws://c:3/ws?attempt=1".to_string(), Duration::ZERO, "goaway", None));
        p.connected("n2", None);
        assert_eq!(dial(p.next(goaway)).0, A);
        // The hint is for the connection it came with: a later drop without one uses the seeds.
        assert_eq!(dial(p.next(dropped)).2, "dropped");
    }

    #[test]
    fn an_abrupt_drop_after_serving_a_while_comes_back_within_one_base_from_n_zero() {
        let (mut p, mut twin) = policy(8);
        for _ in 0..5 {
            p.next(Outcome::Refused { status: 429, retry_after: None });
            twin.after_refusal(None);
        }
        twin.reset();
        let dropped = Outcome::Ended { code: close::ABNORMAL, goaway: false, lasted: BASE };
        let (url, wait, why, _) = dial(p.next(dropped));
        assert_eq!((url.as_str(), why, wait), (A, "dropped", twin.first_reconnect()));
        assert!(wait <= BASE);
        assert_eq!(p.backoff().failures(), 0);
        // Dropped within one base of connecting: treated like a refusal, growing with such drops
        // in a row, but not with the refusals before the connection opened.
        let quick = Outcome::Ended { code: close::ABNORMAL, goaway: false, lasted: BASE / 2 };
        assert_eq!(dial(p.next(quick.clone())).2, "dropped_early");
        assert_eq!(p.backoff().failures(), 1);
        for _ in 0..6 {
            p.next(Outcome::Refused { status: 429, retry_after: None });
        }
        let (_, wait, _, _) = dial(p.next(quick));
        assert_eq!(p.backoff().failures(), 2, "the second early drop in a row: n = 1 when it waited");
        assert!(wait <= 2 * BASE, "{wait:?}: not the 429s' backoff");
    }

    #[test]
    fn drops_wait_first_reconnect_after_a_stable_connection_and_reset_the_backoff() {
        let (mut p, mut twin) = policy(2);
        for _ in 0..4 {
            p.next(Outcome::Refused { status: 429, retry_after: None });
            twin.after_refusal(None);
        }
        let (url, wait, why, _) = dial(p.next(Outcome::Ended { code: 1006, goaway: false, lasted: STABLE }));
        assert_eq!((url.as_str(), why, wait), (A, "dropped", twin.first_reconnect()));
        assert!(wait <= BASE);
        assert_eq!(p.backoff().failures(), 0, "a stable connection resets n");
        // A connection that drops early keeps growing the backoff instead.
        let early = Outcome::Ended { code: 1000, goaway: false, lasted: Duration::from_millis(10) };
        twin.reset();
        let (_, wait, why, _) = dial(p.next(early.clone()));
        assert_eq!((why, wait), ("dropped_early", twin.after_refusal(None)));
        let (_, wait, _, _) = dial(p.next(early));
        assert_eq!(wait, twin.after_refusal(None));
        assert_eq!(p.backoff().failures(), 2);
    }

    #[test]
    fn close_codes_decide() {
        let (mut p, mut twin) = policy(3);
        let ended = |code, goaway| Outcome::Ended { code, goaway, lasted: Duration::from_secs(1) };
        assert_eq!(dial(p.next(ended(1001, true))), (A.to_string(), Duration::ZERO, "goaway", None));
        assert_eq!(dial(p.next(ended(1001, false))).1, Duration::ZERO, "1001 alone is prompt too");
        assert_eq!(dial(p.next(ended(1006, true))).2, "goaway", "goaway then a drop is prompt");
        let (_, wait, why, _) = dial(p.next(ended(4002, false)));
        assert_eq!((why, wait), ("route_lost", twin.after_refusal(None)));
        let (_, wait, why, _) = dial(p.next(ended(1013, false)));
        assert_eq!((why, wait), ("no_quorum", twin.after_refusal(None)));
        assert_eq!(p.next(ended(4001, false)), Step::Stop(StopReason::Superseded));
    }

    #[test]
    fn stale_jumps_past_the_floor_promptly_once() {
        let (mut p, mut twin) = policy(4);
        let stale = |e, a| Outcome::Stale { floor_epoch: e, floor_attempt: a };
        assert_eq!(dial(p.next(stale(4, 90))), (A.to_string(), Duration::ZERO, "stale_attempt", Some(90)));
        let (_, wait, why, raise) = dial(p.next(stale(4, 95)));
        assert_eq!((why, wait, raise), ("stale_again", twin.after_refusal(None), Some(95)));
        assert_eq!(p.next(stale(5, 1)), Step::Stop(StopReason::StaleEpoch { floor_epoch: 5 }));
        assert_eq!(dial(p.next(stale(3, 1))).2, "stale_epoch_mismatch");
    }

    #[test]
    fn redirects_are_followed_three_times_in_a_row_then_backed_off() {
        let (mut p, mut twin) = policy(5);
        let to = |port: u16| Outcome::Redirected {
            location: Some(Target::parse(&format!("ws://c:{port}/ws?attempt=9&steer=on")).unwrap()),
            node: format!("n{port}"),
        };
        for port in 1..=3 {
            let (url, wait, why, _) = dial(p.next(to(port)));
            assert_eq!((url, wait, why), (format!("ws://c:{port}/ws?attempt=1&steer=on"), Duration::ZERO, "redirect"));
        }
        let (url, wait, why, _) = dial(p.next(to(4)));
        assert_eq!((url.as_str(), why, wait), (A, "too_many_redirects", twin.after_refusal(None)));
        // The count starts again after backing off.
        assert_eq!(dial(p.next(to(5))).2, "redirect");
        let bad = Outcome::Redirected { location: None, node: String::new() };
        assert_eq!(dial(p.next(bad)).2, "bad_redirect");
    }

    #[test]
    fn an_unreachable_redirect_target_is_reported_with_fallback_until_connected() {
        let (mut p, _) = policy(6);
        let loc = Target::parse("ws://c:7/ws?attempt=3").unwrap();
        p.next(Outcome::Redirected { location: Some(loc), node: "n7".into() });
        let (url, wait, why, _) = dial(p.next(Outcome::Unreachable));
        assert_eq!(
            (url.as_str(), wait, why),
            ("ws://a:1/ws?attempt=1&fallback=n7", Duration::ZERO, "redirect_unreachable")
        );
        // A refusal of that retry keeps the fallback; the origin itself being unreachable rotates.
        let (url, _, _, _) = dial(p.next(Outcome::Refused { status: 429, retry_after: None }));
        assert_eq!(url, "ws://a:1/ws?attempt=1&fallback=n7");
        let (url, _, why, _) = dial(p.next(Outcome::Unreachable));
        assert_eq!((url.as_str(), why), ("ws://b:2/ws?attempt=1&fallback=n7", "unreachable_next"));
        // Once connected, it is dropped.
        let (url, _, _, _) = dial(p.next(Outcome::Ended { code: 1001, goaway: true, lasted: Duration::ZERO }));
        assert_eq!(url, B);
    }
    #[test]
    fn an_abrupt_drop_soon_after_connecting_still_goes_where_the_hello_said_after_the_refusals_wait() {
        let (mut p, mut twin) = policy(9);
        p.connected("n1", Some(Target::parse("ws://b:2/ws").unwrap()));
        let quick = Outcome::Ended { code: close::ABNORMAL, goaway: false, lasted: BASE / 2 };
        let (url, wait, why, _) = dial(p.next(quick));
        assert_eq!(
            (url.as_str(), why, wait),
            ("ws://b:2/ws?attempt=1&fallback=n1", "dropped_early", twin.after_refusal(None))
        );
        assert_eq!(p.backoff().failures(), 1);
        // Should that node be unreachable too, the seeds are asked, still leaving n1 out.
        let (url, _, why, _) = dial(p.next(Outcome::Unreachable));
        assert_eq!((url.as_str(), why), ("ws://a:1/ws?attempt=1&fallback=n1", "redirect_unreachable"));
        // A node that closes cleanly at once is not reported gone: back to the seeds.
        p.connected("n2", Some(Target::parse("ws://b:2/ws").unwrap()));
        let closed = Outcome::Ended { code: 1000, goaway: false, lasted: BASE / 2 };
        let (url, _, why, _) = dial(p.next(closed));
        assert_eq!((url.as_str(), why), (A, "dropped_early"));
    }
}
