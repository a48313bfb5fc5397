//! [`KeyRange`]: the ranges [`Transaction::scan`](super::Transaction::scan) takes.

use std::ops::{Bound, Range, RangeFrom, RangeFull, RangeInclusive, RangeTo, RangeToInclusive};

/// A range of keys for [`Transaction::scan`](super::Transaction::scan): any Rust range (`..`, `a..b`, `a..=b`, `a..`,
/// `..b`, `..=b`) or a pair of [`Bound`]s, over anything that is bytes (`&[u8]`, `&[u8; N]`,
/// `Vec<u8>`, `&str`, ...).
///
/// ```
/// use shoal::KeyRange;
/// use std::ops::Bound;
/// let (lo, hi) = (b"a"..b"c").key_bounds();
/// assert_eq!((lo, hi), (Bound::Included(&b"a"[..]), Bound::Excluded(&b"c"[..])));
/// assert_eq!((..).key_bounds(), (Bound::Unbounded, Bound::Unbounded));
/// let pair: (Bound<&str>, Bound<&str>) = (Bound::Excluded("a"), Bound::Unbounded);
/// assert_eq!(pair.key_bounds().0, Bound::Excluded(&b"a"[..]));
/// ```
pub trait KeyRange {
    /// The lower and upper bound as byte slices.
    fn key_bounds(&self) -> (Bound<&[u8]>, Bound<&[u8]>);
}

fn bound_of<K: AsRef<[u8]>>(b: Bound<&K>) -> Bound<&[u8]> {
    b.map(|k| k.as_ref())
}

impl KeyRange for RangeFull {
    fn key_bounds(&self) -> (Bound<&[u8]>, Bound<&[u8]>) {
        (Bound::Unbounded, Bound::Unbounded)
    }
}

impl<K: AsRef<[u8]>> KeyRange for Range<K> {
    fn key_bounds(&self) -> (Bound<&[u8]>, Bound<&[u8]>) {
        (
            Bound::Included(self.start.as_ref()),
            Bound::Excluded(self.end.as_ref()),
        )
    }
}

impl<K: AsRef<[u8]>> KeyRange for RangeInclusive<K> {
    fn key_bounds(&self) -> (Bound<&[u8]>, Bound<&[u8]>) {
        (
            Bound::Included(self.start().as_ref()),
            Bound::Included(self.end().as_ref()),
        )
    }
}

impl<K: AsRef<[u8]>> KeyRange for RangeFrom<K> {
    fn key_bounds(&self) -> (Bound<&[u8]>, Bound<&[u8]>) {
        (Bound::Included(self.start.as_ref()), Bound::Unbounded)
    }
}

impl<K: AsRef<[u8]>> KeyRange for RangeTo<K> {
    fn key_bounds(&self) -> (Bound<&[u8]>, Bound<&[u8]>) {
        (Bound::Unbounded, Bound::Excluded(self.end.as_ref()))
    }
}

impl<K: AsRef<[u8]>> KeyRange for RangeToInclusive<K> {
    fn key_bounds(&self) -> (Bound<&[u8]>, Bound<&[u8]>) {
        (Bound::Unbounded, Bound::Included(self.end.as_ref()))
    }
}

impl<K: AsRef<[u8]>> KeyRange for (Bound<K>, Bound<K>) {
    fn key_bounds(&self) -> (Bound<&[u8]>, Bound<&[u8]>) {
        (bound_of(self.0.as_ref()), bound_of(self.1.as_ref()))
    }
}
