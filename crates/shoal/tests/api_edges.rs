//! Probes of the public API: misuse and edge inputs.

use std::ops::Bound;
use std::time::Duration;

use shoal::doppel::SplitOp;
use shoal::{ConcurrencyControl, Database, Error, LockMode, LogMode, Options};

const CCS: [ConcurrencyControl; 4] = [
    ConcurrencyControl::TwoPhaseLocking,
    ConcurrencyControl::Optimistic,
    ConcurrencyControl::Doppel,
    ConcurrencyControl::Serial,
];

fn opts(cc: ConcurrencyControl) -> Options {
    Options::default()
        .with_cc(cc)
        .with_lock_timeout(Duration::from_millis(200))
}

fn within<T: Send + 'static>(secs: u64, f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(secs)).ok()
}

#[test]
fn error_is_send_sync_static() {
    fn f<T: std::error::Error + Send + Sync + 'static>() {}
    f::<Error>();
}

#[test]
fn key_length_boundaries() {
    for cc in CCS {
        let db = Database::in_memory_with(opts(cc));
        let t = db.create_table("t").unwrap();
        let max = vec![7u8; 4096];
        let over = vec![7u8; 4097];
        let mut tx = db.begin();
        tx.put(&t, &max, b"v").unwrap();
        assert!(matches!(
            tx.put(&t, &over, b"v"),
            Err(Error::KeyTooLarge { len: 4097, .. })
        ));
        assert!(matches!(
            tx.insert(&t, &over, b"v"),
            Err(Error::KeyTooLarge { .. })
        ));
        assert!(matches!(tx.get(&t, &over), Err(Error::KeyTooLarge { .. })));
        assert!(matches!(
            tx.delete(&t, &over),
            Err(Error::KeyTooLarge { .. })
        ));
        assert!(matches!(
            tx.add(&t, &over, 1),
            Err(Error::KeyTooLarge { .. })
        ));
        assert!(matches!(
            tx.add_and_get(&t, &over, 1),
            Err(Error::KeyTooLarge { .. })
        ));
        assert!(matches!(
            tx.update(&t, &over, |_| vec![]),
            Err(Error::KeyTooLarge { .. })
        ));
        assert!(matches!(
            tx.scan(&t, &over[..]..),
            Err(Error::KeyTooLarge { .. })
        ));
        assert!(matches!(
            tx.scan_rev_limit(&t, ..&over[..], 1),
            Err(Error::KeyTooLarge { .. })
        ));
        assert!(matches!(tx.get(&t, b""), Err(Error::EmptyKey)));
        assert!(matches!(tx.delete(&t, b""), Err(Error::EmptyKey)));
        assert!(matches!(tx.add(&t, b"", 1), Err(Error::EmptyKey)));
        assert!(matches!(tx.oput(&t, b"", 1, b"x"), Err(Error::EmptyKey)));
        assert!(matches!(
            tx.topk_insert(&t, b"", 1, b"x", 3),
            Err(Error::EmptyKey)
        ));
        assert!(matches!(
            tx.update(&t, b"", |_| vec![]),
            Err(Error::EmptyKey)
        ));
        assert_eq!(tx.get(&t, &max).unwrap(), Some(b"v".to_vec()));
        tx.commit().unwrap();
    }
}

#[test]
fn foreign_and_stale_table_handles() {
    let dir = tempfile::tempdir().unwrap();
    for cc in CCS {
        let o = opts(cc);
        let stale = {
            let db = Database::open(dir.path(), o.clone()).unwrap();
            let t = db.table("t").or_else(|_| db.create_table("t")).unwrap();
            db.run(|tx| tx.put(&t, "k", "v")).unwrap();
            t
        };
        let db = Database::open(dir.path(), o.clone()).unwrap();
        let mut tx = db.begin();
        assert!(matches!(
            tx.get(&stale, "k"),
            Err(Error::ForeignTable { .. })
        ));
        assert!(matches!(
            tx.put(&stale, "k", "x"),
            Err(Error::ForeignTable { .. })
        ));
        assert!(matches!(
            tx.scan(&stale, ..),
            Err(Error::ForeignTable { .. })
        ));
        assert!(matches!(
            tx.scan_rev_limit(&stale, .., 3),
            Err(Error::ForeignTable { .. })
        ));
        assert!(matches!(
            tx.scan_limit(&stale, .., 0),
            Err(Error::ForeignTable { .. })
        ));
        assert!(matches!(
            tx.add(&stale, "n", 1),
            Err(Error::ForeignTable { .. })
        ));
        assert!(matches!(
            tx.update(&stale, "n", |_| vec![]),
            Err(Error::ForeignTable { .. })
        ));
        let r = tx.lock_table(&stale, LockMode::S);
        assert!(
            matches!(r, Err(Error::ForeignTable { .. })),
            "{cc:?} lock_table: {r:?}"
        );
        drop(tx);
        if cc == ConcurrencyControl::Doppel {
            assert!(matches!(
                db.split_hint(&stale, "k", SplitOp::Add),
                Err(Error::ForeignTable { .. })
            ));
        }
        let t = db.table("t").unwrap();
        assert_eq!(db.run(|tx| tx.get(&t, "k")).unwrap(), Some(b"v".to_vec()));
    }
}

