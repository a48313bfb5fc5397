//! The slot hand-over of the admission gate (see the parent module's docs for the design).
//!
//! This file reaches atomics, the queue mutex and parking only through `super::sync`, so the
//! model-checking test (`tests/admission_shuttle.rs`) compiles it a second time against
//! `shuttle`'s instrumented primitives.
//!
//! A slot is one word: `FREE`, `BUSY(token)` (a thread runs a transaction in it) or
//! `IDLE(token, seq)` (its thread committed and may take it back without touching anything
//! shared; anyone else may take it too). Taking a slot is a compare-and-swap on that word;
//! the number of slots is the limit, so at most that many threads are ever `BUSY`. Threads
//! that find no slot queue (FIFO; threads resuming a transaction after a lock or log wait
//! ahead of threads beginning one) and park; a slot given up while threads wait goes straight
//! from its owner to the head of the queue (`BUSY(owner)` becomes `BUSY(head)`), never
//! through `FREE`, so a newcomer cannot overtake the queue.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;

use super::sync::{
    current, park, park_timeout, AtomicU64, AtomicUsize, Mutex,
    Ordering::{Release, SeqCst},
    Thread,
};

/// A slot nobody holds.
pub const FREE: u64 = 0;
const BUSY: u64 = 1;
const IDLE: u64 = 2;
const STATE: u64 = 3;
/// `waiting` counts every waiter in its low half and resumers in its high half.
const RESUMER: u64 = 1 << 32;
const NONE: usize = usize::MAX;
/// How many resumers may be served ahead of the thread at the head of the begin queue before
/// it is served: resumers go first (they may hold locks), but never forever.
pub const MAX_OVERTAKE: u32 = 16;

/// The word of a slot that thread `token` runs a transaction in.
pub fn busy(token: u32) -> u64 {
    (token as u64) << 32 | BUSY
}

/// The word of a slot that thread `token` keeps between two transactions; `seq` tells one
/// such period from the next (the watchdog takes a slot only if it saw the same word twice).
pub fn idle(token: u32, seq: u32) -> u64 {
    (token as u64) << 32 | ((seq as u64 & 0x3fff_ffff) << 2) | IDLE
}

/// A parked thread waiting for a slot.
pub struct Waiter {
    thread: Thread,
    token: u32,
    /// The slot it was handed (`NONE` until then).
    granted: AtomicUsize,
    /// Where a synchronous commit's wait stands (`admission::commit`; 0 until the flusher
    /// has dealt with it).
    pub(super) commit: std::sync::atomic::AtomicU8,
}

impl Waiter {
    /// A waiter for `thread`, whose token is `token`.
    pub fn new(thread: Thread, token: u32) -> Arc<Waiter> {
        Arc::new(Waiter {
            thread,
            token,
            granted: AtomicUsize::new(NONE),
            commit: std::sync::atomic::AtomicU8::new(0),
        })
    }

    /// Readies `w` for another wait of thread `token` if nothing else holds it any more (no
    /// queue, no flusher: `Arc::get_mut` sees the last reference, with the other holders'
    /// writes), and says whether it did; a thread that waits again and again (a synchronous
    /// commit per transaction) then allocates its waiter once.
    pub fn reset_unshared(w: &mut Arc<Waiter>, token: u32) -> bool {
        match Arc::get_mut(w) {
            Some(me) if me.token == token => {
                *me.granted.get_mut() = NONE;
                *me.commit.get_mut() = 0;
                true
            }
            _ => false,
        }
    }

    /// The slot handed to it, if any yet.
    pub fn granted(&self) -> Option<usize> {
        let g = self.granted.load(SeqCst);
        (g != NONE).then_some(g)
    }

    /// Its thread.
    pub fn thread(&self) -> Thread {
        self.thread.clone()
    }

    /// Hands slot `i` (already `BUSY(self.token)`) over; the caller unparks the thread.
    pub(super) fn grant(&self, i: usize) {
        self.granted.store(i, SeqCst);
    }
}

