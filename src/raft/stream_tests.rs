//! The append stream over an in-memory pipe, with a scripted follower in place of openraft's
//! `Raft::stream_append`; and the HTTP fallback against a listener without the stream endpoint.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use openraft::entry::EntryPayload;
use openraft::error::Fatal;
use openraft::raft::StreamAppendError;
use tokio::sync::mpsc;

use super::*;
use crate::raft::types::{log_id, Entry, LogId, Vote};

const WAIT: Duration = Duration::from_secs(20);

/// An append of entries `prev + 1 ..= prev + n` (term 1, leader 1).
fn append(prev: u64, n: u64) -> Request {
    AppendEntriesRequest {
        vote: Vote::new_committed(1, 1),
        prev_log_id: (prev > 0).then(|| log_id(1, 1, prev)),
        leader_commit: None,
        entries: (prev + 1..=prev + n)
            .map(|i| Entry { log_id: log_id(1, 1, i), payload: EntryPayload::Blank })
            .collect(),
    }
}

fn last(req: &Request) -> Option<LogId> {
    req.entries.last().map(|e| e.log_id).or(req.prev_log_id)
}

fn whole(req: &Request) -> Result<(Vec<u8>, Option<usize>), RPCError<TypeConfig>> {
    Ok((encode(req).expect("encodes"), None))
}

type Answers = BoxStream<'static, Result<StreamAppendResult<TypeConfig>, Fatal<TypeConfig>>>;

/// A follower that answers every request at once with its last log id.
fn echo(input: BoxStream<'static, Request>) -> Answers {
    Box::pin(input.map(|r| Ok(Ok(last(&r)))))
}

