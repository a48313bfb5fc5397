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
    /// type, so reconciliation cannot fail.
    pub(crate) fn fits(self, value: Option<&[u8]>) -> bool {
        let Some(v) = value else { return true };
        match self {
            SplitOp::Add | SplitOp::Max | SplitOp::Min => v.len() == 8,
            SplitOp::Oput => v.len() >= TUPLE_HEADER,
            SplitOp::TopK(_) => super::value::decode_topk(v).is_some(),
        }
    }
}

/// One operation on a record, or the summary of several on a per-worker slice.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Delta {
    Add(i64),
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

impl Delta {
    pub(crate) fn op(&self) -> SplitOp {
        match self {
            Delta::Add(_) => SplitOp::Add,
            Delta::Max(_) => SplitOp::Max,
            Delta::Min(_) => SplitOp::Min,
            Delta::Oput(_) => SplitOp::Oput,
            Delta::TopK(k, _) => SplitOp::TopK(*k),
        }
    }

    /// OP_delta: folds `next` (the same operation) into this summary. ADD saturates; see
    /// [`apply`](Self::apply).
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
                let c = int(cur)?.unwrap_or(0);
                let v = if saturate {
                    c.saturating_add(*n)
                } else {
                    c.checked_add(*n)
                        .ok_or_else(|| Error::Overflow { key: show_key(key) })?
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
                encode_topk(&set)
            }
        })
    }

    /// Log encoding: a tag byte and the argument.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut v = Vec::new();
        match self {
            Delta::Add(n) | Delta::Max(n) | Delta::Min(n) => {
                v.push(match self {
                    Delta::Add(_) => TAG_ADD,
                    Delta::Max(_) => TAG_MAX,
                    _ => TAG_MIN,
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
            TAG_ADD => Delta::Add(int()?),
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
