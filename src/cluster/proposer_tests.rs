use super::*;
use crate::machine::claim::Release;
use crate::machine::lease::Renew;
use crate::machine::Publish;

/// A command whose caller waits for its reply (for ever: the receiver is leaked, so the reply
/// stays wanted).
fn pending(cmd: Command) -> Pending {
    let (reply, rx) = oneshot::channel();
    std::mem::forget(rx);
    Pending { cmd, waiter: Waiter { local_only: false, reply, _bytes: None } }
}

/// A command whose caller stopped waiting (timed out, or went away).
fn abandoned(cmd: Command) -> Pending {
    let (reply, _) = oneshot::channel();
    Pending { cmd, waiter: Waiter { local_only: false, reply, _bytes: None } }
}

type Sent = (bool, Vec<Command>, OwnedSemaphorePermit);

/// Records each batch with its slot, which it keeps: no batch here ever finishes.
fn record(urgent: bool, out: mpsc::UnboundedSender<Sent>) -> impl FnMut(Vec<Pending>, OwnedSemaphorePermit) {
    move |batch, permit| {
        let _ = out.send((urgent, batch.into_iter().map(|p| p.cmd).collect(), permit));
    }
}

/// A disconnect wave: thousands of releases queued and every bulk slot taken by a batch that
/// does not finish. A renewal still goes out at once, alone in its batch.
#[tokio::test]
async fn a_renewal_goes_out_alone_while_releases_hold_every_bulk_slot() {
    let (tx, rx) = mpsc::channel(16 * MAX_BATCH);
    let (urgent_tx, urgent_rx) = mpsc::channel(MAX_BATCH);
    for i in 0..3 * MAX_BATCH {
        tx.send(pending(Command::Release(Release { device: format!("d{i}"), conn: 1 }))).await.unwrap();
    }
    let (out, mut sent) = mpsc::unbounded_channel::<Sent>();
    let cancel = CancellationToken::new();
    tokio::spawn(batches(rx, cancel.clone(), None, Counter::default(), record(false, out.clone())));
    tokio::spawn(batches(urgent_rx, cancel.clone(), None, Counter::default(), record(true, out)));
    let mut held = Vec::new();
    for _ in 0..MAX_IN_FLIGHT {
        let (urgent, cmds, permit) = sent.recv().await.unwrap();
        assert!(!urgent);
        assert_eq!(cmds.len(), MAX_BATCH, "a bulk batch is full");
        held.push(permit);
    }
    let renew = Renew { node: 7, at_ms: 0, lease_ms: 10_000, connections: 0, draining: false, incarnation: 1 };
    urgent_tx.send(pending(Command::Renew(renew))).await.unwrap();
    let (urgent, cmds, _) = tokio::time::timeout(Duration::from_secs(10), sent.recv())
        .await
        .expect("the renewal waited behind the bulk slots")
        .unwrap();
    assert!(urgent);
    assert!(matches!(cmds.as_slice(), [Command::Renew(r)] if r.node == 7), "the renewal goes alone: {cmds:?}");
    cancel.cancel();
    drop(held);
}

fn release(i: usize) -> Command {
    Command::Release(Release { device: format!("d{i}"), conn: 1 })
}

/// Starts a bulk loop whose last commit answered `answered` callers.
fn filling(answered: usize) -> (mpsc::Sender<Pending>, mpsc::UnboundedReceiver<Sent>, Arc<Fill>) {
    let (tx, rx) = mpsc::channel(16 * MAX_BATCH);
    let (out, sent) = mpsc::unbounded_channel::<Sent>();
    let fill = Arc::new(Fill::default());
    if answered > 0 {
        fill.committed(answered);
    }
    tokio::spawn(batches(rx, CancellationToken::new(), Some(fill.clone()), Counter::default(), record(false, out)));
    (tx, sent, fill)
}

