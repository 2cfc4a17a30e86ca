//! The retry loop's decisions, with scripted attempts in place of Raft.

use std::cell::Cell;
use std::time::Duration;

use openraft::errors::PreconditionFailed;
use openraft::errors::{ChangeMembershipError, ClientWriteError, ForwardToLeader, InProgress, RaftError};

use super::{classify, retry, MembershipError, Next};
use crate::raft::types::TypeConfig;

type WriteError = RaftError<TypeConfig, ClientWriteError<TypeConfig>>;

fn in_progress() -> WriteError {
    let e = ChangeMembershipError::InProgress(InProgress { committed: None, membership_log_id: None });
    RaftError::APIError(ClientWriteError::ChangeMembershipError(e))
}

/// What the second step of a joint change answers when another change landed between its steps.
fn overtaken() -> WriteError {
    let e = PreconditionFailed::LastMembershipLogIdMismatch { expected: None, actual: None };
    RaftError::APIError(ClientWriteError::PreconditionFailed(e))
}

fn moved() -> WriteError {
    RaftError::APIError(ClientWriteError::ForwardToLeader(ForwardToLeader::empty()))
}

#[test]
fn a_change_overtaken_between_its_steps_is_planned_again() {
    assert_eq!(classify(&overtaken()), Next::Replan);
    assert_eq!(classify(&in_progress()), Next::Replan);
    assert_eq!(classify(&moved()), Next::NotLeader);
}

#[tokio::test]
async fn an_overtaken_change_whose_goal_now_holds_is_done() {
    // The first attempt is overtaken (by a change that reached the same goal); the second plan
    // finds nothing left to do.
    let plans = Cell::new(0);
    let out = retry(Duration::from_secs(10), || {
        plans.set(plans.get() + 1);
        (plans.get() == 1).then_some(async { Err::<(), _>(overtaken()) })
    })
    .await;
    assert!(out.is_ok(), "{out:?}");
    assert_eq!(plans.get(), 2);
}

#[tokio::test]
async fn an_overtaken_change_whose_goal_is_not_reached_is_proposed_again() {
    let plans = Cell::new(0);
    let out = retry(Duration::from_secs(10), || {
        plans.set(plans.get() + 1);
        let n = plans.get();
        Some(async move {
            if n < 3 {
                Err(overtaken())
            } else {
                Ok(())
            }
        })
    })
    .await;
    assert!(out.is_ok(), "{out:?}");
    assert_eq!(plans.get(), 3);
}

#[tokio::test]
async fn a_move_of_leadership_stops_the_change() {
    let plans = Cell::new(0);
    let out = retry(Duration::from_secs(10), || {
        plans.set(plans.get() + 1);
        Some(async { Err::<(), _>(moved()) })
    })
    .await;
    assert!(matches!(out, Err(MembershipError::NotLeader)), "{out:?}");
    assert_eq!(plans.get(), 1);
}

#[tokio::test]
async fn a_change_that_never_gets_its_turn_times_out() {
    let timeout = Duration::from_millis(300);
    let out = retry(timeout, || Some(async { Err::<(), _>(in_progress()) })).await;
    assert!(matches!(out, Err(MembershipError::Timeout(t)) if t == timeout), "{out:?}");
}
