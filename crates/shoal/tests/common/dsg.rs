//! A history recorder and a checker of Adya's direct serialization graph (DSG).
//!
//! Every value a test writes is unique: it encodes the writing transaction's test-assigned id
//! and a sequence number ([`Version`]), so every read names the version it saw and thus the
//! transaction that wrote it. Every write reads the key first in the same transaction, so it
//! also names the version it overwrote: that gives the version order of each key.
//!
//! From the committed transactions the checker builds the DSG:
//! * `ww`: the writer of the overwritten version -> the writer of the new version,
//! * `wr`: the writer of a version read -> the reader,
//! * `rw` (anti-dependency): the reader of version `v` -> the writer of the version after `v`,
//!
//! and fails on any cycle (Adya's G0, G1c, G-single, G2), printing it. It also fails on
//! G1a (a committed transaction read a version no committed transaction wrote: aborted or
//! invented data), G1b (a read of a version its writer later overwrote itself) and on a
//! version order that is not a chain (two committed writers overwrote the same version: a
//! lost update).
//!
//! Split (commutative) operations: a transaction may instead ADD a distinct power of two to a
//! counter key ([`TxnRecord::adds`], blind: it does not read the counter), and others read the
//! counter's whole value ([`TxnRecord::sums`]): the set bits name exactly the adders whose
//! ADD the reader saw. Adds commute, so adders get no edges among themselves; an adder whose
//! bit a reader saw precedes the reader (`wr`), an adder whose bit it did not see follows it
//! (`rw`). A bit no committed transaction added is an aborted read (G1a).
//!
//! Absent keys read as [`Version::INITIAL`]; scans record a read of every key of the test's
//! key space inside the range, absent keys included (the item-level form of a predicate read
//! when keys are never deleted).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;

/// A transaction id assigned by the test (not the engine's): unique per attempt.
pub type TxnId = u64;
/// A key of the recorded history.
pub type Key = String;

/// One version of a key: the transaction that wrote it and its sequence number in that
/// transaction. `writer == 0` is the initial (absent or preloaded) version.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Version {
    /// The writing transaction (0: the initial state).
    pub writer: TxnId,
    /// Sequence number of the write inside its transaction.
    pub seq: u32,
}

impl Version {
    /// The version every key has before any recorded transaction writes it.
    pub const INITIAL: Version = Version { writer: 0, seq: 0 };

    /// The 12-byte value that carries this version.
    pub fn encode(self) -> Vec<u8> {
        let mut v = Vec::with_capacity(12);
        v.extend_from_slice(&self.writer.to_le_bytes());
        v.extend_from_slice(&self.seq.to_le_bytes());
        v
    }

    /// The version a stored value carries (`None` reads as the initial version).
    pub fn decode(v: Option<&[u8]>) -> Version {
        match v {
            None => Version::INITIAL,
            Some(b) => {
                assert_eq!(b.len(), 12, "a version-carrying value has 12 bytes: {b:?}");
                Version {
                    writer: u64::from_le_bytes(b[..8].try_into().expect("8 bytes")),
                    seq: u32::from_le_bytes(b[8..].try_into().expect("4 bytes")),
                }
            }
        }
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if *self == Version::INITIAL {
            write!(f, "init")
        } else {
            write!(f, "T{}.{}", self.writer, self.seq)
        }
    }
}

/// What one committed transaction did.
#[derive(Clone, Debug, Default)]
pub struct TxnRecord {
    /// The test-assigned id.
    pub id: TxnId,
    /// Reads of versions written by other transactions (or the initial version), in order.
    pub reads: Vec<(Key, Version)>,
    /// Writes: key, version written, version overwritten (may be this transaction's own
    /// earlier version), in order.
    pub writes: Vec<(Key, Version, Version)>,
    /// Blind commutative adds: counter key, and the bit (0..63) this transaction added.
    pub adds: Vec<(Key, u32)>,
    /// Reads of a counter key: the value seen (a set of adders' bits).
    pub sums: Vec<(Key, u64)>,
}

/// Records a running transaction's reads and writes of versioned keys (values are encoded
/// [`Version`]s) into its [`TxnRecord`]: the versions it reads of others (or the initial
/// one), checking that it reads its own writes, and what each of its writes overwrites.
pub struct Recorder {
    /// The record so far (counter adds and sums are pushed to it directly).
    pub rec: TxnRecord,
    /// The transaction's last write of each key it wrote.
    own: HashMap<Key, Version>,
    /// Its writes so far (the `seq` of the next version it writes, less one).
    seq: u32,
}

