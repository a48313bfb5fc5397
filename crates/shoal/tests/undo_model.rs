//! Model check of the 2PL/Serial undo list (txn/undo.rs) and the commit record built from
//! it: random mixes of every write kind (put over live/ghost/absent, insert, delete, integer
//! ops, update with a user closure that may run a nested transaction), repeated writes of
//! one key, random commit (sync or pipelined) / abort / drop, nested transactions on the
//! same thread (2PL), point reads into a reused buffer, against a BTreeMap; durable
//! configurations reopen at the end (the redo records must replay to the same state).

// The model mirrors the engine call by call (a check, then an insert).
#![allow(clippy::map_entry)]

use std::collections::BTreeMap;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use shoal::{ConcurrencyControl, Database, Elr, Error, LogMode, Options, Table, Transaction};

type Model = BTreeMap<Vec<u8>, Vec<u8>>;

const SIZES: [usize; 13] = [
    0, 1, 8, 8, 100, 2047, 2048, 2049, 4000, 32768, 32769, 40000, 70001,
];

fn key(rng: &mut StdRng) -> Vec<u8> {
    let i = rng.gen_range(0u8..5);
    if i == 4 {
        let mut k = vec![b'L'; 300];
        k.push(rng.gen_range(0u8..2));
        k
    } else {
        vec![b'k', i]
    }
}

fn value(rng: &mut StdRng) -> Vec<u8> {
    let n = SIZES[rng.gen_range(0..SIZES.len())];
    let b: u8 = rng.gen();
    (0..n).map(|i| b.wrapping_add((i * 7) as u8)).collect()
}

fn int_of(v: &[u8]) -> Option<i64> {
    v.try_into().ok().map(i64::from_le_bytes)
}

/// Reads the whole table by scan, and every key of `m` (and a few absent ones) through
/// `get_into` with a junk-filled reused buffer.
fn check_view(tx: &mut Transaction<'_>, t: &Table, m: &Model, buf: &mut Vec<u8>, what: &str) {
    let rows = tx
        .scan(t, ..)
        .unwrap_or_else(|e| panic!("{what}: scan {e}"));
    let want: Vec<_> = m.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    assert!(
        rows == want,
        "{what}: scan differs: got {} rows want {}",
        rows.len(),
        want.len()
    );
    for (k, v) in m {
        buf.extend_from_slice(b"junk");
        assert!(tx.get_into(t, k, buf).unwrap(), "{what}: get_into found");
        assert!(buf == v, "{what}: get_into value of {k:?}");
    }
    for k in [&b"k\x00"[..], b"k\x03", b"zz"] {
        buf.extend_from_slice(b"junk");
        let found = tx.get_into(t, k, buf).unwrap();
        assert_eq!(found, m.contains_key(k), "{what}: get_into {k:?}");
        assert!(
            if found {
                buf[..] == m[k][..]
            } else {
                buf.is_empty()
            },
            "{what}: get_into contents {k:?}"
        );
    }
}

struct Run<'a> {
    db: &'a Database,
    tables: &'a [Table],
    nested_table: &'a Table,
    nested_model: &'a mut Model,
    nesting: bool,
    buf: Vec<u8>,
    log: Vec<String>,
}

/// A nested transaction on the same thread (on its own table, so that it never waits
/// for the outer one's locks): random writes, then commit or abort.
fn nested(db: &Database, t: &Table, model: &mut Model, log: &mut Vec<String>, rng: &mut StdRng) {
    let mut view = model.clone();
    let mut tx = db.begin();
    for _ in 0..rng.gen_range(1..6) {
        let k = key(rng);
        match rng.gen_range(0..5) {
            0 | 1 => {
                let v = value(rng);
                tx.put(t, &k, &v).unwrap();
                view.insert(k, v);
            }
            2 => {
                let d = tx.delete(t, &k).unwrap();
                assert_eq!(d, view.remove(&k).is_some(), "nested delete");
            }
            3 => {
                let v = value(rng);
                let r = tx.insert(t, &k, &v);
                if view.contains_key(&k) {
                    assert!(matches!(r, Err(Error::DuplicateKey { .. })), "{r:?}");
                } else {
                    r.unwrap();
                    view.insert(k, v);
                }
            }
            _ => {
                tx.update(t, &k, |c| [c.unwrap_or_default(), b"+"].concat())
                    .unwrap();
                let mut v = view.get(&k).cloned().unwrap_or_default();
                v.push(b'+');
                view.insert(k, v);
            }
        }
    }
    let mut buf = b"xx".to_vec();
    check_view(&mut tx, t, &view, &mut buf, "nested view");
    if rng.gen_bool(0.5) {
        log.push("  nested commit".into());
        tx.commit().unwrap();
        *model = view;
    } else {
        log.push("  nested abort".into());
        tx.abort();
    }
}

