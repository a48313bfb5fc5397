//! Value types of the splittable operations (thesis §4.4) and their byte encodings.
//!
//! **Integers** (ADD, MAX, MIN) are 8-byte little-endian `i64`, as everywhere in shoal.
//!
//! **Ordered tuple** (OPUT): `order: i64 LE (8 bytes) | writer: u32 LE (4 bytes) | bytes`.
//! A tuple `(o', j', x')` replaces `(o, j, x)` when `(o', j') > (o, j)` lexicographically; an
//! absent record counts as order −∞.
//!
//! **Top-K set** (TOPKINSERT): `n: u32 LE` followed by `n` entries, each
//! `order: i64 LE | writer: u32 LE | len: u32 LE | bytes[len]`, sorted by order, largest first.
//! At most one entry per order value (the one with the highest writer id), at most K entries
//! (inserting beyond K drops the smallest order).
//!
//! The writer id is the [`worker_id`](crate::doppel::worker_id) of the thread that ran the
//! operation: the thesis' core id. It makes OPUT and TOPKINSERT commutative.

use crate::error::{show_key, Error, Result};

/// One ordered tuple `(order, writer, value)`: the value type of
/// [`Transaction::oput`](crate::Transaction::oput) and the element type of top-K sets.
///
/// ```
/// use shoal::doppel::OrderedTuple;
/// let t = OrderedTuple { order: 7, writer: 1, value: b"x".to_vec() };
/// let bytes = t.encode();
/// assert_eq!(bytes.len(), 13);
/// assert_eq!(OrderedTuple::decode(&bytes), Some(t));
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct OrderedTuple {
    /// The order: larger wins.
    pub order: i64,
    /// The id of the worker that wrote it: breaks ties between equal orders.
    pub writer: u32,
    /// The payload.
    pub value: Vec<u8>,
}

/// Bytes of an encoded ordered tuple before its payload.
///
/// ```
/// use shoal::doppel::{OrderedTuple, TUPLE_HEADER};
/// let t = OrderedTuple { order: 1, writer: 0, value: b"abc".to_vec() };
/// assert_eq!(t.encode().len(), TUPLE_HEADER + 3);
/// ```
pub const TUPLE_HEADER: usize = 12;

impl OrderedTuple {
    /// The encoding described in the [module documentation](crate::doppel).
    ///
    /// ```
    /// use shoal::doppel::OrderedTuple;
    /// let t = OrderedTuple { order: -1, writer: 2, value: vec![] };
    /// assert_eq!(&t.encode()[..8], &(-1i64).to_le_bytes());
    /// ```
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(TUPLE_HEADER + self.value.len());
        v.extend_from_slice(&self.order.to_le_bytes());
        v.extend_from_slice(&self.writer.to_le_bytes());
        v.extend_from_slice(&self.value);
        v
    }

    /// Decodes [`encode`](Self::encode)'s output; `None` when shorter than the header.
    ///
    /// ```
    /// use shoal::doppel::OrderedTuple;
    /// assert_eq!(OrderedTuple::decode(b"short"), None);
    /// ```
    pub fn decode(b: &[u8]) -> Option<OrderedTuple> {
        let order = i64::from_le_bytes(b.get(0..8)?.try_into().ok()?);
        let writer = u32::from_le_bytes(b.get(8..12)?.try_into().ok()?);
        Some(OrderedTuple {
            order,
            writer,
            value: b[12..].to_vec(),
        })
    }

    /// True when this tuple replaces `old` under OPUT: a larger `(order, writer)`.
    ///
    /// ```
    /// use shoal::doppel::OrderedTuple;
    /// let a = OrderedTuple { order: 1, writer: 9, value: vec![] };
    /// let b = OrderedTuple { order: 2, writer: 0, value: vec![] };
    /// assert!(b.beats(&a) && !a.beats(&b));
    /// ```
    pub fn beats(&self, old: &OrderedTuple) -> bool {
        (self.order, self.writer) > (old.order, old.writer)
    }
}

