//! Inputs that bypassed a limit: split hints on keys no write can use, and values of
//! `update`, `oput` and `topk_insert` that the memory limit did not count.

use shoal::doppel::SplitOp;
use shoal::{ConcurrencyControl, Database, Error, Options};

/// A split hint names a key for blind writes (`add`, `max`, ...), which refuse keys longer
/// than `max_key_len` with `KeyTooLarge`; `split_hint` checks the empty key but takes any
/// longer one, and the coordinator then splits a record that no write can ever reach (and
/// stashes every scan over its range in split phases).
#[test]
fn split_hint_refuses_a_key_longer_than_max_key_len() {
    let db = Database::in_memory_with(Options::default().with_cc(ConcurrencyControl::Doppel));
    let t = db.create_table("t").unwrap();
    let max = db.options().max_key_len;
    db.split_hint(&t, vec![b'k'; max], SplitOp::Add).unwrap();
    // The write the hint is for refuses the longer key...
    let over = vec![b'k'; max + 1];
    assert!(matches!(
        db.run(|tx| tx.add(&t, &over, 1)),
        Err(Error::KeyTooLarge { .. })
    ));
    // ...and so should the hint.
    let r = db.split_hint(&t, &over, SplitOp::Add);
    assert!(matches!(r, Err(Error::KeyTooLarge { .. })), "{r:?}");
    let r = db.split_hint(&t, vec![b'k'; 100_000], SplitOp::Max);
    assert!(matches!(r, Err(Error::KeyTooLarge { .. })), "{r:?}");
    // A smaller configured limit applies too.
    let db = Database::in_memory_with(
        Options::default()
            .with_cc(ConcurrencyControl::Doppel)
            .with_max_key_len(16),
    );
    let t = db.create_table("t").unwrap();
    let r = db.split_hint(&t, [b'k'; 17], SplitOp::Add);
    assert!(
        matches!(r, Err(Error::KeyTooLarge { len: 17, max: 16 })),
        "{r:?}"
    );
}

/// `Options::memory_limit`: "a put, insert, update or integer operation that finds the
/// tables at or past it, or whose key and value would take them there, fails with
/// `Error::MemoryLimit`". `put` counts its value (commit 4681e70); `update`, `oput` and
/// `topk_insert` count only the key, so one 16 MiB value goes into a 1 MiB database.
#[test]
fn update_oput_and_topk_values_count_against_the_memory_limit() {
    const LIMIT: u64 = 1 << 20;
    let big = || vec![1u8; 16 << 20];
    let mut report = Vec::new();
    for cc in [
        ConcurrencyControl::TwoPhaseLocking,
        ConcurrencyControl::Serial,
        ConcurrencyControl::Optimistic,
        ConcurrencyControl::Doppel,
    ] {
        for op in ["put", "update", "oput", "topk_insert"] {
            let db = Database::in_memory_with(
                Options::default()
                    .with_cc(cc)
                    .with_memory_limit(Some(LIMIT)),
            );
            let t = db.create_table("t").unwrap();
            let r = db.run(|tx| match op {
                "put" => tx.put(&t, "k", big()),
                "update" => tx.update(&t, "k", |_| big()).map(drop),
                "oput" => tx.oput(&t, "k", 1, &big()[..(16 << 20) - 64]),
                _ => tx.topk_insert(&t, "k", 1, &big()[..(16 << 20) - 64], 1),
            });
            let mut ok = matches!(r, Err(Error::MemoryLimit { .. })) && db.page_bytes() <= LIMIT;
            if ok {
                // A statement error: the transaction goes on.
                let mut tx = db.begin();
                tx.put(&t, "a", "1").unwrap();
                let again = match op {
                    "put" => tx.put(&t, "k", big()),
                    "update" => tx.update(&t, "k", |_| big()).map(drop),
                    "oput" => tx.oput(&t, "k", 1, &big()[..(16 << 20) - 64]),
                    _ => tx.topk_insert(&t, "k", 1, &big()[..(16 << 20) - 64], 1),
                };
                let more = tx.put(&t, "b", "2").is_ok();
                ok = matches!(again, Err(Error::MemoryLimit { .. })) && more && tx.commit().is_ok();
                ok &= db.run(|tx| tx.scan(&t, ..)).unwrap().len() == 2;
            }
            if !ok {
                report.push(format!(
                    "{cc:?} {op}: {r:?}, page_bytes {}",
                    db.page_bytes()
                ));
            }
        }
    }
    assert!(
        report.is_empty(),
        "under a {LIMIT}-byte limit:\n{}",
        report.join("\n")
    );
}