impl Recorder {
    /// A recorder for transaction `id`.
    pub fn new(id: TxnId) -> Recorder {
        Recorder {
            rec: TxnRecord::new(id),
            own: HashMap::new(),
            seq: 0,
        }
    }

    /// The transaction read `seen` as the version of `k`: its own last write if it wrote `k`
    /// (checked), else a read of another transaction's version (recorded). Returns `seen`.
    pub fn observe(&mut self, k: &str, seen: Version) -> Version {
        match self.own.get(k) {
            Some(mine) => assert_eq!(
                seen, *mine,
                "T{}: read {k} after writing it and saw {seen}, not its own write {mine}",
                self.rec.id
            ),
            None => self.rec.reads.push((k.to_string(), seen)),
        }
        seen
    }

    /// Reads `k` in `tx` and [`observe`](Self::observe)s it.
    pub fn get(
        &mut self,
        tx: &mut shoal::Transaction<'_>,
        t: &shoal::Table,
        k: &str,
    ) -> shoal::Result<Version> {
        let seen = Version::decode(tx.get(t, k)?.as_deref());
        Ok(self.observe(k, seen))
    }

    /// Writes the transaction's next version of `k` in `tx`, over `old` (the version it read).
    pub fn put(
        &mut self,
        tx: &mut shoal::Transaction<'_>,
        t: &shoal::Table,
        k: Key,
        old: Version,
    ) -> shoal::Result<()> {
        self.seq += 1;
        let new = Version {
            writer: self.rec.id,
            seq: self.seq,
        };
        tx.put(t, &k, new.encode())?;
        self.own.insert(k.clone(), new);
        self.rec.writes.push((k, new, old));
        Ok(())
    }
}

impl TxnRecord {
    /// An empty record for transaction `id`.
    pub fn new(id: TxnId) -> TxnRecord {
        TxnRecord {
            id,
            ..TxnRecord::default()
        }
    }
    /// Records a read (builder style, for hand-made histories).
    pub fn r(mut self, key: &str, v: Version) -> TxnRecord {
        self.reads.push((key.to_string(), v));
        self
    }
    /// Records a blind commutative add of `bit` to counter `key` (builder style).
    pub fn add(mut self, key: &str, bit: u32) -> TxnRecord {
        self.adds.push((key.to_string(), bit));
        self
    }
    /// Records a read of counter `key` that saw `value` (builder style).
    pub fn sum(mut self, key: &str, value: u64) -> TxnRecord {
        self.sums.push((key.to_string(), value));
        self
    }
    /// Records a write of `new` over `old` (builder style).
    pub fn w(mut self, key: &str, new: Version, old: Version) -> TxnRecord {
        self.writes.push((key.to_string(), new, old));
        self
    }
}

/// Shorthand for a version in hand-made histories.
pub fn v(writer: TxnId, seq: u32) -> Version {
    Version { writer, seq }
}

/// The kind of a DSG edge.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dep {
    /// Write dependency.
    WW,
    /// Read dependency.
    WR,
    /// Anti-dependency.
    RW,
}

/// A DSG edge `from -> to` with its reason.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Edge {
    /// Source transaction.
    pub from: TxnId,
    /// Target transaction.
    pub to: TxnId,
    /// Kind.
    pub dep: Dep,
    /// The key that caused it.
    pub key: Key,
    /// The version involved (the one read / overwritten).
    pub version: Version,
}

impl fmt::Display for Edge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let why = match self.dep {
            Dep::WW => format!("T{} overwrote {} of {}", self.to, self.version, self.key),
            Dep::WR => format!("T{} read {} of {}", self.to, self.version, self.key),
            Dep::RW => format!(
                "T{} read {} of {}, T{} wrote the next version",
                self.from, self.version, self.key, self.to
            ),
        };
        write!(f, "T{} -{:?}-> T{} ({why})", self.from, self.dep, self.to)
    }
}

