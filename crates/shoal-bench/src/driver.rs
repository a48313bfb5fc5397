//! The benchmark driver both paths of `shoal bench` share: the worker loop (draw a transaction,
//! attempt it, retry a retryable abort after a backoff, count what happened), the control
//! thread's measurement window (warm-up, measurement, progress bar, per-interval samples,
//! memory and lock-table gauges) and what a run measured ([`RunStats`], [`TypeStats`]).
//!
//! The engine-specific part is an [`Adapter`]: the shoal-native path (`crate::harness`, a
//! [`crate::workloads::Workload`] on a [`shoal::Database`], with Doppel's stash queue and
//! `--cc atomic`) and the engine-neutral path (`crate::portable`, a portable workload on any
//! [`crate::engines::KvEngine`]) are two adapters over the same loop, so a change to how runs
//! are measured reaches both, and their figures stay comparable.

use std::sync::atomic::{AtomicI64, AtomicU64, AtomicU8, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context};
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressStyle};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use shoal::Database;

use crate::interval::{Gauges, Probe, Sample, Sampler, Sampling};
use crate::rss;
use crate::sweep::Point;
use crate::workloads::doppel_args::{DoppelRun, DoppelSampler};

/// Phases of a run's control word.
const WARMUP: u8 = 0;
const MEASURE: u8 = 1;
const STOP: u8 = 2;

/// How one attempt of a transaction ended ([`WorkerLoop::attempt`]).
#[derive(Debug)]
pub enum Attempt {
    /// Committed.
    Committed,
    /// The workload asked for a rollback: counted, not retried, not an abort (TPC-C
    /// NewOrder's invalid item).
    RolledBack,
    /// Doppel stashed it: not an abort and no reason to back off. `saved`: its inputs went to
    /// the worker's stash queue and the worker goes on with new work; otherwise it is
    /// attempted again (the next `begin` waits for the joined phase, and the wait counts in
    /// its latency).
    Stashed {
        /// Whether the inputs were saved for a later joined phase.
        saved: bool,
    },
    /// A retryable abort, by its index in the abort counters (deadlock, lock timeout,
    /// conflict): attempted again after a backoff.
    Abort(usize),
    /// Anything else: the run stops with this message.
    Fatal(String),
}

/// One worker thread's side of an adapter: its generator and its connection to the engine.
pub trait WorkerLoop {
    /// Draws the next transaction (or takes back one that waited); returns its type (an index
    /// into [`Adapter::kinds`]) and the instant its latency counts from.
    fn next(&mut self) -> (usize, Instant);

    /// Attempts the current transaction once (`start` as [`next`](Self::next) returned it).
    fn attempt(&mut self, start: Instant) -> Attempt;

    /// The current transaction committed.
    fn committed(&mut self);

    /// The run is over (the worker hands in what it tallied).
    fn finish(self);
}

/// What the driver needs from an engine and a loaded workload for one run.
pub trait Adapter: Sync {
    /// A worker's state made on the control thread before the workers start, in thread
    /// order (so nothing of it counts in the measurement window).
    type Prepared: Send;
    /// A worker's loop, made on its own thread (an engine session may be bound to it).
    type Loop<'a>: WorkerLoop
    where
        Self: 'a;

    /// Names of the transaction types, for per-type statistics (default: one, `txn`).
    fn kinds(&self) -> &'static [&'static str] {
        &["txn"]
    }

    /// The state of worker `thread`, whose seed is `seed`.
    fn prepare(&self, thread: usize, seed: u64) -> anyhow::Result<Self::Prepared>;

    /// Worker `thread`'s loop, on its thread; `Err` stops the run with that message.
    fn open(&self, prepared: Self::Prepared, thread: usize) -> Result<Self::Loop<'_>, String>;

    /// A shoal database whose lock-table footprint and Doppel runtime the control thread
    /// watches (shoal-native runs only; the engine-neutral interface has neither).
    fn database(&self) -> Option<&Database> {
        None
    }
}

/// The measurement window of a run and how it is shown.
pub struct Window<'a> {
    /// Warm-up before the window.
    pub warmup: Duration,
    /// Length of the window.
    pub duration: Duration,
    /// Show a progress bar (hidden anyway when stderr is not a terminal).
    pub progress: bool,
    /// Per-interval sampling, and the run's options it names in its heading.
    pub sampling: Option<(Sampling, &'a Point)>,
    /// The run's name: the progress bar's prefix.
    pub label: String,
}

