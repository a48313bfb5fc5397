//! A RUBiS bidding mix after Doppel's port (Narula 2015, §6.1, §7.8).
//!
//! **Data.** `--records` users (default 1,000,000) and one item per 30 users (33,333 by
//! default, the thesis' "1M users bidding on 33K auctions"), each item in one of 20
//! categories and 62 regions. Per item, the auction metadata lives in its own tables so that
//! Doppel can split each record: `maxbid` (MAX), `maxbidder` (OPUT: order = amount, value =
//! the bidder's key), `numbids` (ADD) and `bidhist` (TOPKINSERT of the bid keys, K = 10,
//! ordered by amount). `rating` holds each user's rating (ADD); `catidx` and `regidx` are
//! top-K (K = 20) indexes of the newest items per category and region.
//!
//! **Transactions.** Users are drawn uniformly, items Zipfian(`--alpha`):
//!
//! | type | RUBiS-B % | what it does |
//! |---|---|---|
//! | `store-bid` | 9 | PUT bid; MAX maxbid; OPUT maxbidder; ADD numbids; TOPKINSERT bidhist (Fig. 6-2) |
//! | `store-comment` | 3 | GET item (its seller); PUT comment; ADD the seller's rating |
//! | `store-item` | 3 | PUT a new item; TOPKINSERT it into its category's and region's index |
//! | `view-item` | 35 | GET item, maxbid, numbids |
//! | `view-bid-history` | 10 | GET bidhist |
//! | `view-user-info` | 15 | GET user, rating |
//! | `search-category` | 15 | GET catidx, then up to 5 of its items |
//! | `search-region` | 10 | GET regidx |
//!
//! RUBiS-B is that mix (15% read-write, as RUBiS's bidding mix). RUBiS-C makes `store-bid`
//! 50% of the transactions and scales the others down in proportion. The mix is our
//! approximation: the thesis names the transactions Doppel changed, not their shares.
//!
//! Under `doppel` the metadata updates are the blind operations ([`Transaction::max`],
//! [`Transaction::add`], `oput`, `topk_insert`); under the other modes `max_and_get` and
//! `add_and_get` (read-modify-writes) and the same `oput`/`topk_insert`, which run as read-modify-writes
//! there.
//!
//! **Check.** For every item: `numbids` equals the number of bids stored for it, `maxbid` the
//! largest of their amounts, `maxbidder` names a bidder who bid that amount, and `bidhist`
//! holds the bids with the K largest distinct amounts; bids stored equal the committed
//! StoreBids; ratings add up to the comments' ratings; every index entry is a stored new item
//! of that category or region.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use anyhow::{bail, ensure, Context};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use shoal::{Database, Table, Transaction};

use super::doppel_args::{key16, parse_key16, Variant};
use super::{parallel_load, Ledger, Load, Workload};
use crate::config::{Cc, RunConfig};
use crate::dist::{KeyDist, Sampler};

const LOAD_CHUNK: u64 = 10_000;
/// Categories and regions (RUBiS's defaults).
const CATEGORIES: u64 = 20;
const REGIONS: u64 = 62;
/// Bids kept per item's history, items per index.
const BID_K: u32 = 10;
const INDEX_K: u32 = 20;
/// Users per item.
const USERS_PER_ITEM: u64 = 30;

/// Transaction types, in [`KINDS`] order.
const STORE_BID: usize = 0;
const STORE_COMMENT: usize = 1;
const STORE_ITEM: usize = 2;
const VIEW_ITEM: usize = 3;
const VIEW_BID_HISTORY: usize = 4;
const VIEW_USER_INFO: usize = 5;
const SEARCH_CATEGORY: usize = 6;
const SEARCH_REGION: usize = 7;

const KINDS: &[&str] = &[
    "store-bid",
    "store-comment",
    "store-item",
    "view-item",
    "view-bid-history",
    "view-user-info",
    "search-category",
    "search-region",
];

/// RUBiS-B's shares in percent, in [`KINDS`] order.
const MIX_B: [f64; 8] = [9.0, 3.0, 3.0, 35.0, 10.0, 15.0, 15.0, 10.0];

/// The cumulative mix of a variant: `b`, or `c` (store-bid 50%, the rest scaled).
fn mix(variant: Variant) -> [f64; 8] {
    let mut m = MIX_B;
    if variant == Variant::C {
        let rest = 100.0 - MIX_B[STORE_BID];
        for (i, v) in m.iter_mut().enumerate() {
            *v = if i == STORE_BID {
                50.0
            } else {
                *v * 50.0 / rest
            };
        }
    }
    let mut acc = 0.0;
    for v in &mut m {
        acc += *v;
        *v = acc;
    }
    m
}

