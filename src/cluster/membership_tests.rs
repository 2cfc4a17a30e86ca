//! The retry loop's decisions, with scripted proposals in place of Raft: each test says how many
//! changes reach the goal and what each proposal answers (see [`run`]).

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
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

/// What a scripted proposal answers, and how many steps toward the goal it moved.
type Answer = (Result<(), fn() -> WriteError>, u32);

/// A scripted membership: `steps` changes reach the goal; each proposal answers the next of
/// `answers` and moves the membership that many steps (a refused proposal may have been overtaken
/// by a change that moved it). Returns the outcome and how many proposals were made.
async fn run(steps: u32, answers: Vec<Answer>) -> (Result<(), MembershipError>, usize) {
    let left = Cell::new(steps);
    let answers = RefCell::new(VecDeque::from(answers));
    let proposals = Cell::new(0);
    let out = retry(Duration::from_secs(10), || {
        (left.get() > 0).then(|| {
            proposals.set(proposals.get() + 1);
            let (answer, moved_by) = answers.borrow_mut().pop_front().expect("a scripted answer");
            left.set(left.get().saturating_sub(moved_by));
            async move { answer.map_err(|e| e()) }
        })
    })
    .await;
    (out, proposals.get())
}

#[test]
fn a_change_overtaken_between_its_steps_is_planned_again() {
    assert_eq!(classify(&overtaken()), Next::Replan);
    assert_eq!(classify(&in_progress()), Next::Replan);
    assert_eq!(classify(&moved()), Next::NotLeader);
}

#[tokio::test]
async fn an_overtaken_change_whose_goal_now_holds_is_done() {
    // The leave's second step is refused, but the change that overtook it reached the same goal.
    let (out, proposals) = run(1, vec![(Err(overtaken), 1)]).await;
    assert!(out.is_ok(), "{out:?}");
    assert_eq!(proposals, 1);
}

#[tokio::test]
async fn an_overtaken_change_whose_goal_is_not_reached_is_proposed_again() {
    let (out, proposals) = run(1, vec![(Err(overtaken), 0), (Err(in_progress), 0), (Ok(()), 1)]).await;
    assert!(out.is_ok(), "{out:?}");
    assert_eq!(proposals, 3);
}

#[tokio::test]
async fn a_change_that_only_settled_a_joint_configuration_goes_on() {
    // The first success only settled a joint configuration; the goal needs one more change.
    let (out, proposals) = run(2, vec![(Ok(()), 1), (Ok(()), 1)]).await;
    assert!(out.is_ok(), "{out:?}");
    assert_eq!(proposals, 2);
}

#[tokio::test]
async fn a_move_of_leadership_stops_the_change() {
    let (out, proposals) = run(1, vec![(Err(moved), 0)]).await;
    assert!(matches!(out, Err(MembershipError::NotLeader)), "{out:?}");
    assert_eq!(proposals, 1);
}

#[tokio::test]
async fn a_change_that_never_gets_its_turn_times_out() {
    let timeout = Duration::from_millis(300);
    let out = retry(timeout, || Some(async { Err::<(), _>(in_progress()) })).await;
    assert!(matches!(out, Err(MembershipError::Timeout(t)) if t == timeout), "{out:?}");
}
