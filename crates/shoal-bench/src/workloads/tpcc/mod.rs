//! TPC-C on shoal (TPC-C standard specification 5.11).
//!
//! **Tables.** The nine tables of the specification, `warehouse`, `district`, `customer`,
//! `history`, `new_order`, `orders`, `order_line`, `item` and `stock`, plus two secondary
//! indexes: `customer_name` (customers by last name, then first name, for Payment and
//! OrderStatus by last name) and `order_cust` (orders by customer, for OrderStatus' last
//! order). Ids are 1-based as in the specification and keys are big-endian, so key order is the
//! specification's ordering:
//!
//! | table | key | value |
//! |---|---|---|
//! | warehouse | `w:u32, 0` / `w:u32, 1` | the row / `W_YTD` (i64 cents) |
//! | district | `w, d:u8, 0` / `…, 1` / `…, 2` | the row / `D_YTD` / `D_NEXT_O_ID` (i64) |
//! | customer | `w, d, c:u32` | the row |
//! | customer_name | `w, d, last (16 bytes, 0-padded), first (16), c` | empty |
//! | history | `thread:u16, seq:u64` (load: thread `0xffff`) | the row |
//! | new_order | `w, d, o:u32` | empty |
//! | orders | `w, d, o` | the row |
//! | order_cust | `w, d, c, o` | empty |
//! | order_line | `w, d, o, ol:u8` | the row |
//! | item | `i:u32` | the row |
//! | stock | `w, i` | the row |
//!
//! The counters that every Payment or NewOrder of a warehouse or district updates (`W_YTD`,
//! `D_YTD`, `D_NEXT_O_ID`) live under their own keys as 8-byte integers, updated with
//! [`Transaction::add_and_get`]: an exclusive lock from the start (no shared-to-exclusive upgrade, so no
//! upgrade deadlocks between Payments), and NewOrder's read of the warehouse and district rows
//! (the taxes) does not conflict with Payment's update of the year-to-date amounts. Rows are
//! compact binary encodings (integers fixed-width little-endian, strings with a 2-byte length);
//! money is in cents, tax and discount rates in 1/10,000. Row sizes follow the specification's
//! field lengths (a customer row is about 600 bytes, a stock row about 320).
//!
//! **Load** (clause 4.3.3.1): 100,000 items; per warehouse 100,000 stock rows and 10 districts;
//! per district 3,000 customers (last names from the syllables, NURand(255, 0, 999) beyond the
//! first 1,000), one history row each, 3,000 orders for a random permutation of the customers,
//! 5-15 lines each, and new-order rows for orders 2,101-3,000. The environment variable
//! `SHOAL_TPCC_TINY=1` scales the load down for tests ([`Scale::tiny`]).
//!
//! **Transactions** (clause 2), mix 45% NewOrder, 43% Payment, 4% each OrderStatus, Delivery,
//! StockLevel (or one of them alone, `--mix`). The home warehouse and district are uniform per
//! transaction by default (`--home random`: no terminals); `--home thread` binds worker `i` to
//! home warehouse `i mod W + 1`, as the specification's terminals are bound to theirs (clause
//! 4.2.2) and as Silo's and most papers' drivers bind a worker thread to a warehouse; the
//! district stays uniform. NewOrder: 5-15 lines, items NURand(8191), 1% of lines from a
//! remote warehouse (when W > 1), 1% of transactions with an unused item as the last line,
//! which the harness rolls back as an expected rollback; its lines are sorted by (supply
//! warehouse, item) so that concurrent NewOrders lock stock rows in one order. Payment: 60% by
//! last name, 15% for a customer of a remote warehouse (when W > 1). OrderStatus: 60% by last
//! name; the last order by a reverse range scan of `order_cust`. Delivery: one transaction over
//! all districts, each district's oldest new order by a range scan of `new_order`. StockLevel:
//! a range scan of the order lines of the district's last 20 orders.
//!
//! **Consistency** ([`Tpcc::check`], clause 3.3.2): (1) `W_YTD = sum(D_YTD)`; (2)
//! `D_NEXT_O_ID - 1 = max(O_ID) = max(NO_O_ID)`; (3) `max(NO_O_ID) - min(NO_O_ID) + 1` = the
//! number of new-order rows; (4) `sum(O_OL_CNT)` = the number of order lines, per district.
//!
//! This file holds the schema (keys, row encodings, generators) and the workload's interface
//! to the harness; `load.rs` the load, `txns.rs` the five transactions, `check.rs` the
//! consistency conditions.

