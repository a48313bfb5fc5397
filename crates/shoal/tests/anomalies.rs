//! The isolation anomalies of Adya's thesis as tested by Hermitage (Martin Kleppmann's
//! test suite of transaction isolation levels): G0, G1a, G1b, G1c, OTV, PMP, P4, G-single,
//! G2-item and G2 (predicate), each as a deterministic interleaving of two or three
//! transactions driven by the step scheduler (`common::sched`).
//!
//! A serializable engine must prevent each anomaly, by blocking or by aborting a transaction.
//! Every test checks two things:
//! * the generic check: the observations of the committed transactions and the final state
//!   equal those of some serial order of the committed transactions;
//! * the specific values that the anomaly would show are not shown.
//!
//! Initial state as in Hermitage: `x = 10`, `y = 20` (Hermitage's rows 1 and 2).

mod common;

use common::sched::{add, delete, get, insert, put, put_read_plus, run_schedule, Obs, Op, Run};
use common::{mode_name, modes, KeyRange};

const T1: usize = 0;
const T2: usize = 1;
const T3: usize = 2;

fn xy() -> Vec<(&'static str, i64)> {
    vec![("x", 10), ("y", 20)]
}

/// Runs `steps` under every mode; checks the generic serializability of the outcome and that
/// at least one transaction committed (so the test is not passed by aborting everything);
/// then calls `check` for the anomaly-specific assertions.
fn scenario(
    name: &str,
    initial: &[(&str, i64)],
    ntxns: usize,
    steps: Vec<(usize, Op)>,
    check: impl Fn(&Run) -> Result<(), String>,
) {
    for o in modes() {
        let what = format!("{name} [{}]", mode_name(&o));
        let run = run_schedule(&o, initial, ntxns, steps.clone());
        eprintln!("{what}:\n{}", run.trace());
        assert!(
            (0..ntxns).any(|t| run.committed(t)),
            "{what}: no transaction committed:\n{}",
            run.trace()
        );
        run.assert_serializable(&what);
        if let Err(msg) = check(&run) {
            panic!("{what}: ANOMALY: {msg}\n{}", run.trace());
        }
    }
}

fn final_xy(run: &Run) -> (Option<i64>, Option<i64>) {
    (
        run.final_state.get("x").copied(),
        run.final_state.get("y").copied(),
    )
}

/// G0 (write cycles, dirty writes): T1 and T2 both write x and y; the final state must be
/// entirely T1's or entirely T2's writes, never x from one and y from the other.
#[test]
fn g0_write_cycles() {
    scenario(
        "G0",
        &xy(),
        2,
        vec![
            (T1, put("x", 11)),
            (T2, put("x", 12)),
            (T1, put("y", 21)),
            (T1, Op::Commit),
            (T2, put("y", 22)),
            (T2, Op::Commit),
        ],
        |run| {
            let (x, y) = final_xy(run);
            if (x, y) == (Some(12), Some(21)) || (x, y) == (Some(11), Some(22)) {
                return Err(format!("mixed final state x={x:?} y={y:?}"));
            }
            Ok(())
        },
    );
}

/// G0 with crossed write orders: T1 writes x then y, T2 writes y then x. Without write locks
/// held to commit the final state mixes x = 12 (T2) with y = 21 (T1).
#[test]
fn g0_write_cycles_crossed() {
    scenario(
        "G0 crossed",
        &xy(),
        2,
        vec![
            (T1, put("x", 11)),
            (T2, put("y", 22)),
            (T2, put("x", 12)),
            (T1, put("y", 21)),
            (T1, Op::Commit),
            (T2, Op::Commit),
        ],
        |run| {
            let (x, y) = final_xy(run);
            if (x, y) == (Some(12), Some(21)) || (x, y) == (Some(11), Some(22)) {
                return Err(format!("mixed final state x={x:?} y={y:?}"));
            }
            Ok(())
        },
    );
}

