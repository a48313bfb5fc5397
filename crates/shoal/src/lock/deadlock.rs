//! Deadlock handling that does not depend on a lock table's data structure, shared by every
//! lock table: the prevention policies (no-wait; wait-die and wound-wait of Rosenkrantz,
//! Stearns and Lewis 1978), Dreadlocks (Koskinen and Herlihy; Kimura et al. 2012 §4.2,
//! Algorithm 5) with its waiting styles, and the victim rules of Kimura et al. 2012 §4.3.
//!
//! A table supplies what only it knows: *who blocks me* (a [`Blocker`] per transaction whose
//! granted mode, or whose waiting request ahead, conflicts with the waiting request), a way
//! to wake a waiting transaction, and the waiting itself. The policy decides: wait, die,
//! wound, or deadlock. The waits-for graph ([`DeadlockPolicy::WaitForGraph`]) is the one
//! policy that stays inside each table, because it walks the table's own structure (a graph
//! kept under the shards' mutexes in the sharded table, the lock lists themselves in the
//! latch-free one); [`DeadlockPolicy::Timeout`] needs nothing here.
//!
//! The per-transaction state (Dreadlocks digests, wound marks) lives in
//! [`dread`](super::dread): a digest is published only while its transaction waits, and a
//! wound mark is read only by the wounded transaction when it waits, so a table's
//! acquire and release paths touch it only when a request waits (or, with Dreadlocks, when
//! a release wakes waiters).

use std::time::Duration;

use smallvec::SmallVec;

use super::dread::{fingerprint_of, pipeline_of, Digest, DreadState};
use super::{DeadlockPolicy, LockFailure, TxnId, Victim, WaitStyle};

/// Longest nap of a waiter under a prevention policy or Dreadlocks between two decisions: a
/// wound mark or a changed digest is noticed within it even if nobody wakes the waiter.
pub const DECIDE_EVERY: Duration = Duration::from_millis(1);

/// A transaction blocking a waiting request, as its lock table sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Blocker {
    /// The blocking transaction.
    pub txn: TxnId,
    /// The age its request carries (see [`dread::set_age`](super::dread::set_age)).
    pub age: TxnId,
    /// Its thread's flush-pipeline length when it made the request (victim rules).
    pub pipe: u32,
    /// Its Dreadlocks fingerprint when it made the request (see
    /// [`dread::fingerprint_of`](super::dread::fingerprint_of)).
    pub fp: u32,
}

/// What a waiter does after a decision.
#[derive(Debug, PartialEq, Eq)]
pub enum Decision {
    /// Keep waiting; first wake these transactions if they wait (a Dreadlocks victim that
    /// should see its cycle now, or a wounded transaction that should notice its wound).
    Wait(SmallVec<[TxnId; 4]>),
    /// Give up: withdraw the request and fail with this.
    Fail(LockFailure),
}

/// The deadlock policy of a lock table with its per-transaction state: one per table.
pub struct Deadlocks {
    policy: DeadlockPolicy,
    victim: Victim,
    dread: DreadState,
}

impl std::fmt::Debug for Deadlocks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Deadlocks")
            .field("policy", &self.policy)
            .field("victim", &self.victim)
            .finish()
    }
}

/// Which of two transactions on a cycle Dreadlocks rolls back (Kimura §4.3): true when it
/// is `me` (age `my_age`, flush pipeline `mine`) rather than the other (`their_age`,
/// `theirs`). Ties of pipeline length go to the younger, and ages never tie between two
/// transactions, so exactly one side of a pair is the victim.
pub fn me_victim(victim: Victim, my_age: TxnId, mine: u64, their_age: TxnId, theirs: u64) -> bool {
    let younger = my_age > their_age;
    match victim {
        Victim::KillYoung => younger,
        Victim::KillShort => mine < theirs || (mine == theirs && younger),
        Victim::KillLong => mine > theirs || (mine == theirs && younger),
    }
}

impl Deadlocks {
    /// The state of `policy`, choosing Dreadlocks victims by `victim`.
    pub fn new(policy: DeadlockPolicy, victim: Victim) -> Self {
        Deadlocks {
            policy,
            victim,
            dread: DreadState::new(),
        }
    }

    /// The policy.
    pub fn policy(&self) -> DeadlockPolicy {
        self.policy
    }

    /// The victim rule (used by Dreadlocks).
    pub fn victim(&self) -> Victim {
        self.victim
    }

