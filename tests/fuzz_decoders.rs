//! Property-based fuzzing, on stable Rust, of every decoder the network reaches through the public
//! API: device frames, device tokens, the project codec on Raft RPC and forwarded writes (requests
//! and answers), the admin API's JSON, and the config file. The properties are what a user relies
//! on: no panic, bad input is an `Err` (never a bogus `Ok`), valid input round-trips, and a refusal
//! that promises it never quotes its input.
//!
//! About 7,400 cases in all, under a second in a debug build. A long run (cases per property):
//! `PROPTEST_CASES=200000 cargo test --release --test fuzz_decoders`. [`config`] reads that
//! variable itself: a `cases` set in code would override proptest's own reading of it.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::collections::BTreeMap;
use std::fmt::Debug;
use std::time::{SystemTime, UNIX_EPOCH};

use common::b64;
use gateway::cluster::ProposeError;
use gateway::codec::{decode, decode_with_bytes, encode, CodecError, VERSION};
use gateway::config::{
    Config, ConfigError, DeviceConfig, FileConfig, LogFormat, Start, Timing, MAX_DURATION_MS, MAX_PAYLOAD_LIMIT,
};
use gateway::machine::{
    Ack, Budget, Claim, ClaimReply, Command, Drain, ExtendLeases, Forget, Init, Member, NodeId, Publish, PublishReply,
    Release, ReleaseNode, Renew, Reply, SetAdmission, Superseded, Suspect, Sweep, Swept,
};
use gateway::protocol::{msg_json, ClientFrame, ServerFrame};
use gateway::raft::network::snapshot_body;
use gateway::raft::types::{log_id as new_log_id, Entry, LogId, Request, Snapshot, SnapshotMeta, TypeConfig, Vote};
use gateway::token::{mint, valid_device_id, AuthError, DeviceClaims, Verifier, MAX_TOKEN_BYTES};
use gateway::wire::{
    AdmissionStatus, IdentityReply, JoinRequest, LeaveRequest, MemberStatus, MembershipSummary, NodeRef,
    PromoteRequest, RingStatus, ScaleInStatus, StatusReport,
};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use openraft::error::{Fatal, RaftError};
use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, VoteRequest, VoteResponse};
use openraft::{EntryPayload, Membership, StoredMembership};
use proptest::collection::{btree_map, vec};
use proptest::option::{of, weighted};
use proptest::prelude::*;
use proptest::sample::{select, Index};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Value};

/// `cases` per property, or `PROPTEST_CASES` when it is set.
fn config(cases: u32) -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(cases);
    ProptestConfig { cases, ..ProptestConfig::default() }
}

// ---- "never allocates absurdly" needs the allocator's view ----------------------------------------

/// The system allocator, noting the largest single request while this thread watches.
struct Watched;