/// G1a (aborted reads): T2 must never read 101, written by T1 which aborts.
#[test]
fn g1a_aborted_reads() {
    scenario(
        "G1a",
        &xy(),
        2,
        vec![
            (T1, put("x", 101)),
            (T2, get("x")),
            (T1, Op::Abort),
            (T2, get("x")),
            (T2, Op::Commit),
        ],
        |run| {
            for i in [1, 3] {
                if run.val(i) == Some(Some(101)) {
                    return Err(format!("step {i}: T2 read x = 101, T1's aborted write"));
                }
            }
            if final_xy(run) != (Some(10), Some(20)) {
                return Err("T1's aborted write survived".into());
            }
            Ok(())
        },
    );
}

/// G1b (intermediate reads): T1 writes x = 101, then x = 11, and commits; T2 must never read
/// 101.
#[test]
fn g1b_intermediate_reads() {
    scenario(
        "G1b",
        &xy(),
        2,
        vec![
            (T1, put("x", 101)),
            (T2, get("x")),
            (T1, put("x", 11)),
            (T1, Op::Commit),
            (T2, get("x")),
            (T2, Op::Commit),
        ],
        |run| {
            for i in [1, 4] {
                if run.val(i) == Some(Some(101)) {
                    return Err(format!(
                        "step {i}: T2 read x = 101, T1's intermediate value"
                    ));
                }
            }
            Ok(())
        },
    );
}

/// G1c (circular information flow): T1 writes x, T2 writes y, T1 reads y, T2 reads x. Both
/// committing with T1 having read y = 22 and T2 x = 11 is a wr cycle.
#[test]
fn g1c_circular_information_flow() {
    scenario(
        "G1c",
        &xy(),
        2,
        vec![
            (T1, put("x", 11)),
            (T2, put("y", 22)),
            (T1, get("y")),
            (T2, get("x")),
            (T1, Op::Commit),
            (T2, Op::Commit),
        ],
        |run| {
            if run.committed(T1)
                && run.committed(T2)
                && run.val(2) == Some(Some(22))
                && run.val(3) == Some(Some(11))
            {
                return Err("T1 read T2's y = 22 and T2 read T1's x = 11".into());
            }
            Ok(())
        },
    );
}

/// OTV (observed transaction vanishes): T1 writes x = 11, y = 19 and commits; T2 writes
/// x = 12, y = 18; T3 reads x and y. T3 must see x and y of the same transaction:
/// (10, 20), (11, 19) or (12, 18) — never x = 11 with y = 18 or x = 12 with y = 19.
#[test]
fn otv_observed_transaction_vanishes() {
    scenario(
        "OTV",
        &xy(),
        3,
        vec![
            (T1, put("x", 11)),
            (T1, put("y", 19)),
            (T2, put("x", 12)),
            (T1, Op::Commit),
            (T3, get("x")),
            (T2, put("y", 18)),
            (T3, get("y")),
            (T2, Op::Commit),
            (T3, Op::Commit),
        ],
        |run| {
            if let (Some(Some(x)), Some(Some(y))) = (run.val(4), run.val(6)) {
                if run.committed(T3) && ![(10, 20), (11, 19), (12, 18)].contains(&(x, y)) {
                    return Err(format!("T3 read x = {x} and y = {y}"));
                }
            }
            Ok(())
        },
    );
}

fn k_range() -> KeyRange {
    KeyRange::half_open(b"k0", b"k9")
}

/// PMP (predicate-many-preceders): T1 reads a predicate (a key range) twice while T2 inserts
/// a matching key and commits in between: both reads of T1 must be equal.
fn pmp(name: &str, scan: fn(KeyRange) -> Op) {
    scenario(
        name,
        &[("k1", 10), ("k2", 20), ("z", 1)],
        2,
        vec![
            (T1, scan(k_range())),
            (T2, insert("k3", 30)),
            (T2, Op::Commit),
            (T1, scan(k_range())),
            (T1, Op::Commit),
        ],
        |run| {
            if run.committed(T1) && run.rows(0) != run.rows(3) {
                return Err(format!(
                    "T1's two reads of the range differ: {:?} then {:?}",
                    run.rows(0),
                    run.rows(3)
                ));
            }
            Ok(())
        },
    );
}

#[test]
fn pmp_predicate_read_scan() {
    pmp("PMP scan", Op::Scan);
}

#[test]
fn pmp_predicate_read_scan_rev() {
    pmp("PMP scan_rev", Op::ScanRev);
}