#[test]
fn run_closure_error_and_panic_leave_no_trace() {
    for cc in CCS {
        let db = Database::in_memory_with(opts(cc));
        let t = db.create_table("t").unwrap();
        let mut calls = 0;
        let r: shoal::Result<()> = db.run(|tx| {
            calls += 1;
            tx.put(&t, "a", "1")?;
            Err(Error::Unsupported("mine".into()))
        });
        assert!(matches!(r, Err(Error::Unsupported(_))));
        assert_eq!(calls, 1);
        let db2 = db.clone();
        let t2 = t.clone();
        let p = std::thread::spawn(move || {
            let _ = db2.run(|tx| -> shoal::Result<()> {
                tx.put(&t2, "b", "1")?;
                panic!("boom");
            });
        })
        .join();
        assert!(p.is_err());
        // Also a panic on this thread, caught.
        let p = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _ = db.run(|tx| -> shoal::Result<()> {
                tx.put(&t, "c", "1")?;
                panic!("boom");
            });
        }));
        assert!(p.is_err());
        let db2 = db.clone();
        let t2 = t.clone();
        let rows = within(10, move || {
            db2.run(|tx| {
                tx.put(&t2, "a", "2")?;
                tx.put(&t2, "b", "2")?;
                tx.put(&t2, "c", "2")?;
                tx.scan(&t2, ..)
            })
        })
        .unwrap_or_else(|| panic!("{cc:?}: hung after a panic"))
        .unwrap();
        assert_eq!(rows.len(), 3, "{cc:?}");
    }
}

#[test]
fn nested_begin_on_one_thread() {
    for cc in CCS {
        if cc == ConcurrencyControl::Serial {
            continue; // documented: waits for itself
        }
        let r = within(20, move || {
            let db = Database::in_memory_with(opts(cc).with_max_retries(2));
            let t = db.create_table("t").unwrap();
            db.run(|tx| tx.put(&t, "x", "0")).unwrap();
            let mut outer = db.begin();
            outer.put(&t, "y", "1").unwrap();
            let mut inner = db.begin();
            let g = inner.get(&t, "x");
            let g2 = inner.get(&t, "z");
            let ic = inner.commit();
            let oc = outer.commit();
            (
                format!("{g:?}"),
                format!("{g2:?}"),
                format!("{ic:?}"),
                format!("{oc:?}"),
            )
        });
        let r = r.unwrap_or_else(|| panic!("{cc:?}: nested begin hung"));
        assert!(r.2.starts_with("Ok"), "{cc:?} {r:?}");
        assert!(r.3.starts_with("Ok"), "{cc:?} {r:?}");
    }
}

#[test]
fn huge_values_and_small_segments_survive_reopen() {
    for cc in [
        ConcurrencyControl::TwoPhaseLocking,
        ConcurrencyControl::Optimistic,
    ] {
        let dir = tempfile::tempdir().unwrap();
        let o = opts(cc).with_log_segment_size(1 << 20);
        let big: Vec<u8> = (0..(16usize << 20))
            .map(|i| (i * 7 + i / 251) as u8)
            .collect();
        let mid: Vec<u8> = (0..(3usize << 20) + 5).map(|i| (i / 3) as u8).collect();
        let key = vec![0xabu8; 4096];
        {
            let db = Database::open(dir.path(), o.clone()).unwrap();
            let t = db.create_table("t").unwrap();
            db.run(|tx| tx.put(&t, &key, &big)).unwrap();
            db.run(|tx| tx.put(&t, "mid", &mid)).unwrap();
            db.run(|tx| tx.put(&t, "mid2", &mid)).unwrap();
            db.run(|tx| tx.delete(&t, "mid2").map(|_| ())).unwrap();
            assert_eq!(
                db.run(|tx| tx.get(&t, &key)).unwrap().as_deref(),
                Some(&big[..])
            );
        }
        {
            let db = Database::open(dir.path(), o.clone()).unwrap();
            let t = db.table("t").unwrap();
            assert_eq!(
                db.run(|tx| tx.get(&t, &key)).unwrap().as_deref(),
                Some(&big[..]),
                "{cc:?}"
            );
            assert_eq!(
                db.run(|tx| tx.get(&t, "mid")).unwrap().as_deref(),
                Some(&mid[..])
            );
            assert_eq!(db.run(|tx| tx.get(&t, "mid2")).unwrap(), None);
            db.checkpoint().unwrap();
        }
        let db = Database::open(dir.path(), o.clone()).unwrap();
        let t = db.table("t").unwrap();
        assert_eq!(
            db.run(|tx| tx.get(&t, &key)).unwrap().as_deref(),
            Some(&big[..])
        );
        assert_eq!(db.run(|tx| tx.scan(&t, ..)).unwrap().len(), 2);
    }
}

