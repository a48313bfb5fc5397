//! TPC-C's consistency conditions 1-4 (clause 3.3.2), checked after every run.

use super::*;

impl Tpcc {
    /// Checks consistency conditions 1-4 (clause 3.3.2.1-4) on a quiescent database. Returns
    /// a summary, or an error listing the violations.
    #[cfg(test)]
    pub fn check_db(&self, db: &Database) -> anyhow::Result<String> {
        self.check_against(db, None)
    }

    /// [`check_db`](Self::check_db), and with a ledger that counted commits by type, that
    /// the orders are those loaded plus one per committed NewOrder and the new-order rows
    /// those loaded plus the NewOrders less at most ten per committed Delivery (conditions
    /// 1-4 alone hold on a database where whole NewOrders were lost, or none ran).
    pub fn check_against(&self, db: &Database, ledger: Option<&Ledger>) -> anyhow::Result<String> {
        let s = &self.scale;
        let mut bad = Vec::new();
        let (mut orders_n, mut lines_n, mut new_n) = (0u64, 0u64, 0u64);
        for w in 1..=s.warehouses {
            let w_ytd = db
                .run(|tx| tx.get_i64(&self.warehouse, wkey(w, 1)))?
                .context("missing W_YTD")?;
            let mut d_sum = 0i64;
            for d in 1..=s.districts {
                let (d_ytd, next) = db.run(|tx| {
                    Ok((
                        tx.get_i64(&self.district, dkey(w, d, 1))?,
                        tx.get_i64(&self.district, dkey(w, d, 2))?,
                    ))
                })?;
                let (Some(d_ytd), Some(next)) = (d_ytd, next) else {
                    bail!("district {w}/{d} lacks D_YTD or D_NEXT_O_ID");
                };
                d_sum += d_ytd;
                // Orders: max(O_ID) and sum(O_OL_CNT).
                let mut max_o = 0u32;
                let mut ol_sum = 0u64;
                let mut n_orders = 0u64;
                for (k, v) in db.run(|tx| tx.scan(&self.orders, prefix_range(&dprefix(w, d))))? {
                    let ord = Order::decode(&v).context("malformed order row")?;
                    max_o = max_o.max(id_at(&k, 5));
                    ol_sum += u64::from(ord.ol_cnt);
                    n_orders += 1;
                }
                orders_n += n_orders;
                // New orders: count, min, max.
                let nos = db.run(|tx| tx.scan(&self.new_order, prefix_range(&dprefix(w, d))))?;
                new_n += nos.len() as u64;
                let no_ids: Vec<u32> = nos.iter().map(|(k, _)| id_at(k, 5)).collect();
                // Order lines, in chunks of 1,000 orders.
                let mut n_lines = 0u64;
                let mut lo = 0u32;
                while lo <= max_o {
                    let hi = lo.saturating_add(1000);
                    n_lines += db
                        .run(|tx| tx.scan(&self.order_line, wdid(w, d, lo)..wdid(w, d, hi)))?
                        .len() as u64;
                    if hi == u32::MAX {
                        break;
                    }
                    lo = hi;
                }
                let (_, tail_hi) = prefix_range(&dprefix(w, d));
                n_lines += db
                    .run(|tx| {
                        tx.scan(
                            &self.order_line,
                            (Bound::Included(wdid(w, d, lo).to_vec()), tail_hi.clone()),
                        )
                    })?
                    .len() as u64;
                lines_n += n_lines;
                // Condition 2.
                if next - 1 != i64::from(max_o) {
                    bad.push(format!(
                        "condition 2: district {w}/{d}: D_NEXT_O_ID - 1 = {} but max(O_ID) = {max_o}",
                        next - 1
                    ));
                }
                if let (Some(&min_no), Some(&max_no)) = (no_ids.first(), no_ids.last()) {
                    if i64::from(max_no) != next - 1 {
                        bad.push(format!(
                            "condition 2: district {w}/{d}: D_NEXT_O_ID - 1 = {} but max(NO_O_ID) = {max_no}",
                            next - 1
                        ));
                    }
                    // Condition 3.
                    if u64::from(max_no - min_no) + 1 != no_ids.len() as u64 {
                        bad.push(format!(
                            "condition 3: district {w}/{d}: max(NO_O_ID) - min(NO_O_ID) + 1 = {} \
                             but there are {} new-order rows",
                            u64::from(max_no - min_no) + 1,
                            no_ids.len()
                        ));
                    }
                }
                // Condition 4.
                if ol_sum != n_lines {
                    bad.push(format!(
                        "condition 4: district {w}/{d}: sum(O_OL_CNT) = {ol_sum} but there are \
                         {n_lines} order lines"
                    ));
                }
            }
            // Condition 1.
            if w_ytd != d_sum {
                bad.push(format!(
                    "condition 1: warehouse {w}: W_YTD = {w_ytd} but sum(D_YTD) = {d_sum}"
                ));
            }
        }
        let counted = ledger.filter(|l| {
            l.by_kind.len() == l.commits.len() && l.by_kind.iter().all(|k| k.len() == KINDS.len())
        });
        let mut committed = String::new();
        if let Some(l) = counted {
            let of = |kind: usize| l.by_kind.iter().map(|k| k[kind]).sum::<u64>();
            let (new_orders, deliveries) = (of(NEW_ORDER), of(DELIVERY));
            let districts = u64::from(s.warehouses) * u64::from(s.districts);
            let want_orders = districts * u64::from(s.orders) + new_orders;
            if orders_n != want_orders {
                bad.push(format!(
                    "{orders_n} orders, but {} were loaded and {new_orders} NewOrders committed",
                    districts * u64::from(s.orders)
                ));
            }
            let open = districts * u64::from(s.new_orders) + new_orders;
            if new_n > open || open - new_n > 10 * deliveries {
                bad.push(format!(
                    "{new_n} new-order rows, but {open} were loaded or created and \
                     {deliveries} Deliveries committed (each delivers at most ten)"
                ));
            }
            committed = format!(", as committed ({new_orders} NewOrders, {deliveries} Deliveries)");
        }
        crate::workloads::fail_if_bad("TPC-C", bad)?;
        Ok(format!(
            "conditions 1-4 hold: {} warehouses, {orders_n} orders, {new_n} new orders, \
             {lines_n} order lines{committed}",
            s.warehouses
        ))
    }
}