/// What one run measured for one transaction type.
#[derive(Clone, Debug)]
pub struct TypeStats {
    /// The type's name ([`Adapter::kinds`]).
    pub name: &'static str,
    /// Commits inside the measurement window.
    pub committed: u64,
    /// Expected rollbacks inside the measurement window ([`Attempt::RolledBack`]).
    pub rolled_back: u64,
    /// Aborts inside the measurement window, by reason: deadlock, lock timeout, conflict.
    pub aborts: [u64; 3],
    /// Doppel: attempts stashed inside the measurement window (each re-run in the next
    /// joined phase; not aborts).
    pub stashed: u64,
    /// Latency of the committed transactions that were in flight in the window (committed
    /// in it, or begun in it and committed after it ended: at most one per worker), retries
    /// included, in nanoseconds.
    pub latency_ns: Histogram<u64>,
}

impl TypeStats {
    /// Empty statistics for the type called `name`.
    pub fn new(name: &'static str) -> TypeStats {
        TypeStats {
            name,
            committed: 0,
            rolled_back: 0,
            aborts: [0; 3],
            stashed: 0,
            latency_ns: new_hist(),
        }
    }

    /// All measured aborts of this type.
    pub fn aborted(&self) -> u64 {
        self.aborts.iter().sum()
    }

    fn merge(&mut self, o: &TypeStats) {
        self.committed += o.committed;
        self.rolled_back += o.rolled_back;
        self.stashed += o.stashed;
        for (a, b) in self.aborts.iter_mut().zip(o.aborts) {
            *a += b;
        }
        self.latency_ns
            .add(&o.latency_ns)
            .expect("same histogram bounds");
    }
}

/// What one run measured.
#[derive(Clone, Debug)]
pub struct RunStats {
    /// Commits inside the measurement window.
    pub committed: u64,
    /// Commits in the whole run, warm-up included (= history rows written).
    pub total_committed: u64,
    /// Aborts inside the measurement window, by reason: deadlock, lock timeout, conflict.
    pub aborts: [u64; 3],
    /// Actual length of the measurement window.
    pub measured: Duration,
    /// Latency of the committed transactions that were in flight in the window (see
    /// [`TypeStats::latency_ns`]), in nanoseconds.
    pub latency_ns: Histogram<u64>,
    /// Commits per thread in the whole run.
    pub per_thread: Vec<u64>,
    /// Commits per transaction type in the whole run, warm-up included ([`Adapter::kinds`]
    /// order).
    pub total_by_type: Vec<u64>,
    /// Expected rollbacks inside the measurement window (not retried, not failures).
    pub rolled_back: u64,
    /// The same measurements per transaction type, in [`Adapter::kinds`] order.
    pub per_type: Vec<TypeStats>,
    /// Resident memory (KiB) when the run started (database loaded, no worker yet).
    pub rss_start_kb: Option<u64>,
    /// Resident memory (KiB) at the end of the measurement window, workers still alive.
    pub rss_end_kb: Option<u64>,
    /// Peak resident memory (KiB) during the run (the peak is reset at its start).
    pub peak_rss_kb: Option<u64>,
    /// The lock table's footprint (lock names, request entries) when the run started and
    /// at the end of its measurement window (shoal-native runs).
    pub lock_footprint: Option<[(usize, usize); 2]>,
    /// Per-interval samples of the measurement window (empty unless sampling).
    pub intervals: Vec<Sample>,
    /// Doppel: attempts stashed inside the measurement window (re-run in a joined phase).
    pub stashed: u64,
    /// Doppel: the runtime's counters over the run (`None` unless `--cc doppel`).
    pub doppel: Option<DoppelRun>,
    /// CPU time the worker threads used in the measurement window, summed: each worker's CPU
    /// clock read by the driver as it opens the window and as it stops the run (`None` where
    /// threads' CPU clocks cannot be read). Background threads (the log flusher, the
    /// checkpointer, Doppel's coordinator) are not counted.
    pub worker_cpu: Option<Duration>,
}

impl RunStats {
    /// Measured commits per second.
    pub fn throughput(&self) -> f64 {
        let s = self.measured.as_secs_f64();
        if s > 0.0 {
            self.committed as f64 / s
        } else {
            0.0
        }
    }
}