#[test]
fn topk_and_tuple_ops_on_garbage_are_typed_errors() {
    for cc in CCS {
        let db = Database::in_memory_with(opts(cc));
        let t = db.create_table("t").unwrap();
        for len in [
            0usize, 1, 3, 4, 7, 8, 11, 12, 15, 16, 17, 19, 20, 24, 28, 33, 40, 100,
        ] {
            for fill in [0u8, 1, 0x7f, 0xff] {
                let v = vec![fill; len];
                let mut tx = db.begin();
                tx.put(&t, "g", &v).unwrap();
                let _ = tx.get_topk(&t, "g");
                let _ = tx.get_tuple(&t, "g");
                let _ = tx.topk_insert(&t, "g", 1, b"x", 3);
                let _ = tx.oput(&t, "g", 1, b"x");
                let _ = tx.add(&t, "g", 1);
                let _ = tx.max(&t, "g", 1);
                let _ = tx.get_topk(&t, "g");
                let _ = tx.get_tuple(&t, "g");
                let _ = tx.commit();
            }
        }
        let mut tx = db.begin();
        let _ = tx.topk_insert(&t, "k", 1, b"x", u32::MAX);
        let _ = tx.topk_insert(&t, "k", 2, b"y", 0);
        let _ = tx.get_topk(&t, "k");
        let _ = tx.commit();
    }
}

#[test]
fn doppel_split_ops_survive_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let o = opts(ConcurrencyControl::Doppel);
    {
        let db = Database::open(dir.path(), o.clone()).unwrap();
        let t = db.create_table("t").unwrap();
        db.run(|tx| tx.put(&t, "n", 0i64.to_le_bytes())).unwrap();
        db.run(|tx| tx.put(&t, "m", 0i64.to_le_bytes())).unwrap();
        db.split_hint(&t, "n", SplitOp::Add).unwrap();
        db.split_hint(&t, "m", SplitOp::Max).unwrap();
        db.split_hint(&t, "o", SplitOp::Oput).unwrap();
        db.split_hint(&t, "top", SplitOp::TopK(3)).unwrap();
        for i in 0..200i64 {
            db.run(|tx| {
                tx.add(&t, "n", 1)?;
                tx.max(&t, "m", i)?;
                tx.oput(&t, "o", i % 50, format!("v{i}"))?;
                tx.topk_insert(&t, "top", i, format!("t{i}"), 3)
            })
            .unwrap();
            if i % 37 == 0 {
                assert_eq!(db.run(|tx| tx.get_i64(&t, "n")).unwrap(), Some(i + 1));
            }
        }
        assert_eq!(db.run(|tx| tx.get_i64(&t, "n")).unwrap(), Some(200));
    }
    let db = Database::open(dir.path(), o).unwrap();
    let t = db.table("t").unwrap();
    assert_eq!(db.run(|tx| tx.get_i64(&t, "n")).unwrap(), Some(200));
    assert_eq!(db.run(|tx| tx.get_i64(&t, "m")).unwrap(), Some(199));
    let o = db.run(|tx| tx.get_tuple(&t, "o")).unwrap().unwrap();
    assert_eq!(o.order, 49);
    let top: Vec<i64> = db
        .run(|tx| tx.get_topk(&t, "top"))
        .unwrap()
        .iter()
        .map(|x| x.order)
        .collect();
    assert_eq!(top, vec![199, 198, 197]);
}

#[test]
fn scans_with_odd_bounds() {
    for cc in CCS {
        let db = Database::in_memory_with(opts(cc));
        let t = db.create_table("t").unwrap();
        db.run(|tx| {
            for k in ["a", "b", "c"] {
                tx.put(&t, k, k)?;
            }
            Ok(())
        })
        .unwrap();
        let mut tx = db.begin();
        assert!(tx.scan(&t, "c".."a").unwrap().is_empty());
        assert!(tx.scan_rev(&t, "c".."a").unwrap().is_empty());
        assert!(tx.scan_limit(&t, "c".."a", 5).unwrap().is_empty());
        assert!(tx.scan_rev_limit(&t, "c".."a", 5).unwrap().is_empty());
        assert!(tx.scan(&t, "b".."b").unwrap().is_empty());
        assert!(tx
            .scan_rev_limit(&t, (Bound::Excluded("b"), Bound::Excluded("b")), 5)
            .unwrap()
            .is_empty());
        assert!(tx
            .scan_rev_limit(&t, (Bound::Excluded("b"), Bound::Included("b")), 5)
            .unwrap()
            .is_empty());
        assert_eq!(tx.scan_rev_limit(&t, "b"..="b", 5).unwrap().len(), 1);
        assert_eq!(tx.scan(&t, ""..).unwrap().len(), 3);
        assert_eq!(tx.scan_rev_limit(&t, .., usize::MAX).unwrap().len(), 3);
        tx.commit().unwrap();
    }
}