/// Three callers were answered by the last commit; the first comes back alone, the other two a
/// moment later: the batch waits for them and carries all three.
#[tokio::test(start_paused = true)]
async fn a_batch_waits_for_the_callers_the_last_commit_answered() {
    let (tx, mut sent, _) = filling(3);
    tx.send(pending(release(0))).await.unwrap();
    tokio::time::sleep(Duration::from_micros(300)).await;
    assert!(sent.try_recv().is_err(), "the batch went out before the other callers came back");
    tx.send(pending(release(1))).await.unwrap();
    tx.send(pending(release(2))).await.unwrap();
    let (_, cmds, _) = sent.recv().await.unwrap();
    assert_eq!(cmds.len(), 3, "{cmds:?}");
}

/// Two groups of callers: while the batch waits for the first group, the other batch in flight
/// commits; its callers are waited for as well, and both groups share one entry.
#[tokio::test(start_paused = true)]
async fn callers_answered_while_a_batch_waits_join_it() {
    let (tx, mut sent, fill) = filling(2);
    tx.send(pending(release(0))).await.unwrap();
    tokio::time::sleep(Duration::from_micros(100)).await;
    fill.committed(2);
    for i in 1..4 {
        tx.send(pending(release(i))).await.unwrap();
    }
    let (_, cmds, _) = sent.recv().await.unwrap();
    assert_eq!(cmds.len(), 4, "{cmds:?}");
}

/// A caller that does not come back holds the batch for MAX_LINGER, no longer; with nobody
/// answered (one client, the first write) or one (a single client) nothing waits.
#[tokio::test(start_paused = true)]
async fn a_batch_waits_no_longer_than_the_linger() {
    for (answered, waits) in [(4, MAX_LINGER), (1, Duration::ZERO), (0, Duration::ZERO)] {
        let (tx, mut sent, _) = filling(answered);
        let start = tokio::time::Instant::now();
        tx.send(pending(release(0))).await.unwrap();
        let (_, cmds, _) = sent.recv().await.unwrap();
        assert_eq!((cmds.len(), start.elapsed()), (1, waits), "answered {answered}");
    }
}

fn device(cmd: &Command) -> &str {
    match cmd {
        Command::Release(r) => &r.device,
        Command::Publish(p) => &p.device,
        other => panic!("{other:?}"),
    }
}

/// After a stall the queue holds commands whose callers were told `Timeout` and left: they are
/// dropped, not written, wherever they are in the queue.
#[tokio::test(start_paused = true)]
async fn commands_whose_callers_gave_up_are_not_batched() {
    let (tx, rx) = mpsc::channel(16 * MAX_BATCH);
    for i in 0..6 {
        tx.send(if i % 2 == 0 { abandoned(release(i)) } else { pending(release(i)) }).await.unwrap();
    }
    let (out, mut sent) = mpsc::unbounded_channel::<Sent>();
    let abandoned = Counter::default();
    tokio::spawn(batches(rx, CancellationToken::new(), None, abandoned.clone(), record(false, out)));
    let (_, cmds, _) = sent.recv().await.unwrap();
    assert_eq!(cmds.iter().map(device).collect::<Vec<_>>(), ["d1", "d3", "d5"]);
    assert_eq!(abandoned.get(), 3, "counted in gateway_propose_abandoned_total");
}

/// A publish of the largest payload (1 MiB).
fn big_publish(i: usize) -> Command {
    let payload = format!("\"{}\"", "x".repeat(crate::config::MAX_PAYLOAD_LIMIT - 2));
    let (keep_count, keep_age_ms, keep_key_ms, max_keys) = (100, 60_000, 60_000, 100);
    let device = format!("d{i}");
    Command::Publish(Publish { device, payload, key: None, at_ms: 0, keep_count, keep_age_ms, keep_key_ms, max_keys })
}