/// A latency histogram: 1 ns .. ~18 minutes at 3 significant digits.
pub fn new_hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 1 << 40, 3).expect("valid histogram bounds")
}

/// The per-thread seed of worker `thread`: derived deterministically from the run's seed.
pub fn thread_seed(seed: u64, thread: usize) -> u64 {
    splitmix64(seed ^ splitmix64(thread as u64 + 1))
}

fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// A fresh directory named `prefix` and a random suffix, removed when dropped: inside `parent`
/// (created if missing), or in the system's temporary directory.
pub fn fresh_dir(
    parent: Option<&std::path::Path>,
    prefix: &str,
) -> anyhow::Result<tempfile::TempDir> {
    let b = tempfile::Builder::new().prefix(prefix).clone();
    match parent {
        Some(d) => {
            std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
            b.tempdir_in(d)
                .with_context(|| format!("creating a directory in {}", d.display()))
        }
        None => b.tempdir().context("creating a temporary directory"),
    }
}

/// A progress bar with `template`, or a hidden one when `progress` is off.
pub fn bar(progress: bool, len: u64, template: &str) -> ProgressBar {
    if !progress {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new(len);
    pb.set_style(
        ProgressStyle::with_template(template)
            .expect("valid template")
            .progress_chars("=> "),
    );
    pb
}

/// Waits before retry `attempt` of an aborted transaction: yield at first, then a random sleep
/// growing to about a millisecond.
pub fn backoff(attempt: u32, rng: &mut SmallRng) {
    if attempt <= 2 {
        std::thread::yield_now();
    } else {
        let cap = 1u64 << attempt.min(10);
        std::thread::sleep(Duration::from_micros(rng.gen_range(0..cap)));
    }
}

/// A counter on its own cache line, so per-thread counters do not false-share.
#[repr(align(128))]
#[derive(Default)]
pub struct Padded(pub AtomicU64);

struct Control {
    phase: AtomicU8,
    fatal: Mutex<Option<String>>,
    commits: Vec<Padded>,
    /// Per-interval sampling's counters and histograms, when sampling.
    probe: Option<Probe>,
    /// Each worker's CPU clock (see [`own_cpu_clock`]), published when it starts; `NO_CLOCK`
    /// before that or where there is none.
    clocks: Vec<AtomicI64>,
}

const NO_CLOCK: i64 = i64::MIN;

impl Control {
    fn phase(&self) -> u8 {
        self.phase.load(Ordering::Acquire)
    }

    fn fail(&self, msg: String) {
        if let Ok(mut f) = self.fatal.lock() {
            f.get_or_insert(msg);
        }
        self.phase.store(STOP, Ordering::Release);
    }

    fn commits(&self) -> u64 {
        self.commits
            .iter()
            .map(|p| p.0.load(Ordering::Relaxed))
            .sum()
    }
}

struct WorkerOut {
    total: u64,
    /// Commits per type in the whole run.
    total_by_type: Vec<u64>,
    per_type: Vec<TypeStats>,
}

/// The calling thread's CPU clock, which another thread may read with [`cpu_of`] while this
/// one lives (Linux; `None` elsewhere or on error).
fn own_cpu_clock() -> Option<i64> {
    #[cfg(target_os = "linux")]
    {
        let mut id: libc::clockid_t = 0;
        // SAFETY: `pthread_self()` is the calling, live thread and `id` a valid, writable
        // clockid for the duration of the call.
        let r = unsafe { libc::pthread_getcpuclockid(libc::pthread_self(), &mut id) };
        (r == 0).then_some(i64::from(id))
    }
    #[cfg(not(target_os = "linux"))]
    None
}

/// The CPU time of the thread whose clock is `clock` (from [`own_cpu_clock`]).
fn cpu_of(clock: i64) -> Option<Duration> {
    #[cfg(target_os = "linux")]
    {
        let id = libc::clockid_t::try_from(clock).ok()?;
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid, writable timespec for the duration of the call; a clock
        // id of a thread that has exited makes the call fail, nothing worse.
        let r = unsafe { libc::clock_gettime(id, &mut ts) };
        (r == 0).then(|| {
            Duration::new(
                u64::try_from(ts.tv_sec).unwrap_or(0),
                u32::try_from(ts.tv_nsec).unwrap_or(0),
            )
        })
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = clock;
        None
    }
}

/// Every worker's CPU clock now: where a worker has not yet published its clock it has
/// barely started, and counts from zero.
fn cpu_clocks(ctl: &Control) -> Vec<Option<Duration>> {
    ctl.clocks
        .iter()
        .map(|c| match c.load(Ordering::Acquire) {
            NO_CLOCK => Some(Duration::ZERO),
            c => cpu_of(c),
        })
        .collect()
}

/// The worker loop: every transaction until the run stops.
fn worker<L: WorkerLoop>(
    kinds: &'static [&'static str],
    ctl: &Control,
    mut l: L,
    thread: usize,
    seed: u64,
) -> WorkerOut {
    let mut out = WorkerOut {
        total: 0,
        total_by_type: vec![0; kinds.len()],
        per_type: kinds.iter().map(|n| TypeStats::new(n)).collect(),
    };
    let mut rng = SmallRng::seed_from_u64(seed ^ 0x5eed);
    'txns: while ctl.phase() != STOP {
        let (kind, start) = l.next();
        let kind = kind.min(out.per_type.len() - 1);
        // Begun inside the window: its latency counts even if it commits after the stop (a
        // transaction stuck in a wait at the window's end is the tail the figures are for).
        let begun_measuring = ctl.phase() == MEASURE;
        let mut attempt = 0u32;
        loop {
            match l.attempt(start) {
                Attempt::Committed => break,
                Attempt::RolledBack => {
                    if ctl.phase() == MEASURE {
                        out.per_type[kind].rolled_back += 1;
                    }
                    continue 'txns;
                }
                Attempt::Stashed { saved } => {
                    if ctl.phase() == MEASURE {
                        out.per_type[kind].stashed += 1;
                    }
                    if ctl.phase() == STOP {
                        break 'txns;
                    }
                    if saved {
                        continue 'txns;
                    }
                }
                Attempt::Abort(r) => {
                    if ctl.phase() == MEASURE {
                        out.per_type[kind].aborts[r] += 1;
                        if let Some(p) = &ctl.probe {
                            p.abort(thread);
                        }
                    }
                    if ctl.phase() == STOP {
                        break 'txns;
                    }
                    attempt += 1;
                    backoff(attempt, &mut rng);
                }
                Attempt::Fatal(msg) => {
                    ctl.fail(msg);
                    break 'txns;
                }
            }
        }
        let elapsed = start.elapsed();
        l.committed();
        out.total += 1;
        out.total_by_type[kind] += 1;
        ctl.commits[thread].0.fetch_add(1, Ordering::Relaxed);
        let ns = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        if ctl.phase() == MEASURE {
            let t = &mut out.per_type[kind];
            t.committed += 1;
            t.latency_ns.saturating_record(ns);
            if let Some(p) = &ctl.probe {
                p.commit(thread, ns);
            }
        } else if begun_measuring {
            out.per_type[kind].latency_ns.saturating_record(ns);
        }
    }
    l.finish();
    out
}

