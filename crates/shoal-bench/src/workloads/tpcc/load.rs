//! TPC-C's load (clause 4.3.3.1): the tables created and filled in work items spread over
//! the load threads.

use super::*;

impl Tpcc {
    /// Creates the tables in the empty database `db` and loads them at `scale`, with up to
    /// `load_threads` threads. Advances `progress` by the rows loaded.
    pub fn load(
        db: &Database,
        scale: Scale,
        load_threads: usize,
        progress: &ProgressBar,
    ) -> anyhow::Result<Tpcc> {
        anyhow::ensure!(scale.warehouses >= 1, "at least one warehouse");
        anyhow::ensure!(
            scale.new_orders <= scale.orders && scale.orders <= scale.customers,
            "bad scale {scale:?}"
        );
        let create = |name: &str| crate::workloads::create_table(db, name);
        let t = Tpcc {
            warehouse: create("warehouse")?,
            district: create("district")?,
            customer: create("customer")?,
            customer_name: create("customer_name")?,
            history: create("history")?,
            new_order: create("new_order")?,
            orders: create("orders")?,
            order_cust: create("order_cust")?,
            order_line: create("order_line")?,
            item: create("item")?,
            stock: create("stock")?,
            scale,
            optimistic: db.options().cc == shoal::ConcurrencyControl::Optimistic,
        };
        let mut items = Vec::new();
        let mut lo = 1;
        while lo <= scale.items {
            let hi = (lo + LOAD_ITEMS).min(scale.items + 1);
            items.push(LoadItem::Items(lo, hi));
            lo = hi;
        }
        for w in 1..=scale.warehouses {
            items.push(LoadItem::Warehouse(w));
            let mut lo = 1;
            while lo <= scale.items {
                let hi = (lo + LOAD_ITEMS).min(scale.items + 1);
                items.push(LoadItem::Stock(w, lo, hi));
                lo = hi;
            }
            for d in 1..=scale.districts {
                items.push(LoadItem::Customers(w, d));
                let mut lo = 1;
                while lo <= scale.orders {
                    let hi = (lo + LOAD_ORDERS).min(scale.orders + 1);
                    items.push(LoadItem::Orders(w, d, lo, hi));
                    lo = hi;
                }
            }
        }
        let load_time = now_micros();
        crate::workloads::parallel_load(&items, load_threads, progress, |&item| {
            db.run(|tx| t.load_item(tx, item, load_time))
                .with_context(|| format!("loading {item:?}"))
        })?;
        Ok(t)
    }