/// Nothing takes from the queue (a quorum loss): it fills to its bytes, not to its 16,384
/// commands; the next caller waits for room within its deadline and is told `Timeout` with
/// nothing queued; a queued command answered makes room for the next.
#[tokio::test(start_paused = true)]
async fn the_queue_holds_at_most_its_bytes_and_a_caller_waits_for_room_within_its_deadline() {
    let (tx, mut rx) = mpsc::channel(16 * MAX_BATCH);
    let (urgent, _urgent_rx) = mpsc::channel(MAX_BATCH);
    let timeout = Duration::from_secs(5);
    let p =
        Proposer { tx, urgent, bytes: Arc::new(Semaphore::new(QUEUED_BYTES)), timeout, writing: TaskTracker::new() };
    let fit = QUEUED_BYTES / big_publish(0).weight();
    assert_eq!(fit, 15, "sixteen batches of 1 MiB hold fifteen publishes of 1 MiB and their devices");
    let deadline = tokio::time::Instant::now() + timeout;
    let mut callers = Vec::new();
    for i in 0..fit {
        callers.push(p.enqueue(big_publish(i), false, deadline, timeout).await.expect("room"));
    }
    let started = tokio::time::Instant::now();
    let full = p.propose(big_publish(fit)).await;
    assert!(matches!(full, Err(ProposeError::Timeout(5000))), "{full:?}");
    assert_eq!(started.elapsed(), timeout, "it waited its deadline for room");
    // A claim-sized command still fits in what the publishes left.
    let deadline = tokio::time::Instant::now() + timeout;
    callers.push(p.enqueue(release(99), false, deadline, timeout).await.expect("room for a release"));
    // The first publish is answered: room for the next, at once.
    let first = rx.recv().await.unwrap();
    assert_eq!(device(&first.cmd), "d0");
    drop(first);
    let started = tokio::time::Instant::now();
    callers.push(p.enqueue(big_publish(fit + 1), false, deadline, timeout).await.expect("room after an answer"));
    assert_eq!(started.elapsed(), Duration::ZERO);
    let mut queued = Vec::new();
    while let Ok(q) = rx.try_recv() {
        queued.push(device(&q.cmd).to_string());
    }
    let want: Vec<String> = (1..fit).map(|i| format!("d{i}")).chain(["d99".into(), format!("d{}", fit + 1)]).collect();
    assert_eq!(queued, want, "the publish that timed out was never queued");
}

/// A refused batch keeps each command with its own caller when some callers leave it (gave up,
/// or wait for a leader duty a follower must not forward), whether Raft still shares the
/// commands or not.
#[test]
fn a_batch_split_keeps_each_command_with_its_caller_in_order() {
    for shared in [false, true] {
        let (cmds, mut batch): (Vec<Command>, Vec<Waiter>) = (0..6)
            .map(|i| {
                let mut p = if i % 3 == 1 { abandoned(release(i)) } else { pending(release(i)) };
                p.waiter.local_only = i % 3 == 2;
                p.split()
            })
            .unzip();
        let mut cmds = Arc::new(cmds);
        let raft_share = shared.then(|| cmds.clone());
        let local = split_off(&mut cmds, &mut batch, |w| !w.local_only);
        assert_eq!(local.len(), 2);
        assert!(local.iter().all(|w| w.local_only));
        let gave_up = split_off(&mut cmds, &mut batch, |w| !w.reply.is_closed());
        assert_eq!(gave_up.len(), 2);
        assert!(gave_up.iter().all(|w| w.reply.is_closed()));
        let kept: Vec<&str> = cmds.iter().map(device).collect();
        assert_eq!(kept, [device(&release(0)), device(&release(3))], "shared: {shared}");
        assert!(batch.iter().all(|w| !w.local_only && !w.reply.is_closed()));
        assert!(split_off(&mut cmds, &mut batch, |_| true).is_empty());
        assert_eq!(cmds.len(), batch.len());
        if let Some(share) = raft_share {
            assert_eq!(share.len(), 6, "what Raft holds is not changed under it");
        }
    }
}