/// PMP after the reader's own insert: T1 scans the range, then inserts a key into it, which
/// splits the gap that T1's scan locked in two. T2 then inserts a key into the upper half (just
/// above T1's new key, so T2's prior key is T1's key) and commits; T1's second scan must show
/// T1's own key and nothing else new. `initial` decides which lock of the scan covered the
/// split gap: an `S` on a key inside the range, or the `NS` on the key below the range (an
/// empty range).
fn pmp_own_insert(name: &str, initial: &[(&str, i64)], scan: fn(KeyRange) -> Op) {
    scenario(
        name,
        initial,
        2,
        vec![
            (T1, scan(k_range())),
            (T1, insert("k3", 30)),
            (T2, insert("k4", 40)),
            (T2, Op::Commit),
            (T1, scan(k_range())),
            (T1, Op::Commit),
        ],
        |run| {
            let has =
                |i: usize, k: &str| run.rows(i).is_some_and(|r| r.iter().any(|(kk, _)| kk == k));
            if run.committed(T1) && has(4, "k4") {
                return Err(format!(
                    "T1's second read of the range shows T2's k4, its first did not: {:?} then {:?}",
                    run.rows(0),
                    run.rows(4)
                ));
            }
            if run.committed(T1) && run.committed(T2) && !has(4, "k3") {
                return Err("T1's second read lost its own insert".into());
            }
            Ok(())
        },
    );
}

#[test]
fn pmp_own_insert_splits_scanned_gap() {
    pmp_own_insert(
        "PMP own insert",
        &[("k1", 10), ("k8", 80), ("z", 1)],
        Op::Scan,
    );
}

#[test]
fn pmp_own_insert_splits_prior_key_gap_of_empty_range() {
    pmp_own_insert(
        "PMP own insert, empty range",
        &[("a", 1), ("z", 1)],
        Op::Scan,
    );
    pmp_own_insert("PMP own insert, empty table", &[], Op::ScanRev);
}

/// PMP with a delete inside the range instead of an insert.
#[test]
fn pmp_predicate_read_delete() {
    scenario(
        "PMP delete",
        &[("k1", 10), ("k2", 20), ("k3", 30)],
        2,
        vec![
            (T1, Op::Scan(k_range())),
            (T2, delete("k2")),
            (T2, Op::Commit),
            (T1, Op::ScanRev(k_range())),
            (T1, Op::Commit),
        ],
        |run| {
            if let (Some(a), Some(b)) = (run.rows(0), run.rows(3)) {
                let mut b = b.clone();
                b.reverse();
                if run.committed(T1) && *a != b {
                    return Err(format!(
                        "T1's two reads of the range differ: {a:?} then {b:?}"
                    ));
                }
            }
            Ok(())
        },
    );
}

/// PMP for write predicates: T1 adds 10 to every row; T2 deletes the rows whose value is 20.
/// If both commit, T2 ran either before T1 (deleting k2, leaving k1 = 20) or after it
/// (deleting k1 = 20, leaving k2 = 30): never both rows surviving as k1 = 20, k2 = 30.
#[test]
fn pmp_write_predicate() {
    scenario(
        "PMP write",
        &[("k1", 10), ("k2", 20)],
        2,
        vec![
            (T1, Op::AddAll(KeyRange::all(), 10)),
            (T2, Op::DeleteWhere(KeyRange::all(), 20)),
            (T1, Op::Commit),
            (T2, Op::Scan(KeyRange::all())),
            (T2, Op::Commit),
        ],
        |run| {
            let fin: Vec<(&str, i64)> = run
                .final_state
                .iter()
                .map(|(k, v)| (k.as_str(), *v))
                .collect();
            if run.committed(T1) && run.committed(T2) && fin == [("k1", 20), ("k2", 30)] {
                return Err("T2's delete matched no row although both committed".into());
            }
            Ok(())
        },
    );
}

/// The check of the counter scenarios: counter `c` (from 0) equals the number of
/// committed increments, one per transaction.
fn every_increment_counts(run: &Run) -> Result<(), String> {
    let n = [T1, T2].iter().filter(|&&t| run.committed(t)).count() as i64;
    let c = run.final_state.get("c").copied();
    if c != Some(n) {
        return Err(format!("{n} increments committed but the counter is {c:?}"));
    }
    Ok(())
}