/// The loaded tables.
pub struct Rubis {
    t: Tables,
    users: u64,
    items: u64,
    /// For the top-K orders of new items.
    base: Instant,
    store_bids: AtomicU64,
    store_comments: AtomicU64,
    store_items: AtomicU64,
    /// Sum of the ratings of committed comments.
    ratings: std::sync::atomic::AtomicI64,
}

struct Tables {
    users: Table,
    items: Table,
    bids: Table,
    comments: Table,
    maxbid: Table,
    maxbidder: Table,
    numbids: Table,
    bidhist: Table,
    rating: Table,
    catidx: Table,
    regidx: Table,
}

/// A worker's state: the current transaction's inputs.
#[derive(Clone)]
pub struct RubisWorker {
    rng: SmallRng,
    blind: bool,
    mix: [f64; 8],
    items: Sampler,
    /// Unique ids for new bids, comments and items: run, thread, sequence.
    uid_base: u64,
    seq: u64,
    kind: usize,
    user: u64,
    item: u64,
    amount: i64,
    rating: i64,
    category: u64,
    region: u64,
}

/// A bid's stored value: item, bidder, amount (8 bytes each, little-endian).
fn bid_value(item: u64, user: u64, amount: i64) -> [u8; 24] {
    let mut v = [0u8; 24];
    v[..8].copy_from_slice(&item.to_le_bytes());
    v[8..16].copy_from_slice(&user.to_le_bytes());
    v[16..].copy_from_slice(&amount.to_le_bytes());
    v
}

fn u64_at(v: &[u8], at: usize) -> anyhow::Result<u64> {
    let b: [u8; 8] = v
        .get(at..at + 8)
        .and_then(|s| s.try_into().ok())
        .context("a short value")?;
    Ok(u64::from_le_bytes(b))
}

/// An item's stored value: seller, category, region.
fn item_value(seller: u64, category: u64, region: u64) -> [u8; 24] {
    bid_value(seller, category, region as i64)
}

fn k16(prefix: u8, id: u64) -> [u8; 16] {
    let mut k = [0u8; 16];
    key16(prefix, id, &mut k);
    k
}

impl Rubis {
    fn uid(w: &RubisWorker) -> u64 {
        w.uid_base | (w.seq & 0xffff_ffff)
    }
}

impl Workload for Rubis {
    type Worker = RubisWorker;

    fn rows(cfg: &RunConfig) -> u64 {
        cfg.records + (cfg.records / USERS_PER_ITEM).max(1)
    }

    fn load(l: Load<'_>) -> anyhow::Result<Rubis> {
        let users = l.cfg.records;
        ensure!(users >= 1, "rubis needs at least one user");
        let items = (users / USERS_PER_ITEM).max(1);
        let t = |name: &str| super::create_table(l.db, name);
        let t = Tables {
            users: t("users")?,
            items: t("items")?,
            bids: t("bids")?,
            comments: t("comments")?,
            maxbid: t("maxbid")?,
            maxbidder: t("maxbidder")?,
            numbids: t("numbids")?,
            bidhist: t("bidhist")?,
            rating: t("rating")?,
            catidx: t("catidx")?,
            regidx: t("regidx")?,
        };
        let chunks: Vec<u64> = (0..users.max(items)).step_by(LOAD_CHUNK as usize).collect();
        parallel_load(&chunks, l.load_threads, l.progress, |&lo| {
            let hi = (lo + LOAD_CHUNK).min(users.max(items));
            l.db.run(|tx| {
                for i in lo..hi.min(users) {
                    tx.insert(&t.users, k16(b'u', i), k16(b'n', i))?;
                }
                for i in lo..hi.min(items) {
                    let v = item_value(i * 7919 % users, i % CATEGORIES, i % REGIONS);
                    tx.insert(&t.items, k16(b'i', i), v)?;
                }
                Ok(())
            })?;
            Ok(hi.min(users).saturating_sub(lo) + hi.min(items).saturating_sub(lo))
        })?;
        Ok(Rubis {
            t,
            users,
            items,
            base: Instant::now(),
            store_bids: AtomicU64::new(0),
            store_comments: AtomicU64::new(0),
            store_items: AtomicU64::new(0),
            ratings: std::sync::atomic::AtomicI64::new(0),
        })
    }