impl Run<'_> {
    fn nested(&mut self, rng: &mut StdRng) {
        nested(
            self.db,
            self.nested_table,
            self.nested_model,
            &mut self.log,
            rng,
        );
    }

    fn step(&mut self, rng: &mut StdRng, tx: &mut Transaction<'_>, view: &mut [Model]) {
        let ti = rng.gen_range(0..self.tables.len());
        let t = &self.tables[ti];
        let m = &mut view[ti];
        let k = key(rng);
        let op = rng.gen_range(0..12);
        self.log
            .push(format!("  op{op} t{ti} {:?}", &k[..k.len().min(3)]));
        match op {
            0 | 1 => {
                let v = value(rng);
                tx.put(t, &k, &v).unwrap();
                m.insert(k, v);
            }
            2 => {
                let v = value(rng);
                let r = tx.insert(t, &k, &v);
                if m.contains_key(&k) {
                    assert!(matches!(r, Err(Error::DuplicateKey { .. })), "{r:?}");
                } else {
                    r.unwrap();
                    m.insert(k, v);
                }
            }
            3 | 4 => {
                let d = tx.delete(t, &k).unwrap();
                assert_eq!(d, m.remove(&k).is_some(), "delete");
            }
            5 => {
                let n: i64 = rng.gen_range(-50..50);
                let which = rng.gen_range(0..3);
                let cur = m.get(&k).map(|v| int_of(v));
                let got = match which {
                    0 => tx.add_and_get(t, &k, n),
                    1 => tx.max_and_get(t, &k, n),
                    _ => tx.min_and_get(t, &k, n),
                };
                match cur {
                    Some(None) => {
                        assert!(matches!(got, Err(Error::NotAnInteger { .. })), "{got:?}")
                    }
                    c => {
                        let c = c.flatten();
                        let want = match which {
                            0 => c.unwrap_or(0) + n,
                            1 => c.map_or(n, |c| c.max(n)),
                            _ => c.map_or(n, |c| c.min(n)),
                        };
                        assert_eq!(got.unwrap(), want, "int op");
                        m.insert(k, want.to_le_bytes().to_vec());
                    }
                }
            }
            6 | 7 => {
                let replace = rng.gen_bool(0.4);
                let newv = value(rng);
                let nest = self.nesting && rng.gen_bool(0.3);
                let mut seen = None;
                let (db, nt) = (self.db, self.nested_table);
                let (nm, nlog) = (&mut *self.nested_model, &mut self.log);
                let n = tx
                    .update(t, &k, |cur| {
                        seen = Some(cur.map(<[u8]>::to_vec));
                        if nest {
                            // A nested transaction on this thread while the outer one is
                            // inside its update.
                            nested(db, nt, nm, nlog, rng);
                        }
                        if replace {
                            newv.clone()
                        } else {
                            [cur.unwrap_or_default(), b"u"].concat()
                        }
                    })
                    .unwrap();
                assert_eq!(seen.unwrap().as_ref(), m.get(&k), "update saw");
                let v = if replace {
                    newv
                } else {
                    [m.get(&k).map_or(&[][..], |v| &v[..]), b"u"].concat()
                };
                assert_eq!(n, v.len());
                m.insert(k, v);
            }
            8 => {
                self.buf.extend_from_slice(b"junk");
                let found = if rng.gen() {
                    tx.get_into(t, &k, &mut self.buf).unwrap()
                } else {
                    tx.get_for_update_into(t, &k, &mut self.buf).unwrap()
                };
                assert_eq!(found, m.contains_key(&k));
                match m.get(&k) {
                    Some(v) => assert!(&self.buf == v, "get_into value"),
                    None => assert!(self.buf.is_empty(), "get_into absent"),
                }
            }
            9 => {
                assert_eq!(tx.get(t, &k).unwrap().as_ref(), m.get(&k), "get");
            }
            10 if self.nesting => self.nested(rng),
            _ => {
                let mut buf = std::mem::take(&mut self.buf);
                check_view(tx, t, m, &mut buf, "outer view");
                self.buf = buf;
            }
        }
    }
}

fn open(dir: Option<&std::path::Path>, opts: &Options) -> (Database, Vec<Table>, Table) {
    let db = match dir {
        Some(d) => Database::open(d, opts.clone()).unwrap(),
        None => Database::in_memory_with(opts.clone()),
    };
    let mut tables: Vec<Table> = ["t0", "t1", "nested"]
        .iter()
        .map(|n| db.table(n).or_else(|_| db.create_table(n)).unwrap())
        .collect();
    let nested = tables.pop().unwrap();
    (db, tables, nested)
}

fn check_committed(db: &Database, tables: &[Table], nested: &Table, c: &[Model], n: &Model) {
    let mut tx = db.begin();
    let mut buf = b"junk".to_vec();
    for (i, t) in tables.iter().enumerate() {
        check_view(&mut tx, t, &c[i], &mut buf, "committed");
    }
    check_view(&mut tx, nested, n, &mut buf, "committed nested");
    tx.commit().unwrap();
}

