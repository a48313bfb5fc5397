//! The splittable operations with their init / delta / reconcile functions (thesis §3.1,
//! §4.4, Fig. 5-1).
//!
//! A [`Delta`] is one operation with its argument. A per-worker slice is itself a `Delta`,
//! the *summary* (thesis §4.2) of every operation the worker applied in the split phase:
//! `init` is the first operation, `delta` folds the next one in with [`Delta::merge`], and
//! `reconcile` applies the summary to the global record with [`Delta::apply`]. Every summary
//! runs in time independent of the number of operations it stands for (except TOPKINSERT,
//! bounded by K).

use super::value::{
    decode_topk_at, decode_tuple_at, encode_topk, topk_insert, OrderedTuple, TUPLE_HEADER,
};
use crate::error::{show_key, Error, Result};

/// A splittable operation: the *selected operation* of a split record (thesis §3.3). Used
/// with [`Database::split_hint`](crate::Database::split_hint).
///
/// ```
/// use shoal::doppel::SplitOp;
/// assert_ne!(SplitOp::TopK(3), SplitOp::TopK(5)); // K is part of the operation
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SplitOp {
    /// ADD(k, n) on integers.
    Add,
    /// MAX(k, n) on integers.
    Max,
    /// MIN(k, n) on integers.
    Min,
    /// OPUT(k, o, x) on ordered tuples.
    Oput,
    /// TOPKINSERT(k, o, x) on top-K sets with this K.
    TopK(u32),
}

impl SplitOp {
    /// Whether `value` (the global record, `None` when absent) can hold this operation's
    /// type, so reconciliation cannot fail; for TOPKINSERT, also whether a set of K tuples
    /// each as long as its longest stays within `max` bytes (`Options::max_value_len`), so
    /// that split operations that each pass [`Delta::bounded_by`] cannot outgrow it.
    pub(crate) fn fits(self, value: Option<&[u8]>, max: usize) -> bool {
        let Some(v) = value else { return true };
        match self {
            SplitOp::Add | SplitOp::Max | SplitOp::Min => v.len() == 8,
            SplitOp::Oput => v.len() >= TUPLE_HEADER,
            SplitOp::TopK(k) => super::value::decode_topk(v)
                .is_some_and(|set| set.iter().all(|t| topk_bytes(k, t.value.len()) <= max)),
        }
    }
}

/// One operation on a record, or the summary of several on a per-worker slice.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Delta {
    /// An `i128`: a summary adds its operations exactly, and saturates only once, when it is
    /// applied (an `i64` summary that saturated on the way could lose an addition whose
    /// final sum fits: `+MAX, +MAX, -MAX`). One operation always fits an `i64`.
    Add(i128),
    Max(i64),
    Min(i64),
    Oput(OrderedTuple),
    /// K and the set (one tuple for a single operation).
    TopK(u32, Vec<OrderedTuple>),
}

const TAG_ADD: u8 = 1;
const TAG_MAX: u8 = 2;
const TAG_MIN: u8 = 3;
const TAG_OPUT: u8 = 4;
const TAG_TOPK: u8 = 5;

/// `n` clamped to the `i64` bounds.
pub(crate) fn clamp_i64(n: i128) -> i64 {
    i64::try_from(n).unwrap_or(if n < 0 { i64::MIN } else { i64::MAX })
}

/// Bytes of a top-K set of `k` tuples of `len` value bytes each.
fn topk_bytes(k: u32, len: usize) -> usize {
    (k as usize)
        .saturating_mul(len.saturating_add(16))
        .saturating_add(4)
}

impl Delta {
    /// Whether this operation can run on a split record of a database whose values hold at
    /// most `max` bytes, whatever the other workers' operations: the reconciled value
    /// cannot outgrow `max` (an ordered tuple no longer than `max`; a top-K set with room
    /// for K tuples as long as this one). In a joined phase the resulting value is checked
    /// instead, which a split phase cannot see; an operation that fails here runs there.
    pub(crate) fn bounded_by(&self, max: usize) -> bool {
        match self {
            // An integer is 8 bytes, which a joined phase refuses when `max` is smaller.
            Delta::Add(_) | Delta::Max(_) | Delta::Min(_) => 8 <= max,
            Delta::Oput(t) => TUPLE_HEADER.saturating_add(t.value.len()) <= max,
            Delta::TopK(k, ts) => ts.iter().all(|t| topk_bytes(*k, t.value.len()) <= max),
        }
    }

    /// Bytes of [`encode`](Self::encode)'s output.
    pub(crate) fn encoded_len(&self) -> usize {
        1 + match self {
            Delta::Add(_) | Delta::Max(_) | Delta::Min(_) => 8,
            Delta::Oput(t) => TUPLE_HEADER + t.value.len(),
            Delta::TopK(_, ts) => 4 + 4 + ts.iter().map(|t| 16 + t.value.len()).sum::<usize>(),
        }
    }

    pub(crate) fn op(&self) -> SplitOp {
        match self {
            Delta::Add(_) => SplitOp::Add,
            Delta::Max(_) => SplitOp::Max,
            Delta::Min(_) => SplitOp::Min,
            Delta::Oput(_) => SplitOp::Oput,
            Delta::TopK(k, _) => SplitOp::TopK(*k),
        }
    }

    /// OP_delta: folds `next` (the same operation) into this summary. ADD sums exactly (an
    /// `i128` holds the sum of 2^64 operations of an `i64` each); see [`apply`](Self::apply).
    pub(crate) fn merge(&mut self, next: Delta) {
        match (self, next) {
            (Delta::Add(a), Delta::Add(b)) => *a = a.saturating_add(b),
            (Delta::Max(a), Delta::Max(b)) => *a = (*a).max(b),
            (Delta::Min(a), Delta::Min(b)) => *a = (*a).min(b),
            (Delta::Oput(a), Delta::Oput(b)) => {
                if b.beats(a) {
                    *a = b;
                }
            }
            (Delta::TopK(k, a), Delta::TopK(_, b)) => {
                for t in b {
                    topk_insert(a, t, *k);
                }
            }
            (me, other) => debug_assert!(false, "merging {other:?} into {me:?}"),
        }
    }