#[test]
fn commit_modes_on_memory_and_disk() {
    let dir = tempfile::tempdir().unwrap();
    for cc in CCS {
        let db = Database::in_memory_with(opts(cc));
        let t = db.create_table("t").unwrap();
        let mut tx = db.begin();
        tx.set_log_mode(LogMode::Async);
        tx.put(&t, "k", "v").unwrap();
        let tk = tx.commit_pipelined().unwrap();
        assert!(tk.is_durable());
        tk.wait().unwrap();
        db.flush().unwrap();
        assert_eq!(db.checkpoint().unwrap(), None);
    }
    for cc in CCS {
        {
            let db = Database::open(dir.path(), opts(cc)).unwrap();
            let t = db.table("t").or_else(|_| db.create_table("t")).unwrap();
            let mut tx = db.begin();
            tx.put(&t, format!("{cc:?}p"), "v").unwrap();
            let tk = tx.commit_pipelined().unwrap();
            tk.wait().unwrap();
            let mut tx = db.begin();
            tx.set_log_mode(LogMode::Async);
            tx.put(&t, format!("{cc:?}a"), "v").unwrap();
            tx.commit().unwrap();
            db.flush().unwrap();
        }
        let db = Database::open(dir.path(), opts(cc)).unwrap();
        let t = db.table("t").unwrap();
        assert_eq!(
            db.run(|tx| tx.get(&t, format!("{cc:?}p"))).unwrap(),
            Some(b"v".to_vec())
        );
        assert_eq!(
            db.run(|tx| tx.get(&t, format!("{cc:?}a"))).unwrap(),
            Some(b"v".to_vec())
        );
    }
}

#[test]
fn table_names_survive_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let long: String = "é".repeat(127) + "x"; // 255 bytes
    let names = ["a", "with space", "ünïcödé", "🦀", long.as_str()];
    {
        let db = Database::open(dir.path(), Options::default()).unwrap();
        for (i, n) in names.iter().enumerate() {
            let t = db.create_table(n).unwrap();
            db.run(|tx| tx.put(&t, "k", [i as u8])).unwrap();
        }
        assert!(matches!(
            db.create_table(&("é".repeat(128))),
            Err(Error::InvalidTableName { .. })
        ));
    }
    let db = Database::open(dir.path(), Options::default()).unwrap();
    let mut want: Vec<String> = names.iter().map(|s| s.to_string()).collect();
    want.sort();
    assert_eq!(db.tables(), want);
    for (i, n) in names.iter().enumerate() {
        let t = db.table(n).unwrap();
        assert_eq!(db.run(|tx| tx.get(&t, "k")).unwrap(), Some(vec![i as u8]));
    }
}

#[test]
fn pipelined_ticket_outlives_its_database() {
    for cc in [
        ConcurrencyControl::TwoPhaseLocking,
        ConcurrencyControl::Optimistic,
    ] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_path_buf();
        let o = opts(cc).with_log_latency(Duration::from_millis(300));
        let r = within(20, move || {
            let db = Database::open(&path, o.clone()).unwrap();
            let t = db.create_table("t").unwrap();
            let mut tx = db.begin();
            tx.put(&t, "k", "v").unwrap();
            let ticket = tx.commit_pipelined().unwrap();
            let early = ticket.is_durable();
            drop(t);
            drop(db);
            let w = ticket.wait();
            let db = Database::open(&path, o).unwrap();
            let t = db.table("t").unwrap();
            let got = db.run(|tx| tx.get(&t, "k")).unwrap();
            (early, format!("{w:?}"), got)
        })
        .unwrap_or_else(|| panic!("{cc:?}: ticket.wait() after the database was dropped hung"));
        assert_eq!(r.2, Some(b"v".to_vec()), "{cc:?} {r:?}");
        assert_eq!(r.1, "Ok(())", "{cc:?} {r:?}");
    }
}

#[test]
fn doppel_run_inside_run_reading_a_split_key() {
    let r = within(60, || {
        let db = Database::in_memory_with(opts(ConcurrencyControl::Doppel));
        let t = db.create_table("t").unwrap();
        db.run(|tx| tx.put(&t, "n", 0i64.to_le_bytes())).unwrap();
        db.split_hint(&t, "n", SplitOp::Add).unwrap();
        let mut out = Vec::new();
        for i in 0..50 {
            db.run(|tx| tx.add(&t, "n", 1)).unwrap();
            let r = db.run(|tx| {
                tx.put(&t, format!("o{i}"), "x")?;
                db.run(|t2| t2.get_i64(&t, "n"))
            });
            out.push(format!("{r:?}"));
        }
        out
    });
    let out = r.expect("hung");
    for (i, o) in out.iter().enumerate() {
        assert_eq!(o, &format!("Ok(Some({}))", i + 1), "{out:?}");
    }
}