    fn worker(&self, cfg: &RunConfig, run: u16, thread: u16, seed: u64) -> RubisWorker {
        RubisWorker {
            rng: SmallRng::seed_from_u64(seed),
            blind: cfg.cc == Cc::Doppel,
            mix: mix(cfg.variant),
            items: KeyDist::Zipf(cfg.alpha.unwrap_or(1.8)).over(self.items),
            uid_base: (u64::from(run) << 44) | (u64::from(thread & 0xfff) << 32),
            seq: 0,
            kind: 0,
            user: 0,
            item: 0,
            amount: 0,
            rating: 0,
            category: 0,
            region: 0,
        }
    }

    fn next(&self, w: &mut RubisWorker) {
        let x = w.rng.gen_range(0.0..100.0);
        w.kind = w.mix.iter().position(|&c| x < c).unwrap_or(SEARCH_REGION);
        w.user = w.rng.gen_range(0..self.users);
        w.item = w.items.sample(&mut w.rng);
        w.amount = w.rng.gen_range(1..=1_000_000);
        w.rating = w.rng.gen_range(-1..=5);
        w.category = w.rng.gen_range(0..CATEGORIES);
        w.region = w.rng.gen_range(0..REGIONS);
    }

    fn execute(&self, w: &RubisWorker, tx: &mut Transaction<'_>) -> shoal::Result<()> {
        let t = &self.t;
        let item = k16(b'i', w.item);
        let user = k16(b'u', w.user);
        match w.kind {
            STORE_BID => {
                let bid = k16(b'b', Rubis::uid(w));
                tx.put(&t.bids, bid, bid_value(w.item, w.user, w.amount))?;
                if w.blind {
                    tx.max(&t.maxbid, item, w.amount)?;
                } else {
                    tx.max_and_get(&t.maxbid, item, w.amount)?;
                }
                tx.oput(&t.maxbidder, item, w.amount, user)?;
                if w.blind {
                    tx.add(&t.numbids, item, 1)?;
                } else {
                    tx.add_and_get(&t.numbids, item, 1)?;
                }
                tx.topk_insert(&t.bidhist, item, w.amount, bid, BID_K)?;
            }
            STORE_COMMENT => {
                let it = tx.get(&t.items, item)?.unwrap_or_default();
                let seller = u64_at(&it, 0).unwrap_or(0);
                let c = k16(b'c', Rubis::uid(w));
                let mut v = bid_value(w.item, w.user, w.rating).to_vec();
                v.extend_from_slice(&seller.to_le_bytes());
                tx.put(&t.comments, c, v)?;
                let s = k16(b'u', seller);
                if w.blind {
                    tx.add(&t.rating, s, w.rating)?;
                } else {
                    tx.add_and_get(&t.rating, s, w.rating)?;
                }
            }
            STORE_ITEM => {
                let k = k16(b'n', Rubis::uid(w));
                tx.put(&t.items, k, item_value(w.user, w.category, w.region))?;
                let order = self.base.elapsed().as_micros() as i64;
                tx.topk_insert(&t.catidx, k16(b'c', w.category), order, k, INDEX_K)?;
                tx.topk_insert(&t.regidx, k16(b'r', w.region), order, k, INDEX_K)?;
            }
            VIEW_ITEM => {
                let v = (
                    tx.get(&t.items, item)?,
                    tx.get_i64(&t.maxbid, item)?,
                    tx.get_i64(&t.numbids, item)?,
                );
                std::hint::black_box(v);
            }
            VIEW_BID_HISTORY => {
                std::hint::black_box(tx.get_topk(&t.bidhist, item)?);
            }
            VIEW_USER_INFO => {
                let v = (tx.get(&t.users, user)?, tx.get_i64(&t.rating, user)?);
                std::hint::black_box(v);
            }
            SEARCH_CATEGORY => {
                let set = tx.get_topk(&t.catidx, k16(b'c', w.category))?;
                for e in set.iter().take(5) {
                    std::hint::black_box(tx.get(&t.items, &e.value)?);
                }
            }
            _ => {
                std::hint::black_box(tx.get_topk(&t.regidx, k16(b'r', w.region))?);
            }
        }
        Ok(())
    }

    fn committed(&self, w: &mut RubisWorker) {
        match w.kind {
            STORE_BID => self.store_bids.fetch_add(1, Ordering::Relaxed),
            STORE_COMMENT => {
                self.ratings.fetch_add(w.rating, Ordering::Relaxed);
                self.store_comments.fetch_add(1, Ordering::Relaxed)
            }
            STORE_ITEM => self.store_items.fetch_add(1, Ordering::Relaxed),
            _ => return,
        };
        w.seq += 1;
    }

    fn save(&self, w: &mut RubisWorker) -> Option<RubisWorker> {
        let copy = w.clone();
        // The copy keeps this sequence number: new transactions use the next ones.
        w.seq += 1;
        Some(copy)
    }