    /// Applies the operation (or a summary: OP_reconcile) to the record value `cur` and
    /// returns the new value. `saturate`: ADD clamps at the `i64` bounds instead of failing
    /// with [`Error::Overflow`] (reconciliation and recovery, which cannot fail).
    pub(crate) fn apply(&self, key: &[u8], cur: Option<&[u8]>, saturate: bool) -> Result<Vec<u8>> {
        let int = |cur: Option<&[u8]>| -> Result<Option<i64>> {
            cur.map(|v| {
                v.try_into()
                    .map(i64::from_le_bytes)
                    .map_err(|_| Error::NotAnInteger {
                        key: show_key(key),
                        len: v.len(),
                    })
            })
            .transpose()
        };
        Ok(match self {
            Delta::Add(n) => {
                let exact = i128::from(int(cur)?.unwrap_or(0)).saturating_add(*n);
                let v = if saturate {
                    clamp_i64(exact)
                } else {
                    i64::try_from(exact).map_err(|_| Error::Overflow { key: show_key(key) })?
                };
                v.to_le_bytes().to_vec()
            }
            Delta::Max(n) => int(cur)?.map_or(*n, |c| c.max(*n)).to_le_bytes().to_vec(),
            Delta::Min(n) => int(cur)?.map_or(*n, |c| c.min(*n)).to_le_bytes().to_vec(),
            Delta::Oput(t) => match cur {
                None => t.encode(),
                Some(v) => {
                    let old = decode_tuple_at(key, v)?;
                    if t.beats(&old) {
                        t.encode()
                    } else {
                        v.to_vec()
                    }
                }
            },
            Delta::TopK(k, ts) => {
                let mut set = match cur {
                    None => Vec::new(),
                    Some(v) => decode_topk_at(key, v)?,
                };
                for t in ts {
                    topk_insert(&mut set, t.clone(), *k);
                }
                // A summary stands for at least one insert, and each leaves at most K: with
                // K = 0 the summary itself is empty (its inserts kept nothing).
                set.truncate(*k as usize);
                encode_topk(&set)
            }
        })
    }

    /// Log encoding: a tag byte and the argument.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut v = Vec::new();
        match self {
            // Only single operations are logged, and one ADD is an `i64`.
            Delta::Add(n) => {
                v.push(TAG_ADD);
                v.extend_from_slice(&clamp_i64(*n).to_le_bytes());
            }
            Delta::Max(n) | Delta::Min(n) => {
                v.push(if matches!(self, Delta::Max(_)) {
                    TAG_MAX
                } else {
                    TAG_MIN
                });
                v.extend_from_slice(&n.to_le_bytes());
            }
            Delta::Oput(t) => {
                v.push(TAG_OPUT);
                v.extend_from_slice(&t.encode());
            }
            Delta::TopK(k, ts) => {
                v.push(TAG_TOPK);
                v.extend_from_slice(&k.to_le_bytes());
                v.extend_from_slice(&encode_topk(ts));
            }
        }
        v
    }

    /// Inverse of [`encode`](Self::encode).
    pub(crate) fn decode(b: &[u8]) -> Option<Delta> {
        let (&tag, rest) = b.split_first()?;
        let int = || rest.try_into().ok().map(i64::from_le_bytes);
        Some(match tag {
            TAG_ADD => Delta::Add(int()?.into()),
            TAG_MAX => Delta::Max(int()?),
            TAG_MIN => Delta::Min(int()?),
            TAG_OPUT => Delta::Oput(OrderedTuple::decode(rest)?),
            TAG_TOPK => {
                let k = u32::from_le_bytes(rest.get(0..4)?.try_into().ok()?);
                Delta::TopK(k, super::value::decode_topk(&rest[4..])?)
            }
            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deltas_round_trip_and_summaries_match_sequential_application() {
        let t = |o, w, v: &str| OrderedTuple {
            order: o,
            writer: w,
            value: v.into(),
        };
        let seqs: Vec<Vec<Delta>> = vec![
            vec![Delta::Add(3), Delta::Add(-10), Delta::Add(4)],
            vec![Delta::Max(3), Delta::Max(-10), Delta::Max(4)],
            vec![Delta::Min(3), Delta::Min(-10), Delta::Min(4)],
            vec![
                Delta::Oput(t(1, 0, "a")),
                Delta::Oput(t(2, 0, "b")),
                Delta::Oput(t(2, 1, "c")),
                Delta::Oput(t(0, 5, "d")),
            ],
            vec![
                Delta::TopK(2, vec![t(1, 0, "a")]),
                Delta::TopK(2, vec![t(3, 0, "b")]),
                Delta::TopK(2, vec![t(2, 1, "c")]),
            ],
        ];
        for seq in seqs {
            for d in &seq {
                assert_eq!(Delta::decode(&d.encode()).as_ref(), Some(d));
            }
            for init in [None, Some(seq[0].apply(b"k", None, false).unwrap())] {
                let mut v = init.clone();
                for d in &seq {
                    v = Some(d.apply(b"k", v.as_deref(), false).unwrap());
                }
                let mut sum = seq[0].clone();
                for d in &seq[1..] {
                    sum.merge(d.clone());
                }
                let r = sum.apply(b"k", init.as_deref(), true).unwrap();
                assert_eq!(Some(r), v, "{seq:?}");
            }
        }
    }
}
