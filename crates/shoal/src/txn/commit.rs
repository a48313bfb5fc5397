//! Commit: durability tickets, the wait for the log, and two-phase locking's commit with early
//! lock release.
//!
//! Every protocol that logs ends its commit by waiting for (or handing out a ticket for) the
//! log position that makes it durable: [`durable`]. Two-phase locking's commit also decides
//! when its locks go (Athanassoulis et al. 2011; Kimura et al. 2012 §5.3): at the end
//! ([`Elr::Off`]), shared locks at the commit request ([`Elr::Shared`]), or every lock once the
//! commit record is in the log buffer, exclusive ones leaving their commit LSN as a tag for
//! later readers ([`Elr::Sx`], [`Elr::SxUnsafe`]). Under flush pipelining the locks still held
//! travel with the durability callback and the flush daemon releases them.

use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

use super::twopl::{has_exclusive, TwoPl};
use super::Ctx;
use crate::db::{Elr, LogMode, Table};
use crate::error::{Error, Result};
use crate::lock::LockId;
use crate::log::buffer::LogBuffer;
use crate::log::record::{LogRecord, Write as LogWrite};

/// Tells when a commit made with [`Transaction::commit_pipelined`](super::Transaction::commit_pipelined) is durable.
#[derive(Clone, Debug)]
pub struct CommitTicket {
    state: Option<Arc<TicketState>>,
}

#[derive(Debug, Default)]
struct TicketState {
    outcome: Mutex<Option<std::result::Result<(), String>>>,
    cv: Condvar,
}

impl TicketState {
    fn set(&self, r: std::result::Result<(), String>) {
        *self.outcome.lock() = Some(r);
        self.cv.notify_all();
    }
}

impl CommitTicket {
    pub(super) fn done() -> Self {
        CommitTicket { state: None }
    }

    pub(super) fn pending() -> Self {
        CommitTicket {
            state: Some(Arc::new(TicketState::default())),
        }
    }

    /// True once the commit is on stable storage.
    ///
    /// ```
    /// # fn main() -> shoal::Result<()> {
    /// let db = shoal::Database::in_memory();
    /// let t = db.create_table("t")?;
    /// let mut tx = db.begin();
    /// tx.put(&t, "k", "v")?;
    /// // Without a log there is nothing to wait for.
    /// assert!(tx.commit_pipelined()?.is_durable());
    /// # Ok(())
    /// # }
    /// ```
    pub fn is_durable(&self) -> bool {
        match &self.state {
            None => true,
            Some(st) => matches!(*st.outcome.lock(), Some(Ok(()))),
        }
    }

    /// Blocks until the commit is durable; fails if the log failed first (then the commit
    /// may or may not survive a crash).
    ///
    /// ```
    /// # fn main() -> shoal::Result<()> {
    /// let db = shoal::Database::in_memory();
    /// let t = db.create_table("t")?;
    /// let mut tx = db.begin();
    /// tx.put(&t, "k", "v")?;
    /// tx.commit_pipelined()?.wait()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn wait(&self) -> Result<()> {
        let Some(st) = &self.state else {
            return Ok(());
        };
        // A wait: it holds no admission slot (nor one kept for a next transaction).
        crate::admission::blocking(|| self.wait_outcome(st))
    }

    fn wait_outcome(&self, st: &TicketState) -> Result<()> {
        let mut g = st.outcome.lock();
        loop {
            match &*g {
                Some(Ok(())) => return Ok(()),
                Some(Err(e)) => {
                    return Err(Error::Io {
                        path: std::path::PathBuf::from("<log>"),
                        source: std::io::Error::other(e.clone()),
                    })
                }
                None => st.cv.wait(&mut g),
            }
        }
    }
}

/// What a commit in `mode` returns once its log record ends at `lsn` (`None`: nothing to wait
/// for): it waits for the flush (`Sync`), hands out a ticket the flush daemon completes
/// (`Pipelined`), or returns at once (`Async`).
pub(super) fn durable(
    log: Option<&LogBuffer>,
    lsn: Option<u64>,
    mode: LogMode,
) -> Result<CommitTicket> {
    let (Some(log), Some(lsn)) = (log, lsn) else {
        return Ok(CommitTicket::done());
    };
    match mode {
        LogMode::Sync => {
            crate::admission::commit_wait(log, lsn, false).map(|()| CommitTicket::done())
        }
        LogMode::Pipelined => {
            let ticket = CommitTicket::pending();
            let state = ticket.state.clone();
            // Queuing the callback wakes the flusher.
            log.on_durable(
                lsn,
                Box::new(move |res| {
                    if let Some(st) = state {
                        st.set(res);
                    }
                }),
            );
            Ok(ticket)
        }
        LogMode::Async | LogMode::None => Ok(CommitTicket::done()),
    }
}