    /// Loads one work item in `tx`; returns the rows inserted.
    fn load_item(&self, tx: &mut Transaction<'_>, item: LoadItem, now: u64) -> shoal::Result<u64> {
        let s = &self.scale;
        let mut rows = 0u64;
        match item {
            LoadItem::Items(lo, hi) => {
                let mut rng = seeded(&[1, u64::from(lo)]);
                for i in lo..hi {
                    let it = Item {
                        im_id: rng.gen_range(1..=10_000),
                        price: rng.gen_range(100..=10_000),
                        name: astring(&mut rng, 14, 24),
                        data: data_string(&mut rng),
                    };
                    tx.insert(&self.item, item_key(i), it.encode())?;
                    rows += 1;
                }
            }
            LoadItem::Stock(w, lo, hi) => {
                let mut rng = seeded(&[2, u64::from(w), u64::from(lo)]);
                for i in lo..hi {
                    let st = Stock {
                        quantity: rng.gen_range(10..=100),
                        ytd: 0,
                        order_cnt: 0,
                        remote_cnt: 0,
                        dist: astring(&mut rng, DIST_LEN * 10, DIST_LEN * 10),
                        data: data_string(&mut rng),
                    };
                    tx.insert(&self.stock, stock_key(w, i), st.encode())?;
                    rows += 1;
                }
            }
            LoadItem::Warehouse(w) => {
                let mut rng = seeded(&[3, u64::from(w)]);
                tx.insert(&self.warehouse, wkey(w, 0), place(&mut rng, 6).encode())?;
                tx.insert(
                    &self.warehouse,
                    wkey(w, 1),
                    (3_000_000i64 * i64::from(s.districts)).to_le_bytes(),
                )?;
                rows += 2;
                for d in 1..=s.districts {
                    tx.insert(&self.district, dkey(w, d, 0), place(&mut rng, 6).encode())?;
                    tx.insert(&self.district, dkey(w, d, 1), 3_000_000i64.to_le_bytes())?;
                    tx.insert(
                        &self.district,
                        dkey(w, d, 2),
                        (i64::from(s.orders) + 1).to_le_bytes(),
                    )?;
                    rows += 3;
                }
            }
            LoadItem::Customers(w, d) => {
                let mut rng = seeded(&[4, u64::from(w), u64::from(d)]);
                for c in 1..=s.customers {
                    let last = if c <= s.names() {
                        last_name(c - 1)
                    } else {
                        last_name(nurand(&mut rng, 255, C_LAST_LOAD, 0, s.names() - 1))
                    };
                    let cu = Customer {
                        first: astring(&mut rng, 8, 16),
                        middle: b"OE".to_vec(),
                        last,
                        street1: astring(&mut rng, 10, 20),
                        street2: astring(&mut rng, 10, 20),
                        city: astring(&mut rng, 10, 20),
                        state: astring(&mut rng, 2, 2),
                        zip: zip(&mut rng),
                        phone: nstring(&mut rng, 16, 16),
                        since: now,
                        credit: if rng.gen_bool(0.1) { b"BC" } else { b"GC" }.to_vec(),
                        credit_lim: 5_000_000,
                        discount: rng.gen_range(0..=5000),
                        balance: -1000,
                        ytd_payment: 1000,
                        payment_cnt: 1,
                        delivery_cnt: 0,
                        data: astring(&mut rng, 300, 500),
                    };
                    tx.insert(&self.customer, wdid(w, d, c), cu.encode())?;
                    tx.insert(
                        &self.customer_name,
                        cname_key(w, d, &cu.last, &cu.first, c),
                        [],
                    )?;
                    let h = History {
                        c_id: c,
                        c_d: d,
                        c_w: w,
                        d,
                        w,
                        date: now,
                        amount: 1000,
                        data: astring(&mut rng, 12, 24),
                    };
                    let seq = ((u64::from(w) * 256 + u64::from(d)) << 32) | u64::from(c);
                    tx.insert(&self.history, history_key(0xffff, seq), h.encode())?;
                    rows += 3;
                }
            }
            LoadItem::Orders(w, d, lo, hi) => {
                // The customer permutation of this district, the same for every chunk.
                let mut perm: Vec<u32> = (1..=s.customers).collect();
                perm.shuffle(&mut seeded(&[5, u64::from(w), u64::from(d)]));
                let mut rng = seeded(&[6, u64::from(w), u64::from(d), u64::from(lo)]);
                let first_new = s.orders - s.new_orders + 1;
                for o in lo..hi {
                    let delivered = o < first_new;
                    let ord = Order {
                        c_id: perm[(o - 1) as usize],
                        entry_d: now,
                        carrier_id: if delivered { rng.gen_range(1..=10) } else { 0 },
                        ol_cnt: rng.gen_range(5..=15),
                        all_local: 1,
                    };
                    tx.insert(&self.orders, wdid(w, d, o), ord.encode())?;
                    tx.insert(&self.order_cust, oc_key(w, d, ord.c_id, o), [])?;
                    rows += 2;
                    for n in 1..=ord.ol_cnt {
                        let l = OrderLine {
                            i_id: rng.gen_range(1..=s.items),
                            supply_w: w,
                            delivery_d: if delivered { now } else { 0 },
                            quantity: 5,
                            amount: if delivered {
                                0
                            } else {
                                rng.gen_range(1..=999_999)
                            },
                            dist_info: astring(&mut rng, DIST_LEN, DIST_LEN),
                        };
                        tx.insert(&self.order_line, ol_key(w, d, o, n), l.encode())?;
                        rows += 1;
                    }
                    if !delivered {
                        tx.insert(&self.new_order, wdid(w, d, o), [])?;
                        rows += 1;
                    }
                }
            }
        }
        Ok(rows)
    }
}
