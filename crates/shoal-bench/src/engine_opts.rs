//! Engine options the harness can sweep: the lock table, intent locks, deadlock handling,
//! victim policy, early lock release, log device latency, log directory, checkpoint
//! interval and admission control. Each is an axis of the sweep only when given on the command line; otherwise the
//! engine's default holds (and the JSON record still names it in `engine_options`).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{anyhow, bail};
use shoal::{
    Admission, DeadlockPolicy, Elr, IntentLockKind, KeyRangeModes, LockTableKind, Options, Victim,
    WaitStyle,
};

use crate::sweep::{Point, Value};

/// `--lock-table`: which lock table 2PL uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LockTableArg {
    /// Hash-partitioned latched table (the default): one mutex per shard.
    Sharded,
    /// One latch over the whole lock hash table (Jung et al. Fig. 3, left): the baseline.
    Latched,
    /// Latch-free staged lock table (Jung et al. §3-§4).
    LatchFree,
}

/// `--intent-locks`: where intent locks live.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum IntentArg {
    /// Lightweight intent locks (Kimura §3.2): counters, no lock-table entries.
    Lil,
    /// Intent locks taken through the main lock table.
    Table,
}

/// `--deadlock`: deadlock handling of the lock table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum DeadlockArg {
    /// Exact waits-for graph check when a request blocks (the engine default).
    WaitForGraph,
    /// Dreadlocks, spinning waiters.
    DreadlocksSpin,
    /// Dreadlocks, sleeping waiters.
    DreadlocksSleep,
    /// Dreadlocks, sleeping waiters whose digests a release marks stale.
    DreadlocksBackoff,
    /// Dreadlocks, spin while runnable threads <= cores, sleep past that.
    DreadlocksHybrid,
    /// Wait-die (an older requester waits, a younger one aborts).
    WaitDie,
    /// Wound-wait (an older requester aborts the younger holder).
    WoundWait,
    /// Abort at once instead of waiting.
    NoWait,
    /// Wait until the lock timeout.
    Timeout,
}

/// `--key-range-modes`: which key-range lock modes 2PL uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum KeyModesArg {
    /// Graefe's orthogonal modes (the default).
    Graefe,
    /// Lomet's modes: gap-only and mixed requests become SS or XX.
    Lomet,
    /// S and X only, on key and gap together (ARIES/KVL).
    Sx,
}

/// `--victim`: which transaction of a Dreadlocks deadlock is rolled back. The other
/// policies choose their own victim; the database refuses `kill-short` and `kill-long` with
/// them rather than ignore the choice.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
#[allow(clippy::enum_variant_names)] // the names are the command-line values
pub enum VictimArg {
    /// The younger transaction.
    KillYoung,
    /// The transaction whose thread has fewer pipelined commits waiting to become durable.
    KillShort,
    /// The transaction whose thread has more pipelined commits waiting to become durable.
    KillLong,
}

/// `--elr`: early lock release.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ElrArg {
    /// Locks held until the commit is durable.
    Off,
    /// Shared locks released at the commit request.
    S,
    /// All locks released once the commit record is in the log buffer; read-only
    /// transactions wait for the tags they saw (safe).
    Sx,
    /// As `sx` without the read-only tag wait (unsafe: for experiments only).
    SxUnsafe,
}

macro_rules! names {
    ($t:ty) => {
        impl $t {
            /// The command-line name.
            pub fn name(self) -> String {
                clap::ValueEnum::to_possible_value(&self)
                    .map(|v| v.get_name().to_string())
                    .unwrap_or_default()
            }

            fn parse(s: &str) -> Option<Self> {
                <Self as clap::ValueEnum>::value_variants()
                    .iter()
                    .copied()
                    .find(|v| v.name() == s)
            }
        }
    };
}
names!(LockTableArg);
names!(IntentArg);
names!(DeadlockArg);
names!(VictimArg);
names!(ElrArg);
names!(KeyModesArg);