#[derive(Default)]
struct Queues {
    /// Threads resuming a transaction after a wait (they may hold locks): served first.
    resume: VecDeque<Arc<Waiter>>,
    /// Threads beginning a transaction.
    begin: VecDeque<Arc<Waiter>>,
    /// Resumers served since the head of `begin` arrived there.
    overtaken: u32,
}

impl Queues {
    fn is_empty(&self) -> bool {
        self.resume.is_empty() && self.begin.is_empty()
    }

    /// Whether the next thread served is a beginner.
    fn beginner_first(&self) -> bool {
        self.resume.is_empty() || (!self.begin.is_empty() && self.overtaken >= MAX_OVERTAKE)
    }

    fn head(&self) -> Option<&Arc<Waiter>> {
        if self.beginner_first() {
            self.begin.front()
        } else {
            self.resume.front()
        }
    }

    /// Removes the head; returns it and its share of `waiting`.
    fn pop(&mut self) -> Option<(Arc<Waiter>, u64)> {
        if self.beginner_first() {
            self.overtaken = 0;
            return self.begin.pop_front().map(|w| (w, 1));
        }
        if !self.begin.is_empty() {
            self.overtaken += 1;
        }
        self.resume.pop_front().map(|w| (w, 1 + RESUMER))
    }
}

/// Counters of a gate (see [`Gate::stats`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GateStats {
    /// Slots running a transaction.
    pub busy: usize,
    /// Slots kept by their thread between transactions.
    pub idle: usize,
    /// Threads parked for a slot.
    pub waiting: usize,
    /// Of those, threads resuming a transaction after a wait.
    pub resuming: usize,
    /// Slots handed from a thread (or the watchdog) to a parked one so far.
    pub handovers: u64,
    /// Of those, kept slots the watchdog took from a thread that stayed away.
    pub reclaimed: u64,
    /// Threads that waited the escape time and ran without a slot.
    pub escaped: u64,
}

/// How long a thread keeps its slot across consecutive transactions while other threads
/// wait for one, by default ([`Options::admission_quantum`]; at most: it gives the slot up
/// at the first commit after that). Each
/// hand-over costs a wake-up and a park; at 1 ms TPC-B at 512 threads on 2 cores kept 0.83
/// (2PL) of its 2-thread rate against 0.73 at 200 µs, and p99 fell from 58 ms to 57 µs,
/// while p99.9 rose to the queue's turn (threads ÷ slots × quantum, 270 ms): the mean wait
/// is the same (Little's law), it only comes in fewer, longer turns. Longer quanta trade
/// more of that tail for throughput past the cores: on the thirteenth session's machine,
/// TPC-B at 512 threads ran 8-11% faster at 4 ms, with turns four times as long.
///
/// [`Options::admission_quantum`]: crate::Options::admission_quantum
pub const QUANTUM: Duration = Duration::from_millis(1);

/// The slots and the queue of waiting threads.
pub struct Gate {
    slots: Box<[CachePadded<AtomicU64>]>,
    /// Waiting threads (low half) and resumers among them (high half). Changed under `queue`
    /// only; read without it on the fast paths.
    waiting: CachePadded<AtomicU64>,
    queue: Mutex<Queues>,
    handovers: AtomicU64,
    reclaimed: AtomicU64,
    /// A thread that waited this long for a slot stops waiting and runs without one.
    escape: Option<Duration>,
    escaped: AtomicU64,
    /// Slot holders parked in a lock wait that kept their slot ([`Gate::wait_in_slot`]).
    lock_waiters: CachePadded<AtomicUsize>,
    /// How long a thread keeps its slot across transactions while others wait.
    quantum: Duration,
}

