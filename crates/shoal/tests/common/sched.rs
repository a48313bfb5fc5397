//! A step scheduler for deterministic interleavings of a few transactions.
//!
//! Two-phase locking blocks *inside* an operation, so each transaction runs on its own thread.
//! The test lists the interleaving as steps `(transaction, op)`; the scheduler sends each
//! step to its transaction's thread and waits up to [`STEP_WAIT`] for it to complete. A step
//! still blocked after that is left running: the schedule moves on and the step completes
//! later (when the transaction it waits for commits or aborts, or with a deadlock / lock
//! timeout error). Steps of one transaction always run in schedule order.
//!
//! A transaction that gets a retryable error is dropped (aborted) at once, as an application
//! would, and its later steps are skipped.
//!
//! The same [`Op`]s run on a model (a `BTreeMap`), so [`Run::assert_serializable`] can check
//! that the observations of the committed transactions and the final state equal those of some
//! serial order of the committed transactions.

use std::collections::{BTreeMap, HashMap};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use shoal::{Database, Error, Table, Transaction};

use super::{dec, enc, KeyRange};

/// How long the scheduler waits for a step before moving on.
pub const STEP_WAIT: Duration = Duration::from_millis(100);
/// How long the scheduler waits at the end for blocked steps before declaring the engine stuck.
pub const DRAIN_WAIT: Duration = Duration::from_secs(5);

/// One operation of a scheduled transaction. Values are 8-byte integers.
#[derive(Clone, Debug)]
pub enum Op {
    /// `get_i64(key)` -> `Val`. Remembers the value read for `PutReadPlus`.
    Get(String),
    /// `put(key, value)` -> `Unit`.
    Put(String, i64),
    /// `put(key, last value this transaction read at key (missing: 0) + delta)` -> `Unit`: the
    /// write half of a read-modify-write split over two steps.
    PutReadPlus(String, i64),
    /// `add(key, delta)` -> `Val(Some(new))`.
    Add(String, i64),
    /// `insert(key, value)` -> `Unit`, or `Duplicate`.
    Insert(String, i64),
    /// `delete(key)` -> `Bool(was present)`.
    Delete(String),
    /// `scan(range)` -> `Rows` ascending.
    Scan(KeyRange),
    /// `scan_rev(range)` -> `Rows` descending.
    ScanRev(KeyRange),
    /// Scan the range and add `delta` to every row found -> `Rows` (the old rows).
    AddAll(KeyRange, i64),
    /// Scan the range and delete every row whose value is `value` -> `Rows` (deleted rows).
    DeleteWhere(KeyRange, i64),
    /// Commit -> `Committed`.
    Commit,
    /// Abort -> `Aborted`.
    Abort,
}

/// Shorthands.
pub fn get(k: &str) -> Op {
    Op::Get(k.to_string())
}
/// `put(k, v)`.
pub fn put(k: &str, v: i64) -> Op {
    Op::Put(k.to_string(), v)
}
/// `put(k, read + d)`.
pub fn put_read_plus(k: &str, d: i64) -> Op {
    Op::PutReadPlus(k.to_string(), d)
}
/// `add(k, d)`.
pub fn add(k: &str, d: i64) -> Op {
    Op::Add(k.to_string(), d)
}
/// `insert(k, v)`.
pub fn insert(k: &str, v: i64) -> Op {
    Op::Insert(k.to_string(), v)
}
/// `delete(k)`.
pub fn delete(k: &str) -> Op {
    Op::Delete(k.to_string())
}

/// What a completed step observed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Obs {
    /// A write.
    Unit,
    /// An integer read (or the result of `add_and_get`).
    Val(Option<i64>),
    /// `delete`'s result.
    Bool(bool),
    /// `insert` found the key.
    Duplicate,
    /// Rows of a scan.
    Rows(Vec<(String, i64)>),
    /// Commit succeeded.
    Committed,
    /// Abort done.
    Aborted,
}

/// How a step ended.
#[derive(Debug)]
pub enum Outcome {
    /// It ran and observed this.
    Done(Obs),
    /// It failed.
    Failed(Error),
    /// Its transaction had failed before: not run.
    Skipped,
}

/// One step of a finished run.
#[derive(Debug)]
pub struct StepResult {
    /// The transaction (index into the schedule's transactions, printed as `T{txn+1}`).
    pub txn: usize,
    /// The operation.
    pub op: Op,
    /// Its outcome.
    pub outcome: Outcome,
    /// True when it did not complete within [`STEP_WAIT`] (it blocked).
    pub blocked: bool,
}

/// A finished run of a schedule.
#[derive(Debug)]
pub struct Run {
    /// Number of transactions.
    pub ntxns: usize,
    /// The state before the run.
    pub initial: BTreeMap<String, i64>,
    /// Every step in schedule order.
    pub steps: Vec<StepResult>,
    /// The table's content after the run.
    pub final_state: BTreeMap<String, i64>,
}

