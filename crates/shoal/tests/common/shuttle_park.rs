//! Parking for the shuttle models (`admission_shuttle.rs`, `latchfree_shuttle.rs`), which
//! include it with `#[path]` and hand it to the engine source they compile as its `sync`
//! module's thread primitives. Parking is modelled without spurious wake-ups (shuttle's own
//! `park` may wake spuriously whenever another task can run, which would hide a lost
//! wake-up): a parked task returns only once its token was set by `unpark`, so a lost
//! wake-up leaves it parked forever, which shuttle reports as a deadlock.
#![allow(dead_code)] // each model uses part of it

use std::sync::Arc;
use std::time::Duration;

use shuttle::sync::atomic::{AtomicBool, Ordering};

shuttle::thread_local! {
    static TOKEN: Arc<AtomicBool> = Arc::new(AtomicBool::new(false));
}

/// A thread handle whose `unpark` sets the thread's token.
#[derive(Clone, Debug)]
pub struct Thread {
    inner: shuttle::thread::Thread,
    token: Arc<AtomicBool>,
}

impl Thread {
    pub fn id(&self) -> shuttle::thread::ThreadId {
        self.inner.id()
    }

    pub fn unpark(&self) {
        self.token.store(true, Ordering::SeqCst);
        self.inner.unpark();
    }
}

pub fn current() -> Thread {
    Thread {
        inner: shuttle::thread::current(),
        token: TOKEN.with(Arc::clone),
    }
}

/// Returns once the token is (or was) set.
pub fn park() {
    let token = TOKEN.with(Arc::clone);
    while !token.swap(false, Ordering::SeqCst) {
        shuttle::thread::park();
    }
}

/// [`park`]: no timeout in the model.
pub fn park_timeout(_: Duration) {
    park()
}