/// Why a history is not serializable.
#[derive(Clone, Debug)]
pub enum Violation {
    /// A cycle in the DSG, with its Adya class (G0, G1c, G-single, G2).
    Cycle {
        /// G0 / G1c / G-single / G2.
        class: &'static str,
        /// The edges of the cycle, in order.
        edges: Vec<Edge>,
    },
    /// G1a: a committed transaction read a version no committed transaction wrote.
    AbortedRead {
        /// The reader.
        reader: TxnId,
        /// The key.
        key: Key,
        /// The version read.
        version: Version,
    },
    /// G1b: a committed transaction read a version its writer overwrote itself later.
    IntermediateRead {
        /// The reader.
        reader: TxnId,
        /// The key.
        key: Key,
        /// The version read.
        version: Version,
    },
    /// Two committed transactions overwrote the same version: the version order of the key
    /// is not a chain (a lost update).
    ForkedVersion {
        /// The key.
        key: Key,
        /// The version overwritten twice.
        version: Version,
        /// The two writers.
        writers: (TxnId, TxnId),
    },
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::Cycle { class, edges } => {
                writeln!(f, "{class} cycle of {} transactions:", edges.len())?;
                for e in edges {
                    writeln!(f, "    {e}")?;
                }
                Ok(())
            }
            Violation::AbortedRead {
                reader,
                key,
                version,
            } => write!(
                f,
                "G1a: committed T{reader} read {version} of {key}, which no committed transaction wrote"
            ),
            Violation::IntermediateRead {
                reader,
                key,
                version,
            } => write!(
                f,
                "G1b: committed T{reader} read {version} of {key}, an intermediate version its writer overwrote"
            ),
            Violation::ForkedVersion {
                key,
                version,
                writers,
            } => write!(
                f,
                "lost update: committed T{} and T{} both overwrote {version} of {key}",
                writers.0, writers.1
            ),
        }
    }
}

/// A recorded history of committed transactions.
#[derive(Clone, Debug, Default)]
pub struct History {
    /// The committed transactions.
    pub txns: Vec<TxnRecord>,
}

/// Statistics of a checked history (to assert that a test exercised something).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Committed transactions.
    pub txns: usize,
    /// Edges by kind: ww, wr, rw.
    pub ww: usize,
    /// Read dependencies.
    pub wr: usize,
    /// Anti-dependencies.
    pub rw: usize,
}

impl History {
    /// An empty history.
    pub fn new() -> History {
        History::default()
    }

    /// Adds a committed transaction.
    pub fn push(&mut self, t: TxnRecord) {
        self.txns.push(t);
    }

    /// Builds the DSG edges, or the first non-cycle violation found.
    pub fn edges(&self) -> Result<Vec<Edge>, Violation> {
        // Final version of each key per writer, and every version written.
        let mut written: HashMap<(&str, Version), TxnId> = HashMap::new();
        let mut overwritten_by_self: HashSet<(&str, Version)> = HashSet::new();
        // next[(key, v)] = (writer of the version after v, that version)
        let mut next: HashMap<(&str, Version), (TxnId, Version)> = HashMap::new();
        let mut edges = Vec::new();
        for t in &self.txns {
            for (k, new, old) in &t.writes {
                assert_eq!(new.writer, t.id, "T{} recorded a write of {new}", t.id);
                written.insert((k.as_str(), *new), t.id);
                if old.writer == t.id {
                    overwritten_by_self.insert((k.as_str(), *old));
                    continue;
                }
                if let Some((other, _)) = next.insert((k.as_str(), *old), (t.id, *new)) {
                    return Err(Violation::ForkedVersion {
                        key: k.clone(),
                        version: *old,
                        writers: (other, t.id),
                    });
                }
            }
        }
        // The edge `dep` from the committed writer of `version` of `key` to `txn`, which
        // read or overwrote it (a version no committed transaction wrote was read from an
        // aborted one).
        let depends_on_writer = |txn: TxnId, dep: Dep, key: &String, version: Version| match written
            .get(&(key.as_str(), version))
        {
            Some(&w) => Ok(Edge {
                from: w,
                to: txn,
                dep,
                key: key.clone(),
                version,
            }),
            None => Err(Violation::AbortedRead {
                reader: txn,
                key: key.clone(),
                version,
            }),
        };
        for t in &self.txns {
            for (k, new, old) in &t.writes {
                let _ = new;
                if old.writer == t.id || *old == Version::INITIAL {
                    continue;
                }
                edges.push(depends_on_writer(t.id, Dep::WW, k, *old)?);
            }
            for (k, ver) in &t.reads {
                if ver.writer == t.id {
                    continue;
                }
                if *ver != Version::INITIAL {
                    edges.push(depends_on_writer(t.id, Dep::WR, k, *ver)?);
                    if overwritten_by_self.contains(&(k.as_str(), *ver)) {
                        return Err(Violation::IntermediateRead {
                            reader: t.id,
                            key: k.clone(),
                            version: *ver,
                        });
                    }
                }
                if let Some(&(w, _)) = next.get(&(k.as_str(), *ver)) {
                    if w != t.id {
                        edges.push(Edge {
                            from: t.id,
                            to: w,
                            dep: Dep::RW,
                            key: k.clone(),
                            version: *ver,
                        });
                    }
                }
            }
        }
        self.commutative_edges(&mut edges)?;
        Ok(edges)
    }