fn exec(
    tx: &mut Transaction<'_>,
    t: &Table,
    op: &Op,
    local: &mut HashMap<String, i64>,
) -> shoal::Result<Obs> {
    let rows = |r: Vec<(Vec<u8>, Vec<u8>)>| -> Vec<(String, i64)> {
        r.into_iter()
            .map(|(k, v)| (String::from_utf8(k).expect("utf-8 key"), dec(&v)))
            .collect()
    };
    Ok(match op {
        Op::Get(k) => {
            let v = tx.get_i64(t, k)?;
            local.insert(k.clone(), v.unwrap_or(0));
            Obs::Val(v)
        }
        Op::Put(k, v) => {
            tx.put(t, k, enc(*v))?;
            Obs::Unit
        }
        Op::PutReadPlus(k, d) => {
            let base = local.get(k).copied().unwrap_or(0);
            tx.put(t, k, enc(base + d))?;
            Obs::Unit
        }
        Op::Add(k, d) => Obs::Val(Some(tx.add_and_get(t, k, *d)?)),
        Op::Insert(k, v) => match tx.insert(t, k, enc(*v)) {
            Ok(()) => Obs::Unit,
            Err(Error::DuplicateKey { .. }) => Obs::Duplicate,
            Err(e) => return Err(e),
        },
        Op::Delete(k) => Obs::Bool(tx.delete(t, k)?),
        Op::Scan(r) => Obs::Rows(rows(tx.scan(t, r.clone())?)),
        Op::ScanRev(r) => Obs::Rows(rows(tx.scan_rev(t, r.clone())?)),
        Op::AddAll(r, d) => {
            let found = rows(tx.scan(t, r.clone())?);
            for (k, v) in &found {
                tx.put(t, k, enc(v + d))?;
            }
            Obs::Rows(found)
        }
        Op::DeleteWhere(r, val) => {
            let found = rows(tx.scan(t, r.clone())?);
            let mut deleted = Vec::new();
            for (k, v) in found {
                if v == *val {
                    assert!(tx.delete(t, &k)?, "a key the scan found is present");
                    deleted.push((k, v));
                }
            }
            Obs::Rows(deleted)
        }
        Op::Commit | Op::Abort => unreachable!("handled by the worker"),
    })
}

/// Runs `op` on the model state.
fn model(state: &mut BTreeMap<String, i64>, op: &Op, local: &mut HashMap<String, i64>) -> Obs {
    let in_range = |state: &BTreeMap<String, i64>, r: &KeyRange| -> Vec<(String, i64)> {
        state
            .iter()
            .filter(|(k, _)| r.contains_key(k.as_bytes()))
            .map(|(k, v)| (k.clone(), *v))
            .collect()
    };
    match op {
        Op::Get(k) => {
            let v = state.get(k).copied();
            local.insert(k.clone(), v.unwrap_or(0));
            Obs::Val(v)
        }
        Op::Put(k, v) => {
            state.insert(k.clone(), *v);
            Obs::Unit
        }
        Op::PutReadPlus(k, d) => {
            let base = local.get(k).copied().unwrap_or(0);
            state.insert(k.clone(), base + d);
            Obs::Unit
        }
        Op::Add(k, d) => {
            let n = state.get(k).copied().unwrap_or(0) + d;
            state.insert(k.clone(), n);
            Obs::Val(Some(n))
        }
        Op::Insert(k, v) => {
            if state.contains_key(k) {
                Obs::Duplicate
            } else {
                state.insert(k.clone(), *v);
                Obs::Unit
            }
        }
        Op::Delete(k) => Obs::Bool(state.remove(k).is_some()),
        Op::Scan(r) => Obs::Rows(in_range(state, r)),
        Op::ScanRev(r) => {
            let mut v = in_range(state, r);
            v.reverse();
            Obs::Rows(v)
        }
        Op::AddAll(r, d) => {
            let found = in_range(state, r);
            for (k, v) in &found {
                state.insert(k.clone(), v + d);
            }
            Obs::Rows(found)
        }
        Op::DeleteWhere(r, val) => {
            let found: Vec<_> = in_range(state, r)
                .into_iter()
                .filter(|(_, v)| v == val)
                .collect();
            for (k, _) in &found {
                state.remove(k);
            }
            Obs::Rows(found)
        }
        Op::Commit => Obs::Committed,
        Op::Abort => Obs::Aborted,
    }
}

type Slots = Arc<(Mutex<Vec<Option<Outcome>>>, Condvar)>;