#[test]
fn statement_errors_leave_no_trace_and_the_transaction_usable() {
    let dir = tempfile::tempdir().unwrap();
    for cc in CCS {
        let path = dir.path().join(format!("{cc:?}"));
        let o = opts(cc).with_max_value_len(100);
        {
            let db = Database::open(&path, o.clone()).unwrap();
            let t = db.create_table("t").unwrap();
            db.run(|tx| {
                tx.put(&t, "a", "1")?;
                tx.put(&t, "s", "text")?;
                tx.put(&t, "n", i64::MAX.to_le_bytes())
            })
            .unwrap();
            let mut tx = db.begin();
            tx.put(&t, "w", "before").unwrap();
            let e = |r: shoal::Result<()>| format!("{r:?}");
            let errs = vec![
                e(tx.update(&t, "a", |_| vec![0; 101]).map(drop)),
                e(tx.update(&t, "new", |_| vec![0; 101]).map(drop)),
                e(tx.oput(&t, "s", 1, b"x")),
                e(tx.topk_insert(&t, "s", 1, b"x", 2)),
                e(tx.topk_insert(&t, "big", 1, [0u8; 90], 5)),
                e(tx.add(&t, "s", 1)),
                e(tx.add(&t, "n", 1)),
                e(tx.add_and_get(&t, "n", 1).map(drop)),
                e(tx.max(&t, "s", 1)),
                e(tx.insert(&t, "a", "2")),
                e(tx.put(&t, "a", [0u8; 101])),
                e(tx.oput(&t, "o", 1, [0u8; 100])),
            ];
            for x in &errs {
                assert!(x.starts_with("Err"), "{cc:?}: {errs:?}");
            }
            assert_eq!(
                tx.get(&t, "a").unwrap(),
                Some(b"1".to_vec()),
                "{cc:?} {errs:?}"
            );
            assert_eq!(tx.get(&t, "new").unwrap(), None, "{cc:?}");
            assert_eq!(tx.get(&t, "big").unwrap(), None, "{cc:?} {errs:?}");
            assert_eq!(tx.get(&t, "o").unwrap(), None, "{cc:?} {errs:?}");
            assert_eq!(tx.get(&t, "s").unwrap(), Some(b"text".to_vec()), "{cc:?}");
            assert_eq!(tx.get_i64(&t, "n").unwrap(), Some(i64::MAX), "{cc:?}");
            tx.put(&t, "w2", "after").unwrap();
            tx.commit()
                .unwrap_or_else(|e| panic!("{cc:?}: {e} after {errs:?}"));
        }
        let db = Database::open(&path, o).unwrap();
        let t = db.table("t").unwrap();
        let rows = db.run(|tx| tx.scan(&t, ..)).unwrap();
        let keys: Vec<String> = rows
            .iter()
            .map(|(k, _)| String::from_utf8_lossy(k).into_owned())
            .collect();
        assert_eq!(keys, ["a", "n", "s", "w", "w2"], "{cc:?}");
        assert_eq!(rows[0].1, b"1");
    }
}

#[test]
fn writes_succeed_again_after_deletes_free_pages_under_every_protocol() {
    const LIMIT: u64 = 2 << 20;
    for cc in CCS {
        let db = Database::in_memory_with(opts(cc).with_memory_limit(Some(LIMIT)));
        let a = db.create_table("a").unwrap();
        let fill = |n0: u32| {
            let mut n = n0;
            while db
                .run(|tx| tx.put(&a, n.to_be_bytes(), [7u8; 3000]))
                .is_ok()
            {
                n += 1;
            }
            n
        };
        let n = fill(0);
        assert!(n > 30, "{cc:?} {n}");
        for i in 0..n {
            db.run(|tx| tx.delete(&a, i.to_be_bytes())).unwrap();
        }
        for _ in 0..100 {
            db.run(|tx| tx.get(&a, "x").map(drop)).unwrap();
        }
        std::thread::sleep(Duration::from_millis(50));
        for _ in 0..100 {
            db.run(|tx| tx.get(&a, "x").map(drop)).unwrap();
        }
        let m = fill(1_000_000) - 1_000_000;
        assert!(
            m > n / 2,
            "{cc:?}: {n} rows filled it, only {m} after deleting them all; page_bytes {}",
            db.page_bytes()
        );
    }
}

#[test]
fn reopen_alternating_log_modes_and_protocols() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path();
    {
        let db = Database::open(p, Options::default()).unwrap();
        let t = db.create_table("t").unwrap();
        db.run(|tx| tx.put(&t, "a", "1")).unwrap();
    }
    {
        let db = Database::open(
            p,
            Options::default()
                .with_log(LogMode::None)
                .with_cc(ConcurrencyControl::Optimistic),
        )
        .unwrap();
        let t = db.table("t").unwrap();
        assert_eq!(db.run(|tx| tx.get(&t, "a")).unwrap(), Some(b"1".to_vec()));
        db.run(|tx| tx.put(&t, "b", "unlogged")).unwrap();
        let u = db.create_table("u").unwrap();
        db.run(|tx| tx.put(&u, "x", "unlogged")).unwrap();
        assert_eq!(db.checkpoint().unwrap(), None);
    }
    {
        let db = Database::open(p, Options::default().with_cc(ConcurrencyControl::Doppel)).unwrap();
        let t = db.table("t").unwrap();
        assert_eq!(db.run(|tx| tx.get(&t, "a")).unwrap(), Some(b"1".to_vec()));
        assert_eq!(db.run(|tx| tx.get(&t, "b")).unwrap(), None);
        assert!(db.table("u").is_err());
        let u = db.create_table("u").unwrap();
        db.run(|tx| tx.put(&u, "y", "logged")).unwrap();
        db.run(|tx| tx.add(&t, "n", 5)).unwrap();
        db.checkpoint().unwrap();
        db.run(|tx| tx.add(&t, "n", 5)).unwrap();
    }
    let db = Database::open(p, Options::default().with_cc(ConcurrencyControl::Serial)).unwrap();
    let t = db.table("t").unwrap();
    let u = db.table("u").unwrap();
    assert_eq!(db.run(|tx| tx.get_i64(&t, "n")).unwrap(), Some(10));
    assert_eq!(
        db.run(|tx| tx.scan(&u, ..)).unwrap(),
        vec![(b"y".to_vec(), b"logged".to_vec())]
    );
    assert_eq!(db.run(|tx| tx.scan(&t, ..)).unwrap().len(), 2);
}