    /// The edges of blind commutative adds and the reads of their counters.
    fn commutative_edges(&self, edges: &mut Vec<Edge>) -> Result<(), Violation> {
        let bit_version = |b: u32| Version { writer: 0, seq: b };
        let mut adder: HashMap<(&str, u32), TxnId> = HashMap::new();
        let mut by_key: HashMap<&str, Vec<(u32, TxnId)>> = HashMap::new();
        for t in &self.txns {
            for (k, b) in &t.adds {
                assert!(*b < 64, "T{}: bit {b} of {k} out of range", t.id);
                if let Some(other) = adder.insert((k.as_str(), *b), t.id) {
                    return Err(Violation::ForkedVersion {
                        key: k.clone(),
                        version: bit_version(*b),
                        writers: (other, t.id),
                    });
                }
                by_key.entry(k.as_str()).or_default().push((*b, t.id));
            }
        }
        for t in &self.txns {
            for (k, seen) in &t.sums {
                for b in (0..64).filter(|b| seen & (1 << b) != 0) {
                    if !adder.contains_key(&(k.as_str(), b)) {
                        return Err(Violation::AbortedRead {
                            reader: t.id,
                            key: k.clone(),
                            version: bit_version(b),
                        });
                    }
                }
                for &(b, a) in by_key.get(k.as_str()).map_or(&[][..], |v| v) {
                    if a == t.id {
                        continue;
                    }
                    let (from, to, dep) = if seen & (1 << b) != 0 {
                        (a, t.id, Dep::WR)
                    } else {
                        (t.id, a, Dep::RW)
                    };
                    edges.push(Edge {
                        from,
                        to,
                        dep,
                        key: k.clone(),
                        version: Version { writer: a, seq: b },
                    });
                }
            }
        }
        Ok(())
    }

    /// The final value of every counter key the history added to: the OR (= sum) of its
    /// committed adders' bits.
    pub fn final_sums(&self) -> HashMap<Key, u64> {
        let mut out: HashMap<Key, u64> = HashMap::new();
        for t in &self.txns {
            for (k, b) in &t.adds {
                *out.entry(k.clone()).or_default() |= 1 << b;
            }
        }
        out
    }

    /// The last version of every key the history wrote: the versions no committed write
    /// overwrote. A correct engine's final state holds exactly these (keys never written keep
    /// their initial version). Panics if a key has several (a fork: `check` reports it).
    pub fn final_versions(&self) -> HashMap<Key, Version> {
        let mut written: HashMap<&str, HashSet<Version>> = HashMap::new();
        let mut overwritten: HashSet<(&str, Version)> = HashSet::new();
        for t in &self.txns {
            for (k, new, old) in &t.writes {
                written.entry(k.as_str()).or_default().insert(*new);
                overwritten.insert((k.as_str(), *old));
            }
        }
        written
            .into_iter()
            .map(|(k, vs)| {
                let heads: Vec<Version> = vs
                    .into_iter()
                    .filter(|v| !overwritten.contains(&(k, *v)))
                    .collect();
                assert_eq!(
                    heads.len(),
                    1,
                    "key {k}: the version order is not a chain: {heads:?}"
                );
                (k.to_string(), heads[0])
            })
            .collect()
    }

    /// Checks the history: `Ok` with statistics when serializable, the violation otherwise.
    pub fn check(&self) -> Result<Stats, Violation> {
        let edges = self.edges()?;
        let mut stats = Stats {
            txns: self.txns.len(),
            ..Stats::default()
        };
        for e in &edges {
            match e.dep {
                Dep::WW => stats.ww += 1,
                Dep::WR => stats.wr += 1,
                Dep::RW => stats.rw += 1,
            }
        }
        match find_cycle(&edges) {
            None => Ok(stats),
            Some(cycle) => {
                let rw = cycle.iter().filter(|e| e.dep == Dep::RW).count();
                let class = if rw >= 2 {
                    "G2"
                } else if rw == 1 {
                    "G-single"
                } else if cycle.iter().any(|e| e.dep == Dep::WR) {
                    "G1c"
                } else {
                    "G0"
                };
                Err(Violation::Cycle {
                    class,
                    edges: cycle,
                })
            }
        }
    }

