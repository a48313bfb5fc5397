//! TPC-C's five transactions (clause 2): drawing their inputs and running them.

use super::*;

impl Tpcc {
    /// Inserts a row of an order NewOrder just numbered. Under optimistic concurrency control
    /// the order number comes from a possibly stale read of `D_NEXT_O_ID`, and shoal's insert
    /// reports [`shoal::Error::DuplicateKey`] at once, before commit-time validation would
    /// find the stale read: that is a conflict, so it is reported as one (and retried). Under
    /// 2PL the exclusive lock on `D_NEXT_O_ID` makes a duplicate impossible, so it stays fatal.
    fn insert_new(
        &self,
        tx: &mut Transaction<'_>,
        table: &Table,
        key: &[u8],
        value: &[u8],
    ) -> shoal::Result<()> {
        match tx.insert(table, key, value) {
            Err(shoal::Error::DuplicateKey { key }) if self.optimistic => {
                Err(shoal::Error::Conflict {
                    txn: tx.id(),
                    detail: format!("order key {key} taken: D_NEXT_O_ID was read stale"),
                })
            }
            other => other,
        }
    }

    /// Draws the inputs of a transaction of type `kind`, at home warehouse `home` if given
    /// (else uniform).
    pub(super) fn draw(&self, rng: &mut SmallRng, kind: usize, home: Option<u32>) -> Txn {
        let s = &self.scale;
        let w = home.unwrap_or_else(|| rng.gen_range(1..=s.warehouses));
        let d = rng.gen_range(1..=s.districts);
        let other_w = |rng: &mut SmallRng| {
            let o = rng.gen_range(1..s.warehouses);
            if o >= w {
                o + 1
            } else {
                o
            }
        };
        let by = |rng: &mut SmallRng| {
            if rng.gen_range(0..100) < 60 {
                CustomerBy::LastName(last_name(nurand(rng, 255, C_LAST_RUN, 0, s.names() - 1)))
            } else {
                CustomerBy::Id(nurand(rng, 1023, C_ID, 1, s.customers))
            }
        };
        match kind {
            NEW_ORDER => {
                let n = rng.gen_range(5..=15);
                let rollback = rng.gen_range(0..100) == 0;
                let mut lines: Vec<Line> = (0..n)
                    .map(|_| Line {
                        i_id: nurand(rng, 8191, C_OL_I_ID, 1, s.items),
                        supply_w: if s.warehouses > 1 && rng.gen_range(0..100) == 0 {
                            other_w(rng)
                        } else {
                            w
                        },
                        qty: rng.gen_range(1..=10),
                    })
                    .collect();
                // One lock order for stock rows; the unused item stays last.
                lines.sort_by_key(|l| (l.supply_w, l.i_id));
                if rollback {
                    lines.last_mut().unwrap().i_id = s.items + 1;
                }
                Txn::NewOrder {
                    w,
                    d,
                    c: nurand(rng, 1023, C_ID, 1, s.customers),
                    lines,
                    rollback,
                    now: now_micros(),
                }
            }
            PAYMENT => {
                let (c_w, c_d) = if s.warehouses > 1 && rng.gen_range(0..100) < 15 {
                    (other_w(rng), rng.gen_range(1..=s.districts))
                } else {
                    (w, d)
                };
                Txn::Payment {
                    w,
                    d,
                    c_w,
                    c_d,
                    by: by(rng),
                    amount: rng.gen_range(100..=500_000),
                    now: now_micros(),
                }
            }
            ORDER_STATUS => Txn::OrderStatus { w, d, by: by(rng) },
            DELIVERY => Txn::Delivery {
                w,
                carrier: rng.gen_range(1..=10),
                now: now_micros(),
            },
            _ => Txn::StockLevel {
                w,
                d,
                threshold: rng.gen_range(10..=20),
            },
        }
    }