/// Encodes a top-K set (entries sorted by order, largest first) as described in the
/// [module documentation](crate::doppel).
///
/// ```
/// use shoal::doppel::{decode_topk, encode_topk, OrderedTuple};
/// let set = vec![OrderedTuple { order: 5, writer: 0, value: b"a".to_vec() }];
/// assert_eq!(decode_topk(&encode_topk(&set)), Some(set));
/// ```
pub fn encode_topk(set: &[OrderedTuple]) -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(&(set.len() as u32).to_le_bytes());
    for t in set {
        v.extend_from_slice(&t.order.to_le_bytes());
        v.extend_from_slice(&t.writer.to_le_bytes());
        v.extend_from_slice(&(t.value.len() as u32).to_le_bytes());
        v.extend_from_slice(&t.value);
    }
    v
}

/// Decodes [`encode_topk`]'s output; `None` on malformed bytes.
///
/// ```
/// use shoal::doppel::decode_topk;
/// assert_eq!(decode_topk(&0u32.to_le_bytes()), Some(vec![]));
/// assert_eq!(decode_topk(b"xy"), None);
/// ```
pub fn decode_topk(b: &[u8]) -> Option<Vec<OrderedTuple>> {
    let n = u32::from_le_bytes(b.get(0..4)?.try_into().ok()?) as usize;
    let mut pos = 4;
    let mut out = Vec::with_capacity(n.min(b.len() / 16));
    for _ in 0..n {
        let order = i64::from_le_bytes(b.get(pos..pos + 8)?.try_into().ok()?);
        let writer = u32::from_le_bytes(b.get(pos + 8..pos + 12)?.try_into().ok()?);
        let len = u32::from_le_bytes(b.get(pos + 12..pos + 16)?.try_into().ok()?) as usize;
        let start = pos + 16;
        let value = b.get(start..start.checked_add(len)?)?.to_vec();
        pos = start + len;
        out.push(OrderedTuple {
            order,
            writer,
            value,
        });
    }
    (pos == b.len()).then_some(out)
}

/// Inserts `t` into the top-`k` set `set` (sorted by order, largest first).
pub(crate) fn topk_insert(set: &mut Vec<OrderedTuple>, t: OrderedTuple, k: u32) {
    match set.binary_search_by(|e| t.order.cmp(&e.order)) {
        Ok(i) => {
            if t.writer > set[i].writer {
                set[i] = t;
            }
        }
        Err(i) => set.insert(i, t),
    }
    set.truncate(k as usize);
}

pub(crate) fn decode_tuple_at(key: &[u8], v: &[u8]) -> Result<OrderedTuple> {
    OrderedTuple::decode(v).ok_or_else(|| Error::WrongType {
        key: show_key(key),
        expected: "an ordered tuple",
    })
}

pub(crate) fn decode_topk_at(key: &[u8], v: &[u8]) -> Result<Vec<OrderedTuple>> {
    decode_topk(v).ok_or_else(|| Error::WrongType {
        key: show_key(key),
        expected: "a top-K set",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(order: i64, writer: u32, v: &str) -> OrderedTuple {
        OrderedTuple {
            order,
            writer,
            value: v.as_bytes().to_vec(),
        }
    }

    #[test]
    fn topk_keeps_k_largest_one_per_order() {
        let mut s = Vec::new();
        for x in [
            t(1, 0, "a"),
            t(5, 0, "b"),
            t(3, 1, "c"),
            t(5, 2, "d"),
            t(5, 1, "e"),
        ] {
            topk_insert(&mut s, x, 2);
        }
        assert_eq!(s, vec![t(5, 2, "d"), t(3, 1, "c")]);
        assert_eq!(decode_topk(&encode_topk(&s)), Some(s));
    }

    proptest::proptest! {
        #[test]
        fn decoders_never_panic(b in proptest::collection::vec(proptest::num::u8::ANY, 0..80)) {
            let _ = decode_topk(&b);
            let _ = OrderedTuple::decode(&b);
        }
    }
}