#[test]
fn records_as_large_as_a_small_log_buffer() {
    for (cc, mode) in [
        (ConcurrencyControl::TwoPhaseLocking, LogMode::Sync),
        (ConcurrencyControl::Optimistic, LogMode::Async),
        (ConcurrencyControl::TwoPhaseLocking, LogMode::Pipelined),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let max_value = 65536 - 32 - 4096 - 16;
        let o = opts(cc)
            .with_log(mode)
            .with_log_buffer(1 << 16)
            .with_log_segment_size(100_000)
            .with_max_value_len(max_value);
        let mut want = std::collections::BTreeMap::new();
        {
            let db = Database::open(dir.path(), o.clone()).unwrap();
            let t = db.create_table("t").unwrap();
            for i in 0..40u32 {
                let mut k = vec![b'k'; 4096];
                k[..4].copy_from_slice(&i.to_be_bytes());
                let len = if i % 3 == 0 {
                    5
                } else {
                    max_value - (i as usize % 2)
                };
                let v = vec![i as u8; len];
                db.run(|tx| tx.put(&t, &k, &v))
                    .unwrap_or_else(|e| panic!("{cc:?} {mode:?} {i}: {e}"));
                want.insert(k, v);
                if i == 20 {
                    db.checkpoint().unwrap();
                }
            }
            // One byte more than a record holds: refused, typed.
            let r = db.run(|tx| {
                tx.put(&t, vec![b'z'; 4096], vec![0u8; max_value])?;
                tx.put(&t, "small", "x")
            });
            assert!(matches!(r, Err(Error::TransactionTooLarge { .. })), "{r:?}");
        }
        let db = Database::open(dir.path(), o).unwrap();
        let t = db.table("t").unwrap();
        let rows = db.run(|tx| tx.scan(&t, ..)).unwrap();
        assert_eq!(rows.len(), want.len(), "{cc:?} {mode:?}");
        assert!(rows.into_iter().eq(want.into_iter()), "{cc:?} {mode:?}");
    }
}

#[test]
fn limited_scans_skip_many_own_deletes_and_see_own_inserts() {
    for cc in CCS {
        let db = Database::in_memory_with(opts(cc));
        let t = db.create_table("t").unwrap();
        let k = |i: u32| format!("k{i:06}");
        db.run(|tx| {
            for i in 0..1000 {
                tx.put(&t, k(i * 2), "c")?;
            }
            Ok(())
        })
        .unwrap();
        let mut m: std::collections::BTreeMap<String, &str> =
            (0..1000).map(|i| (k(i * 2), "c")).collect();
        let mut tx = db.begin();
        for i in 0..600 {
            assert!(tx.delete(&t, k(i * 2)).unwrap());
            m.remove(&k(i * 2));
        }
        for i in (1..1999).step_by(97) {
            tx.put(&t, k(i), "own").unwrap();
            m.insert(k(i), "own");
        }
        for i in 1500..2000 {
            if i % 2 == 0 {
                tx.delete(&t, k(i)).unwrap();
                m.remove(&k(i));
            }
        }
        let rows = |r: Vec<(Vec<u8>, Vec<u8>)>| -> Vec<(String, String)> {
            r.into_iter()
                .map(|(a, b)| (String::from_utf8(a).unwrap(), String::from_utf8(b).unwrap()))
                .collect()
        };
        let all: Vec<(String, String)> =
            m.iter().map(|(a, b)| (a.clone(), b.to_string())).collect();
        assert_eq!(rows(tx.scan(&t, ..).unwrap()), all, "{cc:?}");
        assert_eq!(
            rows(tx.scan_limit(&t, .., 5).unwrap()),
            all[..5].to_vec(),
            "{cc:?}"
        );
        let rev: Vec<_> = all.iter().rev().cloned().collect();
        assert_eq!(
            rows(tx.scan_rev_limit(&t, .., 5).unwrap()),
            rev[..5].to_vec(),
            "{cc:?}"
        );
        assert_eq!(rows(tx.scan_rev(&t, ..).unwrap()), rev, "{cc:?}");
        let mid: Vec<_> = all
            .iter()
            .filter(|(a, _)| a.as_str() >= "k000500" && a.as_str() < "k001600")
            .cloned()
            .collect();
        assert_eq!(
            rows(tx.scan_limit(&t, "k000500".."k001600", 7).unwrap()),
            mid[..7].to_vec(),
            "{cc:?}"
        );
        let midrev: Vec<_> = mid.iter().rev().take(7).cloned().collect();
        assert_eq!(
            rows(tx.scan_rev_limit(&t, "k000500".."k001600", 7).unwrap()),
            midrev,
            "{cc:?}"
        );
        tx.commit().unwrap();
        let committed = rows(db.run(|tx| tx.scan(&t, ..)).unwrap());
        assert_eq!(committed, all, "{cc:?}");
    }
}