/// Parses a duration such as `10ms`, `50us`, `1.5s`, `2m` or `0`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let v: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration such as 10ms, 50us or 1s"))?;
    let scale = match unit.trim() {
        "" if v == 0.0 => 1.0,
        "ns" => 1e-9,
        "us" | "µs" => 1e-6,
        "ms" => 1e-3,
        "s" => 1.0,
        "m" | "min" => 60.0,
        _ => return Err(format!("{s:?}: give a unit: ns, us, ms, s or m")),
    };
    let secs = v * scale;
    if !secs.is_finite() || secs > 1e6 {
        return Err(format!("{s:?} is too long"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Parses `--checkpoint-interval`: a duration, or `off`.
pub fn parse_interval(s: &str) -> Result<String, String> {
    if s.trim() == "off" {
        return Ok("off".into());
    }
    let d = parse_duration(s)?;
    if d.is_zero() {
        return Err("a checkpoint interval must be more than 0 (or `off`)".into());
    }
    Ok(s.trim().to_string())
}

/// Parses `--admission`: `off`, `auto` or a positive number of running transactions.
pub fn parse_admission(s: &str) -> Result<String, String> {
    admission_of(s).map(|_| s.trim().to_ascii_lowercase())
}

fn admission_of(s: &str) -> Result<Admission, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "off" => Ok(Admission::Off),
        "auto" => Ok(Admission::Auto),
        n => match n.parse::<usize>() {
            Ok(n) if n > 0 => Ok(Admission::Limit(n)),
            _ => Err(format!(
                "{s:?}: give `off`, `auto` or a number of running transactions (1 or more)"
            )),
        },
    }
}

/// The command-line name of an admission setting (`off`, `auto` or the number).
pub fn admission_name(a: Admission) -> String {
    match a {
        Admission::Off => "off".into(),
        Admission::Auto => "auto".into(),
        Admission::Limit(n) => n.max(1).to_string(),
    }
}

/// Parses `--log-latency`: any duration, kept as given for display.
pub fn parse_latency(s: &str) -> Result<String, String> {
    parse_duration(s).map(|_| s.trim().to_string())
}

fn text<'a>(p: &'a Point, name: &str) -> anyhow::Result<Option<&'a str>> {
    match p.get(name) {
        None => Ok(None),
        Some(Value::Text(s)) => Ok(Some(s)),
        Some(v) => bail!("option {name}: expected a name, got {v}"),
    }
}

fn parsed<T>(p: &Point, name: &str, f: impl Fn(&str) -> Option<T>) -> anyhow::Result<Option<T>> {
    text(p, name)?
        .map(|s| f(s).ok_or_else(|| anyhow!("unknown --{name} {s}")))
        .transpose()
}