    /// Panics with a readable message (including the involved transactions) when the
    /// history is not serializable; returns the statistics otherwise.
    pub fn assert_serializable(&self, what: &str) -> Stats {
        match self.check() {
            Ok(s) => s,
            Err(v) => {
                let mut involved: Vec<TxnId> = match &v {
                    Violation::Cycle { edges, .. } => edges.iter().map(|e| e.from).collect(),
                    Violation::AbortedRead { reader, .. }
                    | Violation::IntermediateRead { reader, .. } => vec![*reader],
                    Violation::ForkedVersion { writers, .. } => vec![writers.0, writers.1],
                };
                involved.sort_unstable();
                involved.dedup();
                let mut msg = format!(
                    "{what}: history of {} committed transactions is NOT serializable: {v}\n",
                    self.txns.len()
                );
                for t in self.txns.iter().filter(|t| involved.contains(&t.id)) {
                    msg.push_str(&format!("  T{}: ", t.id));
                    for (k, ver) in &t.reads {
                        msg.push_str(&format!("r({k}={ver}) "));
                    }
                    for (k, new, old) in &t.writes {
                        msg.push_str(&format!("w({k}: {old}->{new}) "));
                    }
                    for (k, b) in &t.adds {
                        msg.push_str(&format!("add({k}, bit {b}) "));
                    }
                    for (k, seen) in &t.sums {
                        msg.push_str(&format!("sum({k}={seen:#x}) "));
                    }
                    msg.push('\n');
                }
                panic!("{msg}");
            }
        }
    }
}

/// Finds a cycle in the graph (Tarjan's strongly connected components, then a shortest
/// cycle through one node of a non-trivial component by breadth-first search).
pub fn find_cycle(edges: &[Edge]) -> Option<Vec<Edge>> {
    let mut adj: BTreeMap<TxnId, Vec<usize>> = BTreeMap::new();
    for (i, e) in edges.iter().enumerate() {
        if e.from != e.to {
            adj.entry(e.from).or_default().push(i);
            adj.entry(e.to).or_default();
        }
    }
    let nodes: Vec<TxnId> = adj.keys().copied().collect();
    // Iterative Tarjan.
    let mut index: HashMap<TxnId, usize> = HashMap::new();
    let mut low: HashMap<TxnId, usize> = HashMap::new();
    let mut on_stack: HashSet<TxnId> = HashSet::new();
    let mut stack: Vec<TxnId> = Vec::new();
    let mut next_index = 0usize;
    let mut scc_of: HashMap<TxnId, usize> = HashMap::new();
    let mut scc_sizes: Vec<usize> = Vec::new();
    for &root in &nodes {
        if index.contains_key(&root) {
            continue;
        }
        // (node, position in its adjacency list)
        let mut call: Vec<(TxnId, usize)> = vec![(root, 0)];
        index.insert(root, next_index);
        low.insert(root, next_index);
        next_index += 1;
        stack.push(root);
        on_stack.insert(root);
        while let Some(&mut (n, ref mut pos)) = call.last_mut() {
            let out = &adj[&n];
            if *pos < out.len() {
                let m = edges[out[*pos]].to;
                *pos += 1;
                if let std::collections::hash_map::Entry::Vacant(e) = index.entry(m) {
                    e.insert(next_index);
                    low.insert(m, next_index);
                    next_index += 1;
                    stack.push(m);
                    on_stack.insert(m);
                    call.push((m, 0));
                } else if on_stack.contains(&m) {
                    let l = low[&n].min(index[&m]);
                    low.insert(n, l);
                }
            } else {
                call.pop();
                if let Some(&(p, _)) = call.last() {
                    let l = low[&p].min(low[&n]);
                    low.insert(p, l);
                }
                if low[&n] == index[&n] {
                    let id = scc_sizes.len();
                    let mut size = 0;
                    loop {
                        let w = stack.pop().expect("Tarjan stack");
                        on_stack.remove(&w);
                        scc_of.insert(w, id);
                        size += 1;
                        if w == n {
                            break;
                        }
                    }
                    scc_sizes.push(size);
                }
            }
        }
    }
    let start = nodes.iter().copied().find(|n| scc_sizes[scc_of[n]] > 1)?;
    let comp = scc_of[&start];
    // BFS from start inside its component back to start.
    let mut pred: HashMap<TxnId, usize> = HashMap::new();
    let mut queue = std::collections::VecDeque::from([start]);
    while let Some(n) = queue.pop_front() {
        for &ei in &adj[&n] {
            let m = edges[ei].to;
            if scc_of[&m] != comp {
                continue;
            }
            if m == start {
                let mut cycle = vec![edges[ei].clone()];
                let mut cur = n;
                while cur != start {
                    let pe = pred[&cur];
                    cycle.push(edges[pe].clone());
                    cur = edges[pe].from;
                }
                cycle.reverse();
                return Some(cycle);
            }
            if let std::collections::hash_map::Entry::Vacant(e) = pred.entry(m) {
                e.insert(ei);
                queue.push_back(m);
            }
        }
    }
    unreachable!("a strongly connected component of more than one node has a cycle")
}