use std::collections::BTreeSet;
use std::ops::Bound;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use indicatif::ProgressBar;
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use shoal::{Database, Table, Transaction};

use super::{Ledger, Load, Workload};
use crate::config::RunConfig;

mod check;
mod load;
mod txns;

/// Which transactions a run draws.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Mix {
    /// The specification's mix: 45% NewOrder, 43% Payment, 4% each of the others.
    Full,
    /// NewOrder alone.
    NewOrder,
    /// Payment alone.
    Payment,
    /// OrderStatus alone.
    OrderStatus,
    /// Delivery alone.
    Delivery,
    /// StockLevel alone.
    StockLevel,
}

impl Mix {
    /// The command-line name.
    pub fn name(self) -> &'static str {
        match self {
            Mix::Full => "full",
            Mix::NewOrder => "new-order",
            Mix::Payment => "payment",
            Mix::OrderStatus => "order-status",
            Mix::Delivery => "delivery",
            Mix::StockLevel => "stock-level",
        }
    }

    /// Parses a command-line name.
    pub fn parse(s: &str) -> Option<Mix> {
        [
            Mix::Full,
            Mix::NewOrder,
            Mix::Payment,
            Mix::OrderStatus,
            Mix::Delivery,
            Mix::StockLevel,
        ]
        .into_iter()
        .find(|m| m.name() == s)
    }
}

/// Names of the transaction types, in [`Workload::kinds`] order.
pub const KINDS: [&str; 5] = [
    "new-order",
    "payment",
    "order-status",
    "delivery",
    "stock-level",
];
const NEW_ORDER: usize = 0;
const PAYMENT: usize = 1;
const ORDER_STATUS: usize = 2;
const DELIVERY: usize = 3;
const STOCK_LEVEL: usize = 4;

/// `--home`: how a transaction's home warehouse is chosen.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Home {
    /// Uniform over the warehouses, for every transaction.
    #[default]
    Random,
    /// Worker `i`'s home warehouse is `i mod W + 1`, for all its transactions (the
    /// specification's terminals, each bound to one warehouse).
    Thread,
}

impl Home {
    /// The command-line name.
    pub fn name(self) -> &'static str {
        match self {
            Home::Random => "random",
            Home::Thread => "thread",
        }
    }
}

/// Whether `SHOAL_TPCC_TINY` asks for the tiny scale (set to a non-empty value other than
/// `0`). `shoal bench tpcc` then names it in its runs (`tpcc-scale` = `tiny`).
pub fn tiny_asked() -> bool {
    std::env::var("SHOAL_TPCC_TINY").is_ok_and(|v| !v.is_empty() && v != "0")
}

/// The database's size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Scale {
    /// Warehouses.
    pub warehouses: u32,
    /// Items (and stock rows per warehouse): 100,000.
    pub items: u32,
    /// Districts per warehouse: 10.
    pub districts: u8,
    /// Customers per district: 3,000.
    pub customers: u32,
    /// Orders loaded per district: 3,000.
    pub orders: u32,
    /// Of those, the last this many are undelivered (have new-order rows): 900.
    pub new_orders: u32,
}

impl Scale {
    /// The specification's scale with `warehouses` warehouses.
    pub fn standard(warehouses: u32) -> Scale {
        Scale {
            warehouses,
            items: 100_000,
            districts: 10,
            customers: 3_000,
            orders: 3_000,
            new_orders: 900,
        }
    }

    /// A scale small enough for tests: 1,000 items, 10 districts of 30 customers and orders.
    pub fn tiny(warehouses: u32) -> Scale {
        Scale {
            warehouses,
            items: 1_000,
            districts: 10,
            customers: 30,
            orders: 30,
            new_orders: 9,
        }
    }

    /// The scale for `cfg`: tiny when its `tpcc-scale` says so or [`tiny_asked`], else
    /// standard.
    pub fn for_config(cfg: &RunConfig) -> Scale {
        let w = u32::try_from(cfg.scale).unwrap_or(u32::MAX).max(1);
        if cfg.tpcc_tiny || tiny_asked() {
            Scale::tiny(w)
        } else {
            Scale::standard(w)
        }
    }