/// Sets the engine options named at sweep point `p` (those not at `p` keep their values).
pub fn apply(p: &Point, o: &mut Options) -> anyhow::Result<()> {
    if let Some(v) = parsed(p, "lock-table", LockTableArg::parse)? {
        o.lock_table = match v {
            LockTableArg::Sharded => LockTableKind::Sharded,
            LockTableArg::Latched => LockTableKind::Latched,
            LockTableArg::LatchFree => LockTableKind::LatchFree,
        };
    }
    if let Some(v) = parsed(p, "intent-locks", IntentArg::parse)? {
        o.intent_locks = match v {
            IntentArg::Lil => IntentLockKind::Lightweight,
            IntentArg::Table => IntentLockKind::LockTable,
        };
    }
    if let Some(v) = parsed(p, "deadlock", DeadlockArg::parse)? {
        o.deadlock = match v {
            DeadlockArg::WaitForGraph => DeadlockPolicy::WaitForGraph,
            DeadlockArg::DreadlocksSpin => DeadlockPolicy::Dreadlocks(WaitStyle::Spin),
            DeadlockArg::DreadlocksSleep => DeadlockPolicy::Dreadlocks(WaitStyle::Sleep),
            DeadlockArg::DreadlocksBackoff => DeadlockPolicy::Dreadlocks(WaitStyle::SleepBackoff),
            DeadlockArg::DreadlocksHybrid => DeadlockPolicy::Dreadlocks(WaitStyle::Hybrid),
            DeadlockArg::WaitDie => DeadlockPolicy::WaitDie,
            DeadlockArg::WoundWait => DeadlockPolicy::WoundWait,
            DeadlockArg::NoWait => DeadlockPolicy::NoWait,
            DeadlockArg::Timeout => DeadlockPolicy::Timeout,
        };
    }
    if let Some(v) = parsed(p, "key-range-modes", KeyModesArg::parse)? {
        o.key_range_modes = match v {
            KeyModesArg::Graefe => KeyRangeModes::Graefe,
            KeyModesArg::Lomet => KeyRangeModes::Lomet,
            KeyModesArg::Sx => KeyRangeModes::SharedExclusive,
        };
    }
    if let Some(v) = parsed(p, "victim", VictimArg::parse)? {
        o.victim = match v {
            VictimArg::KillYoung => Victim::KillYoung,
            VictimArg::KillShort => Victim::KillShort,
            VictimArg::KillLong => Victim::KillLong,
        };
    }
    if let Some(v) = parsed(p, "elr", ElrArg::parse)? {
        o.elr = match v {
            ElrArg::Off => Elr::Off,
            ElrArg::S => Elr::Shared,
            ElrArg::Sx => Elr::Sx,
            ElrArg::SxUnsafe => Elr::SxUnsafe,
        };
    }
    if let Some(s) = text(p, "log-latency")? {
        o.log_latency = parse_duration(s).map_err(|e| anyhow!("--log-latency: {e}"))?;
    }
    if let Some(s) = text(p, "checkpoint-interval")? {
        o.checkpoint_interval = if s == "off" {
            None
        } else {
            Some(parse_duration(s).map_err(|e| anyhow!("--checkpoint-interval: {e}"))?)
        };
    }
    if let Some(s) = text(p, "log-dir")? {
        o.log_dir = Some(PathBuf::from(s));
    }
    match p.get("phase-ms") {
        None => {}
        Some(Value::Float(ms)) if ms.is_finite() && *ms > 0.0 => {
            o.doppel.split_phase = Duration::from_secs_f64(ms / 1e3);
        }
        Some(Value::Int(ms)) if *ms > 0 => o.doppel.split_phase = Duration::from_millis(*ms),
        Some(v) => bail!("option phase-ms: expected a positive number, got {v}"),
    }
    if let Some(s) = text(p, "lock-timeout")? {
        o.lock_timeout = parse_duration(s).map_err(|e| anyhow!("--lock-timeout: {e}"))?;
    }
    match p.get("admission") {
        None => {}
        Some(Value::Text(s)) => {
            o.admission = admission_of(s).map_err(|e| anyhow!("--admission: {e}"))?;
        }
        // A number alone on the command line may reach here as a number.
        Some(Value::Int(n)) if *n > 0 => o.admission = Admission::Limit(*n as usize),
        Some(v) => bail!("option admission: expected off, auto or a number, got {v}"),
    }
    Ok(())
}