/// Runs `threads` workers of `a` through the warm-up and the measurement window. The outer
/// error is the harness's own (a thread that could not start or panicked); the inner one is
/// the message of a worker's fatal error, which stopped the run.
pub fn measure<A: Adapter>(
    win: &Window<'_>,
    a: &A,
    threads: usize,
    seed: u64,
) -> anyhow::Result<Result<RunStats, String>> {
    // Workers start in the warm-up even without one: the window opens only once every
    // worker is spawned, so that neither a transaction committed while later threads were
    // still being spawned counts without its time (4,096 threads with no warm-up reported
    // three times the throughput of a warmed-up run), nor the spawning counts as time.
    let ctl = Control {
        phase: AtomicU8::new(WARMUP),
        fatal: Mutex::new(None),
        commits: (0..threads).map(|_| Padded::default()).collect(),
        probe: win.sampling.map(|_| Probe::new(threads)),
        clocks: (0..threads).map(|_| AtomicI64::new(NO_CLOCK)).collect(),
    };
    let (mut cpu_start, mut cpu_end) = (Vec::new(), Vec::new());
    let mut sampler = win.sampling.map(|(s, point)| Sampler::new(s, point));
    let total = win.warmup + win.duration;
    let pb = if win.sampling.is_some_and(|(s, _)| s.print) {
        ProgressBar::hidden() // the interval lines replace the bar
    } else {
        bar(
            win.progress,
            total.as_secs().max(1),
            "{prefix} [{bar:30}] {pos}/{len}s {msg}",
        )
    };
    pb.set_prefix(win.label.clone());
    rss::reset_peak();
    let rss_start_kb = rss::current_kb();
    let mut rss_end_kb = None;
    let db = a.database();
    let footprint = || {
        db.map(|db| {
            let f = db.lock_table_footprint();
            (f.heads, f.entries)
        })
    };
    let lock_start = footprint();
    let gauges = || {
        let (lock_heads, lock_entries) = footprint().unwrap_or_default();
        Gauges {
            rss_kb: rss::current_kb(),
            lock_heads,
            lock_entries,
        }
    };
    let mut lock_end = lock_start;
    let mut dop = db.map(DoppelSampler::new);
    let mut dop_end = None;
    let kinds = a.kinds();
    let (outs, measured) = std::thread::scope(|s| -> anyhow::Result<_> {
        let mut handles = Vec::with_capacity(threads);
        for t in 0..threads {
            let seed = thread_seed(seed, t);
            let prepared = a.prepare(t, seed)?;
            let ctl = &ctl;
            let h = std::thread::Builder::new()
                .name(format!("bench-{t}"))
                .spawn_scoped(s, move || {
                    if let Some(c) = own_cpu_clock() {
                        ctl.clocks[t].store(c, Ordering::Release);
                    }
                    match a.open(prepared, t) {
                        Ok(l) => worker(kinds, ctl, l, t, seed),
                        Err(msg) => {
                            ctl.fail(msg);
                            WorkerOut {
                                total: 0,
                                total_by_type: vec![0; kinds.len()],
                                per_type: kinds.iter().map(|n| TypeStats::new(n)).collect(),
                            }
                        }
                    }
                })
                .context("spawning a worker thread")?;
            handles.push(h);
        }
        let start = Instant::now();
        let mut measure_start = win.warmup.is_zero().then_some(start);
        if measure_start.is_some() {
            cpu_start = cpu_clocks(&ctl);
            ctl.phase.store(MEASURE, Ordering::Release);
        }
        if let (Some(s), Some(p), Some(t)) = (&mut sampler, &ctl.probe, measure_start) {
            // What the workers committed while the others were spawned is not the window's.
            s.start(t, ctl.commits(), p);
        }
        let mut last_tick = start;
        let mut last_commits = 0u64;
        let measured = loop {
            std::thread::sleep(Duration::from_millis(10));
            let now = Instant::now();
            let el = now - start;
            if ctl.phase() == STOP {
                break Duration::ZERO; // a fatal error
            }
            if measure_start.is_none() && el >= win.warmup {
                cpu_start = cpu_clocks(&ctl);
                ctl.phase.store(MEASURE, Ordering::Release);
                measure_start = Some(now);
                if let (Some(s), Some(p)) = (&mut sampler, &ctl.probe) {
                    s.start(now, ctl.commits(), p);
                }
            }
            if let (Some(d), Some(db), true) = (&mut dop, db, measure_start.is_some()) {
                d.tick(db);
            }
            // The window ends `duration` after it started (not at warm-up + duration from
            // the start: on a loaded machine the first tick can come late).
            if measure_start.is_some_and(|m| now - m >= win.duration) {
                // Stop first, then the clocks: a commit counts only in the measuring phase,
                // so none falls between the window's end and the stop. The workers' CPU
                // clocks are read here too, not when each finishes the transaction it is in.
                ctl.phase.store(STOP, Ordering::Release);
                let end = Instant::now();
                cpu_end = cpu_clocks(&ctl);
                rss_end_kb = rss::current_kb();
                lock_end = footprint();
                dop_end = dop.take().zip(db).and_then(|(d, db)| d.finish(db));
                if let (Some(s), Some(p)) = (&mut sampler, &ctl.probe) {
                    s.finish(end, ctl.commits(), p, gauges);
                }
                break end - measure_start.unwrap_or(end);
            }
            if let (Some(s), Some(p)) = (&mut sampler, &ctl.probe) {
                s.tick(now, ctl.commits(), p, gauges);
            }
            if now - last_tick >= Duration::from_secs(1) {
                let c = ctl.commits();
                let tps = (c - last_commits) as f64 / (now - last_tick).as_secs_f64();
                last_commits = c;
                last_tick = now;
                let phase = if measure_start.is_some() {
                    "measure"
                } else {
                    "warmup"
                };
                pb.set_message(format!("{phase} {tps:.0} tps"));
                pb.set_position(el.as_secs());
            }
        };
        let outs: Vec<WorkerOut> = handles
            .into_iter()
            .map(|h| h.join().map_err(|_| anyhow!("a worker thread panicked")))
            .collect::<anyhow::Result<_>>()?;
        Ok((outs, measured))
    })?;
    pb.finish_and_clear();
    if let Some(msg) = ctl.fatal.lock().map_err(|_| anyhow!("poisoned"))?.take() {
        return Ok(Err(msg));
    }
    let mut stats = RunStats {
        committed: 0,
        total_committed: 0,
        aborts: [0; 3],
        measured,
        latency_ns: new_hist(),
        per_thread: Vec::with_capacity(outs.len()),
        total_by_type: vec![0; kinds.len()],
        rolled_back: 0,
        per_type: kinds.iter().map(|n| TypeStats::new(n)).collect(),
        rss_start_kb,
        rss_end_kb,
        peak_rss_kb: rss::peak_kb(),
        lock_footprint: lock_start.zip(lock_end).map(|(s, e)| [s, e]),
        intervals: sampler.map(|s| s.samples).unwrap_or_default(),
        stashed: 0,
        doppel: dop_end,
        worker_cpu: Some(Duration::ZERO),
    };
    for (t, o) in outs.into_iter().enumerate() {
        let (from, to) = (
            cpu_start.get(t).copied().flatten(),
            cpu_end.get(t).copied().flatten(),
        );
        let window = from.zip(to).map(|(from, to)| to.saturating_sub(from));
        stats.worker_cpu = stats.worker_cpu.zip(window).map(|(a, b)| a + b);
        stats.total_committed += o.total;
        stats.per_thread.push(o.total);
        for (mine, theirs) in stats.total_by_type.iter_mut().zip(&o.total_by_type) {
            *mine += theirs;
        }
        for (mine, theirs) in stats.per_type.iter_mut().zip(&o.per_type) {
            mine.merge(theirs);
        }
    }
    for t in &stats.per_type {
        stats.committed += t.committed;
        stats.rolled_back += t.rolled_back;
        stats.stashed += t.stashed;
        for (a, b) in stats.aborts.iter_mut().zip(t.aborts) {
            *a += b;
        }
        stats
            .latency_ns
            .add(&t.latency_ns)
            .expect("same histogram bounds");
    }
    Ok(Ok(stats))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    /// A scripted engine: every transaction aborts once (a conflict) before it commits, every
    /// third one is rolled back instead, and transaction `fail_at` of a worker is fatal.
    struct Script {
        fail_at: Option<u64>,
        finished: AtomicU64,
    }

    struct ScriptLoop<'a> {
        s: &'a Script,
        n: u64,
        tries: u32,
        commits: u64,
    }

    impl Adapter for Script {
        type Prepared = ();
        type Loop<'a> = ScriptLoop<'a>;

        fn kinds(&self) -> &'static [&'static str] {
            &["even", "odd"]
        }

        fn prepare(&self, _thread: usize, _seed: u64) -> anyhow::Result<()> {
            Ok(())
        }

        fn open(&self, _: (), _thread: usize) -> Result<ScriptLoop<'_>, String> {
            Ok(ScriptLoop {
                s: self,
                n: 0,
                tries: 0,
                commits: 0,
            })
        }
    }

    impl WorkerLoop for ScriptLoop<'_> {
        fn next(&mut self) -> (usize, Instant) {
            self.n += 1;
            self.tries = 0;
            // A type index past the end counts as the last type.
            ((self.n % 2) as usize * 7, Instant::now())
        }

        fn attempt(&mut self, _start: Instant) -> Attempt {
            self.tries += 1;
            if Some(self.n) == self.s.fail_at {
                Attempt::Fatal("scripted failure".into())
            } else if self.n.is_multiple_of(3) {
                Attempt::RolledBack
            } else if self.tries == 1 {
                Attempt::Abort(2)
            } else {
                Attempt::Committed
            }
        }

        fn committed(&mut self) {
            self.commits += 1;
        }

        fn finish(self) {
            self.s.finished.fetch_add(self.commits, Ordering::Relaxed);
        }
    }

    fn window() -> Window<'static> {
        Window {
            warmup: Duration::ZERO,
            duration: Duration::from_millis(100),
            progress: false,
            sampling: None,
            label: "test".into(),
        }
    }

    #[test]
    fn the_loop_counts_commits_aborts_and_rollbacks_per_type() {
        let s = Script {
            fail_at: None,
            finished: AtomicU64::new(0),
        };
        let st = measure(&window(), &s, 2, 7).unwrap().unwrap();
        assert!(st.committed > 0);
        assert_eq!(st.per_thread.len(), 2);
        assert_eq!(st.total_committed, st.per_thread.iter().sum::<u64>());
        // Without a warm-up every commit is measured but those made while the other worker
        // was being spawned and one per worker at the stop, and each worker's loop handed in
        // its own.
        assert!(st.total_committed >= st.committed);
        assert_eq!(s.finished.load(Ordering::Relaxed), st.total_committed);
        // Each commit followed one conflict (made before the window for a worker's first
        // measured commit); a worker stopped mid-retry adds at most one more.
        assert!((st.committed.saturating_sub(2)..=st.committed + 2).contains(&st.aborts[2]));
        assert_eq!(st.aborts[..2], [0, 0]);
        assert!(st.rolled_back > 0);
        // Each worker's transaction in flight at the stop counts in the latencies too.
        assert!((st.committed..=st.committed + 2).contains(&st.latency_ns.len()));
        let names: Vec<&str> = st.per_type.iter().map(|t| t.name).collect();
        assert_eq!(names, ["even", "odd"]);
        assert!(st.per_type.iter().all(|t| t.committed > 0));
        let sum = |f: fn(&TypeStats) -> u64| st.per_type.iter().map(f).sum::<u64>();
        assert_eq!(sum(|t| t.committed), st.committed);
        assert_eq!(sum(|t| t.rolled_back), st.rolled_back);
        assert_eq!(sum(TypeStats::aborted), st.aborts.iter().sum::<u64>());
        assert!(st.measured >= Duration::from_millis(100));
        assert!(st.lock_footprint.is_none() && st.doppel.is_none());
        if cfg!(target_os = "linux") {
            // Two busy workers for at least 100 ms: some CPU, and not more than the wall
            // time of the window allows (with slack for the stop).
            let cpu = st.worker_cpu.expect("thread CPU clocks on Linux");
            assert!(cpu > Duration::ZERO);
            assert!(cpu <= 2 * (st.measured + Duration::from_secs(1)));
        }
    }

    /// Transactions of a millisecond each; worker 1 takes `spawn` to prepare, its first
    /// transaction takes `block`, and the first it begins 20 ms after it opened takes `late`.
    struct Paced {
        spawn: Duration,
        block: Duration,
        late: Duration,
    }

    struct PacedLoop {
        block: Duration,
        late: Duration,
        opened: Instant,
    }

    impl Adapter for Paced {
        type Prepared = ();
        type Loop<'a> = PacedLoop;

        fn kinds(&self) -> &'static [&'static str] {
            &["paced"]
        }

        fn prepare(&self, thread: usize, _seed: u64) -> anyhow::Result<()> {
            if thread == 1 {
                std::thread::sleep(self.spawn);
            }
            Ok(())
        }

        fn open(&self, _: (), thread: usize) -> Result<PacedLoop, String> {
            let mine = |d: Duration| if thread == 1 { d } else { Duration::ZERO };
            Ok(PacedLoop {
                block: mine(self.block),
                late: mine(self.late),
                opened: Instant::now(),
            })
        }
    }

    impl WorkerLoop for PacedLoop {
        fn next(&mut self) -> (usize, Instant) {
            (0, Instant::now())
        }

        fn attempt(&mut self, _start: Instant) -> Attempt {
            let late = if self.opened.elapsed() >= Duration::from_millis(20) {
                std::mem::take(&mut self.late)
            } else {
                Duration::ZERO
            };
            std::thread::sleep(
                Duration::from_millis(1)
                    .max(std::mem::take(&mut self.block))
                    .max(late),
            );
            Attempt::Committed
        }

        fn committed(&mut self) {}

        fn finish(self) {}
    }

    /// Without a warm-up the window opens once every worker runs: worker 0's commits while
    /// worker 1 is still being prepared are not counted against a window that starts
    /// after them. Counted, they made two workers of at most 1,000 commits a second report
    /// some 3,000 a second here (300 ms of worker 0 alone, then 100 ms of both).
    #[test]
    fn without_a_warm_up_commits_made_while_workers_start_are_not_measured() {
        let p = Paced {
            spawn: Duration::from_millis(300),
            block: Duration::ZERO,
            late: Duration::ZERO,
        };
        let st = measure(&window(), &p, 2, 7).unwrap().unwrap();
        let per_ms = st.committed as f64 / st.measured.as_secs_f64() / 1000.0;
        assert!(
            per_ms <= 2.2,
            "{} commits in {:?}: {per_ms:.2} per ms from two workers of at most 1 per ms",
            st.committed,
            st.measured
        );
        assert!(st.total_committed >= st.committed + 200, "{st:?}");

        // The per-interval series leaves them out too (its first interval counted them).
        let run = Point(vec![("threads", crate::sweep::Value::Int(2))]);
        let every = crate::interval::Sampling {
            every: Duration::from_millis(50),
            print: false,
        };
        let win = Window {
            sampling: Some((every, &run)),
            ..window()
        };
        let st = measure(&win, &p, 2, 7).unwrap().unwrap();
        let sampled: u64 = st.intervals.iter().map(|s| s.commits).sum();
        assert!(
            sampled <= st.committed + 2,
            "intervals {sampled} commits, window {}",
            st.committed
        );
    }

    /// A worker that waits through the whole window (here in one long transaction; in a run,
    /// for an admission slot or a lock) still has its CPU in the window counted: it never
    /// sees the window open, so the driver reads its clock. Before, the run reported no CPU
    /// figure at all.
    #[test]
    fn a_worker_blocked_through_the_window_still_has_its_cpu_counted() {
        let p = Paced {
            spawn: Duration::ZERO,
            block: Duration::from_millis(400),
            late: Duration::ZERO,
        };
        let win = Window {
            warmup: Duration::from_millis(50),
            ..window()
        };
        let st = measure(&win, &p, 2, 7).unwrap().unwrap();
        if cfg!(target_os = "linux") {
            let cpu = st.worker_cpu.expect("every worker's CPU");
            assert!(cpu <= 2 * (st.measured + Duration::from_secs(1)));
        }
        assert!(st.per_thread[1] >= 1);
    }

    /// A transaction that begins in the window and is still running when it ends (here one
    /// of 300 ms, begun some 20 ms into a 100 ms window) has its latency counted once it
    /// commits: leaving out what was in flight at the stop dropped exactly the longest waits
    /// (the tail of a run past the cores).
    #[test]
    fn a_transaction_in_flight_at_the_end_of_the_window_counts_in_the_latencies() {
        let p = Paced {
            spawn: Duration::ZERO,
            block: Duration::ZERO,
            late: Duration::from_millis(300),
        };
        let st = measure(&window(), &p, 2, 7).unwrap().unwrap();
        let max = Duration::from_nanos(st.latency_ns.max());
        assert!(max >= Duration::from_millis(300), "longest latency {max:?}");
        assert!(st.latency_ns.len() <= st.committed + 2);
    }

    #[test]
    fn a_fatal_error_stops_the_run_with_its_message() {
        let s = Script {
            fail_at: Some(5),
            finished: AtomicU64::new(0),
        };
        let msg = measure(&window(), &s, 2, 7).unwrap().unwrap_err();
        assert_eq!(msg, "scripted failure");
    }

    #[test]
    fn thread_seeds_are_deterministic_and_distinct() {
        let seeds: Vec<u64> = (0..8).map(|t| thread_seed(42, t)).collect();
        assert_eq!(
            seeds,
            (0..8).map(|t| thread_seed(42, t)).collect::<Vec<_>>()
        );
        for i in 0..8 {
            assert!(!seeds[..i].contains(&seeds[i]));
            assert_ne!(seeds[i], thread_seed(43, i));
        }
    }
}