fn run(opts: Options, durable: bool, seed: u64, txns: usize) {
    let nesting = opts.cc == ConcurrencyControl::TwoPhaseLocking;
    let mut rng = StdRng::seed_from_u64(seed);
    let dir = tempfile::tempdir().unwrap();
    let path = durable.then(|| dir.path());
    let (db, tables, nested) = open(path, &opts);
    let mut committed = vec![Model::new(); tables.len()];
    let mut nested_model = Model::new();
    let mut tickets = Vec::new();
    {
        let mut r = Run {
            db: &db,
            tables: &tables,
            nested_table: &nested,
            nested_model: &mut nested_model,
            nesting,
            buf: Vec::new(),
            log: Vec::new(),
        };
        for i in 0..txns {
            r.log.push(format!("txn {i}"));
            let mut view = committed.clone();
            let mut tx = db.begin();
            let steps = rng.gen_range(0..14);
            let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                for _ in 0..steps {
                    r.step(&mut rng, &mut tx, &mut view);
                }
                tx
            }));
            let tx = match res {
                Ok(tx) => tx,
                Err(p) => {
                    let tail = r.log.len().saturating_sub(40);
                    eprintln!("seed {seed} {:?}:\n{}", opts.cc, r.log[tail..].join("\n"));
                    std::panic::resume_unwind(p);
                }
            };
            match rng.gen_range(0..10) {
                0..=2 => tx.abort(),
                3 => drop(tx),
                4 | 5 if durable => {
                    tickets.push(tx.commit_pipelined().unwrap());
                    committed = view;
                }
                _ => {
                    tx.commit().unwrap();
                    committed = view;
                }
            }
            if rng.gen_range(0..3) == 0 {
                let (c, n) = (&committed, &*r.nested_model);
                if let Err(p) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    check_committed(&db, &tables, &nested, c, n)
                })) {
                    let tail = r.log.len().saturating_sub(40);
                    eprintln!("seed {seed} {:?}:\n{}", opts.cc, r.log[tail..].join("\n"));
                    std::panic::resume_unwind(p);
                }
            }
        }
    }
    for t in tickets {
        t.wait().unwrap();
    }
    check_committed(&db, &tables, &nested, &committed, &nested_model);
    if durable {
        drop(tables);
        drop(nested);
        drop(db);
        let (db, tables, nested) = open(path, &opts);
        check_committed(&db, &tables, &nested, &committed, &nested_model);
    }
}

fn seeds() -> u64 {
    std::env::var("AUDIT_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(24)
}

#[test]
fn undo_model_2pl_in_memory() {
    for s in 0..seeds() {
        run(Options::default(), false, s, 150);
    }
}

#[test]
fn undo_model_serial_in_memory() {
    for s in 0..seeds() {
        run(
            Options::default().with_cc(ConcurrencyControl::Serial),
            false,
            100 + s,
            150,
        );
    }
}

#[test]
fn undo_model_durable() {
    let configs = [
        (ConcurrencyControl::TwoPhaseLocking, Elr::Off, LogMode::Sync),
        (
            ConcurrencyControl::TwoPhaseLocking,
            Elr::Shared,
            LogMode::Sync,
        ),
        (ConcurrencyControl::TwoPhaseLocking, Elr::Sx, LogMode::Sync),
        (
            ConcurrencyControl::TwoPhaseLocking,
            Elr::Off,
            LogMode::Async,
        ),
        (ConcurrencyControl::Serial, Elr::Off, LogMode::Sync),
    ];
    for s in 0..seeds().div_ceil(2) {
        for (i, &(cc, elr, log)) in configs.iter().enumerate() {
            let opts = Options::default().with_cc(cc).with_elr(elr).with_log(log);
            run(opts, true, 1000 + 10 * s + i as u64, 60);
        }
    }
}

/// The commit record lists a key written many times once (txn/commit.rs `redo_record`):
/// the log grows by the same amount for one write of a key as for fifty (same final value),
/// under 2PL and Serial.
#[test]
fn redo_record_lists_a_rewritten_key_once() {
    for cc in [
        ConcurrencyControl::TwoPhaseLocking,
        ConcurrencyControl::Serial,
    ] {
        let dir = tempfile::tempdir().unwrap();
        let opts = Options::default().with_cc(cc);
        let end = || {
            let db = Database::open(dir.path(), opts.clone()).unwrap();
            db.recovery_stats().unwrap().end_lsn
        };
        {
            let db = Database::open(dir.path(), opts.clone()).unwrap();
            db.create_table("t").unwrap();
        }
        let l0 = end();
        let write = |n: usize| {
            let db = Database::open(dir.path(), opts.clone()).unwrap();
            let t = db.table("t").unwrap();
            db.run(|tx| {
                for i in 0..n {
                    tx.put(&t, "k", vec![i as u8; 1000])?;
                    tx.delete(&t, "k")?;
                    tx.add_and_get(&t, "k", 1)?;
                    tx.update(&t, "k", |_| vec![i as u8; 1000])?;
                    tx.put(&t, "k", [7u8; 1000])?;
                }
                Ok(())
            })
            .unwrap();
        };
        write(1);
        let l1 = end();
        write(50);
        let l2 = end();
        assert_eq!(
            l2 - l1,
            l1 - l0,
            "{cc:?}: log growth for 50 rewrites vs one"
        );
    }
}
