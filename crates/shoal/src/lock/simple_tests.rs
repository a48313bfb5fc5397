//! Tests of the sharded lock table (a child module of `simple.rs`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::*;
use crate::lock::LockKey;
use LockMode::*;

fn shard_index(t: &SimpleLockTable, id: &LockId) -> usize {
    let p: *const Mutex<Shard> = t.shard(id);
    t.shards
        .iter()
        .position(|s| std::ptr::eq(&**s, p))
        .expect("a shard of the table")
}

#[test]
fn keys_of_consecutive_tables_use_disjoint_shards_and_spread_within_their_window() {
    let t = SimpleLockTable::new(DeadlockPolicy::WaitForGraph);
    let windows = 1usize << WINDOW_SHIFT;
    let per = SHARD_COUNT / windows;
    let mut used = vec![std::collections::BTreeSet::new(); windows];
    for (tab, seen) in used.iter_mut().enumerate() {
        for k in 0..4000u32 {
            let key = LockId::Key(tab as crate::lock::TableId, k.to_be_bytes().to_vec().into());
            seen.insert(shard_index(&t, &key));
        }
        seen.insert(shard_index(
            &t,
            &LockId::NegInf(tab as crate::lock::TableId),
        ));
    }
    for (a, sa) in used.iter().enumerate() {
        assert!(
            sa.len() > per / 2,
            "table {a}: {} of {per} shards",
            sa.len()
        );
        assert!(sa.len() <= per);
        for sb in &used[a + 1..] {
            assert!(sa.is_disjoint(sb));
        }
    }
    // The one-shard table has nothing to choose from.
    let one = SimpleLockTable::with_shards(DeadlockPolicy::WaitForGraph, 1);
    assert_eq!(
        shard_index(&one, &LockId::Key(3, LockKey::from(&b"k"[..]))),
        0
    );
}

const LONG: Duration = Duration::from_secs(10);

fn wait_until(what: &str, cond: impl Fn() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < LONG, "timed out waiting for {what}");
        thread::sleep(Duration::from_millis(1));
    }
}

fn table(policy: DeadlockPolicy) -> Arc<SimpleLockTable> {
    Arc::new(SimpleLockTable::new(policy))
}

#[test]
fn inline_and_boxed_key_names_lock_apart() {
    // Keys up to INLINE_KEY bytes are stored in the entry, longer ones boxed; names of
    // every kind that share a table id, and keys that are prefixes of each other, are
    // distinct locks either way.
    let t = table(DeadlockPolicy::WaitForGraph);
    let long = vec![7u8; INLINE_KEY + 1];
    let ids = [
        LockId::Database,
        LockId::Table(2),
        LockId::NegInf(2),
        LockId::Key(2, LockKey::from(&[][..])),
        LockId::Key(2, LockKey::from(&[0u8][..])),
        LockId::Key(2, LockKey::from(&long[..INLINE_KEY - 1])),
        LockId::Key(2, LockKey::from(&long[..INLINE_KEY])),
        LockId::Key(2, long.clone().into()),
        LockId::Key(2, vec![7u8; 3 * INLINE_KEY].into()),
        LockId::Key(3, long.clone().into()),
        // Either side of the id's own inline limit.
        LockId::Key(2, vec![7u8; LockKey::INLINE].into()),
        LockId::Key(2, vec![7u8; LockKey::INLINE + 1].into()),
        LockId::Key(3, LockKey::from(&long[..INLINE_KEY])),
    ];
    for (i, id) in ids.iter().enumerate() {
        assert_eq!(t.lock(i as TxnId + 1, id, X, LONG), Ok(X), "{id:?}");
    }
    assert_eq!(t.queue_count(), ids.len());
    for (i, id) in ids.iter().enumerate() {
        assert_eq!(t.held_mode(i as TxnId + 1, id), X, "{id:?}");
        assert_eq!(t.try_lock(100, id, S), Err(LockFailure::WouldBlock));
        // A fresh copy of the name finds the same lock.
        assert_eq!(
            t.try_lock(100, &id.clone(), S),
            Err(LockFailure::WouldBlock)
        );
    }
    // Waiting and granting on a boxed name and on an inline one.
    for id in [&ids[6], &ids[7]] {
        let h = {
            let (t, id) = (t.clone(), id.clone());
            thread::spawn(move || {
                let r = t.lock(200, &id, S, LONG);
                t.unlock(200, &id);
                r
            })
        };
        wait_until("the S request waits", || t.waiters(id) == 1);
        let owner = ids.iter().position(|x| x == id).unwrap() as TxnId + 1;
        t.unlock(owner, id);
        assert_eq!(h.join().unwrap(), Ok(S));
        assert!(t.is_free(id));
    }
    for (i, id) in ids.iter().enumerate() {
        t.unlock(i as TxnId + 1, id);
        assert!(t.is_free(id), "{id:?}");
    }
    assert_eq!(t.queue_count(), 0);
    assert_eq!(t.footprint(), crate::lock::LockTableFootprint::default());
}