/// Reads the whole table as a map of integers.
pub fn read_all(db: &Database, t: &Table) -> BTreeMap<String, i64> {
    db.run(|tx| tx.scan(t, ..))
        .expect("reading the table after the run")
        .into_iter()
        .map(|(k, v)| (String::from_utf8(k).expect("utf-8 key"), dec(&v)))
        .collect()
}

/// Loads `initial` into a fresh table `t` of a fresh database with `opts`, then runs the
/// schedule `steps` of `ntxns` transactions (indices `0..ntxns`, printed `T1..`).
pub fn run_schedule(
    opts: &shoal::Options,
    initial: &[(&str, i64)],
    ntxns: usize,
    steps: Vec<(usize, Op)>,
) -> Run {
    let db = Database::in_memory_with(opts.clone());
    let table = db.create_table("t").expect("create table");
    db.run(|tx| {
        for (k, v) in initial {
            tx.put(&table, k, enc(*v))?;
        }
        Ok(())
    })
    .expect("loading the initial state");
    let initial_state = read_all(&db, &table);
    let expected_initial: BTreeMap<String, i64> =
        initial.iter().map(|(k, v)| (k.to_string(), *v)).collect();
    assert_eq!(initial_state, expected_initial, "initial state reads back");

    let slots: Slots = Arc::new((
        Mutex::new((0..steps.len()).map(|_| None).collect()),
        Condvar::new(),
    ));
    let mut senders = Vec::new();
    let mut workers = Vec::new();
    for _ in 0..ntxns {
        let (tx_send, rx) = mpsc::channel::<(usize, Op)>();
        senders.push(tx_send);
        let (db, table, slots) = (db.clone(), table.clone(), slots.clone());
        workers.push(std::thread::spawn(move || {
            let mut tx: Option<Transaction<'_>> = None;
            let mut done = false;
            let mut local = HashMap::new();
            for (i, op) in rx {
                let out = if done {
                    Outcome::Skipped
                } else {
                    match op {
                        Op::Commit => {
                            done = true;
                            match tx.take().unwrap_or_else(|| db.begin()).commit() {
                                Ok(()) => Outcome::Done(Obs::Committed),
                                Err(e) => Outcome::Failed(e),
                            }
                        }
                        Op::Abort => {
                            done = true;
                            if let Some(t) = tx.take() {
                                t.abort();
                            }
                            Outcome::Done(Obs::Aborted)
                        }
                        op => {
                            let t = tx.get_or_insert_with(|| db.begin());
                            match exec(t, &table, &op, &mut local) {
                                Ok(o) => Outcome::Done(o),
                                Err(e) => {
                                    if e.is_retryable()
                                        || matches!(e, Error::TransactionAborted { .. })
                                    {
                                        done = true;
                                        tx = None; // drop = abort, releasing the locks now
                                    }
                                    Outcome::Failed(e)
                                }
                            }
                        }
                    }
                };
                let (m, cv) = &*slots;
                m.lock().expect("slots")[i] = Some(out);
                cv.notify_all();
            }
            if let Some(t) = tx {
                t.abort();
            }
        }));
    }

    let mut blocked = vec![false; steps.len()];
    let (m, cv) = &*slots;
    for (i, (t, op)) in steps.iter().enumerate() {
        senders[*t].send((i, op.clone())).expect("worker alive");
        let deadline = Instant::now() + STEP_WAIT;
        let mut g = m.lock().expect("slots");
        while g[i].is_none() {
            let now = Instant::now();
            if now >= deadline {
                blocked[i] = true;
                break;
            }
            g = cv.wait_timeout(g, deadline - now).expect("slots").0;
        }
    }
    drop(senders);
    let deadline = Instant::now() + DRAIN_WAIT;
    {
        let mut g = m.lock().expect("slots");
        while g.iter().any(Option::is_none) {
            let now = Instant::now();
            if now >= deadline {
                let stuck: Vec<String> = steps
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| g[*i].is_none())
                    .map(|(i, (t, op))| format!("step {i}: T{} {op:?}", t + 1))
                    .collect();
                panic!(
                    "steps still blocked {DRAIN_WAIT:?} after the schedule ended \
                     (lock_timeout is {:?}): {stuck:?}",
                    opts.lock_timeout
                );
            }
            g = cv.wait_timeout(g, deadline - now).expect("slots").0;
        }
    }
    for w in workers {
        w.join().expect("worker thread panicked");
    }
    let outcomes: Vec<Outcome> = std::mem::take(&mut *m.lock().expect("slots"))
        .into_iter()
        .map(|o| o.expect("every step completed"))
        .collect();
    let final_state = read_all(&db, &table);
    let run = Run {
        ntxns,
        initial: initial_state,
        steps: steps
            .into_iter()
            .zip(outcomes)
            .zip(blocked)
            .map(|(((txn, op), outcome), blocked)| StepResult {
                txn,
                op,
                outcome,
                blocked,
            })
            .collect(),
        final_state,
    };
    run.assert_no_fatal_errors();
    run
}

