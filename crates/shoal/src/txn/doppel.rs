//! The transaction side of Doppel (Narula 2015; the runtime and its phases are
//! [`crate::doppel`]): Silo's OCC ([`Occ`]) plus the phase the transaction runs in.
//!
//! In a joined phase this is OCC, counting what the transaction does for the classification.
//! In a split phase a blind operation on a record split for it goes to the split write set,
//! folded into this worker's slice after the OCC commit succeeded; any other use of a split
//! record stashes the transaction ([`Error::Stashed`](crate::Error::Stashed)): it is rolled back, and the thread's
//! next `begin()` waits for the next joined phase.

use std::sync::Arc;

use super::commit::durable;
use super::occ::Occ;
use super::{CommitTicket, Ctx, Modify, Protocol, Rows, Span, Write};
use crate::db::LogMode;
use crate::doppel::{Delta, Doppel, Entered, OpClass, SplitWrite};
use crate::error::{show_key, Error, Result};
use crate::lock::TableId;

/// A Doppel transaction: OCC, its phase, its split write set and its statistics.
pub(super) struct DoppelTxn {
    occ: Occ,
    e: Entered,
    /// Split operations to fold into the slices at commit.
    sw: Vec<SplitWrite>,
    /// What the transaction did with which record (key hashes: no allocation), for the
    /// classification.
    ops: Vec<(TableId, u64, OpClass)>,
    /// The keys of `ops`, kept only by sampled transactions.
    keys: Vec<Box<[u8]>>,
}

impl DoppelTxn {
    /// Enters the current phase (waiting while it changes) with `occ`, whose epoch is pinned.
    pub(super) fn begin(rt: &Arc<Doppel>, occ: Occ) -> DoppelTxn {
        DoppelTxn {
            occ,
            e: rt.enter(),
            sw: Vec::new(),
            ops: Vec::new(),
            keys: Vec::new(),
        }
    }

    fn note(&mut self, table: TableId, key: &[u8], class: OpClass) {
        self.ops.push((table, crate::doppel::key_hash(key), class));
        if self.e.sampled {
            self.keys.push(key.into());
        }
    }

    /// Counts a non-blind access and stashes the transaction if it touches a split record.
    fn access(&mut self, cx: &mut Ctx<'_>, slot: u16, key: &[u8], class: OpClass) -> Result<()> {
        let table = cx.table(slot).inner.id;
        self.note(table, key, class);
        if !self.e.split {
            return Ok(());
        }
        match self.e.split_op(table, key) {
            None => Ok(()),
            Some(op) => Err(self.stash(cx, format!("key {} is split for {op:?}", show_key(key)))),
        }
    }

    fn stash(&mut self, cx: &mut Ctx<'_>, detail: String) -> Error {
        let e = Error::Stashed { txn: cx.id, detail };
        cx.failed = Some((e.to_string(), e.is_retryable()));
        self.occ.clear();
        if let Some(rt) = cx.inner().doppel() {
            self.sw.clear();
            rt.stash(self.e.epoch);
        }
        e
    }
}

impl Protocol for DoppelTxn {
    fn get(&mut self, cx: &mut Ctx<'_>, slot: u16, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.access(cx, slot, key, OpClass::Read)?;
        self.occ.get(cx, slot, key)
    }

    fn write(&mut self, cx: &mut Ctx<'_>, slot: u16, key: &[u8], w: Write<'_>) -> Result<()> {
        let class = match w {
            Write::Put(_) => OpClass::Write,
            Write::Insert(_) => OpClass::Read,
        };
        self.access(cx, slot, key, class)?;
        self.occ.write(cx, slot, key, w)
    }

    fn delete(&mut self, cx: &mut Ctx<'_>, slot: u16, key: &[u8]) -> Result<bool> {
        self.access(cx, slot, key, OpClass::Read)?;
        self.occ.delete(cx, slot, key)
    }

    fn update(&mut self, cx: &mut Ctx<'_>, slot: u16, key: &[u8], f: impl Modify) -> Result<usize> {
        // A read-modify-write reads the record: on a split record it would read the global
        // value without the slices' deltas, so it is counted and stashed like a read (so is
        // `int_op`, which returns the value: the default, through here).
        self.access(cx, slot, key, OpClass::Read)?;
        self.occ.update(cx, slot, key, f)
    }

    fn blind(&mut self, cx: &mut Ctx<'_>, slot: u16, key: &[u8], delta: Delta) -> Result<()> {
        let tid = cx.table(slot).inner.id;
        let op = delta.op();
        if self.e.split {
            match self.e.split_op(tid, key) {
                Some(sel) if sel == op => {
                    // A split operation cannot conflict: count it only when sampled.
                    if self.e.sampled {
                        self.note(tid, key, OpClass::Split(op));
                    }
                    if !delta.bounded_by(cx.inner().opts.max_value_len) {
                        return Err(self.stash(
                            cx,
                            format!(
                                "{op:?} on split key {} could outgrow max_value_len",
                                show_key(key)
                            ),
                        ));
                    }
                    // The log record holds the operation, as the OCC write set's charge
                    // holds a value.
                    // One that outgrows the log fails whole (see OCC's `buffer`).
                    if let Err(e) = cx.charge(key, delta.encoded_len()) {
                        self.sw.clear();
                        return Err(self.occ.doom(cx, e));
                    }
                    self.sw.push((tid, key.into(), delta));
                    return Ok(());
                }
                Some(sel) => {
                    self.note(tid, key, OpClass::Split(op));
                    return Err(self.stash(
                        cx,
                        format!("key {} is split for {sel:?}, not {op:?}", show_key(key)),
                    ));
                }
                None => {}
            }
        }
        self.note(tid, key, OpClass::Split(op));
        self.occ.blind(cx, slot, key, delta)
    }

    fn scan(&mut self, cx: &mut Ctx<'_>, slot: u16, span: Span<'_>) -> Result<Rows> {
        // A scan over a range holding a split record is stashed.
        if self.e.split
            && self
                .e
                .split_in_range(cx.table(slot).inner.id, span.lo, span.hi)
        {
            return Err(self.stash(cx, "a scanned range holds a split key".into()));
        }
        self.occ.scan(cx, slot, span)
    }

    fn commit(&mut self, cx: &mut Ctx<'_>, mode: LogMode) -> Result<CommitTicket> {
        // The split operations are logged with the OCC commit, then folded into this
        // worker's slices (OP_delta), where they cannot abort any more.
        let deltas = std::mem::take(&mut self.sw);
        let r = self
            .occ
            .validate_and_install(cx, mode, &deltas)
            .and_then(|lsn| {
                if !deltas.is_empty() {
                    if let Some(rt) = cx.inner().doppel() {
                        rt.apply_slices(self.e.slot, deltas);
                    }
                }
                durable(cx.log(mode), lsn, mode)
            });
        self.occ.end_epoch(cx);
        r
    }

    fn abort(&mut self, cx: &mut Ctx<'_>) {
        self.occ.abort(cx);
    }

    /// Leaves the phase: records the statistics.
    fn end(&mut self, cx: &mut Ctx<'_>) {
        if let Some(rt) = cx.inner().doppel() {
            let conflict = self
                .occ
                .conflict
                .take()
                .map(|(slot, key)| (cx.table(slot).inner.id, key));
            let (ops, keys) = (
                std::mem::take(&mut self.ops),
                std::mem::take(&mut self.keys),
            );
            rt.record(self.e.slot, &ops, &keys, self.e.sampled, conflict);
            rt.exit(self.e.slot);
        }
    }

    fn counts(&self) -> (usize, usize) {
        self.occ.counts()
    }
}
