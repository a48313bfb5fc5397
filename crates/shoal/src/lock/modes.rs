//! Lock modes and compatibility: Graefe's key-range modes (Kimura Table 2), cursor modes
//! (Table 3) and hierarchical intent modes (Table 4).
//!
//! Two families of modes share one enum:
//!
//! * **Key-range modes** `N S X NS NX SN SX XN XS` (Graefe; Kimura §2.2) are the pairs
//!   (key part, gap part) over `{N, S, X}`; `S` is `SS` and `X` is `XX`. A lock on key `k`
//!   protects the half-open interval `[k, next key)`: the key part protects `k`, the gap part
//!   the open gap after it (prior-key locking). Two modes are compatible iff both parts are;
//!   the supremum is the part-wise maximum.
//! * **Intent modes** `N IS IX S SIX X` (Gray et al.; Kimura Table 4) are taken on tables and the
//!   database. Their order is the lattice `N < IS < {IX, S} < SIX < X` with `sup(IX, S) = SIX`.
//!
//! `N`, `S` and `X` belong to both families with the same meaning. A key-range-only mode and an
//! intent-only mode are never requested on the same lock (keys take key-range modes, tables and
//! the database take intent modes); should it happen anyway, such a pair is treated
//! conservatively: the two are **incompatible** and their supremum is `X`.
//!
//! Compatibility and supremum are `const` 12×12 tables computed at compile time, so
//! [`LockMode::compatible`] is a single indexed load and bit test.

/// A lock mode. Key-range modes (`N S X NS NX SN SX XN XS`) are used on keys; intent modes
/// (`N IS IX S SIX X`) on tables and the database. `S` and `X` belong to both families
/// (for keys `S` = `SS` and `X` = `XX`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LockMode {
    /// No lock.
    N,
    /// Shared (key-range: key shared, gap shared).
    S,
    /// Exclusive (key-range: key exclusive, gap exclusive).
    X,
    /// Key free, gap shared.
    NS,
    /// Key free, gap exclusive.
    NX,
    /// Key shared, gap free.
    SN,
    /// Key shared, gap exclusive.
    SX,
    /// Key exclusive, gap free.
    XN,
    /// Key exclusive, gap shared.
    XS,
    /// Intention shared.
    IS,
    /// Intention exclusive.
    IX,
    /// Shared with intention exclusive.
    SIX,
}

/// One part (key or gap) of a key-range lock mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Part {
    /// Not locked.
    N,
    /// Shared.
    S,
    /// Exclusive.
    X,
}

impl Part {
    /// Whether two holders may lock the same part in these modes (Kimura Table 1).
    pub const fn compatible(self, other: Part) -> bool {
        matches!(
            (self, other),
            (Part::N, _) | (_, Part::N) | (Part::S, Part::S)
        )
    }

    /// The stronger of the two parts (`N < S < X`).
    pub const fn max(self, other: Part) -> Part {
        if (self as u8) >= (other as u8) {
            self
        } else {
            other
        }
    }
}

/// Number of lock modes.
const NMODES: usize = 12;

/// Bit mask with one bit per mode (bit `m as u16`).
type ModeMask = u16;

/// `COMPAT[a] & (1 << b) != 0` iff `a` is compatible with `b`.
const COMPAT: [ModeMask; NMODES] = build_compat();

/// `SUP[a][b]` is `a.supremum(b)`.
const SUP: [[LockMode; NMODES]; NMODES] = build_sup();

const fn build_compat() -> [ModeMask; NMODES] {
    let mut t = [0 as ModeMask; NMODES];
    let mut a = 0;
    while a < NMODES {
        let mut b = 0;
        while b < NMODES {
            if compat_slow(LockMode::ALL[a], LockMode::ALL[b]) {
                t[a] |= 1 << b;
            }
            b += 1;
        }
        a += 1;
    }
    t
}

const fn build_sup() -> [[LockMode; NMODES]; NMODES] {
    let mut t = [[LockMode::N; NMODES]; NMODES];
    let mut a = 0;
    while a < NMODES {
        let mut b = 0;
        while b < NMODES {
            t[a][b] = sup_slow(LockMode::ALL[a], LockMode::ALL[b]);
            b += 1;
        }
        a += 1;
    }
    t
}