impl Gate {
    /// A gate with `limit` slots (at least one); a thread that waits `escape` for a slot runs
    /// without one (`None`: waits as long as it takes).
    pub fn new(limit: usize, escape: Option<Duration>) -> Gate {
        Gate {
            escape,
            escaped: AtomicU64::new(0),
            slots: (0..limit.max(1))
                .map(|_| CachePadded::new(AtomicU64::new(FREE)))
                .collect(),
            waiting: CachePadded::new(AtomicU64::new(0)),
            queue: Mutex::new(Queues::default()),
            handovers: AtomicU64::new(0),
            reclaimed: AtomicU64::new(0),
            lock_waiters: CachePadded::new(AtomicUsize::new(0)),
            quantum: QUANTUM,
        }
    }

    /// The gate with quantum `q` (see [`QUANTUM`]).
    pub fn with_quantum(mut self, q: Duration) -> Gate {
        self.quantum = q;
        self
    }

    /// How long a thread keeps its slot across transactions while others wait.
    pub fn quantum(&self) -> Duration {
        self.quantum
    }

    /// Lets a slot holder wait for a lock without giving its slot up, if that leaves at
    /// least one slot held by a thread that is not waiting for a lock; returns whether it
    /// may ([`end_wait_in_slot`](Self::end_wait_in_slot) must follow). The one slot kept free
    /// of lock waiters is what every lock holder that has to take a slot back (a resumer)
    /// eventually gets, so a waiter that keeps its slot cannot starve the holder it waits for.
    pub fn wait_in_slot(&self) -> bool {
        let cap = self.limit() - 1;
        let mut n = self.lock_waiters.load(SeqCst);
        loop {
            if n >= cap {
                return false;
            }
            match self.lock_waiters.compare_exchange(n, n + 1, SeqCst, SeqCst) {
                Ok(_) => return true,
                Err(now) => n = now,
            }
        }
    }

    /// Ends a lock wait that [`wait_in_slot`](Self::wait_in_slot) admitted.
    pub fn end_wait_in_slot(&self) {
        self.lock_waiters.fetch_sub(1, SeqCst);
    }

    /// The number of slots.
    pub fn limit(&self) -> usize {
        self.slots.len()
    }

    /// Threads waiting for a slot, and how many of them resume a transaction.
    pub fn waiting(&self) -> (u32, u32) {
        let w = self.waiting.load(SeqCst);
        (w as u32, (w >> 32) as u32)
    }

    /// Takes a free or kept slot without queueing, if nobody waits.
    fn try_fast(&self, token: u32) -> Option<usize> {
        if self.waiting.load(SeqCst) != 0 {
            return None;
        }
        self.scan(token, true)
    }

    /// Takes the first slot (from a place that depends on `token`, to spread threads) that is
    /// free, or kept by its thread when `idle_too`.
    fn scan(&self, token: u32, idle_too: bool) -> Option<usize> {
        let n = self.slots.len();
        let start = token as usize % n;
        (0..n).map(|k| (start + k) % n).find(|&i| {
            let w = self.slots[i].load(SeqCst);
            let takable = w == FREE || (idle_too && w & STATE == IDLE);
            takable
                && self.slots[i]
                    .compare_exchange(w, busy(token), SeqCst, SeqCst)
                    .is_ok()
        })
    }

    /// Takes a slot for thread `token`, parking in the queue (behind every earlier waiter of
    /// its class; resumers before beginners) until one is handed over. Returns its index, or
    /// `None` if the thread waited the gate's `escape` time and left the queue (it then runs
    /// without a slot). `queued` runs once the thread is in the queue, before it parks.
    pub fn acquire(&self, token: u32, resume: bool, queued: impl FnOnce()) -> Option<usize> {
        if let Some(i) = self.try_fast(token) {
            return Some(i);
        }
        let me = Waiter::new(current(), token);
        if let Some(i) = self.enqueue(&me, resume) {
            return Some(i);
        }
        queued();
        self.wait_granted(&me, resume, None)
    }