thread_local! {
    static WATCHING: Cell<bool> = const { Cell::new(false) };
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

fn note(size: usize) {
    let _ = WATCHING.try_with(|on| on.get() && LARGEST.try_with(|l| l.set(l.get().max(size))).is_ok());
}

// SAFETY: every call goes unchanged to `System`; `note` touches only const thread-locals.
unsafe impl GlobalAlloc for Watched {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        System.alloc(layout)
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        System.alloc_zeroed(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static ALLOCATOR: Watched = Watched;

/// Runs `f`, answering its result and the largest single allocation it asked for.
fn largest_allocation<R>(f: impl FnOnce() -> R) -> (R, usize) {
    LARGEST.with(|l| l.set(0));
    WATCHING.with(|w| w.set(true));
    let out = f();
    WATCHING.with(|w| w.set(false));
    (out, LARGEST.with(Cell::get))
}

// ---- shared generators and mutations --------------------------------------------------------------

fn text() -> BoxedStrategy<String> {
    ".{0,12}".boxed()
}

fn u64s(n: usize) -> impl Strategy<Value = Vec<u64>> {
    vec(any::<u64>(), n)
}

/// Replace, insert or delete (`op % 3`) at a position.
type Edit<T> = (Index, u8, T);

fn edit<T: Clone>(mut items: Vec<T>, edits: &[Edit<T>]) -> Vec<T> {
    for (at, op, x) in edits {
        match (op % 3, items.is_empty()) {
            (0, false) => {
                let i = at.index(items.len());
                items[i] = x.clone();
            }
            (1, _) => items.insert(at.index(items.len() + 1), x.clone()),
            (2, false) => drop(items.remove(at.index(items.len()))),
            _ => {}
        }
    }
    items
}

fn edit_text(s: &str, edits: &[Edit<char>]) -> String {
    edit(s.chars().collect(), edits).into_iter().collect()
}

fn char_edits() -> impl Strategy<Value = Vec<Edit<char>>> {
    let syntax = select(&['{', '}', '[', ']', '"', ':', ',', '0', '9', '-', '.', 'e', '\\', ' ', '=', '\n', 't'][..]);
    vec((any::<Index>(), 0u8..3, prop_oneof![syntax, any::<char>()]), 1..4)
}

/// `text`, edited a little.
fn mutated(text: impl Strategy<Value = String> + 'static) -> BoxedStrategy<String> {
    (text, char_edits()).prop_map(|(t, e)| edit_text(&t, &e)).boxed()
}

fn json_leaf() -> BoxedStrategy<Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        // Dyadic floats are exact in JSON text: equality after a round trip means something.
        (-4096i32..4096).prop_map(|k| json!(f64::from(k) / 64.0)),
        text().prop_map(Value::from),
    ]
    .boxed()
}

fn json_value() -> BoxedStrategy<Value> {
    let object = |m: BTreeMap<String, Value>| Value::Object(m.into_iter().collect());
    json_leaf()
        .prop_recursive(3, 24, 4, move |inner| {
            prop_oneof![
                vec(inner.clone(), 0..4).prop_map(Value::Array),
                btree_map(".{0,6}", inner, 0..4).prop_map(object)
            ]
        })
        .boxed()
}

fn has_float(v: &Value) -> bool {
    match v {
        Value::Number(n) => n.is_f64(),
        Value::Array(a) => a.iter().any(has_float),
        Value::Object(o) => o.values().any(has_float),
        _ => false,
    }
}

/// An object of the present `fields` over `extra` ones.
fn object(fields: Vec<(&str, Option<Value>)>, extra: BTreeMap<&str, Value>) -> Value {
    let mut o: serde_json::Map<String, Value> = extra.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
    o.extend(fields.into_iter().filter_map(|(k, v)| Some((k.to_string(), v?))));
    Value::Object(o)
}

// ---- device frames (`protocol`): the session's decoder and the client's ---------------------------

/// What a client frame must parse to, read off its JSON value.
fn client_oracle(v: &Value) -> Option<ClientFrame> {
    let o = v.as_object()?;
    let number = |k: &str| o.get(k).and_then(Value::as_u64);
    match o.get("t")?.as_str()? {
        "ping" => Some(ClientFrame::Ping),
        "sync" => number("after").map(|after| ClientFrame::Sync { after }),
        "ack" => number("seq").map(|seq| ClientFrame::Ack { seq }),
        "up" => number("id").zip(o.get("payload")).map(|(id, p)| ClientFrame::Up { id, payload: p.clone() }),
        _ => None,
    }
}

fn client_object() -> impl Strategy<Value = Value> {
    let tag = prop_oneof![
        4 => select(&["ping", "sync", "ack", "up"][..]).prop_map(Value::from),
        1 => select(&["pong", "Ping", "SYNC", "", "ack ", "msg"][..]).prop_map(Value::from),
        1 => json_leaf(),
    ];
    let quoted = |n: u64| json!(n.to_string());
    let number =
        || prop_oneof![3 => any::<u64>().prop_map(Value::from), 1 => json_value(), 1 => any::<u64>().prop_map(quoted)];
    let extra = btree_map(select(&["x", "T", "payload", "after_", "Seq"][..]), json_value(), 0..3);
    (weighted(0.95, tag), weighted(0.8, number()), weighted(0.8, number()), weighted(0.8, number()), extra).prop_map(
        |(t, after, seq, id, extra)| object(vec![("t", t), ("after", after), ("seq", seq), ("id", id)], extra),
    )
}

fn server_frame() -> impl Strategy<Value = ServerFrame> {
    let u = any::<u64>;
    prop_oneof![
        (text(), text(), u64s(4), of(text())).prop_map(|(device, node, n, next_url)| {
            ServerFrame::Hello {
                device,
                node,
                node_id: n[0],
                conn: n[1],
                route_version: n[2],
                stream_head: n[3],
                next_url,
            }
        }),
        (u(), json_value()).prop_map(|(seq, payload)| ServerFrame::Msg { seq, payload }),
        u().prop_map(|oldest| ServerFrame::SyncGap { oldest }),
        u().prop_map(|retry_after_ms| ServerFrame::SyncBusy { retry_after_ms }),
        text().prop_map(|reason| ServerFrame::Goaway { reason }),
        Just(ServerFrame::Pong),
        text().prop_map(|error| ServerFrame::Error { error }),
        u().prop_map(|id| ServerFrame::UpAck { id }),
        (u(), text(), of(u()), of(any::<u16>())).prop_map(|(id, reason, retry_after_ms, status)| {
            ServerFrame::UpNack { id, reason, retry_after_ms, status }
        }),
    ]
}

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn client_frames_parse_exactly_the_well_formed_objects(v in client_object()) {
        prop_assert_eq!(serde_json::from_str::<ClientFrame>(&v.to_string()).ok(), client_oracle(&v));
    }

    #[test]
    fn client_frames_accept_nothing_the_oracle_refuses(
        text in prop_oneof![".{0,64}".boxed(), mutated(client_object().prop_map(|v| v.to_string()))]
    ) {
        if let Ok(frame) = serde_json::from_str::<ClientFrame>(&text) {
            let v: Value = serde_json::from_str(&text).map_err(|e| TestCaseError::fail(format!("not JSON: {e}")))?;
            prop_assert_eq!(client_oracle(&v), Some(frame));
        }
    }
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn client_frames_round_trip(n in any::<u64>(), pick in 0usize..3) {
        let frame = [ClientFrame::Ping, ClientFrame::Sync { after: n }, ClientFrame::Ack { seq: n }][pick].clone();
        prop_assert_eq!(serde_json::from_str::<ClientFrame>(&frame.to_json()).ok(), Some(frame));
    }

    #[test]
    fn server_frames_serialize_to_json_that_parses_back(frame in server_frame()) {
        let text = frame.to_json();
        let v: Value = serde_json::from_str(&text).map_err(|e| TestCaseError::fail(format!("{text}: {e}")))?;
        prop_assert!(v["t"].is_string(), "{}", text);
        prop_assert_eq!(serde_json::from_str::<ServerFrame>(&text).ok(), Some(frame.clone()));
        if let ServerFrame::Msg { seq, payload } = &frame {
            let spliced = msg_json(*seq, &payload.to_string());
            prop_assert_eq!(serde_json::from_str::<ServerFrame>(&spliced).ok(), Some(frame.clone()));
        }
    }

    #[test]
    fn server_frame_parser_round_trips_whatever_it_accepts(
        text in prop_oneof![".{0,64}".boxed(), mutated(server_frame().prop_map(|f| f.to_json()))]
    ) {
        if let Ok(frame) = serde_json::from_str::<ServerFrame>(&text) {
            let again = serde_json::from_str::<ServerFrame>(&frame.to_json());
            prop_assert!(again.is_ok(), "{} re-serialized does not parse", text);
            // Floats other than this file's dyadic ones need not survive a round trip bit for bit.
            if !matches!(&frame, ServerFrame::Msg { payload, .. } if has_float(payload)) {
                prop_assert_eq!(again.ok(), Some(frame));
            }
        }
    }

    #[test]
    fn deep_nesting_is_refused_not_overflowed(depth in prop_oneof![1usize..300, 1usize..5000]) {
        let deep = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
        let msg = serde_json::from_str::<ServerFrame>(&format!(r#"{{"t":"msg","seq":1,"payload":{deep}}}"#));
        let ping = serde_json::from_str::<ClientFrame>(&format!(r#"{{"t":"ping","x":{deep}}}"#));
        // serde_json's recursion limit (128) refuses what is deeper; the exact cut is its business.
        if depth <= 100 || depth >= 200 {
            prop_assert_eq!((msg.is_ok(), ping.is_ok()), (depth <= 100, depth <= 100), "depth {}", depth);
        }
        let toml = toml::from_str::<toml::Table>(&format!("a = {deep}"));
        prop_assert!(depth > 50 || toml.is_ok(), "depth {}", depth);
    }
}

// ---- device tokens (`token`): the handshake's decoder ---------------------------------------------

const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";

fn now_s() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).expect("after 1970").as_secs()
}

/// A string no error message contains by chance.
fn marker() -> impl Strategy<Value = String> {
    "mk[a-z0-9]{10}"
}

fn device_id() -> impl Strategy<Value = String> {
    "[A-Za-z0-9._:@-]{1,128}"
}

fn bad_device_id() -> impl Strategy<Value = String> {
    let outside =
        any::<char>().prop_filter("outside the alphabet", |c| !c.is_ascii_alphanumeric() && !"._:@-".contains(*c));
    let with_outsider = ("[A-Za-z0-9]{0,20}", outside, "[A-Za-z0-9]{0,20}").prop_map(|(a, c, b)| format!("{a}{c}{b}"));
    prop_oneof![Just(String::new()), "[A-Za-z0-9]{129,300}", with_outsider]
}

/// A time claim, far enough from `now` that the test's own runtime cannot matter, or junk.
fn time_claim(kind: u8, offset: u64, now: u64, marker: &str) -> Value {
    match kind % 7 {
        0 | 1 => json!(now + 1000 + offset),
        2 => json!(now - 1000 - offset),
        3 => json!(u64::MAX),
        4 => json!(marker),
        5 => json!(1.5e9),
        _ => json!(-5),
    }
}

/// What `verify` must answer for claims signed HS256 with the right secret.
fn claims_oracle(c: &Value, now: u64) -> Option<DeviceClaims> {
    let sub = c.get("sub")?.as_str().filter(|s| valid_device_id(s))?.to_string();
    let exp = c.get("exp")?.as_u64().filter(|&e| e > now)?;
    let epoch = c.get("epoch").map_or(Some(0), Value::as_u64)?;
    let nbf = match c.get("nbf") {
        None | Some(Value::Null) => None,
        Some(v) => Some(v.as_u64().filter(|&n| n < now)?),
    };
    Some(DeviceClaims { sub, epoch, exp, nbf, tenant: None })
}

/// Text more or less like a token, with a marker inside.
fn token_like() -> impl Strategy<Value = (String, String)> {
    let filler =
        prop_oneof![".{0,200}", "[A-Za-z0-9_.=-]{0,300}", json_value().prop_map(|v| b64(v.to_string().as_bytes()))];
    (marker(), filler, any::<Index>(), 0u8..4).prop_map(|(m, f, at, shape)| {
        let header = b64(br#"{"alg":"HS256","typ":"JWT"}"#);
        let t = match shape {
            0 => edit_text(&f, &[(at, 1, '\u{1}')]).replacen('\u{1}', &m, 1),
            1 => format!("{header}.{}.{}", b64(json!({"sub": m, "exp": m}).to_string().as_bytes()), b64(m.as_bytes())),
            2 => format!("{}.{f}.{m}", b64(format!(r#"{{"alg":"{m}"}}"#).as_bytes())),
            _ => format!("{m}.{f}.{m}"),
        };
        (t, m)
    })
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn device_ids_are_1_to_128_bytes_of_the_alphabet(id in prop_oneof![device_id(), bad_device_id(), ".{0,130}"]) {
        let alphabet = id.chars().all(|c| c.is_ascii_alphanumeric() || "._:@-".contains(c));
        prop_assert_eq!(valid_device_id(&id), (1..=128).contains(&id.len()) && alphabet);
    }

    #[test]
    fn minted_tokens_verify_to_their_claims(id in device_id(), epoch in any::<u64>(), ahead in 60u64..1_000_000_000) {
        let exp = now_s() + ahead;
        let token = mint(SECRET, &id, epoch, exp).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(Verifier::new(SECRET).verify(&token), Ok(DeviceClaims { sub: id, epoch, exp, nbf: None, tenant: None }));
    }

    #[test]
    fn mint_refuses_bad_device_ids(id in bad_device_id(), epoch in any::<u64>()) {
        prop_assert_eq!(mint(SECRET, &id, epoch, now_s() + 3600), Err(AuthError::BadDevice));
    }

    #[test]
    fn signed_claims_verify_exactly_when_valid_and_refusals_never_quote_them(
        m in marker(),
        sub in weighted(0.9, (0u8..6, prop_oneof![
            device_id().prop_map(Value::from), bad_device_id().prop_map(Value::from), json_leaf()
        ])),
        exp in weighted(0.9, (any::<u8>(), 0u64..100_000_000)),
        nbf in weighted(0.3, (any::<u8>(), 0u64..100_000_000)),
        epoch in weighted(0.7, prop_oneof![3 => any::<u64>().prop_map(Value::from), 1 => json_leaf()]),
        alg in select(&[Algorithm::HS256, Algorithm::HS256, Algorithm::HS256, Algorithm::HS384, Algorithm::HS512][..]),
        right_key in prop::bool::weighted(0.9),
    ) {
        let now = now_s();
        let time = |c: Option<(u8, u64)>| c.map(|(kind, offset)| time_claim(kind, offset, now, &m));
        // Marked values: a sub the marker makes invalid (`BadDevice`), a string epoch (`Json`).
        let sub = sub.map(|(kind, v)| if kind == 0 { json!(format!("{m}!")) } else { v });
        let epoch = epoch.map(|v| if v.is_string() { json!(m) } else { v });
        let fields = vec![("sub", sub), ("exp", time(exp)), ("nbf", time(nbf)), ("epoch", epoch)];
        let claims = object(fields, [("role", json!(m))].into());
        let key = if right_key { SECRET } else { b"another-secret-of-enough-length!" };
        let token = jsonwebtoken::encode(&Header::new(alg), &claims, &EncodingKey::from_secret(key))
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        let want = claims_oracle(&claims, now).filter(|_| alg == Algorithm::HS256 && right_key);
        match Verifier::new(SECRET).verify(&token) {
            Ok(got) => prop_assert_eq!(Some(got), want, "{}", claims),
            Err(e) => {
                prop_assert_eq!(want, None, "{} refused: {}", claims, e);
                prop_assert!(!e.to_string().contains(&m), "{} quotes the token", e);
            }
        }
    }

    #[test]
    fn any_edit_of_a_valid_token_is_refused(
        id in device_id(), epoch in any::<u64>(), at in any::<Index>(), op in 0u8..4,
        c in prop_oneof![select(&['A', 'Q', 'g', 'w', '_', '-', '.', '=', '0'][..]), any::<char>()],
    ) {
        let token = mint(SECRET, &id, epoch, now_s() + 3600).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let bad = if op == 3 { token[..at.index(token.len())].to_string() } else { edit_text(&token, &[(at, op, c)]) };
        prop_assume!(bad != token);
        let said = Verifier::new(SECRET).verify(&bad).expect_err("an edited token verified").to_string();
        prop_assert!(token.split('.').all(|segment| !said.contains(segment)), "{} quotes the token", said);
    }

    #[test]
    fn arbitrary_text_is_refused_without_being_quoted((token, m) in token_like()) {
        let e = Verifier::new(SECRET).verify(&token).expect_err("arbitrary text verified");
        prop_assert!(!e.to_string().contains(&m), "{} quotes the token", e);
        let fits = !token.is_empty() && token.len() <= MAX_TOKEN_BYTES;
        prop_assert!(!fits || matches!(e, AuthError::Invalid(_)), "{:?}", e);
    }

    #[test]
    fn oversized_tokens_are_refused_before_decoding(
        valid in any::<bool>(), fill in select(&["A", ".", "é"][..]), off in prop_oneof![-2i64..=2, -4000i64..5000]
    ) {
        let base = if valid { mint(SECRET, "d1", 0, now_s() + 3600).expect("valid id") } else { String::new() };
        // Padding to around the limit: on it, one either side, or anywhere.
        let pad = ((MAX_TOKEN_BYTES - base.len()) as i64 + off).max(1) as usize / fill.len();
        let token = format!("{base}{}", fill.repeat(pad.max(1)));
        let e = Verifier::new(SECRET).verify(&token).expect_err("a padded token verified");
        prop_assert_eq!(e == AuthError::TooLong, token.len() > MAX_TOKEN_BYTES, "{} bytes: {:?}", token.len(), e);
    }
}

// ---- the project codec (`codec`): Raft RPC and forwarded writes, both ways ------------------------

fn command() -> impl Strategy<Value = Command> {
    let u = any::<u64>;
    prop_oneof![
        text().prop_map(|cluster_id| Command::Init(Init { cluster_id })),
        (text(), u64s(4)).prop_map(|(device, n)| {
            Command::Claim(Claim { device, node: n[0], conn: n[1], epoch: n[2], attempt: n[3] })
        }),
        (text(), u()).prop_map(|(device, conn)| Command::Release(Release { device, conn })),
        (u64s(5), any::<bool>()).prop_map(|(n, draining)| {
            let (node, at_ms, lease_ms, connections, incarnation) = (n[0], n[1], n[2], n[3], n[4]);
            Command::Renew(Renew { node, at_ms, lease_ms, connections, draining, incarnation })
        }),
        (u(), u(), vec(u(), 0..4))
            .prop_map(|(at_ms, grace_ms, candidates)| { Command::Sweep(Sweep { at_ms, grace_ms, candidates }) }),
        (u(), u()).prop_map(|(at_ms, lease_ms)| Command::ExtendLeases(ExtendLeases { at_ms, lease_ms })),
        (u(), u()).prop_map(|(node, at_ms)| Command::Drain(Drain { node, at_ms })),
        u().prop_map(|node| Command::ReleaseNode(ReleaseNode { node })),
        u().prop_map(|node| Command::Forget(Forget { node })),
        (text(), text(), of(text()), u64s(5)).prop_map(|(device, payload, key, n)| {
            let (at_ms, keep_count, keep_age_ms, keep_key_ms, max_keys) = (n[0], n[1], n[2], n[3], n[4]);
            Command::Publish(Publish { device, payload, key, at_ms, keep_count, keep_age_ms, keep_key_ms, max_keys })
        }),
        (text(), u()).prop_map(|(device, seq)| Command::Ack(Ack { device, seq })),
        u64s(3).prop_map(|n| Command::Suspect(Suspect { node: n[0], at_ms: n[1], hold_ms: n[2] })),
        of((u(), any::<u32>())).prop_map(|b| Command::SetAdmission(SetAdmission {
            budget: b.map(|(milli_rate, burst)| Budget { milli_rate, burst })
        })),
    ]
}

fn reply() -> impl Strategy<Value = Result<Reply, ProposeError>> {
    let (u, b) = (any::<u64>, any::<bool>);
    let claim = (0u8..3, u64s(2), of(u64s(2))).prop_map(|(kind, n, s)| match kind {
        0 => ClaimReply::Accepted {
            version: n[0],
            superseded: s.map(|s| Superseded { node: s[0], conn: s[1] }),
            head: None,
        },
        1 => ClaimReply::Stale { floor_epoch: n[0], floor_attempt: n[1] },
        _ => ClaimReply::NodeNotLive,
    });
    let publish = (u(), of(b())).prop_map(|(seq, p)| {
        p.map_or(PublishReply::NoSuchDevice, |duplicate| PublishReply::Published { seq, duplicate })
    });
    let ok = prop_oneof![
        Just(Reply::Init(())),
        claim.prop_map(Reply::Claim),
        b().prop_map(Reply::Release),
        Just(Reply::Renew(())),
        (vec(u(), 0..4), u()).prop_map(|(expired, routes_deleted)| Reply::Sweep(Swept { expired, routes_deleted })),
        Just(Reply::ExtendLeases(())),
        b().prop_map(Reply::Drain),
        u().prop_map(Reply::ReleaseNode),
        u().prop_map(Reply::Forget),
        publish.prop_map(Reply::Publish),
        u().prop_map(Reply::Ack),
        b().prop_map(Reply::Suspect),
    ];
    let err = (0u8..5, u(), text()).prop_map(|(kind, n, s)| match kind {
        0 => ProposeError::NoLeader,
        1 => ProposeError::Timeout(n),
        2 => ProposeError::Forward(s),
        3 => ProposeError::Rejected(s),
        _ => ProposeError::Stopped,
    });
    prop_oneof![3 => ok.prop_map(Ok), 1 => err.prop_map(Err)]
}

fn log_id() -> impl Strategy<Value = LogId> {
    any::<(u64, u64, u64)>().prop_map(|(term, node, index)| new_log_id(term, node, index))
}

fn vote() -> impl Strategy<Value = Vote> {
    any::<(u64, u64, bool)>().prop_map(|(t, n, c)| if c { Vote::new_committed(t, n) } else { Vote::new(t, n) })
}

fn member() -> impl Strategy<Value = Member> {
    (text(), text(), text()).prop_map(|(name, cluster_addr, public_url)| Member {
        name: name.into(),
        cluster_addr: cluster_addr.into(),
        public_url: public_url.into(),
    })
}

fn membership() -> impl Strategy<Value = Membership<NodeId, Member>> {
    // openraft 0.10 refuses a voter that is not a node; the learners are the nodes left over.
    (btree_map(any::<u64>(), member(), 1..5), any::<Index>()).prop_map(|(nodes, cut)| {
        let voters = nodes.keys().copied().take(1 + cut.index(nodes.len())).collect();
        Membership::new(vec![voters], nodes).expect("every voter is a node")
    })
}

fn entry() -> impl Strategy<Value = Entry> {
    let payload = prop_oneof![
        Just(EntryPayload::Blank),
        vec(command(), 0..4).prop_map(|cmds| EntryPayload::Normal(Request { cmds: cmds.into() })),
        membership().prop_map(EntryPayload::Membership),
    ];
    (log_id(), payload).prop_map(|(log_id, payload)| Entry { log_id, payload })
}

fn fatal() -> impl Strategy<Value = RaftError<TypeConfig>> {
    (0u8..2).prop_map(|k| RaftError::Fatal(if k == 0 { Fatal::Stopped } else { Fatal::Panicked }))
}

type AppendReply = Result<AppendEntriesResponse<TypeConfig>, RaftError<TypeConfig>>;
type VoteReply = Result<VoteResponse<TypeConfig>, RaftError<TypeConfig>>;
/// A whole snapshot: the sender's vote, the snapshot's meta and its bytes.
type SnapshotBody = (Vote, SnapshotMeta, Vec<u8>);
type SnapshotReply = Result<SnapshotResponse<TypeConfig>, RaftError<TypeConfig>>;

/// A body the cluster listener decodes (`/raft/*`, `/cluster/propose/v2`) or an answer its
/// clients decode (`raft::network`, the proposer's forward), in the order of `DECODERS`.
#[derive(Debug)]
enum Body {
    Forward(Vec<Command>),
    Replies(Vec<Result<Reply, ProposeError>>),
    Append(AppendEntriesRequest<TypeConfig>),
    Vote(VoteRequest<TypeConfig>),
    Snapshot(SnapshotBody),
    AppendReply(AppendReply),
    VoteReply(VoteReply),
    SnapshotReply(SnapshotReply),
}

type Decoded = Result<(String, Vec<u8>), CodecError>;

/// Decodes `bytes` as `T`: the value's Debug text and its encoding, to compare.
fn decode_as<T: Serialize + DeserializeOwned + Debug>(bytes: &[u8]) -> Decoded {
    let value: T = decode(bytes)?;
    Ok((format!("{value:?}"), encode(&value).expect("a decoded value encodes")))
}

/// Decodes a whole snapshot as the cluster listener does (`raft::rpc`): the vote and meta, then
/// the snapshot's bytes borrowed from the body (`codec::decode_with_bytes`); encodes it again as
/// a leader sends one (`raft::network::snapshot_body`).
fn decode_snapshot(bytes: &[u8]) -> Decoded {
    let ((vote, meta), data): ((Vote, SnapshotMeta), &[u8]) = decode_with_bytes(bytes)?;
    let sent = Snapshot { meta: meta.clone(), snapshot: std::io::Cursor::new(data.to_vec()) };
    let again = snapshot_body(&vote, sent).expect("a decoded snapshot encodes");
    let value: SnapshotBody = (vote, meta, data.to_vec());
    Ok((format!("{value:?}"), again))
}

const DECODERS: [fn(&[u8]) -> Decoded; 8] = [
    decode_as::<Vec<Command>>,
    decode_as::<Vec<Result<Reply, ProposeError>>>,
    decode_as::<AppendEntriesRequest<TypeConfig>>,
    decode_as::<VoteRequest<TypeConfig>>,
    decode_snapshot,
    decode_as::<AppendReply>,
    decode_as::<VoteReply>,
    decode_as::<SnapshotReply>,
];

impl Body {
    /// Its index in `DECODERS`, its encoding and its Debug text.
    fn encoded(&self) -> (usize, Vec<u8>, String) {
        fn enc<T: Serialize + Debug>(kind: usize, v: &T) -> (usize, Vec<u8>, String) {
            (kind, encode(v).expect("a valid value encodes"), format!("{v:?}"))
        }
        match self {
            Body::Forward(v) => enc(0, v),
            Body::Replies(v) => enc(1, v),
            Body::Append(v) => enc(2, v),
            Body::Vote(v) => enc(3, v),
            Body::Snapshot(v) => enc(4, v),
            Body::AppendReply(v) => enc(5, v),
            Body::VoteReply(v) => enc(6, v),
            Body::SnapshotReply(v) => enc(7, v),
        }
    }
}

fn body() -> impl Strategy<Value = Body> {
    let append = (vote(), of(log_id()), vec(entry(), 0..4), of(log_id())).prop_map(|(vote, prev, entries, commit)| {
        AppendEntriesRequest { vote, prev_log_id: prev, entries, leader_commit: commit }
    });
    let meta = (of(log_id()), of(log_id()), membership())
        .prop_map(|(last, at, m)| SnapshotMeta { last_log_id: last, last_membership: StoredMembership::new(at, m) });
    let snapshot = (vote(), meta, vec(any::<u8>(), 0..64));
    let append_reply = (0u8..4, of(log_id()), vote()).prop_map(|(kind, log_id, vote)| match kind {
        0 => AppendEntriesResponse::Success,
        1 => AppendEntriesResponse::PartialSuccess(log_id),
        2 => AppendEntriesResponse::Conflict,
        _ => AppendEntriesResponse::HigherVote(vote),
    });
    let vote_reply = (vote(), any::<bool>(), of(log_id()))
        .prop_map(|(vote, vote_granted, last_log_id)| VoteResponse::new(vote, last_log_id, vote_granted));
    let snapshot_reply = vote().prop_map(SnapshotResponse::new);
    prop_oneof![
        vec(command(), 0..6).prop_map(Body::Forward),
        vec(reply(), 0..6).prop_map(Body::Replies),
        append.prop_map(Body::Append),
        (vote(), of(log_id())).prop_map(|(vote, last_log_id)| Body::Vote(VoteRequest::new(vote, last_log_id))),
        snapshot.prop_map(Body::Snapshot),
        prop_oneof![append_reply.prop_map(Ok), fatal().prop_map(Err)].prop_map(Body::AppendReply),
        prop_oneof![vote_reply.prop_map(Ok), fatal().prop_map(Err)].prop_map(Body::VoteReply),
        prop_oneof![snapshot_reply.prop_map(Ok), fatal().prop_map(Err)].prop_map(Body::SnapshotReply),
    ]
}

/// The largest single allocation a decode may ask for: serde preallocates at most 1 MiB for a
/// sequence, and the inputs here are a few KiB.
const MAX_DECODE_ALLOCATION: usize = 2 << 20;

/// A byte, often one that means something to bincode's varints (0xFB-0xFF widen an integer).
fn codec_byte() -> impl Strategy<Value = u8> {
    prop_oneof![any::<u8>(), select(&[0, 1, 2, 0x7F, 0x80, 0xFA, 0xFB, 0xFC, 0xFD, 0xFE, 0xFF][..])]
}

/// What every decoder promises: no panic, no allocation out of proportion, and a value that
/// encodes to bytes that decode to the same value. Answers the value's Debug text.
fn decode_sanely(kind: usize, bytes: &[u8]) -> Result<Option<String>, TestCaseError> {
    let (out, largest) = largest_allocation(|| DECODERS[kind](bytes));
    prop_assert!(largest <= MAX_DECODE_ALLOCATION, "decoder {} allocated {} bytes for {:?}", kind, largest, bytes);
    let Ok((debug, again)) = out else { return Ok(None) };
    let back = DECODERS[kind](&again).map_err(|e| TestCaseError::fail(format!("re-encoded, decoder {kind}: {e}")))?;
    prop_assert_eq!(&back.0, &debug);
    Ok(Some(debug))
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn codec_round_trips_every_rpc_body(body in body()) {
        let (kind, bytes, debug) = body.encoded();
        prop_assert_eq!(bytes[0], VERSION);
        prop_assert_eq!(decode_sanely(kind, &bytes)?, Some(debug));
    }

    #[test]
    fn codec_refuses_truncated_extended_and_other_version_bodies(
        body in body(), cut in any::<Index>(), extra in vec(any::<u8>(), 1..8), version in any::<u8>()
    ) {
        let (kind, bytes, _) = body.encoded();
        let short = &bytes[..cut.index(bytes.len())];
        prop_assert_eq!(decode_sanely(kind, short)?, None, "a prefix of {} bytes decoded", short.len());
        let long = [&bytes[..], &extra].concat();
        prop_assert!(matches!(DECODERS[kind](&long), Err(CodecError::Trailing(n)) if n == extra.len()));
        let other = [&[version][..], &bytes[1..]].concat();
        let refused = matches!(DECODERS[kind](&other), Err(CodecError::Version(v)) if v == version);
        prop_assert!(version == VERSION || refused);
    }

    #[test]
    fn codec_survives_mutated_bodies(body in body(), edits in vec((any::<Index>(), 0u8..3, codec_byte()), 1..6)) {
        let mutated = edit(body.encoded().1, &edits);
        for kind in 0..DECODERS.len() {
            decode_sanely(kind, &mutated)?;
        }
    }
}

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn codec_survives_arbitrary_bytes(versioned in prop::bool::weighted(0.9), bytes in vec(codec_byte(), 0..512)) {
        let input = [if versioned { &[VERSION][..] } else { &[] }, &bytes].concat();
        for kind in 0..DECODERS.len() {
            decode_sanely(kind, &input)?;
        }
    }
}

// ---- admin API JSON (`wire`): the cluster listener's decoders and the admin client's --------------

/// A join/promote/leave body, sometimes missing or mistyping a field.
fn admin_body() -> impl Strategy<Value = Value> {
    let string = || weighted(0.9, prop_oneof![4 => text().prop_map(Value::from), 1 => json_leaf()]);
    let extra = || btree_map(select(&["x", "ID", "role"][..]), json_leaf(), 0..2);
    let member = prop_oneof![
        4 => (string(), string(), string(), extra())
            .prop_map(|(n, c, p, e)| object(vec![("name", n), ("cluster_addr", c), ("public_url", p)], e)),
        1 => json_leaf(),
    ];
    let id = prop_oneof![4 => any::<u64>().prop_map(Value::from), 1 => json_leaf()];
    (weighted(0.9, id), weighted(0.9, member), string(), extra())
        .prop_map(|(id, member, node, e)| object(vec![("id", id), ("member", member), ("node", node)], e))
}

fn dyadic() -> impl Strategy<Value = f64> {
    (-100_000i32..100_000).prop_map(|k| f64::from(k) / 1024.0)
}

fn status_report() -> impl Strategy<Value = StatusReport> {
    let node_ref = || (any::<u64>(), text()).prop_map(|(id, name)| NodeRef { id, name });
    // Any route counts: `total_routes` saturates (it overflowed the sum).
    let member = (vec(text(), 5), u64s(2), any::<u64>(), of(any::<i64>()), of(any::<u64>())).prop_map(
        |(s, n, routes, lease_remaining_ms, matched_index)| {
            let [name, cluster_addr, public_url, role, state] = <[String; 5]>::try_from(s).expect("five");
            let (id, connections) = (n[0], n[1]);
            MemberStatus {
                id,
                name,
                cluster_addr,
                public_url,
                role,
                state,
                lease_remaining_ms,
                routes,
                connections,
                matched_index,
                capacity_connections: matched_index,
                utilization: lease_remaining_ms.map(|ms| (ms % 1024) as f64 / 64.0),
                max_connections: matched_index.map(|i| i ^ connections),
            }
        },
    );
    let ring = (any::<u64>(), vec(text(), 0..3), btree_map(text(), dyadic(), 0..3))
        .prop_map(|(version, live, share)| RingStatus { version, live, share });
    let config = (u64s(6), 0usize..10).prop_map(|(n, max_voters)| {
        let (lease_ms, sweep_ms, election_timeout_ms, heartbeat_ms) = (n[0], n[1], n[2], n[3]);
        Timing {
            lease_ms,
            sweep_ms,
            election_timeout_ms,
            heartbeat_ms,
            max_voters,
            snapshot_logs: n[4],
            propose_timeout_ms: n[5],
        }
    });
    let admission =
        || of((dyadic(), any::<u32>()).prop_map(|(rate_per_s, burst)| AdmissionStatus { rate_per_s, burst }));
    let head = (of(text()), node_ref(), of(node_ref()), text(), u64s(4), of(any::<u64>()), of(any::<u64>()));
    (head, config, (admission(), admission()), vec(member, 0..3), ring).prop_map(
        |(
            (cluster_id, node, leader, server_state, n, snapshot_index, purged_index),
            config,
            (admission, admission_budget),
            members,
            ring,
        )| {
            let (term, commit_index, applied_index, last_log_index) = (n[0], n[1], n[2], n[3]);
            let scale_in = Some(node.clone()).filter(|_| term % 2 == 0).map(|node| ScaleInStatus {
                node,
                started_at_ms: term,
                expires_at_ms: commit_index,
            });
            StatusReport {
                cluster_id,
                node,
                leader,
                server_state,
                term,
                commit_index,
                applied_index,
                last_log_index,
                snapshot_index,
                purged_index,
                config,
                admission,
                admission_budget,
                members,
                ring,
                connections_here: purged_index,
                scale_in,
                scaling: None,
            }
        },
    )
}

fn json_text<T: Serialize>(v: &T) -> String {
    serde_json::to_string(v).expect("serializes")
}

/// The admin client's answers, as JSON text.
fn admin_answer() -> impl Strategy<Value = String> {
    let pairs = || vec((any::<u64>(), text()), 0..3);
    prop_oneof![
        status_report().prop_map(|r| json_text(&r)),
        (any::<u64>(), member(), of(text())).prop_map(|(id, member, cluster_id)| json_text(&IdentityReply {
            id,
            member,
            cluster_id
        })),
        (pairs(), pairs()).prop_map(|(voters, learners)| json_text(&MembershipSummary { voters, learners })),
    ]
}

/// Whatever parses as `T` serializes to JSON that parses to the same JSON value.
fn reparses<T: Serialize + DeserializeOwned>(text: &str) -> Result<Option<T>, TestCaseError> {
    let Ok(v) = serde_json::from_str::<T>(text) else { return Ok(None) };
    let value = serde_json::to_value(&v).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let back: T = serde_json::from_str(&value.to_string()).map_err(|e| TestCaseError::fail(format!("{value}: {e}")))?;
    prop_assert_eq!(serde_json::to_value(&back).ok(), Some(value));
    Ok(Some(v))
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn admin_requests_parse_exactly_when_every_field_has_its_type(v in admin_body()) {
        let text = v.to_string();
        let member = ["name", "cluster_addr", "public_url"].iter().all(|k| v["member"][k].is_string());
        let join = serde_json::from_str::<JoinRequest>(&text).ok();
        prop_assert_eq!(join.is_some(), v["id"].is_u64() && member, "{}", text);
        if let Some(j) = join {
            prop_assert_eq!(Some(j.id), v["id"].as_u64());
            prop_assert_eq!(Some(&*j.member.public_url), v["member"]["public_url"].as_str());
        }
        prop_assert_eq!(serde_json::from_str::<PromoteRequest>(&text).ok().map(|p| p.id), v["id"].as_u64());
        let leave = serde_json::from_str::<LeaveRequest>(&text).ok();
        prop_assert_eq!(leave.map(|l| l.node), v["node"].as_str().map(str::to_string));
    }

    #[test]
    fn admin_answers_round_trip_and_render(r in status_report()) {
        let parsed = reparses::<StatusReport>(&json_text(&r))?;
        prop_assert_eq!(parsed.map(|p| serde_json::to_value(p).ok()), Some(serde_json::to_value(&r).ok()));
        let header = format!("answered by {}", r.node.name);
        prop_assert!(r.render().contains(&header));
    }

    #[test]
    fn admin_decoders_never_panic_nor_accept_what_they_cannot_write_back(
        text in prop_oneof![
            ".{0,64}".boxed(),
            json_value().prop_map(|v| v.to_string()).boxed(),
            mutated(admin_body().prop_map(|v| v.to_string())),
            mutated(admin_answer()),
        ]
    ) {
        reparses::<JoinRequest>(&text)?;
        reparses::<PromoteRequest>(&text)?;
        reparses::<LeaveRequest>(&text)?;
        reparses::<IdentityReply>(&text)?;
        reparses::<MembershipSummary>(&text)?;
        if let Some(report) = reparses::<StatusReport>(&text)? {
            report.render();
        }
    }
}

// ---- the config file (`config`): TOML and the merge -----------------------------------------------

/// Keys the merge checks, each with a range across its rules (`key=max` for integers), or a kind.
/// The widest values reach i64::MAX (what TOML holds): the merge used to overflow multiplying them.
const KNOBS: &str = "lease_ms=200000 lease_ms=1099511627776 lease_ms=9223372036854775807 sweep_ms=20000 \
    election_timeout_ms=20000 election_timeout_ms=1099511627776 election_timeout_ms=9223372036854775807 \
    heartbeat_ms=5000 heartbeat_ms=9223372036854775807 retain_ms=9223372036854775807 max_voters=9 snapshot_logs=2 propose_timeout_ms=2 \
    ping_ms=100000 idle_ms=100000 admit_rate=rate admit_burst=2 handshake_timeout_ms=2 header_read_timeout_ms=2 \
    max_message_bytes=17825792 send_queue=2 send_queue_bytes=3145728 sync_buffer_bytes=262145 max_connections=1099511627776 drain_rate=rate \
    drain_timeout_ms=1099511627776 retain_count=2 retain_ms=2 max_payload_bytes=1048578 idempotency_ms=1099511627776 \
    idempotency_keys=1099511627776 name=name join=join standby=bool log_format=format";

fn knobs() -> Vec<(&'static str, &'static str)> {
    KNOBS.split_whitespace().map(|k| k.split_once('=').expect("key=kind")).collect()
}

fn knob() -> impl Strategy<Value = (&'static str, toml::Value)> {
    let specials = [-1.0, 0.0, 0.005, 0.01, 200.0, 1e9, 1.5e9, f64::NAN, f64::INFINITY, f64::NEG_INFINITY];
    let rate = prop_oneof![select(specials.to_vec()), 0.0..2e9f64];
    let name = prop_oneof!["[A-Za-z0-9._-]{1,64}", ".{0,70}"];
    (0..knobs().len(), any::<u64>(), rate, name, any::<bool>()).prop_map(|(i, n, rate, name, b)| {
        let (key, kind) = knobs()[i];
        let value = match kind {
            "rate" => toml::Value::Float(rate),
            "name" => toml::Value::String(name),
            "join" => toml::Value::String(format!("127.0.0.1:{}", n % 65536)),
            "bool" => toml::Value::Boolean(b),
            "format" => toml::Value::String(if b { "json" } else { "text" }.into()),
            max => toml::Value::Integer((n % (max.parse::<u64>().expect("a max") + 1)) as i64),
        };
        (key, value)
    })
}

fn table(knobs: Vec<(&'static str, toml::Value)>) -> toml::Table {
    knobs.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}

/// The config the merge must make of `flags` over `file` over the defaults, or `None` when one
/// of the documented rules refuses it (mirrors `Config::merge` and its checks).
fn expected(flags: &toml::Table, file: &toml::Table) -> Option<Config> {
    let get = |k: &str| flags.get(k).or_else(|| file.get(k));
    let int = |k: &str, default: u64| get(k).and_then(toml::Value::as_integer).map_or(default, |v| v as u64);
    let size = |k: &str, default: usize| int(k, default as u64) as usize;
    let rate =
        |k: &str, d: f64| get(k).map_or(d, |v| v.as_float().or(v.as_integer().map(|i| i as f64)).unwrap_or(f64::NAN));
    let dt = Timing::default();
    let t = Timing {
        lease_ms: int("lease_ms", dt.lease_ms),
        sweep_ms: int("sweep_ms", dt.sweep_ms),
        election_timeout_ms: int("election_timeout_ms", dt.election_timeout_ms),
        heartbeat_ms: int("heartbeat_ms", dt.heartbeat_ms),
        max_voters: size("max_voters", dt.max_voters),
        snapshot_logs: int("snapshot_logs", dt.snapshot_logs),
        propose_timeout_ms: int("propose_timeout_ms", dt.propose_timeout_ms),
    };
    let dd = DeviceConfig::default();
    let max_payload_bytes = size("max_payload_bytes", dd.max_payload_bytes);
    let handshake_timeout_ms = int(
        "handshake_timeout_ms",
        dd.handshake_timeout_ms.max(t.election_timeout_ms.saturating_mul(4).saturating_add(1000)),
    );
    let d = DeviceConfig {
        ping_ms: int("ping_ms", dd.ping_ms),
        idle_ms: int("idle_ms", dd.idle_ms),
        admit_rate: rate("admit_rate", dd.admit_rate),
        admit_burst: int("admit_burst", dd.admit_burst.into()) as u32,
        source_rate: dd.source_rate,
        source_burst: dd.source_burst,
        device_reconnects: dd.device_reconnects,
        device_reconnect_window_ms: dd.device_reconnect_window_ms,
        handshake_timeout_ms,
        overload_commit_ms: handshake_timeout_ms / 4,
        header_read_timeout_ms: int("header_read_timeout_ms", dd.header_read_timeout_ms),
        max_message_bytes: size("max_message_bytes", dd.max_message_bytes),
        send_queue: size("send_queue", dd.send_queue),
        send_queue_bytes: size("send_queue_bytes", dd.send_queue_bytes.max(2 * max_payload_bytes)),
        sync_buffer_bytes: size("sync_buffer_bytes", dd.sync_buffer_bytes),
        max_connections: size("max_connections", dd.max_connections),
        device_nice: dd.device_nice,
        drain_rate: rate("drain_rate", dd.drain_rate),
        drain_timeout_ms: int("drain_timeout_ms", dd.drain_timeout_ms),
        retain_count: int("retain_count", dd.retain_count),
        retain_ms: int("retain_ms", dd.retain_ms),
        max_payload_bytes,
        idempotency_ms: int("idempotency_ms", dd.idempotency_ms),
        idempotency_keys: int("idempotency_keys", dd.idempotency_keys),
    };
    let name = get("name").and_then(toml::Value::as_str).map(str::to_string);
    let start = match (get("join").and_then(toml::Value::as_str), get("standby").and_then(toml::Value::as_bool)) {
        (Some(_), Some(true)) => return None,
        (Some(addr), _) => Start::Join(addr.to_string()),
        (None, Some(true)) => Start::Standby,
        (None, _) => Start::Bootstrap,
    };
    let name_chars = |n: &str| n.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
    let durations = [
        t.lease_ms,
        t.sweep_ms,
        t.election_timeout_ms,
        t.heartbeat_ms,
        t.propose_timeout_ms,
        d.ping_ms,
        d.idle_ms,
        d.handshake_timeout_ms,
        d.header_read_timeout_ms,
        d.drain_timeout_ms,
        d.retain_ms,
        d.idempotency_ms,
    ];
    let rules = [
        name.as_deref().is_none_or(|n| (1..=64).contains(&n.len()) && name_chars(n)),
        durations.iter().all(|ms| *ms <= MAX_DURATION_MS),
        t.max_voters % 2 == 1 && t.max_voters <= 7,
        t.heartbeat_ms > 0 && t.election_timeout_ms >= t.heartbeat_ms.saturating_mul(2),
        t.lease_ms >= t.heartbeat_ms.saturating_mul(3)
            && t.lease_ms >= 300
            && t.lease_ms >= t.election_timeout_ms.saturating_mul(8),
        t.sweep_ms > 0 && t.sweep_ms <= t.lease_ms,
        d.ping_ms > 0 && d.idle_ms > d.ping_ms,
        (0.01..=1e9).contains(&d.admit_rate) && d.admit_burst > 0 && (0.01..=1e9).contains(&d.drain_rate),
        d.retain_count > 0 && d.retain_ms > 0,
        (2..=MAX_PAYLOAD_LIMIT).contains(&d.max_payload_bytes) && d.send_queue_bytes >= 2 * d.max_payload_bytes,
        d.handshake_timeout_ms > 0 && d.header_read_timeout_ms > 0 && d.send_queue > 0,
        (128..=16 << 20).contains(&d.max_message_bytes),
        ((256 << 10)..=1 << 40).contains(&d.sync_buffer_bytes),
        t.snapshot_logs > 0 && t.propose_timeout_ms > 0,
    ];
    let log_format = match get("log_format").and_then(toml::Value::as_str) {
        Some("json") => LogFormat::Json,
        _ => LogFormat::Text,
    };
    let mut cfg = Config::merge(FileConfig::default(), FileConfig::default()).expect("the defaults are valid");
    (cfg.name, cfg.start, cfg.timing, cfg.device, cfg.log_format) = (name, start, t, d, log_format);
    rules.iter().all(|ok| *ok).then_some(cfg)
}

/// The merge answers what the rules say, and an accepted config holds the merged values.
fn merges_as_documented(flags: FileConfig, file: FileConfig, want: Option<Config>) -> Result<(), TestCaseError> {
    match (Config::merge(flags, file), want) {
        (Ok(got), Some(want)) => {
            prop_assert_eq!((&got.name, &got.start, &got.timing), (&want.name, &want.start, &want.timing));
            prop_assert_eq!(got.log_format, want.log_format);
            prop_assert_eq!(got.device, want.device);
        }
        (Err(ConfigError::Invalid(_)), None) => {}
        (got, want) => {
            prop_assert!(false, "merge: {:?}, the rules: {:?}", got.map(|c| c.timing), want.map(|c| c.timing))
        }
    }
    Ok(())
}

fn file_config(t: &toml::Table) -> Result<FileConfig, TestCaseError> {
    toml::from_str(&t.to_string()).map_err(|e| TestCaseError::fail(format!("{t}: {e}")))
}

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn config_merge_accepts_exactly_the_documented_ranges(flags in vec(knob(), 0..3), file in vec(knob(), 0..5)) {
        let (flags, file) = (table(flags), table(file));
        merges_as_documented(file_config(&flags)?, file_config(&file)?, expected(&flags, &file))?;
    }

    #[test]
    fn mutated_config_files_never_panic_and_merge_as_documented(
        file in vec(knob(), 1..8),
        // Digit edits mostly keep the syntax, so the merge sees their values; the others rarely do.
        edits in prop_oneof![vec((any::<Index>(), 0u8..2, select(&['0', '1', '5', '9'][..])), 1..3), char_edits()],
    ) {
        let text = edit_text(&table(file).to_string(), &edits);
        let Ok(parsed) = toml::from_str::<FileConfig>(&text) else { return Ok(()) };
        let generic: toml::Table = toml::from_str(&text).map_err(|e| TestCaseError::fail(e.to_string()))?;
        merges_as_documented(FileConfig::default(), parsed, expected(&toml::Table::new(), &generic))?;
    }

    #[test]
    fn config_files_refuse_unknown_keys_and_mistyped_values(
        file in vec(knob(), 0..4), unknown in "zz_[a-z_]{0,12}", at in any::<Index>(), pick in 0usize..4
    ) {
        let mut t = table(file);
        t.insert(unknown, toml::Value::Integer(1));
        prop_assert!(toml::from_str::<FileConfig>(&t.to_string()).is_err(), "unknown key accepted: {}", t);
        let (key, kind) = knobs()[at.index(knobs().len())];
        use toml::Value as V;
        let (s, b, f, a) = (V::String("1".into()), V::Boolean(true), V::Float(0.5), V::Array(vec![]));
        let wrong = match kind {
            "rate" => [s, b, a, V::Table(toml::Table::new())],
            "name" | "join" => [V::Integer(1), b, f, a],
            "bool" => [V::Integer(1), s, f, a],
            "format" => [V::Integer(1), b, f, V::String("xml".into())],
            _ => [s, b, f, V::Integer(-1)],
        };
        let t: toml::Table = [(key.to_string(), wrong[pick].clone())].into_iter().collect();
        prop_assert!(toml::from_str::<FileConfig>(&t.to_string()).is_err(), "mistyped value accepted: {}", t);
    }
}

// ---- device frames on the wire (RFC 6455 framing, read by ws::frames) ------------------------------

/// The largest frame payload the reader is given in these cases (below it: accepted).
const WIRE_MAX_FRAME: usize = 512;

/// A frame as a device might send it: header bits, opcode nibble, payload, mask.
fn wire_frame() -> impl Strategy<Value = (bool, u8, u8, Vec<u8>, Option<[u8; 4]>)> {
    (
        any::<bool>(),
        prop_oneof![8 => Just(0u8), 1 => 1u8..8],
        prop_oneof![6 => prop::sample::select(vec![0u8, 1, 2, 8, 9, 10]), 1 => 0u8..16],
        prop_oneof![4 => prop::collection::vec(any::<u8>(), 0..140), 1 => prop::collection::vec(any::<u8>(), 500..600)],
        any::<Option<[u8; 4]>>(),
    )
}

/// The frame's bytes, length in its shortest form.
fn wire_bytes((fin, rsv, opcode, payload, mask): &(bool, u8, u8, Vec<u8>, Option<[u8; 4]>)) -> Vec<u8> {
    let mut out = vec![(u8::from(*fin) << 7) | (rsv << 4) | opcode];
    let m = if mask.is_some() { 0x80 } else { 0 };
    match payload.len() {
        n if n < 126 => out.push(m | n as u8),
        n => {
            out.push(m | 126);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
    }
    let mut body = payload.clone();
    if let Some(mask) = mask {
        out.extend_from_slice(mask);
        fastwebsockets::unmask(&mut body, *mask);
    }
    out.extend_from_slice(&body);
    out
}

/// Whether the reader must accept the frame (RFC 6455 §5.2, §5.5; the size limit).
fn wire_valid((fin, rsv, opcode, payload, _): &(bool, u8, u8, Vec<u8>, Option<[u8; 4]>)) -> bool {
    let known = matches!(opcode, 0 | 1 | 2 | 8 | 9 | 10);
    let control = *opcode >= 8;
    let ping_fits = *opcode != 9 || payload.len() <= 125;
    *rsv == 0 && known && (*fin || !control) && ping_fits && payload.len() < WIRE_MAX_FRAME
}

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn device_frames_are_read_exactly_or_refused_within_one_frame_of_memory(
        frames in prop::collection::vec(wire_frame(), 0..6),
        noise in prop::collection::vec(any::<u8>(), 0..40),
    ) {
        let mut bytes: Vec<u8> = frames.iter().flat_map(wire_bytes).collect();
        bytes.extend_from_slice(&noise);
        let rt = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
        let (read, largest) = largest_allocation(|| {
            rt.block_on(async {
                let mut reader = gateway::ws::frames::FrameReader::new(&bytes[..], WIRE_MAX_FRAME);
                let mut read = Vec::new();
                while let Ok(f) = reader.read_frame().await {
                    read.push((f.fin, f.opcode as u8, f.payload));
                }
                read
            })
        });
        // Every frame up to the first invalid one comes back exactly, unmasked.
        let expected: Vec<_> = frames.iter().take_while(|f| wire_valid(f)).map(|(fin, _, op, p, _)| (*fin, *op, p.clone())).collect();
        prop_assert!(read.len() >= expected.len());
        prop_assert_eq!(&read[..expected.len()], &expected[..]);
        if expected.len() < frames.len() {
            prop_assert_eq!(read.len(), expected.len(), "a frame after an invalid one was read");
        }
        // Whatever the bytes, the reader asked for no more than one frame under the limit and its header.
        prop_assert!(largest <= WIRE_MAX_FRAME + 14, "largest allocation {} bytes", largest);
    }
}