/// P4 (lost update) with a counter: both transactions read c, then write read + 1. The
/// counter must end equal to the number of committed increments.
#[test]
fn p4_lost_update_counter() {
    scenario(
        "P4 counter",
        &[("c", 0)],
        2,
        vec![
            (T1, get("c")),
            (T2, get("c")),
            (T1, put_read_plus("c", 1)),
            (T2, put_read_plus("c", 1)),
            (T1, Op::Commit),
            (T2, Op::Commit),
        ],
        every_increment_counts,
    );
}

/// P4 as in Hermitage: both read x = 10 and write x = 11; both committing loses an update.
#[test]
fn p4_lost_update_hermitage() {
    scenario(
        "P4",
        &xy(),
        2,
        vec![
            (T1, get("x")),
            (T2, get("x")),
            (T1, put("x", 11)),
            (T2, put("x", 11)),
            (T1, Op::Commit),
            (T2, Op::Commit),
        ],
        |run| {
            if run.committed(T1)
                && run.committed(T2)
                && run.val(0) == Some(Some(10))
                && run.val(1) == Some(Some(10))
            {
                return Err("both read x = 10 and both committed their write".into());
            }
            Ok(())
        },
    );
}

/// The atomic `add_and_get` never loses an update either: both increments count.
#[test]
fn p4_atomic_add() {
    scenario(
        "P4 add",
        &[("c", 0)],
        2,
        vec![
            (T1, add("c", 1)),
            (T2, add("c", 1)),
            (T1, Op::Commit),
            (T2, Op::Commit),
        ],
        every_increment_counts,
    );
}

/// G-single (read skew): T2 sets x = 12, y = 18 (keeping x + y = 30) between T1's
/// reads of x and y. T1 must see x + y = 30: never x = 10 with y = 18.
#[test]
fn g_single_read_skew() {
    scenario(
        "G-single",
        &xy(),
        2,
        vec![
            (T1, get("x")),
            (T2, get("x")),
            (T2, get("y")),
            (T2, put("x", 12)),
            (T2, put("y", 18)),
            (T2, Op::Commit),
            (T1, get("y")),
            (T1, Op::Commit),
        ],
        |run| {
            if let (Some(Some(x)), Some(Some(y))) = (run.val(0), run.val(6)) {
                if run.committed(T1) && x + y != 30 {
                    return Err(format!("T1 read x = {x}, y = {y}"));
                }
            }
            Ok(())
        },
    );
}

/// G-single with a write predicate: T1 reads x = 10, T2 sets x = 12, y = 18 and commits, T1
/// deletes the rows with value 20. If T1 saw x = 10 it serializes before T2 and must delete y.
#[test]
fn g_single_write_predicate() {
    scenario(
        "G-single write",
        &xy(),
        2,
        vec![
            (T1, get("x")),
            (T2, put("x", 12)),
            (T2, put("y", 18)),
            (T2, Op::Commit),
            (T1, Op::DeleteWhere(KeyRange::all(), 20)),
            (T1, Op::Commit),
        ],
        |run| {
            if run.committed(T1)
                && run.committed(T2)
                && run.val(0) == Some(Some(10))
                && run.rows(4).is_some_and(Vec::is_empty)
            {
                return Err("T1 read x = 10 (before T2) but saw no y = 20 (after T2)".into());
            }
            Ok(())
        },
    );
}

/// G2-item (write skew), the two doctors on call: each reads both, sees two on call and goes
/// off call. At least one doctor must stay on call.
#[test]
fn g2_item_write_skew() {
    scenario(
        "G2-item",
        &[("alice", 1), ("bob", 1)],
        2,
        vec![
            (T1, get("alice")),
            (T1, get("bob")),
            (T2, get("alice")),
            (T2, get("bob")),
            (T1, put("alice", 0)),
            (T2, put("bob", 0)),
            (T1, Op::Commit),
            (T2, Op::Commit),
        ],
        |run| {
            let on_call: i64 = run.final_state.values().sum();
            if on_call < 1 {
                return Err("no doctor is on call".into());
            }
            Ok(())
        },
    );
}