    /// The id of the customer `by` names in district `(w, d)` (see
    /// [`find_customer`](Self::find_customer)).
    fn customer_id(
        &self,
        tx: &mut Transaction<'_>,
        w: u32,
        d: u8,
        by: &CustomerBy,
    ) -> shoal::Result<u32> {
        Ok(match by {
            CustomerBy::Id(c) => *c,
            CustomerBy::LastName(last) => {
                let rows = tx.scan(&self.customer_name, prefix_range(&cname_prefix(w, d, last)))?;
                if rows.is_empty() {
                    return Err(malformed("customer_name"));
                }
                let (k, _) = &rows[(rows.len() - 1) / 2];
                id_at(k, k.len() - 4)
            }
        })
    }

    /// Finds a customer: by id, or the one at position ceil(n/2) among the n customers with
    /// the last name, sorted by first name (clause 2.5.2.2).
    fn find_customer(
        &self,
        tx: &mut Transaction<'_>,
        w: u32,
        d: u8,
        by: &CustomerBy,
        for_update: bool,
    ) -> shoal::Result<(u32, Customer)> {
        let c = self.customer_id(tx, w, d, by)?;
        let key = wdid(w, d, c);
        let v = if for_update {
            tx.get_for_update(&self.customer, key)?
        } else {
            tx.get(&self.customer, key)?
        }
        .ok_or_else(|| malformed("customer"))?;
        Ok((
            c,
            Customer::decode(&v).ok_or_else(|| malformed("customer"))?,
        ))
    }