/// Rank of an intent-family mode in Gray's lattice, as a set of "components":
/// bit 0 = IS, bit 1 = IX, bit 2 = S, bit 3 = X. `sup` is the union, closed upward.
const fn intent_bits(m: LockMode) -> u8 {
    match m {
        LockMode::N => 0b0000,
        LockMode::IS => 0b0001,
        LockMode::IX => 0b0011,
        LockMode::S => 0b0101,
        LockMode::SIX => 0b0111,
        LockMode::X => 0b1111,
        _ => 0xff,
    }
}

const fn intent_from_bits(b: u8) -> LockMode {
    match b {
        0b0000 => LockMode::N,
        0b0001 => LockMode::IS,
        0b0011 => LockMode::IX,
        0b0101 => LockMode::S,
        0b0111 => LockMode::SIX,
        _ => LockMode::X,
    }
}

const fn intent_compat(a: LockMode, b: LockMode) -> bool {
    use LockMode::*;
    match (a, b) {
        (N, _) | (_, N) => true,
        (X, _) | (_, X) => false,
        (IS, _) | (_, IS) => true,
        (IX, IX) | (S, S) => true,
        _ => false,
    }
}

const fn compat_slow(a: LockMode, b: LockMode) -> bool {
    if let (Some((ak, ag)), Some((bk, bg))) = (a.parts(), b.parts()) {
        ak.compatible(bk) && ag.compatible(bg)
    } else if a.in_intent_family() && b.in_intent_family() {
        intent_compat(a, b)
    } else {
        // One key-range-only and one intent-only mode: never happens on one lock; conservative.
        false
    }
}

const fn sup_slow(a: LockMode, b: LockMode) -> LockMode {
    if let (Some((ak, ag)), Some((bk, bg))) = (a.parts(), b.parts()) {
        LockMode::key_range(ak.max(bk), ag.max(bg))
    } else if a.in_intent_family() && b.in_intent_family() {
        intent_from_bits(intent_bits(a) | intent_bits(b))
    } else {
        // One key-range-only and one intent-only mode: never happens on one lock; conservative.
        LockMode::X
    }
}

impl LockMode {
    /// All modes, in declaration order (`mode as usize` indexes this array).
    pub const ALL: [LockMode; NMODES] = [
        LockMode::N,
        LockMode::S,
        LockMode::X,
        LockMode::NS,
        LockMode::NX,
        LockMode::SN,
        LockMode::SX,
        LockMode::XN,
        LockMode::XS,
        LockMode::IS,
        LockMode::IX,
        LockMode::SIX,
    ];

    /// The key-range family in the order of Kimura Table 2 (the first nine of
    /// [`ALL`](Self::ALL)).
    pub const KEY_RANGE: [LockMode; 9] = Self::first_of_all();

    /// The intent family in the order of Kimura Table 4.
    pub const INTENT: [LockMode; 6] = [
        LockMode::N,
        LockMode::S,
        LockMode::X,
        LockMode::IS,
        LockMode::IX,
        LockMode::SIX,
    ];

    /// The first `K` modes of [`ALL`](Self::ALL).
    const fn first_of_all<const K: usize>() -> [LockMode; K] {
        let mut out = [LockMode::N; K];
        let mut i = 0;
        while i < K {
            out[i] = Self::ALL[i];
            i += 1;
        }
        out
    }

    /// Whether a lock in mode `self` held by one transaction lets another hold `other`.
    /// Symmetric. Mixing a key-range-only with an intent-only mode yields `false`.
    #[inline]
    pub const fn compatible(self, other: LockMode) -> bool {
        COMPAT[self as usize] & (1 << other as usize) != 0
    }

    /// The weakest mode that covers both (for conversions): part-wise maximum for key-range
    /// modes, Gray's lattice for intent modes, `X` for a key-range-only/intent-only mix.
    #[inline]
    pub const fn supremum(self, other: LockMode) -> LockMode {
        SUP[self as usize][other as usize]
    }

    /// True when holding `self` makes a request for `other` unnecessary.
    #[inline]
    pub const fn covers(self, other: LockMode) -> bool {
        self.supremum(other) as u8 == self as u8
    }

    /// The bit of this mode in a mode mask.
    #[inline]
    pub(crate) const fn bit(self) -> u16 {
        1 << self as usize
    }

    /// True when `self` is compatible with every mode whose bit is set in `mask`.
    #[inline]
    pub(crate) const fn compatible_with_all(self, mask: u16) -> bool {
        mask & !COMPAT[self as usize] == 0
    }