    /// Puts `me` in the queue of its class, or, with nobody ahead, hands it a free or kept
    /// slot at once (returned, and also granted to `me`). Any thread may call this for any
    /// waiter: a commit whose log record became durable is queued by the log's flusher, so
    /// that its thread wakes up only once it has a slot to run its next transaction in.
    pub fn enqueue(&self, me: &Arc<Waiter>, resume: bool) -> Option<usize> {
        let share = if resume { 1 + RESUMER } else { 1 };
        let wake = {
            let mut q = self.queue.lock();
            // Counted before the scan: a releaser that stores FREE and then finds nobody
            // waiting has stored it before this count, so the scan below sees the slot.
            self.waiting.fetch_add(share, SeqCst);
            if q.is_empty() {
                // Nobody ahead: a free slot or one kept between transactions is ours.
                if let Some(i) = self.scan(me.token, true) {
                    self.waiting.fetch_sub(share, SeqCst);
                    me.grant(i);
                    return Some(i);
                }
            }
            if resume {
                q.resume.push_back(Arc::clone(me));
            } else {
                q.begin.push_back(Arc::clone(me));
            }
            self.drain(&mut q)
        };
        for w in wake {
            w.thread.unpark();
        }
        None
    }

    /// Parks until `me` (queued by [`enqueue`](Self::enqueue) with the same `resume`) is
    /// handed a slot; returns it, or `None` once the thread has waited the gate's `escape`
    /// time since `since` (default: now) and no slot was handed over during the last
    /// `escape` of it either, and the thread left the queue. Only `me`'s thread calls this.
    pub fn wait_granted(
        &self,
        me: &Arc<Waiter>,
        resume: bool,
        since: Option<Instant>,
    ) -> Option<usize> {
        let share = if resume { 1 + RESUMER } else { 1 };
        let mut deadline = self.escape.map(|d| since.unwrap_or_else(Instant::now) + d);
        // Hand-overs so far: while slots keep changing hands the queue moves (FIFO), so
        // this thread's turn comes; only a gate that stood still for a whole escape time
        // may be held by threads that wait for this one.
        let mut seen = self.handovers.load(SeqCst);
        loop {
            let g = me.granted.load(SeqCst);
            if g != NONE {
                return Some(g);
            }
            let (Some(at), Some(escape)) = (deadline, self.escape) else {
                park();
                continue;
            };
            let now = Instant::now();
            if now < at {
                park_timeout(at - now);
                continue;
            }
            let moved = self.handovers.load(SeqCst);
            if moved != seen {
                seen = moved;
                deadline = Some(now + escape);
                continue;
            }
            // Waited too long (threads holding every slot may be waiting for this one
            // outside the engine): leave the queue, unless a slot came meanwhile.
            let mut q = self.queue.lock();
            let g = me.granted.load(SeqCst);
            if g != NONE {
                return Some(g);
            }
            let q = &mut *q;
            for list in [&mut q.resume, &mut q.begin] {
                if let Some(p) = list.iter().position(|w| Arc::ptr_eq(w, me)) {
                    list.remove(p);
                }
            }
            self.waiting.fetch_sub(share, SeqCst);
            self.escaped.fetch_add(1, SeqCst);
            return None;
        }
    }

    /// Hands free slots to waiters, head first; returns the waiters to unpark.
    fn drain(&self, q: &mut Queues) -> Vec<Arc<Waiter>> {
        let mut wake = Vec::new();
        while let Some(head) = q.head() {
            let token = head.token;
            let Some(i) = (0..self.slots.len()).find(|&i| {
                self.slots[i]
                    .compare_exchange(FREE, busy(token), SeqCst, SeqCst)
                    .is_ok()
            }) else {
                break;
            };
            if let Some((w, share)) = q.pop() {
                self.waiting.fetch_sub(share, SeqCst);
                w.grant(i);
                self.handovers.fetch_add(1, SeqCst);
                wake.push(w);
            }
        }
        wake
    }

    /// Takes back slot `i`, kept by this thread with word `kept`; false if another thread
    /// took it meanwhile.
    pub fn reclaim(&self, i: usize, kept: u64, token: u32) -> bool {
        self.slots[i]
            .compare_exchange(kept, busy(token), SeqCst, SeqCst)
            .is_ok()
    }