    fn new_order(
        &self,
        tx: &mut Transaction<'_>,
        (w, d, c): (u32, u8, u32),
        lines: &[Line],
        rollback: bool,
        now: u64,
    ) -> shoal::Result<()> {
        // One buffer for the warehouse, district and customer rows, read in turn; of each,
        // only the field NewOrder uses is decoded (no string copied).
        let mut row = Vec::new();
        if !tx.get_into(&self.warehouse, wkey(w, 0), &mut row)? {
            return Err(malformed("warehouse"));
        }
        let w_tax = Place::tax_of(&row).ok_or_else(|| malformed("warehouse"))?;
        if !tx.get_into(&self.district, dkey(w, d, 0), &mut row)? {
            return Err(malformed("district"));
        }
        let d_tax = Place::tax_of(&row).ok_or_else(|| malformed("district"))?;
        let o = u32::try_from(tx.add_and_get(&self.district, dkey(w, d, 2), 1)? - 1)
            .map_err(|_| malformed("district"))?;
        if !tx.get_into(&self.customer, wdid(w, d, c), &mut row)? {
            return Err(malformed("customer"));
        }
        let discount = Customer::discount_of(&row).ok_or_else(|| malformed("customer"))?;
        let all_local = u8::from(lines.iter().all(|l| l.supply_w == w));
        let ord = Order {
            c_id: c,
            entry_d: now,
            carrier_id: 0,
            ol_cnt: lines.len() as u8,
            all_local,
        };
        self.insert_new(tx, &self.orders, &wdid(w, d, o), &ord.encode())?;
        self.insert_new(tx, &self.new_order, &wdid(w, d, o), &[])?;
        self.insert_new(tx, &self.order_cust, &oc_key(w, d, c, o), &[])?;
        let mut total = 0i64;
        // One buffer each for the item rows, the stock rows and the order lines, and one
        // order line, reused by every line.
        let (mut iv, mut sv, mut olv) = (Vec::new(), Vec::new(), Vec::new());
        let mut ol = OrderLine {
            i_id: 0,
            supply_w: 0,
            delivery_d: 0,
            quantity: 0,
            amount: 0,
            dist_info: Vec::with_capacity(DIST_LEN),
        };
        for (n, l) in lines.iter().enumerate() {
            if !tx.get_into(&self.item, item_key(l.i_id), &mut iv)? {
                if rollback && n + 1 == lines.len() {
                    // The unused item: "Item number is not valid"; the harness rolls back.
                    return Ok(());
                }
                return Err(malformed("item"));
            }
            let price = Item::price_of(&iv).ok_or_else(|| malformed("item"))?;
            let sk = stock_key(l.supply_w, l.i_id);
            // Read for update: the row is written below (one exclusive lock under 2PL, not
            // a shared one and an upgrade).
            if !tx.get_for_update_into(&self.stock, sk, &mut sv)? {
                return Err(malformed("stock"));
            }
            let dist = Stock::order_in_place(&mut sv, u32::from(l.qty), l.supply_w != w, d)
                .ok_or_else(|| malformed("stock"))?;
            tx.put(&self.stock, sk, &sv)?;
            let amount = i64::from(l.qty) * price;
            total += amount;
            ol.i_id = l.i_id;
            ol.supply_w = l.supply_w;
            ol.quantity = l.qty;
            ol.amount = amount;
            ol.dist_info.clear();
            ol.dist_info.extend_from_slice(&dist);
            ol.encode_into(&mut olv);
            self.insert_new(tx, &self.order_line, &ol_key(w, d, o, n as u8 + 1), &olv)?;
        }
        // The total the terminal would show: sum * (1 - discount) * (1 + w_tax + d_tax).
        let _total = total * i64::from(10_000 - discount) / 10_000
            * i64::from(10_000 + w_tax + d_tax)
            / 10_000;
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn payment(
        &self,
        tx: &mut Transaction<'_>,
        (w, d): (u32, u8),
        (c_w, c_d): (u32, u8),
        by: &CustomerBy,
        amount: i64,
        now: u64,
        hkey: [u8; 10],
    ) -> shoal::Result<()> {
        tx.add_and_get(&self.warehouse, wkey(w, 1), amount)?;
        // Of the warehouse and district rows only the names are used (in the history row):
        // they are borrowed from the rows read, not decoded into strings.
        let (mut wv, mut dv) = (Vec::new(), Vec::new());
        if !tx.get_into(&self.warehouse, wkey(w, 0), &mut wv)? {
            return Err(malformed("warehouse"));
        }
        let w_name = Place::name_of(&wv).ok_or_else(|| malformed("warehouse"))?;
        tx.add_and_get(&self.district, dkey(w, d, 1), amount)?;
        if !tx.get_into(&self.district, dkey(w, d, 0), &mut dv)? {
            return Err(malformed("district"));
        }
        let d_name = Place::name_of(&dv).ok_or_else(|| malformed("district"))?;
        // The customer's counters change in the row read (no decoding); only a customer
        // with bad credit, whose C_DATA grows, is decoded and encoded again.
        let c = self.customer_id(tx, c_w, c_d, by)?;
        let ck = wdid(c_w, c_d, c);
        let mut cv = Vec::new();
        if !tx.get_for_update_into(&self.customer, ck, &mut cv)? {
            return Err(malformed("customer"));
        }
        let bad_credit = Customer::add_in_place(&mut cv, -amount, amount, 1, 0)
            .ok_or_else(|| malformed("customer"))?;
        if bad_credit {
            let mut cust = Customer::decode(&cv).ok_or_else(|| malformed("customer"))?;
            let mut data = format!(
                "{c} {c_d} {c_w} {d} {w} {}.{:02} ",
                amount / 100,
                amount % 100
            )
            .into_bytes();
            data.extend_from_slice(&cust.data);
            data.truncate(500);
            cust.data = data;
            cust.encode_into(&mut cv);
        }
        tx.put(&self.customer, ck, &cv)?;
        let mut hdata = Vec::with_capacity(w_name.len() + 4 + d_name.len());
        hdata.extend_from_slice(w_name);
        hdata.extend_from_slice(b"    ");
        hdata.extend_from_slice(d_name);
        let h = History {
            c_id: c,
            c_d,
            c_w,
            d,
            w,
            date: now,
            amount,
            data: hdata,
        };
        tx.insert(&self.history, hkey, h.encode())
    }

    fn order_status(
        &self,
        tx: &mut Transaction<'_>,
        w: u32,
        d: u8,
        by: &CustomerBy,
    ) -> shoal::Result<()> {
        let (c, _cust) = self.find_customer(tx, w, d, by, false)?;
        // The customer's latest order: the last row of its range, read alone.
        let orders = tx.scan_rev_limit(&self.order_cust, prefix_range(&wdid(w, d, c)), 1)?;
        let Some((k, _)) = orders.first() else {
            return Ok(()); // a customer without orders (possible only at tiny scales)
        };
        let o = id_at(k, 9);
        let ov = tx
            .get(&self.orders, wdid(w, d, o))?
            .ok_or_else(|| malformed("orders"))?;
        let ord = Order::decode(&ov).ok_or_else(|| malformed("orders"))?;
        let lines = tx.scan(&self.order_line, prefix_range(&wdid(w, d, o)))?;
        if lines.len() != usize::from(ord.ol_cnt) {
            return Err(malformed("order_line"));
        }
        Ok(())
    }

    fn delivery(
        &self,
        tx: &mut Transaction<'_>,
        w: u32,
        carrier: u8,
        now: u64,
    ) -> shoal::Result<()> {
        for d in 1..=self.scale.districts {
            // The oldest new order: the district's first row, read (and locked, or
            // validated) alone.
            let rows = tx.scan_limit(&self.new_order, prefix_range(&dprefix(w, d)), 1)?;
            let Some((k, _)) = rows.first() else {
                continue; // no undelivered order in this district: skipped
            };
            let o = id_at(k, 5);
            tx.delete(&self.new_order, wdid(w, d, o))?;
            let ov = tx
                .get_for_update(&self.orders, wdid(w, d, o))?
                .ok_or_else(|| malformed("orders"))?;
            let mut ord = Order::decode(&ov).ok_or_else(|| malformed("orders"))?;
            ord.carrier_id = carrier;
            tx.put(&self.orders, wdid(w, d, o), ord.encode())?;
            let mut sum = 0i64;
            for (k, v) in tx.scan(&self.order_line, prefix_range(&wdid(w, d, o)))? {
                let mut l = OrderLine::decode(&v).ok_or_else(|| malformed("order_line"))?;
                sum += l.amount;
                l.delivery_d = now;
                tx.put(&self.order_line, k, l.encode())?;
            }
            let ck = wdid(w, d, ord.c_id);
            let mut cv = tx
                .get_for_update(&self.customer, ck)?
                .ok_or_else(|| malformed("customer"))?;
            Customer::add_in_place(&mut cv, sum, 0, 0, 1).ok_or_else(|| malformed("customer"))?;
            tx.put(&self.customer, ck, &cv)?;
        }
        Ok(())
    }

    fn stock_level(
        &self,
        tx: &mut Transaction<'_>,
        w: u32,
        d: u8,
        threshold: u32,
    ) -> shoal::Result<u64> {
        let next = tx
            .get_i64(&self.district, dkey(w, d, 2))?
            .ok_or_else(|| malformed("district"))?;
        let next = u32::try_from(next).map_err(|_| malformed("district"))?;
        let lines = tx.scan(
            &self.order_line,
            wdid(w, d, next.saturating_sub(20))..wdid(w, d, next),
        )?;
        let items: BTreeSet<u32> = lines
            .iter()
            .filter_map(|(_, v)| OrderLine::decode(v).map(|l| l.i_id))
            .collect();
        let mut low = 0;
        let mut sv = Vec::new();
        for i in items {
            if !tx.get_into(&self.stock, stock_key(w, i), &mut sv)? {
                return Err(malformed("stock"));
            }
            let st = Stock::decode(&sv).ok_or_else(|| malformed("stock"))?;
            if st.quantity < threshold {
                low += 1;
            }
        }
        Ok(low)
    }

    pub(super) fn execute_inner(
        &self,
        w: &TpccWorker,
        tx: &mut Transaction<'_>,
    ) -> shoal::Result<()> {
        match &w.cur {
            Txn::NewOrder {
                w: wh,
                d,
                c,
                lines,
                rollback,
                now,
            } => self.new_order(tx, (*wh, *d, *c), lines, *rollback, *now),
            Txn::Payment {
                w: wh,
                d,
                c_w,
                c_d,
                by,
                amount,
                now,
            } => self.payment(
                tx,
                (*wh, *d),
                (*c_w, *c_d),
                by,
                *amount,
                *now,
                history_key(w.thread, w.seq),
            ),
            Txn::OrderStatus { w: wh, d, by } => self.order_status(tx, *wh, *d, by),
            Txn::Delivery {
                w: wh,
                carrier,
                now,
            } => self.delivery(tx, *wh, *carrier, *now),
            Txn::StockLevel {
                w: wh,
                d,
                threshold,
            } => self.stock_level(tx, *wh, *d, *threshold).map(|_| ()),
        }
    }
}