    /// Rows the load inserts (secondary index entries included).
    pub fn rows(&self) -> u64 {
        let w = u64::from(self.warehouses);
        let d = w * u64::from(self.districts);
        let c = d * u64::from(self.customers);
        let o = d * u64::from(self.orders);
        u64::from(self.items)
            + w * (2 + u64::from(self.items))
            + d * 3
            + 3 * c
            + 2 * o
            + o * 10
            + d * u64::from(self.new_orders)
    }

    /// Number of distinct last names: 1,000, or the customers per district if fewer.
    fn names(&self) -> u32 {
        self.customers.min(1000)
    }
}

// ---------------------------------------------------------------------------------------------
// Keys

fn wkey(w: u32, f: u8) -> [u8; 5] {
    let mut k = [0u8; 5];
    k[..4].copy_from_slice(&w.to_be_bytes());
    k[4] = f;
    k
}

fn dprefix(w: u32, d: u8) -> [u8; 5] {
    let mut k = [0u8; 5];
    k[..4].copy_from_slice(&w.to_be_bytes());
    k[4] = d;
    k
}

fn dkey(w: u32, d: u8, f: u8) -> [u8; 6] {
    let mut k = [0u8; 6];
    k[..5].copy_from_slice(&dprefix(w, d));
    k[5] = f;
    k
}

/// Key of a customer, an order or a new order: warehouse, district, id.
fn wdid(w: u32, d: u8, id: u32) -> [u8; 9] {
    let mut k = [0u8; 9];
    k[..5].copy_from_slice(&dprefix(w, d));
    k[5..].copy_from_slice(&id.to_be_bytes());
    k
}

fn ol_key(w: u32, d: u8, o: u32, n: u8) -> [u8; 10] {
    let mut k = [0u8; 10];
    k[..9].copy_from_slice(&wdid(w, d, o));
    k[9] = n;
    k
}

fn oc_key(w: u32, d: u8, c: u32, o: u32) -> [u8; 13] {
    let mut k = [0u8; 13];
    k[..9].copy_from_slice(&wdid(w, d, c));
    k[9..].copy_from_slice(&o.to_be_bytes());
    k
}

const NAME_LEN: usize = 16;

fn padded(s: &[u8]) -> [u8; NAME_LEN] {
    let mut p = [0u8; NAME_LEN];
    let n = s.len().min(NAME_LEN);
    p[..n].copy_from_slice(&s[..n]);
    p
}

fn cname_prefix(w: u32, d: u8, last: &[u8]) -> Vec<u8> {
    let mut k = dprefix(w, d).to_vec();
    k.extend_from_slice(&padded(last));
    k
}

fn cname_key(w: u32, d: u8, last: &[u8], first: &[u8], c: u32) -> Vec<u8> {
    let mut k = cname_prefix(w, d, last);
    k.extend_from_slice(&padded(first));
    k.extend_from_slice(&c.to_be_bytes());
    k
}

fn item_key(i: u32) -> [u8; 4] {
    i.to_be_bytes()
}

fn stock_key(w: u32, i: u32) -> [u8; 8] {
    let mut k = [0u8; 8];
    k[..4].copy_from_slice(&w.to_be_bytes());
    k[4..].copy_from_slice(&i.to_be_bytes());
    k
}

fn history_key(tag: u16, seq: u64) -> [u8; 10] {
    let mut k = [0u8; 10];
    k[..2].copy_from_slice(&tag.to_be_bytes());
    k[2..].copy_from_slice(&seq.to_be_bytes());
    k
}

/// The range of every key starting with `p`.
fn prefix_range(p: &[u8]) -> (Bound<Vec<u8>>, Bound<Vec<u8>>) {
    let mut hi = p.to_vec();
    while let Some(last) = hi.pop() {
        if last < 0xff {
            hi.push(last + 1);
            return (Bound::Included(p.to_vec()), Bound::Excluded(hi));
        }
    }
    (Bound::Included(p.to_vec()), Bound::Unbounded)
}

fn id_at(k: &[u8], at: usize) -> u32 {
    k.get(at..at + 4)
        .map_or(0, |b| u32::from_be_bytes(b.try_into().unwrap()))
}