impl Run {
    /// Whether transaction `t` committed.
    pub fn committed(&self, t: usize) -> bool {
        self.steps
            .iter()
            .any(|s| s.txn == t && matches!(s.outcome, Outcome::Done(Obs::Committed)))
    }

    /// Whether transaction `t` failed with a retryable error (was aborted by the engine).
    pub fn failed(&self, t: usize) -> bool {
        self.steps
            .iter()
            .any(|s| s.txn == t && matches!(&s.outcome, Outcome::Failed(e) if e.is_retryable()))
    }

    /// The observation of step `i` (schedule index), if it completed.
    pub fn obs(&self, i: usize) -> Option<&Obs> {
        match &self.steps[i].outcome {
            Outcome::Done(o) => Some(o),
            _ => None,
        }
    }

    /// The integer value read by step `i`, if it was a completed read.
    pub fn val(&self, i: usize) -> Option<Option<i64>> {
        match self.obs(i) {
            Some(Obs::Val(v)) => Some(*v),
            _ => None,
        }
    }

    /// The rows observed by step `i`, if it was a completed scan.
    pub fn rows(&self, i: usize) -> Option<&Vec<(String, i64)>> {
        match self.obs(i) {
            Some(Obs::Rows(r)) => Some(r),
            _ => None,
        }
    }

    /// A readable trace of the run.
    pub fn trace(&self) -> String {
        let mut s = String::new();
        s.push_str(&format!("initial: {:?}\n", self.initial));
        for (i, st) in self.steps.iter().enumerate() {
            s.push_str(&format!(
                "  {i:2}: T{} {:?} -> {}{}\n",
                st.txn + 1,
                st.op,
                match &st.outcome {
                    Outcome::Done(o) => format!("{o:?}"),
                    Outcome::Failed(e) => format!("ERROR {e}"),
                    Outcome::Skipped => "skipped (transaction failed before)".to_string(),
                },
                if st.blocked { "  [blocked]" } else { "" }
            ));
        }
        s.push_str(&format!("final: {:?}\n", self.final_state));
        s
    }

    /// Panics on any non-retryable error other than the `TransactionAborted` that follows a
    /// retryable one.
    fn assert_no_fatal_errors(&self) {
        for st in &self.steps {
            if let Outcome::Failed(e) = &st.outcome {
                assert!(
                    e.is_retryable(),
                    "unexpected non-retryable error {e:?} in T{}:\n{}",
                    st.txn + 1,
                    self.trace()
                );
            }
        }
    }

    /// Panics unless the observations of every committed transaction and the final state
    /// equal those of some serial execution of the committed transactions from the initial
    /// state. Returns the serial order found (transaction indices).
    pub fn assert_serializable(&self, what: &str) -> Vec<usize> {
        let committed: Vec<usize> = (0..self.ntxns).filter(|&t| self.committed(t)).collect();
        let mut tried = Vec::new();
        for order in permutations(&committed) {
            let mut state = self.initial.clone();
            let mut ok = true;
            let mut expected_obs = Vec::new();
            for &t in &order {
                let mut local = HashMap::new();
                for (i, st) in self.steps.iter().enumerate() {
                    if st.txn != t {
                        continue;
                    }
                    let want = model(&mut state, &st.op, &mut local);
                    let got = self.obs(i);
                    if got != Some(&want) {
                        ok = false;
                    }
                    expected_obs.push(format!("step {i}: T{} {:?} -> {want:?}", t + 1, st.op));
                }
            }
            if ok && state == self.final_state {
                return order;
            }
            tried.push(format!(
                "serial order {:?}:\n    {}\n    final {:?}",
                order
                    .iter()
                    .map(|t| format!("T{}", t + 1))
                    .collect::<Vec<_>>(),
                expected_obs.join("\n    "),
                state
            ));
        }
        panic!(
            "{what}: NOT SERIALIZABLE: the committed transactions {:?} observed / left a state \
             that no serial order gives.\nrun:\n{}expected one of:\n{}",
            committed
                .iter()
                .map(|t| format!("T{}", t + 1))
                .collect::<Vec<_>>(),
            self.trace(),
            tried.join("\n")
        );
    }
}

/// All permutations of `items` (few: at most 3-4 transactions).
pub fn permutations(items: &[usize]) -> Vec<Vec<usize>> {
    if items.len() <= 1 {
        return vec![items.to_vec()];
    }
    let mut out = Vec::new();
    for i in 0..items.len() {
        let mut rest = items.to_vec();
        let x = rest.remove(i);
        for mut p in permutations(&rest) {
            p.insert(0, x);
            out.push(p);
        }
    }
    out
}