    /// The policy is decided here ([`wait`](Self::wait)): no-wait, wait-die, wound-wait or
    /// Dreadlocks. (Otherwise the table waits until its timeout, searching its waits-for
    /// graph under [`DeadlockPolicy::WaitForGraph`].)
    pub fn decides(&self) -> bool {
        !matches!(
            self.policy,
            DeadlockPolicy::WaitForGraph | DeadlockPolicy::Timeout
        )
    }

    /// Requests must record their transaction's age and pipeline length for the others'
    /// decisions ([`Blocker`]).
    pub fn needs_blocker_ages(&self) -> bool {
        matches!(
            self.policy,
            DeadlockPolicy::WaitDie | DeadlockPolicy::WoundWait | DeadlockPolicy::Dreadlocks(_)
        )
    }

    /// A waiter of this policy can be woken to decide at once (wound-wait's wounded and
    /// Dreadlocks' victims): the table should be able to find its waiting thread.
    pub fn wakes_waiters(&self) -> bool {
        matches!(
            self.policy,
            DeadlockPolicy::WoundWait | DeadlockPolicy::Dreadlocks(_)
        )
    }

    /// A change of a lock (a release, a withdrawal, a grant) may have ended dependencies:
    /// which of its requests' published digests must others now ignore until their owners
    /// refresh them? Called by the table for each remaining request, with whether it still
    /// waits; marks the digest stale when it must. Under sleep-and-backoff (and spinning,
    /// whose refresh is quick but not instant) every request's; under plain sleeping only
    /// those no longer waiting (a request granted just now may still have the digest it
    /// published while it waited). Nothing for the other policies.
    pub fn lock_changed(&self, txn: TxnId, waiting: bool) {
        if let DeadlockPolicy::Dreadlocks(style) = self.policy {
            if style != WaitStyle::Sleep || !waiting {
                self.dread.mark_stale(txn);
            }
        }
    }

    /// True when [`lock_changed`](Self::lock_changed) does anything for a request that
    /// still waits (so a table can skip visiting them otherwise).
    pub fn marks_waiters_stale(&self) -> bool {
        matches!(self.policy, DeadlockPolicy::Dreadlocks(s) if s != WaitStyle::Sleep)
    }

    /// Starts a wait of `txn` (age `age`) under a deciding policy.
    pub fn wait(&self, txn: TxnId, age: TxnId) -> Wait<'_> {
        Wait {
            d: self,
            txn,
            age,
            me: Digest::of_fingerprint(fingerprint_of(txn)),
            published: false,
        }
    }

    /// Wakes the thread of `txn` if it sleeps waiting with a published digest (a table that
    /// has its own way to reach waiting threads uses that instead).
    pub fn nudge(&self, txn: TxnId) {
        self.dread.nudge(txn);
    }
}

/// One wait of one request under a deciding policy ([`Deadlocks::decides`]).
pub struct Wait<'a> {
    d: &'a Deadlocks,
    txn: TxnId,
    age: TxnId,
    /// The digest of my fingerprint alone.
    me: Digest,
    /// A digest of mine is published (Dreadlocks).
    published: bool,
}