/// Every sweepable engine option's effective value in `o`, by axis name, in the form the
/// command line takes (`lock-table` → `sharded`, `log-latency` → `0ms`, `phase-ms` → 20,
/// a number as when swept).
pub fn describe(o: &Options) -> Vec<(&'static str, Value)> {
    let lock_table = match o.lock_table {
        LockTableKind::Sharded => LockTableArg::Sharded,
        LockTableKind::Latched => LockTableArg::Latched,
        LockTableKind::LatchFree => LockTableArg::LatchFree,
    };
    let intent = match o.intent_locks {
        IntentLockKind::Lightweight => IntentArg::Lil,
        IntentLockKind::LockTable => IntentArg::Table,
    };
    let deadlock = match o.deadlock {
        DeadlockPolicy::WaitForGraph => DeadlockArg::WaitForGraph,
        DeadlockPolicy::Dreadlocks(WaitStyle::Spin) => DeadlockArg::DreadlocksSpin,
        DeadlockPolicy::Dreadlocks(WaitStyle::Sleep) => DeadlockArg::DreadlocksSleep,
        DeadlockPolicy::Dreadlocks(WaitStyle::SleepBackoff) => DeadlockArg::DreadlocksBackoff,
        DeadlockPolicy::Dreadlocks(WaitStyle::Hybrid) => DeadlockArg::DreadlocksHybrid,
        DeadlockPolicy::WaitDie => DeadlockArg::WaitDie,
        DeadlockPolicy::WoundWait => DeadlockArg::WoundWait,
        DeadlockPolicy::NoWait => DeadlockArg::NoWait,
        DeadlockPolicy::Timeout => DeadlockArg::Timeout,
    };
    let victim = match o.victim {
        Victim::KillYoung => VictimArg::KillYoung,
        Victim::KillShort => VictimArg::KillShort,
        Victim::KillLong => VictimArg::KillLong,
    };
    let elr = match o.elr {
        Elr::Off => ElrArg::Off,
        Elr::Shared => ElrArg::S,
        Elr::Sx => ElrArg::Sx,
        Elr::SxUnsafe => ElrArg::SxUnsafe,
    };
    let key_modes = match o.key_range_modes {
        KeyRangeModes::Graefe => KeyModesArg::Graefe,
        KeyRangeModes::Lomet => KeyModesArg::Lomet,
        KeyRangeModes::SharedExclusive => KeyModesArg::Sx,
    };
    let ms = |d: Duration| format!("{}ms", d.as_secs_f64() * 1e3);
    let out = vec![
        ("lock-table", lock_table.name()),
        ("intent-locks", intent.name()),
        ("key-range-modes", key_modes.name()),
        ("deadlock", deadlock.name()),
        ("victim", victim.name()),
        ("elr", elr.name()),
        ("log-latency", ms(o.log_latency)),
        (
            "checkpoint-interval",
            o.checkpoint_interval.map_or_else(|| "off".to_string(), ms),
        ),
        ("lock-timeout", ms(o.lock_timeout)),
        ("admission", admission_name(o.admission)),
    ];
    let mut out: Vec<(&'static str, Value)> =
        out.into_iter().map(|(n, v)| (n, Value::Text(v))).collect();
    if o.cc == shoal::ConcurrencyControl::Doppel {
        // `phase-ms` is a number on the command line; the record names it as such.
        out.push((
            "phase-ms",
            Value::Float(o.doppel.split_phase.as_secs_f64() * 1e3),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(parse_duration("10ms"), Ok(Duration::from_millis(10)));
        assert_eq!(parse_duration("50us"), Ok(Duration::from_micros(50)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert!(parse_duration("10").is_err());
        assert!(parse_duration("ms").is_err());
        assert!(parse_duration("-1s").is_err());
    }

    #[test]
    fn names_round_trip() {
        assert_eq!(DeadlockArg::DreadlocksBackoff.name(), "dreadlocks-backoff");
        assert_eq!(
            DeadlockArg::parse("wound-wait"),
            Some(DeadlockArg::WoundWait)
        );
        assert_eq!(ElrArg::SxUnsafe.name(), "sx-unsafe");
        assert_eq!(
            LockTableArg::parse("latch-free"),
            Some(LockTableArg::LatchFree)
        );
    }

    #[test]
    fn apply_sets_only_what_the_point_names() {
        let p = Point(vec![
            ("lock-table", Value::from("latched")),
            ("deadlock", Value::from("dreadlocks-hybrid")),
            ("elr", Value::from("sx")),
            ("log-latency", Value::from("10ms")),
            ("checkpoint-interval", Value::from("off")),
        ]);
        let mut o = Options::default();
        apply(&p, &mut o).unwrap();
        assert_eq!(o.lock_table, LockTableKind::Latched);
        assert_eq!(o.deadlock, DeadlockPolicy::Dreadlocks(WaitStyle::Hybrid));
        assert_eq!(o.elr, Elr::Sx);
        assert_eq!(o.log_latency, Duration::from_millis(10));
        assert_eq!(o.checkpoint_interval, None);
        assert_eq!(o.intent_locks, Options::default().intent_locks);
        let d = describe(&o);
        assert!(
            d.contains(&("deadlock", Value::from("dreadlocks-hybrid"))),
            "{d:?}"
        );
        assert!(d.contains(&("log-latency", Value::from("10ms"))), "{d:?}");
        assert!(
            d.contains(&("checkpoint-interval", Value::from("off"))),
            "{d:?}"
        );
        let bad = Point(vec![("victim", Value::from("kill-nobody"))]);
        assert!(apply(&bad, &mut o).is_err());
        assert!(d.contains(&("admission", Value::from("auto"))), "{d:?}");
    }

    #[test]
    fn admission_parses_off_auto_and_numbers() {
        for (s, a) in [
            ("off", Admission::Off),
            ("auto", Admission::Auto),
            ("4", Admission::Limit(4)),
        ] {
            assert_eq!(parse_admission(s).as_deref(), Ok(s));
            let mut o = Options::default();
            apply(&Point(vec![("admission", Value::from(s))]), &mut o).unwrap();
            assert_eq!(o.admission, a);
            assert_eq!(admission_name(a), s);
        }
        assert!(parse_admission("0").is_err());
        assert!(parse_admission("-2").is_err());
        assert!(parse_admission("lots").is_err());
    }
}