// ---------------------------------------------------------------------------------------------
// Row encoding

#[derive(Default)]
struct Enc(Vec<u8>);

impl Enc {
    fn u8(mut self, v: u8) -> Self {
        self.0.push(v);
        self
    }
    fn u32(mut self, v: u32) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u64(mut self, v: u64) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn i64(mut self, v: i64) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn s(mut self, v: &[u8]) -> Self {
        let n = v.len().min(u16::MAX as usize);
        self.0.extend_from_slice(&(n as u16).to_le_bytes());
        self.0.extend_from_slice(&v[..n]);
        self
    }
}

struct Dec<'a> {
    b: &'a [u8],
    bad: bool,
}

impl<'a> Dec<'a> {
    fn new(b: &'a [u8]) -> Self {
        Dec { b, bad: false }
    }
    fn take(&mut self, n: usize) -> &'a [u8] {
        if self.b.len() < n {
            self.bad = true;
            self.b = &[];
            return &[0u8; 8][..n.min(8)];
        }
        let (h, t) = self.b.split_at(n);
        self.b = t;
        h
    }
    fn u8(&mut self) -> u8 {
        self.take(1)[0]
    }
    fn u32(&mut self) -> u32 {
        let b = self.take(4);
        u32::from_le_bytes(b.try_into().unwrap_or([0; 4]))
    }
    fn u64(&mut self) -> u64 {
        let b = self.take(8);
        u64::from_le_bytes(b.try_into().unwrap_or([0; 8]))
    }
    fn i64(&mut self) -> i64 {
        self.u64() as i64
    }
    fn s(&mut self) -> Vec<u8> {
        self.s_ref().to_vec()
    }
    /// A string field, borrowed from the row (no allocation).
    fn s_ref(&mut self) -> &'a [u8] {
        let n = {
            let b = self.take(2);
            u16::from_le_bytes(b.try_into().unwrap_or([0; 2])) as usize
        };
        self.take(n)
    }
    fn done(&self) -> bool {
        !self.bad && self.b.is_empty()
    }
}