/// G2 (anti-dependency cycles over a predicate): both count the rows of a range, then each
/// inserts a new row into it. If both commit, the later one's count must include the other's
/// insert — impossible here since both counted first, so one must abort (or block until the
/// other finished, which 2PL turns into a deadlock).
fn g2_predicate(name: &str, scan: fn(KeyRange) -> Op, keys: [&str; 2]) {
    scenario(
        name,
        &[("k1", 10), ("k5", 50)],
        2,
        vec![
            (T1, scan(k_range())),
            (T2, scan(k_range())),
            (T1, insert(keys[0], 30)),
            (T2, insert(keys[1], 42)),
            (T1, Op::Commit),
            (T2, Op::Commit),
        ],
        |run| {
            if run.committed(T1) && run.committed(T2) {
                let count1 = run.rows(0).map(Vec::len);
                let count2 = run.rows(1).map(Vec::len);
                let saw = |i: usize, k: &str| {
                    run.rows(i).is_some_and(|r| r.iter().any(|(kk, _)| kk == k))
                };
                if !saw(0, keys[1]) && !saw(1, keys[0]) {
                    return Err(format!(
                        "both committed, counts {count1:?} and {count2:?}: neither saw the other's insert"
                    ));
                }
            }
            Ok(())
        },
    );
}

#[test]
fn g2_predicate_scan_count() {
    g2_predicate("G2 scan", Op::Scan, ["k3", "k4"]);
}

#[test]
fn g2_predicate_scan_rev_count() {
    g2_predicate("G2 scan_rev", Op::ScanRev, ["k3", "k4"]);
}

/// G2 with the inserts in different gaps of the range (below the first key and above the
/// last), so gap locks of different keys must conflict with the scans.
#[test]
fn g2_predicate_edge_gaps() {
    g2_predicate("G2 edge gaps", Op::Scan, ["k0", "k8"]);
}

/// Sanity check of the harness itself: a serial schedule runs without blocking and both
/// transactions commit (so the checks above are not vacuous).
#[test]
fn harness_serial_schedule_commits_both() {
    for o in modes() {
        let run = run_schedule(
            &o,
            &xy(),
            2,
            vec![
                (T1, get("x")),
                (T1, put("x", 11)),
                (T1, Op::Commit),
                (T2, get("x")),
                (T2, put("y", 22)),
                (T2, Op::Commit),
            ],
        );
        assert!(run.committed(T1) && run.committed(T2), "{}", run.trace());
        assert_eq!(run.val(3), Some(Some(11)), "{}", run.trace());
        assert!(run.steps.iter().all(|s| !s.blocked), "{}", run.trace());
        assert_eq!(run.assert_serializable("serial"), vec![T1, T2]);
        assert_eq!(run.obs(2), Some(&Obs::Committed));
    }
}

/// Builds a finished run by hand (no engine), to test the serial-order check itself.
fn fake_run(steps: Vec<(usize, Op, Obs)>, final_state: &[(&str, i64)]) -> Run {
    use common::sched::{Outcome, StepResult};
    Run {
        ntxns: 2,
        initial: [("alice", 1), ("bob", 1)]
            .iter()
            .map(|(k, v)| (k.to_string(), *v))
            .collect(),
        steps: steps
            .into_iter()
            .map(|(txn, op, o)| StepResult {
                txn,
                op,
                outcome: Outcome::Done(o),
                blocked: false,
            })
            .collect(),
        final_state: final_state
            .iter()
            .map(|(k, v)| (k.to_string(), *v))
            .collect(),
    }
}

/// The serial-order check rejects the write-skew outcome (both doctors off call).
#[test]
#[should_panic(expected = "NOT SERIALIZABLE")]
fn harness_rejects_write_skew_outcome() {
    let run = fake_run(
        vec![
            (T1, get("alice"), Obs::Val(Some(1))),
            (T1, get("bob"), Obs::Val(Some(1))),
            (T2, get("alice"), Obs::Val(Some(1))),
            (T2, get("bob"), Obs::Val(Some(1))),
            (T1, put("alice", 0), Obs::Unit),
            (T2, put("bob", 0), Obs::Unit),
            (T1, Op::Commit, Obs::Committed),
            (T2, Op::Commit, Obs::Committed),
        ],
        &[("alice", 0), ("bob", 0)],
    );
    run.assert_serializable("fake write skew");
}