    /// The key-range mode with the given key and gap parts (`(S, S)` is `S`, `(X, X)` is `X`).
    pub const fn key_range(key: Part, gap: Part) -> LockMode {
        match (key, gap) {
            (Part::N, Part::N) => LockMode::N,
            (Part::N, Part::S) => LockMode::NS,
            (Part::N, Part::X) => LockMode::NX,
            (Part::S, Part::N) => LockMode::SN,
            (Part::S, Part::S) => LockMode::S,
            (Part::S, Part::X) => LockMode::SX,
            (Part::X, Part::N) => LockMode::XN,
            (Part::X, Part::S) => LockMode::XS,
            (Part::X, Part::X) => LockMode::X,
        }
    }

    /// `(key part, gap part)` of a key-range-family mode; `None` for `IS`, `IX`, `SIX`.
    pub const fn parts(self) -> Option<(Part, Part)> {
        use Part as P;
        Some(match self {
            LockMode::N => (P::N, P::N),
            LockMode::S => (P::S, P::S),
            LockMode::X => (P::X, P::X),
            LockMode::NS => (P::N, P::S),
            LockMode::NX => (P::N, P::X),
            LockMode::SN => (P::S, P::N),
            LockMode::SX => (P::S, P::X),
            LockMode::XN => (P::X, P::N),
            LockMode::XS => (P::X, P::S),
            LockMode::IS | LockMode::IX | LockMode::SIX => return None,
        })
    }

    /// The key part of a key-range-family mode (`None` for `IS`, `IX`, `SIX`).
    pub const fn key_part(self) -> Option<Part> {
        match self.parts() {
            Some((k, _)) => Some(k),
            None => None,
        }
    }

    /// The gap part of a key-range-family mode (`None` for `IS`, `IX`, `SIX`).
    pub const fn gap_part(self) -> Option<Part> {
        match self.parts() {
            Some((_, g)) => Some(g),
            None => None,
        }
    }

    /// True for the intent-only modes `IS`, `IX`, `SIX`.
    pub const fn is_intent(self) -> bool {
        matches!(self, LockMode::IS | LockMode::IX | LockMode::SIX)
    }

    /// True for modes of the key-range family (`N S X NS NX SN SX XN XS`).
    pub const fn in_key_range_family(self) -> bool {
        !self.is_intent()
    }

    /// True for modes of the intent family (`N IS IX S SIX X`).
    pub const fn in_intent_family(self) -> bool {
        matches!(
            self,
            LockMode::N | LockMode::S | LockMode::X | LockMode::IS | LockMode::IX | LockMode::SIX
        )
    }
}

/// Direction of a range cursor (Kimura Table 3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CursorDir {
    /// Keys in increasing order.
    Ascending,
    /// Keys in decreasing order.
    Descending,
}

/// Which lock a cursor is taking (rows of Kimura Table 3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CursorStep {
    /// Initial positioning: the start bound exists as a key; the lock is on that key.
    InitialExactMatch,
    /// Initial positioning: the start bound does not exist; the lock is on the previous key
    /// (the key whose gap contains the bound).
    InitialNonExistent,
    /// Initial positioning: the start bound does not exist and sorts below the leaf's first
    /// key; the lock is on the leaf's low fence key (or [`LockId::NegInf`](super::LockId)).
    InitialFenceLow,
    /// Moving to the next key (or onto the next page's fence key) that lies inside the range.
    Next,
    /// The final lock of a scan: the key whose value is outside the range but whose gap still
    /// reaches into it (e.g. for a descending cursor the key just below the lower bound).
    Last,
}