    fn kinds(&self) -> &'static [&'static str] {
        KINDS
    }

    fn kind(&self, w: &RubisWorker) -> usize {
        w.kind
    }

    fn check(&self, db: &Database, ledger: &Ledger) -> anyhow::Result<String> {
        let t = &self.t;
        let writes = self.store_bids.load(Ordering::Relaxed)
            + self.store_comments.load(Ordering::Relaxed)
            + self.store_items.load(Ordering::Relaxed);
        ensure!(
            writes <= ledger.total(),
            "{writes} read-write transactions counted, {} commits",
            ledger.total()
        );
        // Per item: bids, largest amount, bidders at it, distinct amounts (top K).
        #[derive(Default)]
        struct Item {
            bids: i64,
            max: i64,
            at_max: Vec<Vec<u8>>,
            top: Vec<i64>,
            keys: HashMap<Vec<u8>, i64>,
        }
        let mut items: HashMap<u64, Item> = HashMap::new();
        let bids = db.run(|tx| tx.scan(&t.bids, ..)).context("scanning bids")?;
        for (k, v) in &bids {
            let (item, user, amount) = (u64_at(v, 0)?, u64_at(v, 8)?, u64_at(v, 16)? as i64);
            ensure!(item < self.items, "bid {k:02x?} on unknown item {item}");
            let e = items.entry(item).or_default();
            e.bids += 1;
            let bidder = k16(b'u', user).to_vec();
            if amount > e.max {
                e.max = amount;
                e.at_max = vec![bidder];
            } else if amount == e.max {
                e.at_max.push(bidder);
            }
            if !e.top.contains(&amount) {
                e.top.push(amount);
                e.top.sort_unstable_by(|a, b| b.cmp(a));
                e.top.truncate(BID_K as usize);
            }
            e.keys.insert(k.clone(), amount);
        }
        ensure!(
            bids.len() as u64 == self.store_bids.load(Ordering::Relaxed),
            "{} bids stored, {} StoreBids committed",
            bids.len(),
            self.store_bids.load(Ordering::Relaxed)
        );
        let scan_ints = |table: &Table| -> anyhow::Result<HashMap<u64, i64>> {
            let rows = db.run(|tx| tx.scan(table, ..))?;
            let mut m = HashMap::new();
            for (k, v) in rows {
                let id = parse_key16(&k).context("a bad key")?;
                m.insert(id, u64_at(&v, 0)? as i64);
            }
            Ok(m)
        };
        let numbids = scan_ints(&t.numbids).context("scanning numbids")?;
        let maxbid = scan_ints(&t.maxbid).context("scanning maxbid")?;
        ensure!(
            numbids.len() == items.len() && maxbid.len() == items.len(),
            "{} numbids and {} maxbid records for {} items with bids",
            numbids.len(),
            maxbid.len(),
            items.len()
        );
        let maxbidder = db.run(|tx| tx.scan(&t.maxbidder, ..))?;
        ensure!(
            maxbidder.len() == items.len(),
            "{} maxbidder records",
            maxbidder.len()
        );
        for (id, e) in &items {
            let k = k16(b'i', *id);
            if numbids.get(id) != Some(&e.bids) {
                bail!(
                    "item {id}: numbids {:?}, {} bids stored",
                    numbids.get(id),
                    e.bids
                );
            }
            if maxbid.get(id) != Some(&e.max) {
                bail!(
                    "item {id}: maxbid {:?}, largest bid {}",
                    maxbid.get(id),
                    e.max
                );
            }
            let (who, hist) =
                db.run(|tx| Ok((tx.get_tuple(&t.maxbidder, k)?, tx.get_topk(&t.bidhist, k)?)))?;
            let who = who.with_context(|| format!("item {id}: no maxbidder"))?;
            if who.order != e.max || !e.at_max.contains(&who.value) {
                bail!(
                    "item {id}: maxbidder bid {} ({:?}), largest bid {}",
                    who.order,
                    String::from_utf8_lossy(&who.value),
                    e.max
                );
            }
            let orders: Vec<i64> = hist.iter().map(|x| x.order).collect();
            if orders != e.top {
                bail!(
                    "item {id}: bid history {orders:?}, largest bids {:?}",
                    e.top
                );
            }
            for x in &hist {
                if e.keys.get(&x.value) != Some(&x.order) {
                    bail!(
                        "item {id}: bid history names bid {:02x?} of {}, not stored",
                        x.value,
                        x.order
                    );
                }
            }
        }
        // Comments and ratings.
        let comments = db.run(|tx| tx.scan(&t.comments, ..))?;
        let mut sum = 0i64;
        for (_, v) in &comments {
            sum += u64_at(v, 16)? as i64;
        }
        let rating: i64 = scan_ints(&t.rating)
            .context("scanning rating")?
            .values()
            .sum();
        ensure!(
            comments.len() as u64 == self.store_comments.load(Ordering::Relaxed),
            "{} comments stored, {} StoreComments committed",
            comments.len(),
            self.store_comments.load(Ordering::Relaxed)
        );
        ensure!(
            rating == sum && sum == self.ratings.load(Ordering::Relaxed),
            "ratings add up to {rating}, comments to {sum}, committed comments to {}",
            self.ratings.load(Ordering::Relaxed)
        );
        // New items and their indexes.
        let all_items = db.run(|tx| tx.scan(&t.items, ..))?;
        let new: HashMap<Vec<u8>, (u64, u64)> = all_items
            .iter()
            .filter(|(k, _)| k.first() == Some(&b'n'))
            .map(|(k, v)| Ok((k.clone(), (u64_at(v, 8)?, u64_at(v, 16)?))))
            .collect::<anyhow::Result<_>>()?;
        ensure!(
            new.len() as u64 == self.store_items.load(Ordering::Relaxed)
                && all_items.len() as u64 == self.items + new.len() as u64,
            "{} items ({} new), {} loaded and {} StoreItems committed",
            all_items.len(),
            new.len(),
            self.items,
            self.store_items.load(Ordering::Relaxed)
        );
        let mut indexed = 0;
        for (table, prefix, n, field) in [
            (&t.catidx, b'c', CATEGORIES, 0),
            (&t.regidx, b'r', REGIONS, 1),
        ] {
            for c in 0..n {
                let set = db.run(|tx| tx.get_topk(table, k16(prefix, c)))?;
                for e in &set {
                    let Some(&it) = new.get(&e.value) else {
                        bail!(
                            "{} {c} lists item {:02x?}, not stored",
                            table.name(),
                            e.value
                        );
                    };
                    let v = if field == 0 { it.0 } else { it.1 };
                    ensure!(v == c, "{} {c} lists an item of {v}", table.name());
                }
                indexed += set.len();
            }
        }
        Ok(format!(
            "{} bids on {} items match numbids, maxbid, maxbidder, bidhist; {} comments match \
             ratings; {} new items, {indexed} index entries",
            bids.len(),
            items.len(),
            comments.len(),
            new.len()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sweep::Value;
    use crate::workloads::testutil::{config_cc, open, run_split};

    #[test]
    fn mixes_add_up() {
        for v in [Variant::B, Variant::C] {
            let m = mix(v);
            assert!((m[7] - 100.0).abs() < 1e-9, "{v:?}: {m:?}");
        }
        assert!((mix(Variant::C)[STORE_BID] - 50.0).abs() < 1e-9);
        let b = mix(Variant::B);
        assert!((b[STORE_ITEM] - 15.0).abs() < 1e-9, "{b:?}");
    }

    #[test]
    fn rubis_checks_under_every_cc() {
        for cc in ["2pl", "occ", "doppel"] {
            for variant in ["b", "c"] {
                let cfg = config_cc(
                    cc,
                    &[
                        ("records", Value::Int(600)),
                        ("variant", Value::from(variant)),
                        ("alpha", Value::Float(1.8)),
                    ],
                );
                let db = open(&cfg);
                let w = crate::workloads::testutil::load::<Rubis>(&db, &cfg, 2);
                let (ledger, _) = run_split(&w, &db, &cfg, 250, 4, |w| {
                    use shoal::doppel::SplitOp;
                    let hot = k16(b'i', 0);
                    db.split_hint(&w.t.maxbid, hot, SplitOp::Max).unwrap();
                    db.split_hint(&w.t.numbids, hot, SplitOp::Add).unwrap();
                    db.split_hint(&w.t.maxbidder, hot, SplitOp::Oput).unwrap();
                    db.split_hint(&w.t.bidhist, hot, SplitOp::TopK(BID_K))
                        .unwrap();
                });
                let msg = w
                    .check(&db, &ledger)
                    .unwrap_or_else(|e| panic!("{cc} {variant}: {e:#}"));
                assert!(w.store_bids.load(Ordering::Relaxed) > 0, "{msg}");
                // A lost bid breaks the check.
                w.store_bids.fetch_add(1, Ordering::Relaxed);
                assert!(w.check(&db, &ledger).is_err());
            }
        }
    }
}