/// Starts `serve` on one end of a pipe with `follow`; the other end, the count of requests it read
/// and the serving task.
fn follower<F, O>(limits: Limits, follow: F) -> (tokio::io::DuplexStream, Arc<AtomicUsize>, tokio::task::JoinHandle<()>)
where
    F: FnOnce(BoxStream<'static, Request>) -> O + Send + 'static,
    O: Stream<Item = Result<StreamAppendResult<TypeConfig>, Fatal<TypeConfig>>> + Send + 'static,
{
    let (leader, follower) = tokio::io::duplex(4 << 20);
    let read = Arc::new(AtomicUsize::new(0));
    let counter = read.clone();
    let on_request = move || {
        counter.fetch_add(1, Ordering::SeqCst);
    };
    let task = tokio::spawn(serve(follower, limits, follow, on_request, CancellationToken::new()));
    (leader, read, task)
}

/// The answers `pipeline` yields for `reqs` over `link`, errors as text.
async fn exchange(
    link: Link,
    slot: &mut Option<Link>,
    reqs: Vec<Request>,
    ttl: Duration,
) -> Vec<Result<Option<LogId>, String>> {
    let answers = pipeline(link, slot, futures_util::stream::iter(reqs), ttl, WAIT, "node-2".into(), whole);
    let answers = tokio::time::timeout(WAIT, answers.collect::<Vec<_>>()).await.expect("the stream ends");
    answers
        .into_iter()
        .map(|a| match a {
            Ok(Ok(id)) => Ok(id),
            Ok(Err(e)) => Err(format!("append error: {e}")),
            Err(e) => Err(format!("rpc error: {e}")),
        })
        .collect()
}

async fn until(what: &str, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn appends_go_out_before_the_earlier_ones_are_answered() {
    // This follower answers nothing until it holds three requests: a sender that waits for each
    // answer before the next request would never get one.
    let hold = |input: BoxStream<'static, Request>| {
        futures_util::stream::once(input.take(3).collect::<Vec<_>>())
            .flat_map(|reqs| futures_util::stream::iter(reqs.into_iter().map(|r| Ok(Ok(last(&r))))))
    };
    let (io, read, _task) = follower(Limits::default(), hold);
    let mut slot = None;
    let reqs = vec![append(0, 2), append(2, 2), append(4, 2)];
    let got = exchange(Link::new(io), &mut slot, reqs, WAIT).await;
    assert_eq!(got, vec![Ok(Some(log_id(1, 1, 2))), Ok(Some(log_id(1, 1, 4))), Ok(Some(log_id(1, 1, 6)))]);
    assert_eq!(read.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn a_fully_answered_connection_carries_the_next_stream() {
    let (io, read, _task) = follower(Limits::default(), echo);
    let mut slot = None;
    let first = exchange(Link::new(io), &mut slot, vec![append(0, 1), append(1, 3)], WAIT).await;
    assert_eq!(first, vec![Ok(Some(log_id(1, 1, 1))), Ok(Some(log_id(1, 1, 4)))]);
    let mut link = slot.take().expect("the link is kept");
    assert!(link.reusable());
    // A heartbeat: no entries, answered with the log id it names.
    let second = exchange(link, &mut slot, vec![append(4, 0)], WAIT).await;
    assert_eq!(second, vec![Ok(Some(log_id(1, 1, 4)))]);
    assert!(slot.is_some());
    assert_eq!(read.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn a_conflict_is_the_last_answer_and_closes_the_connection() {
    let conflict = |input: BoxStream<'static, Request>| {
        input.enumerate().map(|(i, r)| match i {
            0 => Ok(Ok(last(&r))),
            _ => Ok(Err(StreamAppendError::Conflict(r.prev_log_id.expect("has a prev")))),
        })
    };
    let (io, _read, task) = follower(Limits::default(), conflict);
    let mut slot = None;
    let got = exchange(Link::new(io), &mut slot, vec![append(0, 1), append(1, 1), append(2, 1)], WAIT).await;
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(got[0], Ok(Some(log_id(1, 1, 1))));
    assert!(got[1].as_ref().is_err_and(|e| e.contains("Conflict")), "{got:?}");
    assert!(slot.is_none(), "a stream that ended on an error leaves no connection to reuse");
    tokio::time::timeout(WAIT, task).await.expect("the follower closes").expect("no panic");
}

#[tokio::test]
async fn an_unanswered_append_fails_at_the_deadline() {
    let silent = |input: BoxStream<'static, Request>| input.filter_map(|_| async { None });
    let (io, _read, _task) = follower(Limits::default(), silent);
    let mut slot = None;
    let ttl = Duration::from_millis(200);
    let started = Instant::now();
    let got = exchange(Link::new(io), &mut slot, vec![append(0, 1)], ttl).await;
    assert!(started.elapsed() >= ttl);
    assert_eq!(got.len(), 1);
    assert!(got[0].as_ref().is_err_and(|e| e.contains("answered no append within 200 ms")), "{got:?}");
    assert!(slot.is_none());
}

#[tokio::test]
async fn an_unreadable_frame_closes_the_connection_without_an_answer() {
    let oversized = [0xff_u8, 0xff, 0xff, 0xff];
    for bad in [&b"\x00\x00\x00\x05\x01junk"[..], &oversized[..]] {
        let (io, read, task) = follower(Limits::default(), echo);
        let (mut rd, mut wr) = tokio::io::split(io);
        tokio::io::AsyncWriteExt::write_all(&mut wr, bad).await.expect("writes");
        tokio::time::timeout(WAIT, task).await.expect("the follower closes").expect("no panic");
        let mut rest = Vec::new();
        tokio::io::AsyncReadExt::read_to_end(&mut rd, &mut rest).await.expect("reads to the close");
        assert!(rest.is_empty(), "no answer to an unreadable frame");
        assert_eq!(read.load(Ordering::SeqCst), 0);
    }
}

#[tokio::test]
async fn a_leader_that_reads_no_answers_is_closed_after_the_idle_limit() {
    // A pipe that holds a few answers; the leader keeps sending and never reads.
    let (leader, follower_end) = tokio::io::duplex(256);
    let idle = Duration::from_millis(300);
    let limits = Limits { idle, ..Limits::default() };
    let task = tokio::spawn(serve(follower_end, limits, echo, || {}, CancellationToken::new()));
    let (_unread, wr) = tokio::io::split(leader);
    let mut out = FramedWrite::new(wr, codec());
    let sender = tokio::spawn(async move {
        let mut prev = 0;
        while out.send(Bytes::from(encode(&append(prev, 1)).expect("encodes"))).await.is_ok() {
            prev += 1;
        }
    });
    tokio::time::timeout(WAIT, task).await.expect("the follower gives up on the leader").expect("no panic");
    sender.abort();
}

#[tokio::test]
async fn a_follower_reads_no_more_unanswered_bytes_than_its_budget() {
    let req = append(0, 1);
    let frame = encode(&req).expect("encodes").len();
    // Room for three of these requests unanswered, not four.
    let limits = Limits { in_flight: frame * 3 + frame / 2, idle: WAIT };
    let (go, gate) = mpsc::unbounded_channel::<()>();
    let gated = move |mut input: BoxStream<'static, Request>| {
        // Like openraft, take requests as fast as they come; answer one per message on `go`.
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Some(r) = input.next().await {
                if tx.send(r).is_err() {
                    break;
                }
            }
        });
        futures_util::stream::unfold((rx, gate), |(mut rx, mut gate)| async move {
            gate.recv().await?;
            let r = rx.recv().await?;
            Some((Ok(Ok(last(&r))), (rx, gate)))
        })
    };
    let (io, read, _task) = follower(limits, gated);
    let mut out = FramedWrite::new(io, codec());
    for _ in 0..6 {
        out.send(Bytes::from(encode(&req).expect("encodes"))).await.expect("the pipe takes it");
    }
    let count = || read.load(Ordering::SeqCst);
    until("three requests read", || count() == 3).await;
    let fourth = tokio::time::timeout(Duration::from_millis(300), until("a fourth", || count() > 3)).await;
    assert!(fourth.is_err(), "a fourth request was read while three were unanswered");
    go.send(()).expect("the follower listens");
    until("a fourth request once one is answered", || count() == 4).await;
}

#[tokio::test]
async fn a_node_without_the_stream_endpoint_gets_one_request_per_append() {
    use crate::http::HttpClient;
    use crate::machine::Member;
    use crate::raft::network::Network;
    use openraft::network::{RPCOption, RaftNetworkFactory, RaftNetworkV2};
    use openraft::raft::AppendEntriesResponse;

    // An older node: no stream endpoint (404), appends one request each.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("binds");
    let addr = listener.local_addr().expect("has an address");
    let seen = Arc::new(Mutex::new(Vec::<String>::new()));
    let log = seen.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let log = log.clone();
            let svc = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                let log = log.clone();
                async move {
                    let path = req.uri().path().to_string();
                    log.lock().expect("not poisoned").push(path.clone());
                    let body = http_body_util::BodyExt::collect(req.into_body()).await.map(|b| b.to_bytes());
                    let (status, answer) = match (path.as_str(), body) {
                        ("/raft/v2/append", Ok(body)) if decode::<Request>(&body).is_ok() => {
                            let ok = Ok::<_, openraft::error::RaftError<TypeConfig>>(
                                AppendEntriesResponse::<TypeConfig>::Success,
                            );
                            (200, encode(&ok).expect("encodes"))
                        }
                        _ => (404, b"{\"error\":\"not_found\"}".to_vec()),
                    };
                    let resp =
                        hyper::Response::builder().status(status).body(http_body_util::Full::new(Bytes::from(answer)));
                    Ok::<_, std::convert::Infallible>(resp.expect("static parts"))
                }
            });
            let conn =
                hyper::server::conn::http1::Builder::new().serve_connection(hyper_util::rt::TokioIo::new(tcp), svc);
            tokio::spawn(conn);
        }
    });
    let member = Member { name: "node-2".into(), cluster_addr: addr.to_string().into(), public_url: "".into() };
    let mut peer = Network::new(HttpClient::new(b"secret")).new_client(2, &member).await;
    let reqs = futures_util::stream::iter(vec![append(0, 1), append(1, 2)]);
    let answers = peer.stream_append(reqs, RPCOption::new(WAIT)).await.expect("falls back to requests");
    let got: Vec<_> = tokio::time::timeout(WAIT, answers.collect::<Vec<_>>()).await.expect("the stream ends");
    let got: Vec<_> = got.into_iter().map(|a| a.map_err(|e| e.to_string())).collect();
    assert_eq!(got, vec![Ok(Ok(Some(log_id(1, 1, 1)))), Ok(Ok(Some(log_id(1, 1, 3))))]);
    let paths = seen.lock().expect("not poisoned").clone();
    assert_eq!(paths, ["/raft/v2/stream", "/raft/v2/append", "/raft/v2/append"]);
}