/// The lock mode a range cursor takes (Kimura Table 3).
///
/// With prior-key locking a lock on key `k` covers `k` (key part) and the gap `(k, next)`
/// (gap part). `inclusive` says whether the *start* bound belongs to the range; it does not
/// matter for [`CursorStep::Next`] and [`CursorStep::Last`].
///
/// | step | asc. incl. | asc. excl. | desc. incl. | desc. excl. |
/// |---|---|---|---|---|
/// | initial, exact match | `S`* | `NS` | `SN`* | `N` |
/// | initial, non-existent | `NS` | `NS` | `S` | `S` |
/// | initial, non-existent, fence-low | `NS` | `NS` | `NS` | `NS` |
/// | next / page move | `S` | `S` | `S` | `S` |
/// | last | `NS` | `NS` | `NS` | `NS` |
///
/// What each entry protects:
/// * Ascending, exact match on `A`: inclusive needs `A` and the gap after it (the range
///   continues upward) → `S`; the paper takes it at once instead of `SN` now and a conversion
///   to `S` on the first move (*: more conservative, one lock-table access fewer). Exclusive:
///   `A` is outside the range, only its gap is inside → `NS`.
/// * Descending, exact match on `A`: the gap above `A` is outside the range. Inclusive needs
///   only `A` → `SN`* (the gap below `A` is protected by the lock on the previous key taken on
///   the next move). Exclusive: nothing on `A` is in range → `N`.
/// * Non-existent start, lock on the previous key `P`: ascending needs only the gap
///   `(P, next)` holding the bound → `NS`; descending starts *at* `P`, which lies in the range,
///   together with the part of its gap below the bound → `S`.
/// * Non-existent start below the leaf's first key: the bound lies in the gap of the low fence
///   key, whose key value belongs to the previous leaf (it is locked, if in range, when the
///   cursor moves there) → `NS` in all cases.
/// * Next / page move: the key reached and its gap both lie in the range → `S`.
/// * Last: only the gap of the final key reaches into the range → `NS`.
pub const fn cursor_mode(dir: CursorDir, inclusive: bool, step: CursorStep) -> LockMode {
    use CursorDir::*;
    use CursorStep::*;
    match (step, dir, inclusive) {
        (InitialExactMatch, Ascending, true) => LockMode::S,
        (InitialExactMatch, Ascending, false) => LockMode::NS,
        (InitialExactMatch, Descending, true) => LockMode::SN,
        (InitialExactMatch, Descending, false) => LockMode::N,
        (InitialNonExistent, Ascending, _) => LockMode::NS,
        (InitialNonExistent, Descending, _) => LockMode::S,
        (InitialFenceLow, _, _) => LockMode::NS,
        (Next, _, _) => LockMode::S,
        (Last, _, _) => LockMode::NS,
    }
}

#[cfg(test)]
mod tests {
    use super::LockMode::*;
    use super::*;

    const Y: bool = true;
    const O: bool = false; // "×"

    /// Kimura Table 2, literally (rows/columns: N S X NS NX SN SX XN XS).
    const TABLE2: [[bool; 9]; 9] = [
        [Y, Y, Y, Y, Y, Y, Y, Y, Y], // N
        [Y, Y, O, Y, O, Y, O, O, O], // S
        [Y, O, O, O, O, O, O, O, O], // X
        [Y, Y, O, Y, O, Y, O, Y, Y], // NS
        [Y, O, O, O, O, Y, O, Y, O], // NX
        [Y, Y, O, Y, Y, Y, Y, O, O], // SN
        [Y, O, O, O, O, Y, O, O, O], // SX
        [Y, O, O, Y, Y, O, O, O, O], // XN
        [Y, O, O, Y, O, O, O, O, O], // XS
    ];
    const TABLE2_MODES: [LockMode; 9] = [N, S, X, NS, NX, SN, SX, XN, XS];

    /// Kimura Table 4, literally (rows/columns: N S X IS IX SIX).
    const TABLE4: [[bool; 6]; 6] = [
        [Y, Y, Y, Y, Y, Y], // N
        [Y, Y, O, Y, O, O], // S
        [Y, O, O, O, O, O], // X
        [Y, Y, O, Y, Y, Y], // IS
        [Y, O, O, Y, Y, O], // IX
        [Y, O, O, Y, O, O], // SIX
    ];
    const TABLE4_MODES: [LockMode; 6] = [N, S, X, IS, IX, SIX];

    fn check_table<const K: usize>(modes: [LockMode; K], table: [[bool; K]; K]) {
        for i in 0..K {
            for j in 0..K {
                let (a, b) = (modes[i], modes[j]);
                assert_eq!(
                    table[i][j], table[j][i],
                    "paper table asymmetric at {a:?},{b:?}"
                );
                assert_eq!(a.compatible(b), table[i][j], "compatible({a:?}, {b:?})");
                assert_eq!(b.compatible(a), table[i][j], "compatible({b:?}, {a:?})");
            }
        }
    }

    #[test]
    fn table2_key_range_compatibility() {
        check_table(TABLE2_MODES, TABLE2);
    }

    #[test]
    fn table4_intent_compatibility() {
        check_table(TABLE4_MODES, TABLE4);
    }