#[test]
fn empty_bound_keys_in_every_scan() {
    for cc in CCS {
        let db = Database::in_memory_with(opts(cc));
        let t = db.create_table("t").unwrap();
        db.run(|tx| {
            for k in [&b"\0"[..], b"\0\0", b"a", b"\xff"] {
                tx.put(&t, k, "v")?;
            }
            Ok(())
        })
        .unwrap();
        let mut tx = db.begin();
        let e: &[u8] = b"";
        let n = |r: shoal::Result<Vec<(Vec<u8>, Vec<u8>)>>| r.unwrap().len();
        assert_eq!(n(tx.scan(&t, e..=e)), 0, "{cc:?}");
        assert_eq!(n(tx.scan(&t, ..=e)), 0, "{cc:?}");
        assert_eq!(n(tx.scan(&t, e..)), 4, "{cc:?}");
        assert_eq!(
            n(tx.scan_rev(&t, (Bound::Excluded(e), Bound::Unbounded))),
            4,
            "{cc:?}"
        );
        assert_eq!(n(tx.scan_rev_limit(&t, ..=e, 2)), 0, "{cc:?}");
        assert_eq!(
            n(tx.scan_rev_limit(&t, (Bound::Excluded(e), Bound::Unbounded), 9)),
            4,
            "{cc:?}"
        );
        assert_eq!(n(tx.scan_rev_limit(&t, e..=&b"\0"[..], 9)), 1, "{cc:?}");
        assert_eq!(n(tx.scan_limit(&t, e..&b"\0\0"[..], 9)), 1, "{cc:?}");
        tx.commit().unwrap();
    }
}

#[test]
fn nested_2pl_on_one_key_ends_in_a_typed_error_under_every_policy() {
    use shoal::{DeadlockPolicy, LockTableKind, WaitStyle};
    for lt in [LockTableKind::Sharded, LockTableKind::LatchFree] {
        for p in [
            DeadlockPolicy::Timeout,
            DeadlockPolicy::WaitForGraph,
            DeadlockPolicy::NoWait,
            DeadlockPolicy::WaitDie,
            DeadlockPolicy::WoundWait,
            DeadlockPolicy::Dreadlocks(WaitStyle::SleepBackoff),
        ] {
            let r = within(10, move || {
                let db = Database::in_memory_with(
                    opts(ConcurrencyControl::TwoPhaseLocking)
                        .with_deadlock(p)
                        .with_lock_table(lt),
                );
                let t = db.create_table("t").unwrap();
                let mut outer = db.begin();
                outer.put(&t, "k", "outer").unwrap();
                let mut inner = db.begin();
                let g = inner.get(&t, "k");
                drop(inner);
                let still = outer.get(&t, "k").map(|v| v.is_some());
                let c = outer.commit();
                (format!("{g:?}"), format!("{still:?}"), format!("{c:?}"))
            })
            .unwrap_or_else(|| panic!("{lt:?} {p:?}: hung"));
            assert!(
                r.0.starts_with("Err(") && r.0 != "Err(TransactionAborted",
                "{lt:?} {p:?}: {r:?}"
            );
            assert_eq!(r.1, "Ok(true)", "{lt:?} {p:?}: {r:?}");
            assert_eq!(r.2, "Ok(())", "{lt:?} {p:?}: {r:?}");
        }
    }
}

/// Under OCC and Doppel a transaction's writes wait in its write set, counted against the
/// memory limit by the page bytes they will take. Counted by their log bytes, values just
/// past the inline limit (each taking a 32 KiB overflow page) let one transaction install
/// about 15 times the limit.
#[test]
fn one_transaction_of_overflow_values_is_held_to_the_memory_limit() {
    const LIMIT: u64 = 256 << 10;
    let mut report = Vec::new();
    for cc in CCS {
        let db = Database::in_memory_with(opts(cc).with_memory_limit(Some(LIMIT)));
        let t = db.create_table("t").unwrap();
        let mut tx = db.begin();
        let mut accepted = 0u32;
        let mut refused = false;
        for i in 0..2000u32 {
            match tx.put(&t, i.to_be_bytes(), [7u8; 2049]) {
                Ok(()) => accepted += 1,
                Err(Error::MemoryLimit { .. }) => {
                    refused = true;
                    break;
                }
                Err(e) => panic!("{cc:?}: {e}"),
            }
        }
        let committed = tx.commit();
        let used = db.page_bytes();
        if used > 2 * LIMIT || !refused {
            report.push(format!(
                "{cc:?}: {accepted} writes accepted, commit {committed:?}, the tables hold \
                 {used} bytes of pages"
            ));
        }
    }
    assert!(
        report.is_empty(),
        "under a {LIMIT}-byte memory limit:\n{}",
        report.join("\n")
    );
}