#[tokio::test]
async fn a_connection_the_follower_closes_while_idle_ends_the_stream_quietly() {
    let idle = QUIET_CLOSE_AFTER + Duration::from_millis(200);
    let (io, _read, task) = follower(Limits { idle, ..Limits::default() }, echo);
    let mut slot = None;
    // A replication stream: one append, then nothing more for now (the input stays open).
    let input = futures_util::stream::iter([append(0, 1)]).chain(futures_util::stream::pending());
    let answers = pipeline(Link::new(io), &mut slot, input, WAIT, WAIT, "node-2".into(), whole);
    let got = tokio::time::timeout(WAIT, answers.collect::<Vec<_>>()).await.expect("the stream ends");
    let got: Vec<_> = got.into_iter().map(|a| a.map_err(|e| e.to_string())).collect();
    assert_eq!(
        got,
        vec![Ok(Ok(Some(log_id(1, 1, 1))))],
        "the close is no error: openraft opens the next stream at once"
    );
    assert!(slot.is_none());
    tokio::time::timeout(WAIT, task).await.expect("the follower closed").expect("no panic");
}

#[tokio::test]
async fn a_stream_idle_past_its_limit_ends_quietly_and_drops_its_connection() {
    // The follower would wait much longer: the leader's end goes first, so no request of the
    // leader's can meet a connection the follower is closing.
    let (io, _read, task) = follower(Limits { idle: WAIT * 2, ..Limits::default() }, echo);
    let mut slot = None;
    let idle = Duration::from_millis(300);
    let input = futures_util::stream::iter([append(0, 1)]).chain(futures_util::stream::pending());
    let started = Instant::now();
    let answers = pipeline(Link::new(io), &mut slot, input, WAIT, idle, "node-2".into(), whole);
    let got = tokio::time::timeout(WAIT, answers.collect::<Vec<_>>()).await.expect("the stream ends");
    assert!(started.elapsed() >= idle);
    let got: Vec<_> = got.into_iter().map(|a| a.map_err(|e| e.to_string())).collect();
    assert_eq!(got, vec![Ok(Ok(Some(log_id(1, 1, 1))))]);
    assert!(slot.is_none(), "an idle stream's connection is dropped, not kept");
    tokio::time::timeout(WAIT, task).await.expect("the follower sees the close").expect("no panic");
}
