//! Recovery on arbitrary bytes: a database directory whose only log segment (or checkpoint)
//! holds the fuzz input must open cleanly or fail with an error — never panic or hang.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&which, bytes)) = data.split_first() else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let name = if which % 2 == 0 {
        "log-00000000000000000000.seg"
    } else {
        "checkpoint-00000000000000000000.ckpt"
    };
    std::fs::write(dir.path().join(name), bytes).expect("write");
    if let Ok(db) = shoal::Database::open(dir.path(), shoal::Options::default()) {
        for name in db.tables() {
            if let Ok(t) = db.table(&name) {
                let _ = db.run(|tx| tx.scan(&t, ..));
            }
        }
    }
});
