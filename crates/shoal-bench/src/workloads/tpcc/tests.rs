//! Tests of the TPC-C workload (a child module of `tpcc/mod.rs`).

use super::*;

fn tiny(w: u32) -> (Database, Tpcc) {
    tiny_with(w, shoal::ConcurrencyControl::TwoPhaseLocking)
}

fn tiny_with(w: u32, cc: shoal::ConcurrencyControl) -> (Database, Tpcc) {
    let db = Database::in_memory_with(shoal::Options::default().with_cc(cc));
    let t = Tpcc::load(&db, Scale::tiny(w), 2, &ProgressBar::hidden()).unwrap();
    (db, t)
}

fn worker(t: &Tpcc, thread: u16, mix: Mix) -> TpccWorker {
    TpccWorker {
        rng: SmallRng::seed_from_u64(u64::from(thread) + 99),
        mix,
        home: None,
        thread,
        seq: 0,
        cur: t.draw(&mut SmallRng::seed_from_u64(1), STOCK_LEVEL, None),
    }
}

/// Runs `n` transactions of each type on `threads` threads; returns (commits,
/// rollbacks) per type.
fn run(db: &Database, t: &Tpcc, threads: u16, n: usize) -> [(u64, u64); 5] {
    let outs: Vec<[(u64, u64); 5]> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|th| {
                s.spawn(move || {
                    let mut out = [(0u64, 0u64); 5];
                    let mut w = worker(t, th, Mix::Full);
                    for i in 0..5 * n {
                        w.mix = [
                            Mix::NewOrder,
                            Mix::Payment,
                            Mix::OrderStatus,
                            Mix::Delivery,
                            Mix::StockLevel,
                        ][i % 5];
                        t.next(&mut w);
                        loop {
                            let mut tx = db.begin();
                            let r = t.execute(&w, &mut tx);
                            let r = match r {
                                Ok(()) if t.rollback(&w) => {
                                    tx.abort();
                                    out[t.kind(&w)].1 += 1;
                                    break;
                                }
                                Ok(()) => tx.commit(),
                                Err(e) => {
                                    tx.abort();
                                    Err(e)
                                }
                            };
                            match r {
                                Ok(()) => {
                                    t.committed(&mut w);
                                    out[t.kind(&w)].0 += 1;
                                    break;
                                }
                                Err(e) if e.is_retryable() => std::thread::yield_now(),
                                Err(e) => panic!("{e}"),
                            }
                        }
                    }
                    out
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut sum = [(0, 0); 5];
    for o in outs {
        for (a, b) in sum.iter_mut().zip(o) {
            a.0 += b.0;
            a.1 += b.1;
        }
    }
    sum
}

#[test]
fn last_names_and_nurand() {
    assert_eq!(last_name(0), b"BARBARBAR");
    assert_eq!(last_name(371), b"PRICALLYOUGHT");
    let mut rng = SmallRng::seed_from_u64(3);
    for _ in 0..10_000 {
        let v = nurand(&mut rng, 1023, C_ID, 1, 3000);
        assert!((1..=3000).contains(&v));
    }
}

#[test]
fn keys_keep_the_spec_orderings() {
    assert!(wdid(1, 2, 255) < wdid(1, 2, 256));
    assert!(wdid(1, 9, u32::MAX) < wdid(1, 10, 0));
    assert!(ol_key(1, 1, 5, 15) < ol_key(1, 1, 6, 1));
    assert!(cname_key(1, 1, b"ABLE", b"zz", 9) < cname_key(1, 1, b"ABLEABLE", b"a", 1));
    let (lo, hi) = prefix_range(&[1, 0xff]);
    assert_eq!(
        (lo, hi),
        (Bound::Included(vec![1, 0xff]), Bound::Excluded(vec![2]))
    );
}

#[test]
fn rows_encode_their_fields_in_order_little_endian() {
    let o = Order {
        c_id: 1,
        entry_d: 2,
        carrier_id: 3,
        ol_cnt: 4,
        all_local: 5,
    };
    assert_eq!(o.encode(), [1, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 3, 4, 5]);
    let i = Item {
        im_id: 7,
        price: -1,
        name: b"ab".to_vec(),
        data: Vec::new(),
    };
    let mut want = vec![7, 0, 0, 0];
    want.extend([0xff; 8]);
    want.extend([2, 0, b'a', b'b', 0, 0]);
    assert_eq!(i.encode(), want);
    assert_eq!(Item::decode(&want), Some(i));
    assert_eq!(Item::decode(&want[..want.len() - 1]), None);
}

#[test]
fn rows_round_trip() {
    let mut rng = SmallRng::seed_from_u64(5);
    let p = place(&mut rng, 6);
    assert_eq!(Place::decode(&p.encode()), Some(p));
    let l = OrderLine {
        i_id: 7,
        supply_w: 2,
        delivery_d: 0,
        quantity: 5,
        amount: 123,
        dist_info: astring(&mut rng, 24, 24),
    };
    assert_eq!(OrderLine::decode(&l.encode()), Some(l.clone()));
    assert_eq!(OrderLine::decode(&l.encode()[1..]), None);
}

#[test]
fn tiny_load_runs_every_transaction_and_stays_consistent() {
    for cc in [
        shoal::ConcurrencyControl::TwoPhaseLocking,
        shoal::ConcurrencyControl::Optimistic,
    ] {
        tiny_run(cc);
    }
}

fn tiny_run(cc: shoal::ConcurrencyControl) {
    let (db, t) = tiny_with(2, cc);
    let s = t.check_db(&db).unwrap();
    assert!(s.contains("conditions 1-4 hold"), "{s}");
    let n = 40;
    let per = run(&db, &t, 2, n);
    for (k, (c, r)) in per.iter().enumerate() {
        assert_eq!(c + r, 2 * n as u64, "{}", KINDS[k]);
        if k != NEW_ORDER {
            assert_eq!(*r, 0);
        }
    }
    t.check_db(&db).unwrap();
    // Against what committed: the counts hold, and a NewOrder lost as a whole (its order,
    // new-order row and lines together, which conditions 1-4 cannot see) is reported.
    let ledger = |new_orders_lost: u64| Ledger {
        commits: vec![vec![per.iter().map(|p| p.0).sum()]],
        by_kind: vec![per
            .iter()
            .enumerate()
            .map(|(k, p)| {
                if k == NEW_ORDER {
                    p.0 + new_orders_lost
                } else {
                    p.0
                }
            })
            .collect()],
    };
    let s = t.check_against(&db, Some(&ledger(0))).unwrap();
    assert!(s.contains("as committed"), "{s}");
    let e = t.check_against(&db, Some(&ledger(1))).unwrap_err();
    assert!(format!("{e:#}").contains("NewOrders committed"), "{e:#}");
    // Deliveries happened: fewer new orders than loaded plus created.
    let no = db.run(|tx| tx.scan(&t.new_order, ..)).unwrap().len() as u64;
    assert!(no < 2 * 10 * 9 + per[NEW_ORDER].0, "{no}");
}

#[test]
fn a_worker_bound_to_its_home_warehouse_draws_only_there() {
    let (_db, t) = tiny(3);
    for thread in 0..5u16 {
        let mut w = worker(&t, thread, Mix::Full);
        let home = u32::from(thread) % 3 + 1;
        w.home = Some(home);
        for _ in 0..2_000 {
            t.next(&mut w);
            let wh = match &w.cur {
                Txn::NewOrder { w, .. }
                | Txn::Payment { w, .. }
                | Txn::OrderStatus { w, .. }
                | Txn::Delivery { w, .. }
                | Txn::StockLevel { w, .. } => *w,
            };
            assert_eq!(wh, home, "thread {thread}");
        }
    }
}

#[test]
fn draws_follow_the_mix_and_the_spec_percentages() {
    let (_db, t) = tiny(3);
    let mut w = worker(&t, 0, Mix::Full);
    let n = 40_000;
    let mut kinds = [0u32; 5];
    let (mut no, mut rollbacks, mut lines, mut remote_lines) = (0, 0, 0, 0);
    let (mut pay, mut remote_pay, mut by_name) = (0, 0, 0);
    for _ in 0..n {
        t.next(&mut w);
        kinds[t.kind(&w)] += 1;
        match &w.cur {
            Txn::NewOrder {
                w: wh,
                lines: ls,
                rollback,
                ..
            } => {
                no += 1;
                rollbacks += u32::from(*rollback);
                assert!((5..=15).contains(&ls.len()));
                for (i, l) in ls.iter().enumerate() {
                    lines += 1;
                    remote_lines += u32::from(l.supply_w != *wh);
                    let unused = l.i_id == t.scale.items + 1;
                    assert_eq!(unused, *rollback && i + 1 == ls.len());
                }
            }
            Txn::Payment { w: wh, c_w, by, .. } => {
                pay += 1;
                remote_pay += u32::from(c_w != wh);
                by_name += u32::from(matches!(by, CustomerBy::LastName(_)));
            }
            _ => {}
        }
    }
    let pct = |x: u32, of: u32| f64::from(x) * 100.0 / f64::from(of);
    for (k, want) in [45.0, 43.0, 4.0, 4.0, 4.0].into_iter().enumerate() {
        let got = pct(kinds[k], n);
        assert!((got - want).abs() < 1.0, "{}: {got}%", KINDS[k]);
    }
    assert!((pct(rollbacks, no) - 1.0).abs() < 0.5);
    assert!((pct(remote_lines, lines) - 1.0).abs() < 0.3);
    assert!((pct(remote_pay, pay) - 15.0).abs() < 1.5);
    assert!((pct(by_name, pay) - 60.0).abs() < 2.0);
}

#[test]
fn check_catches_injected_inconsistencies() {
    let (db, t) = tiny(1);
    // Condition 1: a district's YTD moves without its warehouse's.
    db.run(|tx| tx.add_and_get(&t.district, dkey(1, 3, 1), 100).map(|_| ()))
        .unwrap();
    let e = t.check_db(&db).unwrap_err().to_string();
    assert!(e.contains("condition 1"), "{e}");
    db.run(|tx| tx.add_and_get(&t.district, dkey(1, 3, 1), -100).map(|_| ()))
        .unwrap();
    t.check_db(&db).unwrap();
    // Condition 3: a hole in the new orders.
    let first = 30 - 9 + 1;
    db.run(|tx| tx.delete(&t.new_order, wdid(1, 4, first + 3)).map(|_| ()))
        .unwrap();
    let e = t.check_db(&db).unwrap_err().to_string();
    assert!(e.contains("condition 3"), "{e}");
    assert!(!e.contains("condition 1"), "{e}");
    db.run(|tx| tx.insert(&t.new_order, wdid(1, 4, first + 3), []))
        .unwrap();
    // Condition 4: a lost order line.
    db.run(|tx| tx.delete(&t.order_line, ol_key(1, 5, 7, 1)).map(|_| ()))
        .unwrap();
    let e = t.check_db(&db).unwrap_err().to_string();
    assert!(e.contains("condition 4"), "{e}");
}

/// The tiny scale is an option of the run (named in its record), not only an environment
/// variable.
#[test]
fn the_tiny_scale_is_a_named_option() {
    use crate::sweep::{Point, Value};
    let cfg = RunConfig::for_test("2pl", &[("tpcc-scale", Value::Text("tiny".into()))]);
    assert!(cfg.tpcc_tiny);
    if !super::tiny_asked() {
        let standard = RunConfig::for_test("2pl", &[]);
        assert!(Scale::for_config(&standard).rows() > Scale::for_config(&cfg).rows());
    }
    let bad = Point(vec![
        ("cc", Value::Cc(crate::config::Cc::TwoPl)),
        ("threads", Value::Int(1)),
        ("seed", Value::Int(1)),
        ("tpcc-scale", Value::Text("huge".into())),
    ]);
    assert!(RunConfig::from_point(&bad).is_err());
}

#[test]
fn new_order_changes_a_stock_row_in_place_as_decode_change_encode_would() {
    let mut rng = SmallRng::seed_from_u64(11);
    for round in 0..200u32 {
        let st = Stock {
            quantity: rng.gen_range(0..=120),
            ytd: rng.gen_range(0..1_000_000),
            order_cnt: rng.gen_range(0..1000),
            remote_cnt: rng.gen_range(0..1000),
            dist: astring(&mut rng, DIST_LEN * 10, DIST_LEN * 10),
            data: data_string(&mut rng),
        };
        let (qty, remote, d) = (
            rng.gen_range(1..=10u32),
            round % 3 == 0,
            rng.gen_range(1..=10u8),
        );
        // The reference: the row decoded, changed as clause 2.4.2.2 says, encoded again.
        let mut want = st.clone();
        want.quantity = if st.quantity >= qty + 10 {
            st.quantity - qty
        } else {
            st.quantity + 91 - qty
        };
        want.ytd += u64::from(qty);
        want.order_cnt += 1;
        want.remote_cnt += u32::from(remote);
        let mut row = st.encode();
        let info = Stock::order_in_place(&mut row, qty, remote, d).expect("a stock row");
        assert_eq!(row, want.encode());
        assert_eq!(&info[..], st.dist_info(d));
    }
    // A malformed row is refused and left alone.
    let st = Stock {
        quantity: 50,
        ytd: 0,
        order_cnt: 0,
        remote_cnt: 0,
        dist: vec![b'x'; DIST_LEN * 10],
        data: b"data".to_vec(),
    };
    let row = st.encode();
    for bad in [&row[..row.len() - 1], &row[..19], &[][..]] {
        let mut b = bad.to_vec();
        assert_eq!(Stock::order_in_place(&mut b, 5, false, 1), None);
        assert_eq!(b, bad);
    }
    // S_DIST shorter than ten districts: refused too.
    let mut short = Stock {
        dist: vec![b'x'; DIST_LEN * 3],
        ..st
    }
    .encode();
    assert_eq!(Stock::order_in_place(&mut short, 5, false, 4), None);
}

#[test]
fn an_item_rows_price_reads_without_decoding_its_strings() {
    let i = Item {
        im_id: 7,
        price: 12_345,
        name: b"name".to_vec(),
        data: b"ORIGINAL data".to_vec(),
    };
    let row = i.encode();
    assert_eq!(Item::price_of(&row), Some(12_345));
    assert_eq!(Item::price_of(&row[..row.len() - 1]), None);
    let mut longer = row.clone();
    longer.push(0);
    assert_eq!(Item::price_of(&longer), None);
}

#[test]
fn tax_discount_and_name_read_as_decode_would_without_copying_strings() {
    let mut rng = SmallRng::seed_from_u64(5);
    let mut s = |lo, hi| astring(&mut rng, lo, hi);
    for round in 0..100u32 {
        let p = Place {
            name: s(6, 10),
            street1: s(10, 20),
            street2: s(10, 20),
            city: s(10, 20),
            state: s(2, 2),
            zip: s(9, 9),
            tax: round * 13 % 2_001,
        };
        let row = p.encode();
        assert_eq!(Place::tax_of(&row), Place::decode(&row).map(|p| p.tax));
        assert_eq!(Place::tax_of(&row), Some(p.tax));
        assert_eq!(Place::tax_of(&row[..row.len() - 1]), None);
        assert_eq!(Place::name_of(&row), Some(&p.name[..]));
        assert_eq!(Place::name_of(&row[..row.len() - 1]), None);
        let c = Customer {
            first: s(8, 16),
            middle: b"OE".to_vec(),
            last: last_name(round % 1000),
            street1: s(10, 20),
            street2: s(10, 20),
            city: s(10, 20),
            state: s(2, 2),
            zip: s(9, 9),
            phone: s(16, 16),
            since: u64::from(round),
            credit: if round % 10 == 0 { b"BC" } else { b"GC" }.to_vec(),
            credit_lim: 5_000_000,
            discount: round * 37 % 5_001,
            balance: -1_000,
            ytd_payment: 1_000,
            payment_cnt: 1,
            delivery_cnt: 0,
            data: s(300, 500),
        };
        let row = c.encode();
        assert_eq!(
            Customer::discount_of(&row),
            Customer::decode(&row).map(|c| c.discount)
        );
        assert_eq!(Customer::discount_of(&row), Some(c.discount));
        let mut longer = row.clone();
        longer.push(0);
        assert_eq!(Customer::discount_of(&longer), None);
        assert_eq!(Customer::discount_of(&row[..row.len() / 2]), None);
        // Payment's and Delivery's change in place: as decode, change, encode would.
        let (amount, sum) = (i64::from(round) * 7 - 300, i64::from(round) * 11);
        let mut want = c.clone();
        want.balance += sum - amount;
        want.ytd_payment += amount;
        want.payment_cnt += 1;
        want.delivery_cnt += 1;
        let mut changed = row.clone();
        let bad = Customer::add_in_place(&mut changed, -amount, amount, 1, 0);
        assert_eq!(bad, Some(c.credit == b"BC"));
        assert_eq!(Customer::add_in_place(&mut changed, sum, 0, 0, 1), bad);
        assert_eq!(changed, want.encode());
        let mut cut = row[..row.len() - 1].to_vec();
        assert_eq!(Customer::add_in_place(&mut cut, 1, 1, 1, 1), None);
        assert_eq!(cut, row[..row.len() - 1]);
    }
}