    /// Keeps slot `i` (held `BUSY` by this thread) for this thread's next transaction, as
    /// `idle(token, seq)`; returns that word.
    pub fn keep(&self, i: usize, token: u32, seq: u32) -> u64 {
        let w = idle(token, seq);
        // Release is enough: nobody pairs this store with a check of their own (a waiter
        // that misses it is served at this thread's next end, or by the watchdog), and it
        // is a plain store on x86, not an exchange, once per transaction.
        self.slots[i].store(w, Release);
        w
    }

    /// Gives up slot `i` (held `BUSY` by the caller): to the head of the queue if a thread
    /// waits, else free.
    pub fn release(&self, i: usize) {
        if self.waiting.load(SeqCst) != 0 {
            let popped = {
                let mut q = self.queue.lock();
                q.pop().map(|(w, share)| {
                    self.waiting.fetch_sub(share, SeqCst);
                    self.slots[i].store(busy(w.token), SeqCst);
                    w.grant(i);
                    w
                })
            };
            if let Some(w) = popped {
                self.handovers.fetch_add(1, SeqCst);
                w.thread.unpark();
                return;
            }
        }
        self.slots[i].store(FREE, SeqCst);
        // A thread may have queued after the check above (it counts itself before it scans,
        // so either it saw this FREE or this sees it).
        if self.waiting.load(SeqCst) != 0 {
            let wake = {
                let mut q = self.queue.lock();
                self.drain(&mut q)
            };
            for w in wake {
                w.thread.unpark();
            }
        }
    }

    /// Gives up slot `i` that this thread keeps with word `kept` (no-op if it was taken).
    pub fn release_kept(&self, i: usize, kept: u64, token: u32) {
        if self.reclaim(i, kept, token) {
            self.release(i);
        }
    }

    /// The watchdog's round: while threads wait, a slot still kept with the word `seen`
    /// recorded for it in the previous round (its thread has not come back since) goes to
    /// the head of the queue. `seen` has one entry per slot. Returns the slots taken.
    pub fn police(&self, seen: &mut [u64]) -> usize {
        let mut taken = 0;
        if self.waiting.load(SeqCst) == 0 {
            seen.iter_mut().for_each(|s| *s = FREE);
            return 0;
        }
        let mut wake = Vec::new();
        for (i, s) in seen.iter_mut().enumerate().take(self.slots.len()) {
            let w = self.slots[i].load(SeqCst);
            if w & STATE == IDLE && *s == w {
                let mut q = self.queue.lock();
                if let Some(head) = q.head() {
                    let token = head.token;
                    if self.slots[i]
                        .compare_exchange(w, busy(token), SeqCst, SeqCst)
                        .is_ok()
                    {
                        if let Some((h, share)) = q.pop() {
                            self.waiting.fetch_sub(share, SeqCst);
                            h.grant(i);
                            wake.push(h);
                            taken += 1;
                            self.handovers.fetch_add(1, SeqCst);
                            self.reclaimed.fetch_add(1, SeqCst);
                        }
                    }
                }
            }
            *s = self.slots[i].load(SeqCst);
        }
        {
            // A safety net: free slots go to waiters (the release path does this already).
            let mut q = self.queue.lock();
            wake.extend(self.drain(&mut q));
        }
        for w in wake {
            w.thread.unpark();
        }
        taken
    }

    /// A snapshot of the slots and the queue.
    pub fn stats(&self) -> GateStats {
        let (mut busy_n, mut idle_n) = (0, 0);
        for s in self.slots.iter() {
            match s.load(SeqCst) & STATE {
                BUSY => busy_n += 1,
                IDLE => idle_n += 1,
                _ => {}
            }
        }
        let (waiting, resuming) = self.waiting();
        GateStats {
            busy: busy_n,
            idle: idle_n,
            waiting: waiting as usize,
            resuming: resuming as usize,
            handovers: self.handovers.load(SeqCst),
            reclaimed: self.reclaimed.load(SeqCst),
            escaped: self.escaped.load(SeqCst),
        }
    }
}
