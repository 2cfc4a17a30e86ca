//! `gateway scale-in` and `gateway events` (issue 15). Scale-in is serial and printed step by
//! step: take the cluster's scale-in lock (which checks quorum and capacity), drain the node (503
//! and out of the ring; its devices move at its drain rate), wait for zero connections and zero
//! routes on it, remove it from the membership, release the lock. The lock is extended while the
//! run lasts and lapses by itself if this process dies.

use std::time::{Duration, Instant};

use super::admin::{Admin, AdminError};
use crate::wire::{EventView, EventsReply, MemberStatus, ScaleInLockRequest, ScaleInUnlockRequest, StatusReport};

/// What `gateway scale-in` was asked.
#[derive(Debug, Clone)]
pub struct ScaleIn {
    pub cluster: String,
    /// Name or id of the node to remove.
    pub node: String,
    pub force: bool,
    /// The lock lapses this long after its last extension (a crashed CLI frees it then).
    pub lock_ttl: Duration,
    /// Give up (and release the lock) when the node still holds routes after this long.
    pub timeout: Duration,
}

/// How long between two looks at the cluster.
const POLL: Duration = Duration::from_millis(200);

impl Admin {
    /// `GET /cluster/events?after=S`.
    pub async fn events(&self, addr: &str, after: u64) -> Result<EventsReply, AdminError> {
        let res = self.http().get(addr, &format!("/cluster/events?after={after}"), Duration::from_secs(10)).await;
        self.parse(addr, res).await
    }

    async fn lock(&self, addr: &str, req: &ScaleInLockRequest) -> Result<serde_json::Value, AdminError> {
        let res = self.http().post_json(addr, "/cluster/scale-in/lock", req, Duration::from_secs(30)).await;
        self.parse(addr, res).await
    }

    async fn unlock(&self, addr: &str, req: &ScaleInUnlockRequest) -> Result<serde_json::Value, AdminError> {
        let res = self.http().post_json(addr, "/cluster/scale-in/unlock", req, Duration::from_secs(30)).await;
        self.parse(addr, res).await
    }

    /// Runs a serial scale-in, reporting each step through `say`.
    pub async fn scale_in(&self, job: &ScaleIn, say: &mut (dyn FnMut(&str) + Send)) -> Result<(), AdminError> {
        let started = Instant::now();
        let status = self.status(&job.cluster).await?;
        let target = find(&status, &job.node)
            .ok_or_else(|| {
                AdminError::Other(format!("{} is not a member of the cluster at {}", job.node, job.cluster))
            })?
            .clone();
        // Talk to a member that stays: the target exits once drained.
        let via = status
            .members
            .iter()
            .filter(|m| m.id != target.id && m.state == "live")
            .map(|m| m.cluster_addr.clone())
            .next()
            .ok_or_else(|| AdminError::Other("no other live member to run the scale-in through".into()))?;
        let owner: u64 = rand::random();
        let ttl_ms = job.lock_ttl.as_millis() as u64;
        let req = ScaleInLockRequest { node: target.id, owner, ttl_ms, force: job.force };
        say(&format!(
            "step 1/4: lock: checking quorum and capacity for removing {} (id {}, {} connections, {} routes)",
            target.name, target.id, target.connections, target.routes
        ));
        self.lock(&via, &req).await?;
        say(&format!(
            "  locked: no other scale-in may start (the lock lapses {} s after this run stops)",
            ttl_ms / 1000
        ));
        let outcome = self.drain_and_remove(job, &target, &via, &req, started, say).await;
        let done = if outcome.is_ok() { "done" } else { "aborted" };
        let unlock = ScaleInUnlockRequest { node: target.id, owner, outcome: done.into() };
        if let Err(e) = self.unlock(&via, &unlock).await {
            say(&format!("  releasing the lock failed ({e}); it lapses by itself in {} s", ttl_ms / 1000));
        }
        outcome?;
        say(&format!("done: {} removed in {:.1} s", target.name, started.elapsed().as_secs_f64()));
        Ok(())
    }

    async fn drain_and_remove(
        &self,
        job: &ScaleIn,
        target: &MemberStatus,
        via: &str,
        lock: &ScaleInLockRequest,
        started: Instant,
        say: &mut (dyn FnMut(&str) + Send),
    ) -> Result<(), AdminError> {
        say(&format!("step 2/4: drain {}: 503 to new handshakes, out of the ring, devices told to move", target.name));
        self.drain(&target.cluster_addr).await?;
        say("step 3/4: moving devices at the node's drain rate");
        let deadline = started + job.timeout;
        let mut extended = Instant::now();
        let mut last = None;
        loop {
            if extended.elapsed() >= job.lock_ttl / 3 {
                self.lock(via, lock).await?;
                extended = Instant::now();
            }
            // Connections: the node's own count while it answers (it exits when drained).
            let here = match self.status(&target.cluster_addr).await {
                Ok(s) => s.connections_here,
                Err(AdminError::Http(_)) => Some(0),
                Err(e) => return Err(e),
            };
            let cluster = self.status(via).await?;
            let routes = find(&cluster, &target.id.to_string()).map_or(0, |m| m.routes);
            let line = format!(
                "  connections left {}, routes left {routes}, elapsed {:.1} s",
                here.map_or("?".to_string(), |c| c.to_string()),
                started.elapsed().as_secs_f64()
            );
            if last.as_ref() != Some(&line) {
                say(&line);
                last = Some(line);
            }
            if here == Some(0) && routes == 0 {
                break;
            }
            if Instant::now() > deadline {
                return Err(AdminError::Other(format!(
                    "{} still holds {routes} routes after {:?}: aborting (the node stays drained; rerun to finish)",
                    target.name, job.timeout
                )));
            }
            tokio::time::sleep(POLL).await;
        }
        say(&format!("step 4/4: remove {} from the membership", target.name));
        let out = self.leave(via, &target.id.to_string()).await?;
        let names: Vec<&str> = out.membership.voters.iter().map(|(_, n)| n.as_str()).collect();
        say(&format!("  membership: voters [{}]", names.join(", ")));
        Ok(())
    }

    /// Prints the events after `after` through `say`; with `follow`, polls for new ones every
    /// `every` until `stop` resolves. Returns the last seq printed.
    pub async fn print_events(
        &self,
        addr: &str,
        mut after: u64,
        follow: Option<Duration>,
        say: &mut (dyn FnMut(&EventView) + Send),
    ) -> Result<u64, AdminError> {
        loop {
            let page = self.events(addr, after).await?;
            // The log keeps the newest 256: a cursor older than that skips what was dropped.
            for e in &page.events {
                say(e);
                after = e.seq;
            }
            match follow {
                Some(every) if page.events.is_empty() => tokio::time::sleep(every).await,
                Some(_) => {}
                None => return Ok(after),
            }
        }
    }
}

fn find<'a>(status: &'a StatusReport, name_or_id: &str) -> Option<&'a MemberStatus> {
    status.members.iter().find(|m| m.name == name_or_id || m.id.to_string() == name_or_id)
}