/// The serial-order check accepts the same schedule when T2 saw T1's write (T1 before T2),
/// and names that order.
#[test]
fn harness_accepts_serializable_outcome() {
    let run = fake_run(
        vec![
            (T1, get("alice"), Obs::Val(Some(1))),
            (T1, get("bob"), Obs::Val(Some(1))),
            (T2, get("alice"), Obs::Val(Some(0))),
            (T2, get("bob"), Obs::Val(Some(1))),
            (T1, put("alice", 0), Obs::Unit),
            (T2, put("bob", 0), Obs::Unit),
            (T1, Op::Commit, Obs::Committed),
            (T2, Op::Commit, Obs::Committed),
        ],
        &[("alice", 0), ("bob", 0)],
    );
    assert_eq!(run.assert_serializable("fake serial"), vec![T1, T2]);
}

/// Two-phase locking: the requester that closes a waits-for cycle fails with a retryable
/// error, is rolled back at once (the other transaction proceeds while the victim's handle is
/// still alive) and every later operation of the victim, commit included, fails with
/// `TransactionAborted`.
#[test]
fn deadlock_victim_is_doomed_and_releases_its_locks() {
    use common::{dec, enc};
    use shoal::{ConcurrencyControl, Database, Error};
    use std::time::Duration;
    for o in modes()
        .into_iter()
        .filter(|o| o.cc == ConcurrencyControl::TwoPhaseLocking)
    {
        let db = Database::in_memory_with(o.clone());
        let t = db.create_table("t").expect("create table");
        db.run(|tx| {
            tx.put(&t, "x", enc(10))?;
            tx.put(&t, "y", enc(20))
        })
        .expect("load");
        std::thread::scope(|s| {
            let mut t2 = db.begin();
            t2.put(&t, "y", enc(22)).expect("T2 locks y");
            let (locked_x, locked_x_rx) = std::sync::mpsc::channel();
            let (got_y, got_y_rx) = std::sync::mpsc::channel();
            let (db, t) = (&db, &t);
            let t1 = s.spawn(move || {
                let mut t1 = db.begin();
                t1.put(t, "x", enc(11)).expect("T1 locks x");
                locked_x.send(()).expect("main thread waits");
                let r = t1.put(t, "y", enc(21)); // blocks behind T2
                got_y.send(()).expect("main thread waits");
                r.and_then(|()| t1.commit())
            });
            locked_x_rx.recv().expect("T1 locked x");
            std::thread::sleep(Duration::from_millis(100)); // T1 now waits for y
            let e = t2
                .put(t, "x", enc(12))
                .expect_err("T2 closes a waits-for cycle: it must fail");
            assert!(e.is_retryable(), "deadlock error is retryable: {e:?}");
            assert!(
                matches!(e, Error::Deadlock { .. }),
                "with the waits-for graph the requester fails with Deadlock at once: {e:?}"
            );
            // The victim was rolled back at once: T1 gets y while T2's handle is still alive.
            got_y_rx
                .recv_timeout(Duration::from_secs(2))
                .expect("T1 is granted y although the doomed T2 was not dropped yet");
            for r in [
                t2.get(t, "y").map(|_| ()),
                t2.put(t, "z", enc(1)),
                t2.scan(t, ..).map(|_| ()),
                t2.add_and_get(t, "x", 1).map(|_| ()),
            ] {
                assert!(
                    matches!(r, Err(Error::TransactionAborted { .. })),
                    "an operation of a doomed transaction: {r:?}"
                );
            }
            let c = t2.commit();
            assert!(
                matches!(c, Err(Error::TransactionAborted { .. })),
                "commit of a doomed transaction: {c:?}"
            );
            t1.join()
                .expect("T1 thread")
                .expect("T1 finishes and commits");
        });
        let fin = db
            .run(|tx| Ok((tx.get(&t, "x")?, tx.get(&t, "y")?, tx.get(&t, "z")?)))
            .expect("read back");
        assert_eq!(
            (fin.0.map(|v| dec(&v)), fin.1.map(|v| dec(&v)), fin.2),
            (Some(11), Some(21), None),
            "T1's writes only"
        );
    }
}