#[test]
fn a_shards_first_lock_and_its_table_hold_locks_apart() {
    // Four keys of one shard: the first lock taken lives in the shard, the others in its
    // table; releasing the first leaves the others held, and the next lock taken there
    // takes the shard's own place again.
    let t = table(DeadlockPolicy::WaitForGraph);
    let key = |k: u32| LockId::Key(1, k.to_be_bytes().to_vec().into());
    let home = shard_index(&t, &key(0));
    let keys: Vec<LockId> = (0..)
        .map(key)
        .filter(|k| shard_index(&t, k) == home)
        .take(4)
        .collect();
    let s = Duration::from_secs(1);
    for (txn, k) in keys[..3].iter().enumerate() {
        assert_eq!(t.lock(txn as u64 + 1, k, X, s), Ok(X));
    }
    assert_eq!(t.queue_count(), 3);
    for (txn, k) in keys[..3].iter().enumerate() {
        // Held by its own transaction only.
        assert_eq!(t.try_lock(9, k, S), Err(LockFailure::WouldBlock));
        assert_eq!(t.lock(txn as u64 + 1, k, S, s), Ok(X));
    }
    t.unlock(1, &keys[0]);
    assert!(t.is_free(&keys[0]));
    assert!(!t.is_free(&keys[1]) && !t.is_free(&keys[2]));
    assert_eq!(t.lock(4, &keys[3], S, s), Ok(S));
    assert_eq!(t.try_lock(5, &keys[3], X), Err(LockFailure::WouldBlock));
    assert_eq!(t.lock(5, &keys[0], S, s), Ok(S));
    for (txn, k) in [(2, 1), (3, 2), (4, 3), (5, 0)] {
        t.unlock(txn, &keys[k]);
    }
    assert!(t.is_idle());
    assert_eq!(t.footprint().heads, 0);
}

#[test]
fn an_entry_name_matches_exactly_the_ids_of_its_key() {
    // Keys of zero bytes that differ only in length, keys around the 16-byte inline limit
    // of an entry's name and the 22-byte one of a lock id, in two tables.
    let mut ids = vec![LockId::Database];
    for t in [1u32, 2] {
        ids.push(LockId::Table(t));
        ids.push(LockId::NegInf(t));
        for n in [0usize, 1, 2, 8, 15, 16, 17, 22, 23, 40] {
            for b in [0u8, 9] {
                let mut k = vec![b; n];
                ids.push(LockId::Key(t, LockKey::from(&k[..])));
                if let Some(last) = k.last_mut() {
                    *last = 1;
                    ids.push(LockId::Key(t, LockKey::from(k)));
                }
            }
        }
    }
    for a in &ids {
        let name = Name::of(a);
        assert_eq!(name.hash(), hash_id(a), "{a:?}");
        for b in &ids {
            assert_eq!(name.is(b), a == b, "{a:?} against {b:?}");
        }
    }
}