impl Wait<'_> {
    /// Decides, given the transactions that block the request now (its lock table's view;
    /// `blockers` is not empty). No-wait fails at once. Wait-die fails if a blocker is older;
    /// wound-wait fails if the requester was wounded, else wounds the younger blockers (and
    /// asks the table to wake them). Dreadlocks unions the blockers' digests into the
    /// requester's; finding the requester's fingerprint in a blocker's digest closes a cycle,
    /// and the victim rule says whether the requester rolls back (else the table wakes the
    /// other side to see the cycle now rather than at the end of its nap).
    pub fn decide(&mut self, blockers: &[Blocker]) -> Decision {
        let first = blockers.first().map(|b| b.txn);
        let d = self.d;
        match d.policy {
            DeadlockPolicy::NoWait => Decision::Fail(LockFailure::Deadlock { blocker: first }),
            // Ages, not ids: a restarted transaction keeps its first attempt's age.
            DeadlockPolicy::WaitDie => match blockers.iter().find(|b| b.age < self.age) {
                Some(b) => Decision::Fail(LockFailure::Deadlock {
                    blocker: Some(b.txn),
                }),
                None => Decision::Wait(SmallVec::new()),
            },
            DeadlockPolicy::WoundWait => {
                if d.dread.take_wound(self.txn) {
                    return Decision::Fail(LockFailure::Deadlock { blocker: None });
                }
                let mut wake = SmallVec::new();
                for b in blockers.iter().filter(|b| b.age > self.age) {
                    d.dread.wound(b.txn);
                    wake.push(b.txn);
                }
                Decision::Wait(wake)
            }
            DeadlockPolicy::Dreadlocks(style) => {
                let mut digest = self.me;
                let mut wake = SmallVec::new();
                let mine = pipeline_of(self.txn).min(u64::from(u32::MAX));
                for b in blockers {
                    let theirs = d.dread.digest_of(b.txn, b.fp);
                    if theirs.contains(&self.me) {
                        if me_victim(d.victim, self.age, mine, b.age, u64::from(b.pipe)) {
                            return Decision::Fail(LockFailure::Deadlock {
                                blocker: Some(b.txn),
                            });
                        }
                        // A spinner re-decides at once anyway.
                        if style != WaitStyle::Spin {
                            wake.push(b.txn);
                        }
                    }
                    digest.union(&theirs);
                }
                d.dread.publish(self.txn, digest);
                self.published = true;
                Decision::Wait(wake)
            }
            DeadlockPolicy::WaitForGraph | DeadlockPolicy::Timeout => {
                Decision::Wait(SmallVec::new())
            }
        }
    }

    /// Waits until the next decision (at most `left`, the time to the request's timeout, and
    /// at most [`DECIDE_EVERY`]), with the table's primitives: Dreadlocks' spinners yield,
    /// hybrid waiters yield while the runnable threads fit on the cores and park past that,
    /// everyone else parks. Call without holding a latch (hybrid may read `/proc`).
    pub fn nap(&self, left: Duration, yield_now: impl FnOnce(), park: impl FnOnce(Duration)) {
        let nap = left.min(DECIDE_EVERY);
        match self.d.policy {
            DeadlockPolicy::Dreadlocks(WaitStyle::Spin) => yield_now(),
            DeadlockPolicy::Dreadlocks(WaitStyle::Hybrid) => {
                if self.d.dread.try_spin() {
                    yield_now();
                    self.d.dread.end_spin();
                } else {
                    park(nap);
                }
            }
            _ => park(nap),
        }
    }

    /// Withdraws the published digest, if any: the request stops waiting (granted, or about
    /// to be granted, or failed). A later [`decide`](Self::decide) publishes again.
    pub fn retire(&mut self) {
        if std::mem::take(&mut self.published) {
            self.d.dread.retire(self.txn);
        }
    }
}

impl Drop for Wait<'_> {
    fn drop(&mut self) {
        self.retire();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(txn: TxnId) -> Blocker {
        Blocker {
            txn,
            age: txn,
            pipe: 0,
            fp: super::super::dread::txn_fingerprint(txn),
        }
    }

    #[test]
    fn prevention_decisions_follow_ages() {
        let d = Deadlocks::new(DeadlockPolicy::NoWait, Victim::KillYoung);
        assert_eq!(
            d.wait(5, 5).decide(&[b(7)]),
            Decision::Fail(LockFailure::Deadlock { blocker: Some(7) })
        );
        let d = Deadlocks::new(DeadlockPolicy::WaitDie, Victim::KillYoung);
        assert!(matches!(d.wait(5, 5).decide(&[b(7)]), Decision::Wait(_)));
        assert_eq!(
            d.wait(7, 7).decide(&[b(9), b(5)]),
            Decision::Fail(LockFailure::Deadlock { blocker: Some(5) })
        );
        // A restarted transaction keeps its first attempt's age.
        assert!(matches!(d.wait(9, 3).decide(&[b(5)]), Decision::Wait(_)));
        let d = Deadlocks::new(DeadlockPolicy::WoundWait, Victim::KillYoung);
        match d.wait(5, 5).decide(&[b(3), b(7)]) {
            Decision::Wait(w) => assert_eq!(w.as_slice(), &[7]),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            d.wait(7, 7).decide(&[b(5)]),
            Decision::Fail(LockFailure::Deadlock { blocker: None }),
            "the wounded fails when it waits"
        );
        assert!(matches!(d.wait(7, 7).decide(&[b(5)]), Decision::Wait(_)));
    }

    #[test]
    fn dreadlocks_finds_a_two_cycle_and_picks_one_victim() {
        for victim in [Victim::KillYoung, Victim::KillShort, Victim::KillLong] {
            let d = Deadlocks::new(DeadlockPolicy::Dreadlocks(WaitStyle::Sleep), victim);
            let mut w1 = d.wait(1, 1);
            assert!(matches!(w1.decide(&[b(2)]), Decision::Wait(_)));
            let mut w2 = d.wait(2, 2);
            // Equal pipelines: every rule picks the younger.
            assert_eq!(
                w2.decide(&[b(1)]),
                Decision::Fail(LockFailure::Deadlock { blocker: Some(1) }),
                "{victim:?}"
            );
            drop(w2);
            w1.retire();
        }
    }
}