/// The lightweight intent-lock table has 4096 objects. Table ids beyond them shared the
/// object their id wraps to: X or S on table 4096 locked the whole database, on table 4097
/// table 1, and a transaction on an unlocked table timed out.
#[test]
fn a_table_lock_on_table_4096_or_4097_leaves_other_tables_free() {
    let db =
        Database::in_memory_with(Options::default().with_lock_timeout(Duration::from_millis(300)));
    let tables: Vec<shoal::Table> = (1..=4097)
        .map(|i| db.create_table(&format!("t{i}")).unwrap())
        .collect();
    let (first, t4096, t4097) = (&tables[0], &tables[4095], &tables[4096]);
    db.run(|tx| tx.put(first, "k", "v")).unwrap();
    let mut report = Vec::new();
    for (name, locked) in [("t4096", t4096), ("t4097", t4097)] {
        for mode in [LockMode::X, LockMode::S] {
            let mut holder = db.begin();
            holder.lock_table(locked, mode).unwrap();
            // Another thread reads and writes table t1, which nobody has locked.
            let (db2, t1) = (db.clone(), first.clone());
            let other = std::thread::spawn(move || {
                let mut tx = db2.begin();
                let r = tx.get(&t1, "k").and_then(|_| tx.put(&t1, "k2", "w"));
                let r = r.map_err(|e| e.to_string());
                let committed = r.is_ok() && tx.commit().is_ok();
                (r, committed)
            })
            .join()
            .unwrap();
            // And the lock still excludes what it should: a writer of the locked table.
            let (db3, lt) = (db.clone(), locked.clone());
            let blocked = std::thread::spawn(move || {
                let mut tx = db3.begin();
                tx.put(&lt, "x", "y").is_err()
            })
            .join()
            .unwrap();
            holder.commit().unwrap();
            if other.0.is_err() || !other.1 || !blocked {
                report.push(format!(
                    "{mode:?} on {name}: a transaction on table t1 got {:?}, a writer of \
                     {name} blocked: {blocked}",
                    other.0
                ));
            }
        }
    }
    assert!(report.is_empty(), "{}", report.join("\n"));
}

/// Under OCC and Doppel a buffered write counts the pages it will take; one that replaces
/// an earlier write of the same key in the write set (which keeps the last value only) takes
/// the earlier one's count back. Counted once per write, a transaction that rewrote one
/// 2049-byte value 8 times was refused under a 256 KiB limit on an empty database, though its
/// commit installs a single overflow page.
#[test]
fn rewriting_one_overflow_value_is_not_counted_once_per_write() {
    const LIMIT: u64 = 256 << 10;
    let mut report = Vec::new();
    for cc in [
        ConcurrencyControl::TwoPhaseLocking,
        ConcurrencyControl::Optimistic,
        ConcurrencyControl::Doppel,
    ] {
        let db = Database::in_memory_with(
            Options::default()
                .with_cc(cc)
                .with_memory_limit(Some(LIMIT)),
        );
        let t = db.create_table("t").unwrap();
        let r = db.run(|tx| {
            for i in 0..8u8 {
                tx.put(&t, "k", [i; 2049])?;
            }
            Ok(())
        });
        if r.is_err() {
            report.push(format!(
                "{cc:?}: {r:?} (the tables hold {} bytes of pages)",
                db.page_bytes()
            ));
        }
    }
    assert!(
        report.is_empty(),
        "one key rewritten 8 times with a 2049-byte value under a {LIMIT}-byte limit:\n{}",
        report.join("\n")
    );
}

/// The blind operations count what they add by the pages it will take, as `put` does: at 7
/// pages held under a 250 KiB limit, `oput` of a 2049-byte tuple (stored past the inline
/// limit: one 32 KiB overflow page) was accepted where `put` of the same bytes was refused,
/// and the tables ended over the limit.
#[test]
fn a_blind_oput_is_counted_by_its_pages_like_put() {
    const LIMIT: u64 = 250 << 10;
    let mut report = Vec::new();
    for cc in [
        ConcurrencyControl::TwoPhaseLocking,
        ConcurrencyControl::Optimistic,
    ] {
        let db = Database::in_memory_with(
            Options::default()
                .with_cc(cc)
                .with_memory_limit(Some(LIMIT)),
        );
        let tables: Vec<_> = (0..7)
            .map(|i| db.create_table(&format!("t{i}")).unwrap())
            .collect();
        let t = &tables[0];
        assert_eq!(db.page_bytes(), 7 * (32 << 10));
        let put = db.run(|tx| tx.put(t, "x", [1u8; 2049]));
        assert!(
            matches!(put, Err(Error::MemoryLimit { .. })),
            "{cc:?}: put {put:?}"
        );
        let oput = db.run(|tx| tx.oput(t, "x", 1, [1u8; 2049]));
        let used = db.page_bytes();
        if oput.is_ok() && used > LIMIT {
            report.push(format!(
                "{cc:?}: put refused, oput of the same 2049 bytes accepted; the tables now \
                 hold {used} bytes of pages"
            ));
        }
    }
    assert!(
        report.is_empty(),
        "under a {LIMIT}-byte memory limit:\n{}",
        report.join("\n")
    );
}