/// A field of a row: how [`Enc`] writes it and [`Dec`] reads it back.
trait Field: Sized {
    /// Bytes [`put`](Self::put) writes.
    fn size(&self) -> usize;
    fn put(&self, e: Enc) -> Enc;
    fn get(d: &mut Dec<'_>) -> Self;
}

/// [`Field`] for the integers, each through the [`Enc`] and [`Dec`] method of its name.
macro_rules! int_fields {
    ($($t:ident),*) => {$(
        impl Field for $t {
            fn size(&self) -> usize {
                std::mem::size_of::<$t>()
            }
            fn put(&self, e: Enc) -> Enc {
                e.$t(*self)
            }
            fn get(d: &mut Dec<'_>) -> $t {
                d.$t()
            }
        }
    )*};
}

int_fields!(u8, u32, u64, i64);

impl Field for Vec<u8> {
    fn size(&self) -> usize {
        2 + self.len().min(u16::MAX as usize)
    }
    fn put(&self, e: Enc) -> Enc {
        e.s(self)
    }
    fn get(d: &mut Dec<'_>) -> Vec<u8> {
        d.s()
    }
}

/// The row types of the TPC-C tables, each with its value encoding: `encode` writes the
/// fields in their order ([`Field`]), `decode` reads them back (`None` unless the value is
/// exactly one row).
macro_rules! rows {
    ($($(#[$m:meta])* struct $name:ident { $($(#[$fm:meta])* $f:ident: $t:ty,)* })*) => {$(
        $(#[$m])*
        struct $name {
            $($(#[$fm])* $f: $t,)*
        }

        impl $name {
            fn encode(&self) -> Vec<u8> {
                let mut v = Vec::new();
                self.encode_into(&mut v);
                v
            }

            /// [`encode`](Self::encode) into `out`, replacing its contents (a buffer reused
            /// row after row allocates once).
            #[allow(dead_code)] // used for some rows only
            fn encode_into(&self, out: &mut Vec<u8>) {
                out.clear();
                // Sized up front: a row grown from empty reallocated up to six times.
                out.reserve(0 $(+ self.$f.size())*);
                let e = Enc(std::mem::take(out));
                $(let e = self.$f.put(e);)*
                *out = e.0;
            }

            #[allow(dead_code)] // history rows are only written
            fn decode(v: &[u8]) -> Option<$name> {
                let mut d = Dec::new(v);
                let row = $name {
                    $($f: Field::get(&mut d),)*
                };
                d.done().then_some(row)
            }
        }
    )*};
}

fn malformed(what: &str) -> shoal::Error {
    shoal::Error::Unsupported(format!("tpcc: malformed or missing {what} row"))
}

rows! {
    /// Warehouse or district row (static part): name, address, tax.
    #[derive(Clone, Debug, PartialEq)]
    struct Place {
        name: Vec<u8>,
        street1: Vec<u8>,
        street2: Vec<u8>,
        city: Vec<u8>,
        state: Vec<u8>,
        zip: Vec<u8>,
        /// Tax rate in 1/10,000.
        tax: u32,
    }

    #[derive(Clone, Debug, PartialEq)]
    struct Customer {
        first: Vec<u8>,
        middle: Vec<u8>,
        last: Vec<u8>,
        street1: Vec<u8>,
        street2: Vec<u8>,
        city: Vec<u8>,
        state: Vec<u8>,
        zip: Vec<u8>,
        phone: Vec<u8>,
        since: u64,
        credit: Vec<u8>,
        credit_lim: i64,
        /// Discount in 1/10,000.
        discount: u32,
        balance: i64,
        ytd_payment: i64,
        payment_cnt: u32,
        delivery_cnt: u32,
        data: Vec<u8>,
    }

    #[derive(Clone, Copy, Debug, PartialEq)]
    struct Order {
        c_id: u32,
        entry_d: u64,
        /// 0 = null.
        carrier_id: u8,
        ol_cnt: u8,
        all_local: u8,
    }

    #[derive(Clone, Debug, PartialEq)]
    struct OrderLine {
        i_id: u32,
        supply_w: u32,
        /// 0 = null.
        delivery_d: u64,
        quantity: u8,
        amount: i64,
        dist_info: Vec<u8>,
    }

    #[derive(Clone, Debug, PartialEq)]
    struct Item {
        im_id: u32,
        price: i64,
        name: Vec<u8>,
        data: Vec<u8>,
    }

    #[derive(Clone, Debug, PartialEq)]
    struct Stock {
        quantity: u32,
        ytd: u64,
        order_cnt: u32,
        remote_cnt: u32,
        /// `S_DIST_01` .. `S_DIST_10`, 24 bytes each.
        dist: Vec<u8>,
        data: Vec<u8>,
    }

    #[derive(Clone, Debug, PartialEq)]
    struct History {
        c_id: u32,
        c_d: u8,
        c_w: u32,
        d: u8,
        w: u32,
        date: u64,
        amount: i64,
        data: Vec<u8>,
    }
}

const DIST_LEN: usize = 24;

impl Stock {
    #[cfg(test)]
    fn dist_info(&self, d: u8) -> &[u8] {
        let i = usize::from(d.saturating_sub(1) % 10) * DIST_LEN;
        self.dist.get(i..i + DIST_LEN).unwrap_or(&[])
    }

    /// NewOrder's change to the encoded stock row `row`, made in place (clause 2.4.2.2:
    /// S_QUANTITY down by `qty`, or up by 91 - `qty` when fewer than `qty` + 10 are left;
    /// S_YTD up by `qty`, S_ORDER_CNT by one, S_REMOTE_CNT by one for a `remote` supplier),
    /// and the row's S_DIST_xx for district `d`. `None` unless `row` is one well-formed stock
    /// row. The same bytes as decoding, changing and encoding the row, without allocating:
    /// the four counters are the row's first, fixed-size fields.
    fn order_in_place(row: &mut [u8], qty: u32, remote: bool, d: u8) -> Option<[u8; DIST_LEN]> {
        let mut r = Dec::new(row);
        let quantity = r.u32();
        let ytd = r.u64();
        let order_cnt = r.u32();
        let remote_cnt = r.u32();
        let dist = r.s_ref();
        let _data = r.s_ref();
        if !r.done() {
            return None;
        }
        let i = usize::from(d.saturating_sub(1) % 10) * DIST_LEN;
        let info: [u8; DIST_LEN] = dist.get(i..i + DIST_LEN)?.try_into().ok()?;
        let quantity = if quantity >= qty + 10 {
            quantity - qty
        } else {
            quantity + 91 - qty
        };
        let head = Enc(Vec::with_capacity(20))
            .u32(quantity)
            .u64(ytd + u64::from(qty))
            .u32(order_cnt + 1)
            .u32(remote_cnt + u32::from(remote))
            .0;
        row.get_mut(..head.len())?.copy_from_slice(&head);
        Some(info)
    }
}

impl Place {
    /// The name of the encoded warehouse or district row `row`, borrowed from it; `None`
    /// unless it is one well-formed row.
    fn name_of(row: &[u8]) -> Option<&[u8]> {
        let mut r = Dec::new(row);
        let name = r.s_ref();
        for _ in 0..5 {
            let _address = r.s_ref();
        }
        let _tax = r.u32();
        r.done().then_some(name)
    }

    /// The tax rate of the encoded warehouse or district row `row`, `None` unless it is one
    /// well-formed row (no allocation: its strings are skipped, not copied).
    fn tax_of(row: &[u8]) -> Option<u32> {
        let mut r = Dec::new(row);
        for _ in 0..6 {
            let _name_and_address = r.s_ref();
        }
        let tax = r.u32();
        r.done().then_some(tax)
    }
}

impl Customer {
    /// Adds `balance`, `ytd_payment`, `payment_cnt` and `delivery_cnt` to C_BALANCE,
    /// C_YTD_PAYMENT, C_PAYMENT_CNT and C_DELIVERY_CNT of the encoded customer row `row`, in
    /// place: the same bytes as decoding, changing and encoding the row, without allocating
    /// (the four are fixed-size fields at an offset the strings before them give). Returns
    /// whether the customer's credit is bad (C_CREDIT "BC"); `None`, and `row` unchanged,
    /// unless it is one well-formed customer row.
    fn add_in_place(
        row: &mut [u8],
        balance: i64,
        ytd_payment: i64,
        payment_cnt: u32,
        delivery_cnt: u32,
    ) -> Option<bool> {
        let (at, bad_credit, old) = {
            let mut r = Dec::new(row);
            for _ in 0..9 {
                let _name_address_phone = r.s_ref();
            }
            let _since = r.u64();
            let credit = r.s_ref();
            let _credit_lim = r.i64();
            let _discount = r.u32();
            let at = row.len() - r.b.len();
            let old = (r.i64(), r.i64(), r.u32(), r.u32());
            let _data = r.s_ref();
            if !r.done() {
                return None;
            }
            (at, credit == b"BC", old)
        };
        let fields = row.get_mut(at..at + 24)?;
        fields[..8].copy_from_slice(&(old.0 + balance).to_le_bytes());
        fields[8..16].copy_from_slice(&(old.1 + ytd_payment).to_le_bytes());
        fields[16..20].copy_from_slice(&(old.2 + payment_cnt).to_le_bytes());
        fields[20..].copy_from_slice(&(old.3 + delivery_cnt).to_le_bytes());
        Some(bad_credit)
    }

    /// The discount of the encoded customer row `row`, `None` unless it is one well-formed
    /// customer row (no allocation: its strings are skipped, not copied).
    fn discount_of(row: &[u8]) -> Option<u32> {
        let mut r = Dec::new(row);
        for _ in 0..9 {
            let _name_address_phone = r.s_ref();
        }
        let _since = r.u64();
        let _credit = r.s_ref();
        let _credit_lim = r.i64();
        let discount = r.u32();
        let _balance = r.i64();
        let _ytd_payment = r.i64();
        let _payment_cnt = r.u32();
        let _delivery_cnt = r.u32();
        let _data = r.s_ref();
        r.done().then_some(discount)
    }
}

impl Item {
    /// The price of the encoded item row `row`, `None` unless it is one well-formed item
    /// row (no allocation: its strings are skipped, not copied).
    fn price_of(row: &[u8]) -> Option<i64> {
        let mut r = Dec::new(row);
        let _im_id = r.u32();
        let price = r.i64();
        let _name = r.s_ref();
        let _data = r.s_ref();
        r.done().then_some(price)
    }
}

// ---------------------------------------------------------------------------------------------
// Random data (clause 4.3.2)

const SYLLABLES: [&str; 10] = [
    "BAR", "OUGHT", "ABLE", "PRI", "PRES", "ESE", "ANTI", "CALLY", "ATION", "EING",
];

/// The last name of number `n` in 0..=999 (clause 4.3.2.3).
pub fn last_name(n: u32) -> Vec<u8> {
    let mut s = String::new();
    for div in [100, 10, 1] {
        s.push_str(SYLLABLES[(n / div % 10) as usize]);
    }
    s.into_bytes()
}

/// NURand(A, x, y) with run-time constant `c` (clause 2.1.6).
pub fn nurand(rng: &mut impl Rng, a: u32, c: u32, x: u32, y: u32) -> u32 {
    (((rng.gen_range(0..=a) | rng.gen_range(x..=y)) + c) % (y - x + 1)) + x
}

/// The C constants of NURand: for C_LAST at load, C_LAST at run time (differing by 66, within
/// clause 2.1.6.1's bounds), C_ID and OL_I_ID.
const C_LAST_LOAD: u32 = 157;
const C_LAST_RUN: u32 = 223;
const C_ID: u32 = 259;
const C_OL_I_ID: u32 = 7911;

const ALNUM: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";

fn astring(rng: &mut impl Rng, lo: usize, hi: usize) -> Vec<u8> {
    let n = rng.gen_range(lo..=hi);
    (0..n)
        .map(|_| ALNUM[rng.gen_range(0..ALNUM.len())])
        .collect()
}

fn nstring(rng: &mut impl Rng, lo: usize, hi: usize) -> Vec<u8> {
    let n = rng.gen_range(lo..=hi);
    (0..n).map(|_| b'0' + rng.gen_range(0..10u8)).collect()
}

fn zip(rng: &mut impl Rng) -> Vec<u8> {
    let mut z = nstring(rng, 4, 4);
    z.extend_from_slice(b"11111");
    z
}

/// A data string of 26-50 characters, 10% containing "ORIGINAL".
fn data_string(rng: &mut impl Rng) -> Vec<u8> {
    let mut s = astring(rng, 26, 50);
    if rng.gen_bool(0.1) {
        let at = rng.gen_range(0..=s.len() - 8);
        s[at..at + 8].copy_from_slice(b"ORIGINAL");
    }
    s
}

fn place(rng: &mut impl Rng, name_lo: usize) -> Place {
    Place {
        name: astring(rng, name_lo, 10),
        street1: astring(rng, 10, 20),
        street2: astring(rng, 10, 20),
        city: astring(rng, 10, 20),
        state: astring(rng, 2, 2),
        zip: zip(rng),
        tax: rng.gen_range(0..=2000),
    }
}

fn now_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

fn seeded(parts: &[u64]) -> SmallRng {
    let mut x = 0x7cc_7cc_u64;
    for p in parts {
        x = x.rotate_left(17) ^ p.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
    SmallRng::seed_from_u64(x)
}

// ---------------------------------------------------------------------------------------------
// The workload

/// A loaded TPC-C database.
pub struct Tpcc {
    warehouse: Table,
    district: Table,
    customer: Table,
    customer_name: Table,
    history: Table,
    new_order: Table,
    orders: Table,
    order_cust: Table,
    order_line: Table,
    item: Table,
    stock: Table,
    scale: Scale,
    /// The database runs optimistic concurrency control: see [`Tpcc::insert_new`].
    optimistic: bool,
}

/// How a Payment or OrderStatus finds its customer.
#[derive(Clone, Debug, PartialEq)]
enum CustomerBy {
    Id(u32),
    LastName(Vec<u8>),
}

/// One NewOrder line's inputs: item, supplying warehouse, quantity.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Line {
    i_id: u32,
    supply_w: u32,
    qty: u8,
}

/// A transaction's inputs.
#[derive(Clone, Debug, PartialEq)]
enum Txn {
    NewOrder {
        w: u32,
        d: u8,
        c: u32,
        lines: Vec<Line>,
        /// The last line's item is unused: the transaction rolls back.
        rollback: bool,
        now: u64,
    },
    Payment {
        w: u32,
        d: u8,
        c_w: u32,
        c_d: u8,
        by: CustomerBy,
        amount: i64,
        now: u64,
    },
    OrderStatus {
        w: u32,
        d: u8,
        by: CustomerBy,
    },
    Delivery {
        w: u32,
        carrier: u8,
        now: u64,
    },
    StockLevel {
        w: u32,
        d: u8,
        threshold: u32,
    },
}

impl Txn {
    fn kind(&self) -> usize {
        match self {
            Txn::NewOrder { .. } => NEW_ORDER,
            Txn::Payment { .. } => PAYMENT,
            Txn::OrderStatus { .. } => ORDER_STATUS,
            Txn::Delivery { .. } => DELIVERY,
            Txn::StockLevel { .. } => STOCK_LEVEL,
        }
    }
}

/// A worker thread's state.
pub struct TpccWorker {
    rng: SmallRng,
    mix: Mix,
    /// The home warehouse of every transaction (`--home thread`), or `None`: uniform.
    home: Option<u32>,
    thread: u16,
    seq: u64,
    cur: Txn,
}

/// Orders per load transaction of the order work items.
const LOAD_ORDERS: u32 = 300;
/// Items or stock rows per load transaction.
const LOAD_ITEMS: u32 = 5_000;

#[derive(Clone, Copy, Debug)]
enum LoadItem {
    Items(u32, u32),
    Stock(u32, u32, u32),
    Warehouse(u32),
    Customers(u32, u8),
    Orders(u32, u8, u32, u32),
}

impl Workload for Tpcc {
    type Worker = TpccWorker;

    fn rows(cfg: &RunConfig) -> u64 {
        Scale::for_config(cfg).rows()
    }

    fn load(l: Load<'_>) -> anyhow::Result<Tpcc> {
        Tpcc::load(l.db, Scale::for_config(l.cfg), l.load_threads, l.progress)
    }

    fn worker(&self, cfg: &RunConfig, run: u16, thread: u16, seed: u64) -> TpccWorker {
        TpccWorker {
            rng: SmallRng::seed_from_u64(seed),
            mix: cfg
                .mix
                .and_then(crate::config::Mix::tpcc)
                .unwrap_or(Mix::Full),
            home: match cfg.home {
                Home::Random => None,
                Home::Thread => Some(u32::from(thread) % self.scale.warehouses + 1),
            },
            thread,
            seq: u64::from(run) << 48,
            cur: Txn::StockLevel {
                w: 1,
                d: 1,
                threshold: 10,
            },
        }
    }

    fn next(&self, w: &mut TpccWorker) {
        let kind = match w.mix {
            Mix::Full => match w.rng.gen_range(0..100) {
                0..=44 => NEW_ORDER,
                45..=87 => PAYMENT,
                88..=91 => ORDER_STATUS,
                92..=95 => DELIVERY,
                _ => STOCK_LEVEL,
            },
            Mix::NewOrder => NEW_ORDER,
            Mix::Payment => PAYMENT,
            Mix::OrderStatus => ORDER_STATUS,
            Mix::Delivery => DELIVERY,
            Mix::StockLevel => STOCK_LEVEL,
        };
        w.cur = self.draw(&mut w.rng, kind, w.home);
    }

    /// Under optimistic concurrency control a transaction may read another's commit half
    /// installed (a new order without its order row, fewer lines than `O_OL_CNT`); commit-time
    /// validation would abort it, so such a "missing row" is reported as a conflict. Under 2PL
    /// it is a real inconsistency and fails the run.
    fn execute(&self, w: &TpccWorker, tx: &mut Transaction<'_>) -> shoal::Result<()> {
        match self.execute_inner(w, tx) {
            Err(shoal::Error::Unsupported(m)) if self.optimistic => Err(shoal::Error::Conflict {
                txn: tx.id(),
                detail: m,
            }),
            other => other,
        }
    }

    fn committed(&self, w: &mut TpccWorker) {
        if w.cur.kind() == PAYMENT {
            w.seq += 1;
        }
    }

    fn kinds(&self) -> &'static [&'static str] {
        &KINDS
    }

    fn kind(&self, w: &TpccWorker) -> usize {
        w.cur.kind()
    }

    fn rollback(&self, w: &TpccWorker) -> bool {
        matches!(w.cur, Txn::NewOrder { rollback: true, .. })
    }

    fn check(&self, db: &Database, ledger: &Ledger) -> anyhow::Result<String> {
        self.check_against(db, Some(ledger))
    }
}

#[cfg(test)]
mod tests;