impl TwoPl {
    /// Commits under two-phase locking (and without locks: `Serial`, `None`), with the early
    /// lock release [`Options::elr`](crate::Options::elr) chooses.
    pub(super) fn commit_elr(&mut self, cx: &mut Ctx<'_>, mode: LogMode) -> Result<CommitTicket> {
        let inner = cx.inner();
        let log = match &inner.log {
            Some(log) if mode != LogMode::None => log,
            _ => {
                self.undo.clear();
                self.release_all(cx);
                return Ok(CommitTicket::done());
            }
        };
        let elr = inner.opts.elr;
        if self.undo.is_empty() {
            // Read-only. It may have read data whose commit is not durable yet: it must not
            // return before that commit is (Kimura §5.3, Algorithm 7). Under 2PL such a
            // commit released its exclusive locks early (SX-ELR, or an `Async` commit) and
            // left its LSN as a tag on them; under `Serial` (no locks) a pipelined or
            // asynchronous commit gave up the serial turn before it was durable, and
            // everything this transaction could have read was logged below `released`.
            self.release_all(cx);
            let seen = if self.locking {
                self.max_tag
            } else {
                log.released()
            };
            // Under SX-ELR even an `Async` reader waits (what it read may have been released
            // by a `Sync` commit whose caller has not returned yet); without ELR, or under
            // `Serial` (no locks to release early), an `Async` reader asked for no
            // durability and waits for none.
            let wait = match elr {
                Elr::SxUnsafe => false,
                Elr::Sx if self.locking => true,
                _ => mode != LogMode::Async,
            };
            if wait && seen > log.durable() {
                crate::admission::commit_wait(log, seen, false)?;
            }
            return Ok(CommitTicket::done());
        }
        if elr == Elr::Shared {
            // S-ELR: shared locks go at the commit request.
            self.release_matching(cx, |m| !has_exclusive(m));
        }
        let bytes = self.redo_record(cx).encode();
        // The commit record enters the buffer while the exclusive locks are still held, so a
        // transaction that depends on this one logs its commit after it: commit order = log
        // order.
        let end = match log.insert(&bytes) {
            Ok((_, end)) => end,
            Err(e) => {
                // Not in the log: roll back and report (the log is unusable now).
                self.fail(cx, &e);
                return Err(e);
            }
        };
        // While this transaction holds its exclusive locks, nobody has seen its writes: if the
        // log fails before the commit is durable they are rolled back, so a failed commit
        // leaves no trace. Under SX-ELR they are visible already; the failed log refuses
        // every later operation instead (see `Transaction::active`).
        let keep_undo = matches!(elr, Elr::Off | Elr::Shared) && mode != LogMode::Async;
        if !keep_undo {
            self.undo.clear();
        }
        if matches!(elr, Elr::Sx | Elr::SxUnsafe) {
            // SX-ELR: every lock goes once the commit record is in the buffer; X locks leave
            // their commit LSN as a tag on the queue for later readers.
            self.release_all_tagged(cx, end);
        }
        match mode {
            LogMode::Sync => {
                let r = crate::admission::commit_wait(
                    log,
                    end,
                    !self.held.is_empty() || !self.intents.is_empty(),
                );
                if r.is_err() {
                    self.rollback(cx);
                }
                self.undo.clear();
                self.release_all(cx);
                r.map(|()| CommitTicket::done())
            }
            LogMode::Async | LogMode::None => {
                // Released before the commit is durable: leave its LSN on the exclusive
                // locks (as SX-ELR does) for readers that must wait for it.
                self.release_all_tagged(cx, end);
                Ok(CommitTicket::done())
            }
            LogMode::Pipelined => {
                let ticket = CommitTicket::pending();
                let state = ticket.state.clone();
                // The thread's flush pipeline grows until this commit is durable (the
                // kill-short / kill-long victim policies compare these lengths).
                let pipe = crate::lock::dread::pipeline_handle();
                pipe.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
                if self.held.is_empty()
                    && self.intents.is_empty()
                    && self.ghosts.is_empty()
                    && self.undo.is_empty()
                {
                    // Nothing left to release (SX-ELR released it all): the callback only
                    // completes the ticket, and takes no handle of the database's shared
                    // objects (each a reference count both cores would write per commit).
                    log.on_durable(
                        end,
                        Box::new(move |res| {
                            if let Some(st) = state {
                                st.set(res);
                            }
                            pipe.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
                        }),
                    );
                    return Ok(ticket);
                }
                // Locks still held (no ELR) travel with the callback and are released by the
                // flush daemon when the commit is durable.
                let held: Vec<LockId> = self.held.drain().map(|(id, _)| id).collect();
                let mut intents = std::mem::take(&mut self.intents);
                let lil = inner.lil.clone();
                let mut ghosts = std::mem::take(&mut self.ghosts);
                let mut undo = std::mem::take(&mut self.undo);
                // Owned handles: the callback outlives this borrow of the database.
                let tables: Vec<Table> = cx.tables.iter().map(|&t| t.clone()).collect();
                let locks = std::sync::Arc::clone(&inner.locks);
                let reclaim = std::sync::Arc::clone(&inner.reclaim);
                let (id, locking) = (cx.id, self.locking);
                log.on_durable(
                    end,
                    Box::new(move |res| {
                        // The ticket first: once another transaction can take these locks
                        // (and see the writes), the ticket must already say durable.
                        // A commit that will never be durable is rolled back before its
                        // locks go (without ELR nobody has seen its writes).
                        if res.is_err() {
                            undo.undo(&tables, &mut ghosts);
                        }
                        undo.clear();
                        if let Some(st) = state {
                            st.set(res);
                        }
                        for l in &held {
                            locks.unlock(id, l);
                        }
                        if let Some(lil) = lil {
                            lil.release_all(&mut intents);
                        }
                        // Durable: the log is durable up to `end` at least now.
                        reclaim.collect_locked(
                            &*locks,
                            locking,
                            0,
                            || end,
                            ghosts.into_iter().map(|(s, k)| (&tables[s as usize], k)),
                        );
                        pipe.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
                    }),
                );
                Ok(ticket)
            }
        }
    }

    /// The commit record: the after-image of every key this transaction changed.
    fn redo_record(&self, cx: &Ctx<'_>) -> LogRecord {
        // From the undo list's after-images: no descent of the tree per key.
        let writes = self
            .undo
            .redo()
            .into_iter()
            .map(|(table, key, value)| LogWrite {
                table: cx.table(table).inner.id,
                key: key.to_vec(),
                value: value.map(<[u8]>::to_vec),
            })
            .collect();
        LogRecord::Commit { txn: cx.id, writes }
    }
}