    #[test]
    fn mixed_families_are_incompatible_and_sup_to_x() {
        for a in [NS, NX, SN, SX, XN, XS] {
            for b in [IS, IX, SIX] {
                assert!(!a.compatible(b) && !b.compatible(a));
                assert_eq!(a.supremum(b), X);
                assert_eq!(b.supremum(a), X);
            }
        }
        for m in LockMode::ALL {
            assert!(m.compatible(N) && N.compatible(m));
            assert!(!X.compatible(m) || m == N);
        }
    }

    /// `weaker(a, b)`: every mode of the family compatible with `b` is compatible with `a`,
    /// judged on the paper's literal table (independent of the implementation).
    fn weaker<const K: usize>(t: &[[bool; K]; K], a: usize, b: usize) -> bool {
        (0..K).all(|m| !t[b][m] || t[a][m])
    }

    /// The supremum laws over a family (`modes`, compatibility table `t`), then the
    /// paper's worked examples (`a ∨ b = s` for each `(a, b, s)` of `examples`).
    fn check_supremum<const K: usize>(
        modes: [LockMode; K],
        t: [[bool; K]; K],
        examples: &[(LockMode, LockMode, LockMode)],
    ) {
        for &(a, b, s) in examples {
            assert_eq!(a.supremum(b), s, "{a:?} v {b:?}");
        }
        let idx = |m: LockMode| modes.iter().position(|&x| x == m).unwrap();
        for i in 0..K {
            let a = modes[i];
            assert_eq!(a.supremum(a), a, "idempotent {a:?}");
            assert!(a.covers(a) && a.covers(N) && X.covers(a));
            for j in 0..K {
                let b = modes[j];
                let s = a.supremum(b);
                assert_eq!(s, b.supremum(a), "commutative {a:?} {b:?}");
                let si = idx(s);
                assert!(
                    weaker(&t, i, si) && weaker(&t, j, si),
                    "sup({a:?},{b:?}) too weak"
                );
                assert!(s.covers(a) && s.covers(b));
                // Least: every upper bound of a and b in the family is at least as strong.
                for (c, cm) in modes.iter().enumerate() {
                    if weaker(&t, i, c) && weaker(&t, j, c) {
                        assert!(weaker(&t, si, c), "sup({a:?},{b:?})={s:?} not below {cm:?}");
                    }
                }
                // covers agrees with the semantic order.
                assert_eq!(a.covers(b), weaker(&t, j, i), "covers({a:?},{b:?})");
            }
        }
    }

    #[test]
    fn supremum_laws_key_range() {
        let examples = [(SN, NS, S), (SN, NX, SX), (XN, NS, XS), (S, XN, XS)];
        check_supremum(TABLE2_MODES, TABLE2, &examples);
    }

    #[test]
    fn supremum_laws_intent() {
        let six_absorbs = [(SIX, IS, SIX), (SIX, IX, SIX), (SIX, S, SIX)];
        let examples = [(IS, IX, IX), (S, IX, SIX), (IS, S, S)];
        check_supremum(TABLE4_MODES, TABLE4, &[examples, six_absorbs].concat());
    }

    #[test]
    fn parts_round_trip() {
        for m in LockMode::KEY_RANGE {
            let (k, g) = m.parts().unwrap();
            assert_eq!(LockMode::key_range(k, g), m);
            assert_eq!(m.key_part(), Some(k));
            assert_eq!(m.gap_part(), Some(g));
            assert!(!m.is_intent());
        }
        for m in [IS, IX, SIX] {
            assert!(m.is_intent() && m.parts().is_none());
        }
    }

    #[test]
    fn table3_cursor_modes() {
        use CursorDir::*;
        use CursorStep::*;
        // (step, [asc incl, asc excl, desc incl, desc excl])
        let table = [
            (InitialExactMatch, [S, NS, SN, N]),
            (InitialNonExistent, [NS, NS, S, S]),
            (InitialFenceLow, [NS, NS, NS, NS]),
            (Next, [S, S, S, S]),
            (Last, [NS, NS, NS, NS]),
        ];
        for (step, row) in table {
            let cols = [
                (Ascending, true),
                (Ascending, false),
                (Descending, true),
                (Descending, false),
            ];
            for ((dir, incl), want) in cols.into_iter().zip(row) {
                assert_eq!(
                    cursor_mode(dir, incl, step),
                    want,
                    "{step:?} {dir:?} {incl}"
                );
            }
        }
    }
}
