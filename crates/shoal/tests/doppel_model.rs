//! Model-based test of Doppel's split operations through `Database::run`: split hints on
//! integer, tuple and top-K keys, short phases so that split and joined phases alternate,
//! random operations (stashed and re-run in split phases), reopens; every read compared
//! with a model. SHOAL_MODEL_SEEDS / SHOAL_MODEL_STEPS as in `model.rs`.

use std::collections::BTreeMap;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use shoal::doppel::{DoppelOptions, SplitOp};
use shoal::{ConcurrencyControl, Database, Error, Options, Table};

#[derive(Clone, Debug, PartialEq)]
enum V {
    Int(i64),
    Tuple(i64, Vec<u8>),
    TopK(Vec<(i64, Vec<u8>)>), // largest order first
    Bytes(Vec<u8>),
}

type Model = BTreeMap<&'static str, V>;

#[derive(Clone, Debug)]
enum Op {
    Add(&'static str, i64),
    AddGet(&'static str, i64),
    Max(&'static str, i64),
    Min(&'static str, i64),
    GetI(&'static str),
    Oput(&'static str, i64, Vec<u8>),
    GetTuple(&'static str),
    TopK(&'static str, i64, Vec<u8>),
    GetTopK(&'static str),
    Put(&'static str, Vec<u8>),
    Get(&'static str),
    Scan,
}

const INTS: [&str; 4] = ["h0", "h1", "mx", "mn"];
const PLAIN: [&str; 2] = ["p0", "p1"];

fn gen_op(rng: &mut StdRng) -> Op {
    let int = |rng: &mut StdRng| INTS[rng.gen_range(0..INTS.len())];
    let val = |rng: &mut StdRng| {
        (0..rng.gen_range(0..6))
            .map(|_| rng.gen::<u8>())
            .collect::<Vec<u8>>()
    };
    match rng.gen_range(0..14) {
        0..=2 => Op::Add(int(rng), rng.gen_range(-5..6)),
        3 => Op::AddGet(int(rng), rng.gen_range(-5..6)),
        4 => Op::Max(int(rng), rng.gen_range(-50..50)),
        5 => Op::Min(int(rng), rng.gen_range(-50..50)),
        6 => Op::GetI(int(rng)),
        7 => Op::Oput("tp", rng.gen_range(0..20), val(rng)),
        8 => Op::GetTuple("tp"),
        9 => Op::TopK("tk", rng.gen_range(0..20), val(rng)),
        10 => Op::GetTopK("tk"),
        11 => Op::Put(PLAIN[rng.gen_range(0..2)], val(rng)),
        12 => Op::Get(PLAIN[rng.gen_range(0..2)]),
        _ => Op::Scan,
    }
}

fn int_of(m: &Model, k: &str) -> Option<i64> {
    match m.get(k) {
        None => None,
        Some(V::Int(i)) => Some(*i),
        Some(v) => panic!("model: {k} holds {v:?}"),
    }
}

fn apply(tx: &mut shoal::Transaction<'_>, t: &Table, m: &mut Model, op: &Op) -> shoal::Result<()> {
    match op.clone() {
        Op::Add(k, n) | Op::AddGet(k, n) => {
            let new = int_of(m, k).unwrap_or(0) + n;
            if let Op::AddGet(..) = op {
                assert_eq!(tx.add_and_get(t, k, n)?, new, "{op:?}");
            } else {
                tx.add(t, k, n)?;
            }
            m.insert(k, V::Int(new));
        }
        Op::Max(k, n) => {
            tx.max(t, k, n)?;
            m.insert(k, V::Int(int_of(m, k).map_or(n, |c| c.max(n))));
        }
        Op::Min(k, n) => {
            tx.min(t, k, n)?;
            m.insert(k, V::Int(int_of(m, k).map_or(n, |c| c.min(n))));
        }
        Op::GetI(k) => assert_eq!(tx.get_i64(t, k)?, int_of(m, k), "{op:?}"),
        Op::Oput(k, o, v) => {
            tx.oput(t, k, o, &v)?;
            let keep = matches!(m.get(k), Some(V::Tuple(old, _)) if *old >= o);
            if !keep {
                m.insert(k, V::Tuple(o, v));
            }
        }
        Op::GetTuple(k) => {
            let got = tx.get_tuple(t, k)?.map(|x| V::Tuple(x.order, x.value));
            assert_eq!(got.as_ref(), m.get(k), "{op:?}");
        }
        Op::TopK(k, o, v) => {
            tx.topk_insert(t, k, o, &v, 3)?;
            let mut set = match m.get(k) {
                Some(V::TopK(s)) => s.clone(),
                None => Vec::new(),
                Some(x) => panic!("{x:?}"),
            };
            if !set.iter().any(|(so, _)| *so == o) {
                set.push((o, v));
                set.sort_by_key(|b| std::cmp::Reverse(b.0));
                set.truncate(3);
            }
            m.insert(k, V::TopK(set));
        }
        Op::GetTopK(k) => {
            let got: Vec<(i64, Vec<u8>)> = tx
                .get_topk(t, k)?
                .into_iter()
                .map(|x| (x.order, x.value))
                .collect();
            let want = match m.get(k) {
                Some(V::TopK(s)) => s.clone(),
                _ => Vec::new(),
            };
            assert_eq!(got, want, "{op:?}");
        }
        Op::Put(k, v) => {
            tx.put(t, k, &v)?;
            m.insert(k, V::Bytes(v));
        }
        Op::Get(k) => {
            let want = match m.get(k) {
                Some(V::Bytes(b)) => Some(b.clone()),
                None => None,
                Some(x) => panic!("{x:?}"),
            };
            assert_eq!(tx.get(t, k)?, want, "{op:?}");
        }
        Op::Scan => {
            let rows = tx.scan(t, ..)?;
            let keys: Vec<String> = rows
                .iter()
                .map(|(k, _)| String::from_utf8(k.clone()).unwrap())
                .collect();
            let want: Vec<String> = m.keys().map(|k| k.to_string()).collect();
            assert_eq!(keys, want, "scan");
        }
    }
    Ok(())
}

fn check(db: &Database, t: &Table, m: &Model, what: &str) {
    let ops: Vec<Op> = INTS
        .iter()
        .map(|k| Op::GetI(k))
        .chain([
            Op::GetTuple("tp"),
            Op::GetTopK("tk"),
            Op::Get("p0"),
            Op::Get("p1"),
            Op::Scan,
        ])
        .collect();
    db.run(|tx| {
        let mut view = m.clone();
        for op in &ops {
            apply(tx, t, &mut view, op)?;
        }
        Ok(())
    })
    .unwrap_or_else(|e| panic!("{what}: {e}"));
}

fn open(dir: &std::path::Path, o: &Options) -> (Database, Table) {
    let db = Database::open(dir, o.clone()).unwrap();
    let t = db.table("t").or_else(|_| db.create_table("t")).unwrap();
    for k in ["h0", "h1"] {
        db.split_hint(&t, k, SplitOp::Add).unwrap();
    }
    db.split_hint(&t, "mx", SplitOp::Max).unwrap();
    db.split_hint(&t, "mn", SplitOp::Min).unwrap();
    db.split_hint(&t, "tp", SplitOp::Oput).unwrap();
    db.split_hint(&t, "tk", SplitOp::TopK(3)).unwrap();
    (db, t)
}

fn run(seed: u64, steps: usize) {
    let dir = tempfile::tempdir().unwrap();
    let o = Options::default()
        .with_cc(ConcurrencyControl::Doppel)
        .with_doppel(
            DoppelOptions::default()
                .with_split_phase(Duration::from_millis(2))
                .with_classify_interval(Duration::from_millis(3))
                .with_max_joined(Duration::from_millis(2)),
        );
    let mut rng = StdRng::seed_from_u64(seed);
    let (mut db, mut t) = open(dir.path(), &o);
    let mut m = Model::new();
    for n in 0..steps {
        let ops: Vec<Op> = (0..rng.gen_range(1..5)).map(|_| gen_op(&mut rng)).collect();
        let mut out = None;
        let r = db.run(|tx| {
            let mut view = m.clone();
            for op in &ops {
                apply(tx, &t, &mut view, op)?;
            }
            out = Some(view);
            Ok(())
        });
        match r {
            Ok(()) => m = out.take().unwrap(),
            Err(e) => panic!("seed {seed} step {n}: {ops:?}: {e}"),
        }
        if rng.gen_range(0..60) == 0 {
            check(&db, &t, &m, "before reopen");
            drop(t);
            drop(db);
            (db, t) = open(dir.path(), &o);
            check(
                &db,
                &t,
                &m,
                &format!("seed {seed} after reopen at step {n}"),
            );
        }
        if rng.gen_range(0..80) == 0 {
            db.checkpoint().unwrap();
        }
    }
    let stats = db.doppel_stats().unwrap();
    eprintln!("seed {seed}: {stats:?}");
    check(&db, &t, &m, "end");
    drop(t);
    drop(db);
    let (db, t) = open(dir.path(), &o);
    check(
        &db,
        &t,
        &m,
        &format!("seed {seed} final reopen ({stats:?})"),
    );
    let _ = Error::EmptyKey;
}

#[test]
fn doppel_split_model() {
    let env = |n: &str, d: u64| {
        std::env::var(n)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(d)
    };
    let base = env("SHOAL_MODEL_SEED", 1);
    for s in base..base + env("SHOAL_MODEL_SEEDS", 3) {
        run(s, env("SHOAL_MODEL_STEPS", 300) as usize);
    }
}
