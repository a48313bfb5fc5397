//! Engine options the harness can sweep: the lock table, intent locks, key-range modes,
//! deadlock handling, victim policy, early lock release, log device latency, log directory,
//! checkpoint interval, lock timeout and admission control.
//!
//! Each is typed from the command line to [`Options`]: clap parses `--lock-table latch-free`
//! straight into a [`Setting::LockTable`]`(`[`LockTableKind::LatchFree`]`)`, the sweep carries
//! the setting as an axis value ([`Value::Setting`]), and a run's configuration applies it to
//! its `Options` ([`Setting::apply`]); [`Setting::of`] names every option's effective value
//! for the records. An option is an axis of the sweep only when given on the command line;
//! otherwise the engine's default holds (and the JSON record still names it).
//!
//! Adding an option: a variant of [`Setting`] (with its arms in the `impl`), and a line of
//! [`OPTIONS`] (its name, help and parser).

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser, ValueParser};
use shoal::{
    Admission, DeadlockPolicy, Elr, IntentLockKind, KeyRangeModes, LockTableKind, Options, Victim,
    WaitStyle,
};

use crate::sweep::{Axis, Value};

/// The command-line name of each value of an engine enum, with the help line for `--help`.
type Names<T> = [(&'static str, T, &'static str)];

#[rustfmt::skip]
const LOCK_TABLES: &Names<LockTableKind> = &[
    ("sharded", LockTableKind::Sharded, "Hash-partitioned latched table (the default): one mutex per shard"),
    ("latched", LockTableKind::Latched, "One latch over the whole lock hash table (Jung et al. Fig. 3, left): the baseline"),
    ("latch-free", LockTableKind::LatchFree, "Latch-free staged lock table (Jung et al. §3-§4)"),
];

#[rustfmt::skip]
const INTENT_LOCKS: &Names<IntentLockKind> = &[
    ("lil", IntentLockKind::Lightweight, "Lightweight intent locks (Kimura §3.2): counters, no lock-table entries"),
    ("table", IntentLockKind::LockTable, "Intent locks taken through the main lock table"),
];

#[rustfmt::skip]
const KEY_RANGE_MODES: &Names<KeyRangeModes> = &[
    ("graefe", KeyRangeModes::Graefe, "Graefe's orthogonal modes (the default)"),
    ("lomet", KeyRangeModes::Lomet, "Lomet's modes: gap-only and mixed requests become SS or XX"),
    ("sx", KeyRangeModes::SharedExclusive, "S and X only, on key and gap together (ARIES/KVL)"),
];

#[rustfmt::skip]
const DEADLOCK: &Names<DeadlockPolicy> = &[
    ("wait-for-graph", DeadlockPolicy::WaitForGraph, "Exact waits-for graph check when a request blocks (the engine default)"),
    ("dreadlocks-spin", DeadlockPolicy::Dreadlocks(WaitStyle::Spin), "Dreadlocks, spinning waiters"),
    ("dreadlocks-sleep", DeadlockPolicy::Dreadlocks(WaitStyle::Sleep), "Dreadlocks, sleeping waiters"),
    ("dreadlocks-backoff", DeadlockPolicy::Dreadlocks(WaitStyle::SleepBackoff), "Dreadlocks, sleeping waiters whose digests a release marks stale"),
    ("dreadlocks-hybrid", DeadlockPolicy::Dreadlocks(WaitStyle::Hybrid), "Dreadlocks, spin while runnable threads <= cores, sleep past that"),
    ("wait-die", DeadlockPolicy::WaitDie, "Wait-die (an older requester waits, a younger one aborts)"),
    ("wound-wait", DeadlockPolicy::WoundWait, "Wound-wait (an older requester aborts the younger holder)"),
    ("no-wait", DeadlockPolicy::NoWait, "Abort at once instead of waiting"),
    ("timeout", DeadlockPolicy::Timeout, "Wait until the lock timeout"),
];

#[rustfmt::skip]
const VICTIMS: &Names<Victim> = &[
    ("kill-young", Victim::KillYoung, "The younger transaction"),
    ("kill-short", Victim::KillShort, "The transaction whose thread has fewer pipelined commits waiting to become durable"),
    ("kill-long", Victim::KillLong, "The transaction whose thread has more pipelined commits waiting to become durable"),
];

#[rustfmt::skip]
const ELR: &Names<Elr> = &[
    ("off", Elr::Off, "Locks held until the commit is durable"),
    ("s", Elr::Shared, "Shared locks released at the commit request"),
    ("sx", Elr::Sx, "All locks released once the commit record is in the log buffer; read-only transactions wait for the tags they saw (safe)"),
    ("sx-unsafe", Elr::SxUnsafe, "As `sx` without the read-only tag wait (unsafe: for experiments only)"),
];

fn name_in<T: PartialEq>(names: &Names<T>, v: &T) -> &'static str {
    names
        .iter()
        .find(|(_, x, _)| x == v)
        .map_or("?", |(n, _, _)| n)
}

fn parse_in<T: Copy>(names: &Names<T>, s: &str) -> Option<T> {
    names.iter().find(|(n, _, _)| *n == s).map(|(_, v, _)| *v)
}

/// A clap parser for the names in `names`, listing them (with their help) in `--help`.
fn enum_parser<T: Copy + Send + Sync + 'static>(
    names: &'static Names<T>,
    wrap: fn(T) -> Setting,
) -> impl TypedValueParser<Value = Setting> {
    let values = names
        .iter()
        .map(|(n, _, help)| PossibleValue::new(*n).help(*help));
    PossibleValuesParser::new(values)
        .map(move |s| wrap(parse_in(names, &s).expect("a listed name")))
}

/// A duration, with the text it was given as (`50us` stays `50us` in tables and records).
#[derive(Clone, Debug, PartialEq)]
pub struct Given<T> {
    /// The value.
    pub value: T,
    /// The text it came from, or its rendering when it came from [`Options`].
    pub text: String,
}

impl Given<Duration> {
    fn parse(s: &str) -> Result<Self, String> {
        Ok(Given {
            value: parse_duration(s)?,
            text: s.trim().to_string(),
        })
    }

    fn of(d: Duration) -> Self {
        Given {
            value: d,
            text: ms(d),
        }
    }
}

fn ms(d: Duration) -> String {
    format!("{}ms", d.as_secs_f64() * 1e3)
}

/// One engine option set to one value: an axis value of the sweep.
#[derive(Clone, Debug, PartialEq)]
pub enum Setting {
    /// `--lock-table`: which lock table 2PL uses.
    LockTable(LockTableKind),
    /// `--intent-locks`: where intent locks live.
    IntentLocks(IntentLockKind),
    /// `--key-range-modes`: which key-range lock modes 2PL uses.
    KeyRangeModes(KeyRangeModes),
    /// `--deadlock`: deadlock handling of the lock table.
    Deadlock(DeadlockPolicy),
    /// `--victim`: which transaction of a Dreadlocks deadlock is rolled back.
    Victim(Victim),
    /// `--elr`: early lock release.
    Elr(Elr),
    /// `--log-latency`: extra delay per log flush.
    LogLatency(Given<Duration>),
    /// `--checkpoint-interval`: background checkpoints (`None`: off).
    CheckpointInterval(Option<Given<Duration>>),
    /// `--lock-timeout`: longest wait for one lock.
    LockTimeout(Given<Duration>),
    /// `--admission`: load control.
    Admission(Admission),
    /// `--admission-quantum`: how long a thread keeps its slot while others wait.
    AdmissionQuantum(Given<Duration>),
    /// `--log-dir`: where the log lives (a fresh subdirectory per database).
    LogDir(PathBuf),
    /// `--huge-pages`: the tables' pages on transparent huge pages.
    HugePages(bool),
}

impl Setting {
    /// The option's name on the command line without the dashes (the sweep axis).
    pub fn axis(&self) -> &'static str {
        match self {
            Setting::LockTable(_) => "lock-table",
            Setting::IntentLocks(_) => "intent-locks",
            Setting::KeyRangeModes(_) => "key-range-modes",
            Setting::Deadlock(_) => "deadlock",
            Setting::Victim(_) => "victim",
            Setting::Elr(_) => "elr",
            Setting::LogLatency(_) => "log-latency",
            Setting::CheckpointInterval(_) => "checkpoint-interval",
            Setting::LockTimeout(_) => "lock-timeout",
            Setting::Admission(_) => "admission",
            Setting::AdmissionQuantum(_) => "admission-quantum",
            Setting::LogDir(_) => "log-dir",
            Setting::HugePages(_) => "huge-pages",
        }
    }

    /// Sets the option in `o`.
    pub fn apply(&self, o: &mut Options) {
        match self {
            Setting::LockTable(v) => o.lock_table = *v,
            Setting::IntentLocks(v) => o.intent_locks = *v,
            Setting::KeyRangeModes(v) => o.key_range_modes = *v,
            Setting::Deadlock(v) => o.deadlock = *v,
            Setting::Victim(v) => o.victim = *v,
            Setting::Elr(v) => o.elr = *v,
            Setting::LogLatency(d) => o.log_latency = d.value,
            Setting::CheckpointInterval(d) => o.checkpoint_interval = d.as_ref().map(|d| d.value),
            Setting::LockTimeout(d) => o.lock_timeout = d.value,
            Setting::Admission(a) => o.admission = *a,
            Setting::AdmissionQuantum(d) => o.admission_quantum = d.value,
            Setting::LogDir(p) => o.log_dir = Some(p.clone()),
            Setting::HugePages(h) => o.huge_pages = *h,
        }
    }

    /// Every sweepable option's effective value in `o` (but the log directory, which a run
    /// names only when it is swept).
    pub fn of(o: &Options) -> Vec<Setting> {
        vec![
            Setting::LockTable(o.lock_table),
            Setting::IntentLocks(o.intent_locks),
            Setting::KeyRangeModes(o.key_range_modes),
            Setting::Deadlock(o.deadlock),
            Setting::Victim(o.victim),
            Setting::Elr(o.elr),
            Setting::LogLatency(Given::of(o.log_latency)),
            Setting::CheckpointInterval(o.checkpoint_interval.map(Given::of)),
            Setting::LockTimeout(Given::of(o.lock_timeout)),
            Setting::Admission(o.admission),
            Setting::AdmissionQuantum(Given::of(o.admission_quantum)),
            Setting::HugePages(o.huge_pages),
        ]
    }

    /// Parses the value `s` of the option named `axis` as the command line does.
    #[cfg(test)]
    pub fn parse(axis: &str, s: &str) -> Result<Setting, String> {
        use clap::{Args, FromArgMatches};
        let cmd = EngineArgs::augment_args(clap::Command::new("t").no_binary_name(true));
        let m = cmd
            .try_get_matches_from([format!("--{axis}={s}")])
            .map_err(|e| e.to_string())?;
        let a = EngineArgs::from_arg_matches(&m).map_err(|e| e.to_string())?;
        let mut values = a.given.into_iter().flatten();
        values
            .next()
            .ok_or_else(|| format!("no value for --{axis}"))
    }

    /// The sweep value of option `axis` at `s` (tests).
    #[cfg(test)]
    pub fn value(axis: &str, s: &str) -> Value {
        Value::Setting(Setting::parse(axis, s).expect("a valid engine option"))
    }
}

impl fmt::Display for Setting {
    /// The value as the command line takes it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Setting::LockTable(v) => f.write_str(name_in(LOCK_TABLES, v)),
            Setting::IntentLocks(v) => f.write_str(name_in(INTENT_LOCKS, v)),
            Setting::KeyRangeModes(v) => f.write_str(name_in(KEY_RANGE_MODES, v)),
            Setting::Deadlock(v) => f.write_str(name_in(DEADLOCK, v)),
            Setting::Victim(v) => f.write_str(name_in(VICTIMS, v)),
            Setting::Elr(v) => f.write_str(name_in(ELR, v)),
            Setting::LogLatency(d) | Setting::LockTimeout(d) | Setting::AdmissionQuantum(d) => {
                f.write_str(&d.text)
            }
            Setting::CheckpointInterval(d) => f.write_str(d.as_ref().map_or("off", |d| &d.text)),
            Setting::Admission(Admission::Off) => f.write_str("off"),
            Setting::Admission(Admission::Auto) => f.write_str("auto"),
            Setting::Admission(Admission::Limit(n)) => write!(f, "{}", n.max(&1)),
            Setting::LogDir(p) => write!(f, "{}", p.display()),
            Setting::HugePages(h) => f.write_str(if *h { "on" } else { "off" }),
        }
    }
}

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
fn parse_interval(s: &str) -> Result<Setting, String> {
    if s.trim() == "off" {
        return Ok(Setting::CheckpointInterval(None));
    }
    let d = Given::parse(s)?;
    if d.value.is_zero() {
        return Err("a checkpoint interval must be more than 0 (or `off`)".into());
    }
    Ok(Setting::CheckpointInterval(Some(d)))
}

/// Parses `--admission`: `off`, `auto` or a positive number of running transactions.
fn parse_admission(s: &str) -> Result<Setting, String> {
    let a = match s.trim().to_ascii_lowercase().as_str() {
        "off" => Admission::Off,
        "auto" => Admission::Auto,
        n => match n.parse::<usize>() {
            Ok(n) if (1..=4096).contains(&n) => Admission::Limit(n),
            _ => {
                return Err(format!(
                    "{s:?}: give `off`, `auto` or a number of running transactions (1 to 4096, \
                     as many as --threads allows)"
                ))
            }
        },
    };
    Ok(Setting::Admission(a))
}

/// Parses `--huge-pages`: `on` or `off`.
fn parse_huge(s: &str) -> Result<Setting, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "on" => Ok(Setting::HugePages(true)),
        "off" => Ok(Setting::HugePages(false)),
        _ => Err(format!("{s:?}: give `on` or `off`")),
    }
}

/// Parses `--admission-quantum`: a duration above 0.
fn parse_quantum(s: &str) -> Result<Setting, String> {
    let d = Given::parse(s)?;
    if d.value.is_zero() {
        return Err("a quantum must be more than 0".into());
    }
    Ok(Setting::AdmissionQuantum(d))
}

/// The engine options of `shoal bench`: name (the long option, and the sweep axis), help,
/// and the parser that types a value. Each takes a comma-separated list of values to sweep.
type EngineOption = (&'static str, &'static str, fn() -> ValueParser);

const OPTIONS: &[EngineOption] = &[
    (
        "lock-table",
        "Lock table for 2PL: `sharded` (default: hash-partitioned, one mutex per shard), \
         `latched` (one latch over the whole table: the baseline of Jung et al.) or \
         `latch-free` (Jung et al.'s staged lock table)",
        || ValueParser::new(enum_parser(LOCK_TABLES, Setting::LockTable)),
    ),
    (
        "intent-locks",
        "Intent locks on tables and the database: `lil` (lightweight intent locks, the \
         default) or `table` (through the lock table)",
        || ValueParser::new(enum_parser(INTENT_LOCKS, Setting::IntentLocks)),
    ),
    (
        "key-range-modes",
        "Key-range lock modes for 2PL: `graefe` (default), `lomet` or `sx` (S/X only)",
        || ValueParser::new(enum_parser(KEY_RANGE_MODES, Setting::KeyRangeModes)),
    ),
    (
        "deadlock",
        "Deadlock handling of the lock table (default `wait-for-graph`)",
        || ValueParser::new(enum_parser(DEADLOCK, Setting::Deadlock)),
    ),
    (
        "victim",
        "Which transaction of a Dreadlocks deadlock is rolled back (default `kill-young`); \
         `kill-short` and `kill-long` need a `dreadlocks-*` policy (every lock table runs \
         every `--deadlock` policy; other victim choices are refused, not ignored)",
        || ValueParser::new(enum_parser(VICTIMS, Setting::Victim)),
    ),
    (
        "elr",
        "Early lock release (default `off`): `s` releases shared locks at the commit \
         request, `sx` all locks once the commit record is buffered (safe), `sx-unsafe` \
         without the read-only wait",
        || ValueParser::new(enum_parser(ELR, Setting::Elr)),
    ),
    (
        "log-latency",
        "Extra delay per log flush on top of the real fsync, e.g. `10ms` (a disk) or `50us`",
        || ValueParser::new(|s: &str| Given::parse(s).map(Setting::LogLatency)),
    ),
    (
        "checkpoint-interval",
        "Background checkpoint interval, e.g. `10s`, or `off` (default)",
        || ValueParser::new(parse_interval),
    ),
    (
        "admission",
        "Load control: how many transactions run at once (`auto`, the default: one per core; \
         `off`: no limit, the old behaviour; or a number). Threads past the limit wait in \
         begin (counted in their latency); a transaction waiting for a lock or the log does \
         not count",
        || ValueParser::new(parse_admission),
    ),
    (
        "admission-quantum",
        "Load control's quantum (default 1ms): while threads wait for a slot, a thread keeps \
         its slot across transactions this long; longer pays fewer hand-overs past the \
         cores, at longer turns in the queue (its tail)",
        || ValueParser::new(parse_quantum),
    ),
    (
        "lock-timeout",
        "Longest wait for one lock before a transaction aborts (default 2s)",
        || ValueParser::new(|s: &str| Given::parse(s).map(Setting::LockTimeout)),
    ),
    (
        "huge-pages",
        "The tables' pages on transparent huge pages (`on`, the default: fewer TLB misses in \
         large tables) or on 4 KiB pages (`off`: cheaper growth where fresh memory is dear, \
         as on a virtual machine whose host backs memory on first touch)",
        || ValueParser::new(parse_huge),
    ),
    (
        "log-dir",
        "Put the log in DIR (a fresh subdirectory per database, removed afterwards) instead \
         of in the database directory",
        || ValueParser::new(|s: &str| Ok::<_, String>(Setting::LogDir(PathBuf::from(s)))),
    ),
];

/// The engine options given on the command line ([`OPTIONS`]), each with its values.
#[derive(Clone, Debug, Default)]
pub struct EngineArgs {
    given: Vec<Vec<Setting>>,
}

impl clap::Args for EngineArgs {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        OPTIONS.iter().fold(cmd, |cmd, (name, help, parser)| {
            cmd.arg(
                clap::Arg::new(*name)
                    .long(*name)
                    .help(*help)
                    .value_delimiter(',')
                    .value_name("LIST")
                    .action(clap::ArgAction::Append)
                    .value_parser(parser()),
            )
        })
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        Self::augment_args(cmd)
    }
}

impl clap::FromArgMatches for EngineArgs {
    fn from_arg_matches(m: &clap::ArgMatches) -> Result<Self, clap::Error> {
        let mut a = EngineArgs::default();
        a.update_from_arg_matches(m)?;
        Ok(a)
    }

    fn update_from_arg_matches(&mut self, m: &clap::ArgMatches) -> Result<(), clap::Error> {
        self.given = OPTIONS
            .iter()
            .filter_map(|(name, _, _)| Some(m.get_many::<Setting>(name)?.cloned().collect()))
            .collect();
        Ok(())
    }
}

impl EngineArgs {
    /// One sweep axis per option given (options not given keep the engine's default), in
    /// the order of the command-line help.
    pub fn axes(&self) -> Vec<Axis> {
        self.given
            .iter()
            .filter_map(|v| {
                let name = v.first()?.axis();
                Some(Axis::new(name, true, v.iter().cloned().map(Value::Setting)))
            })
            .collect()
    }

    /// Whether any engine option was given.
    pub fn any(&self) -> bool {
        !self.given.is_empty()
    }

    /// The options given that only a run taking locks uses (`lock-table`, `deadlock`,
    /// `victim`, `intent-locks`, `key-range-modes`), by name.
    pub fn lock_options(&self) -> Vec<&'static str> {
        self.given_names(|s| {
            matches!(
                s,
                Setting::LockTable(_)
                    | Setting::Deadlock(_)
                    | Setting::Victim(_)
                    | Setting::IntentLocks(_)
                    | Setting::KeyRangeModes(_)
            )
        })
    }

    /// The options given that only a logging run uses (`log-latency`), by name.
    pub fn log_options(&self) -> Vec<&'static str> {
        self.given_names(|s| matches!(s, Setting::LogLatency(_)))
    }

    /// Whether `--elr` was given.
    pub fn elr_given(&self) -> bool {
        !self
            .given_names(|s| matches!(s, Setting::Elr(_)))
            .is_empty()
    }

    fn given_names(&self, pick: impl Fn(&Setting) -> bool) -> Vec<&'static str> {
        self.given
            .iter()
            .filter_map(|v| v.first())
            .filter(|s| pick(s))
            .map(Setting::axis)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sweep::Point;

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
        for (axis, names) in [
            ("deadlock", DEADLOCK.iter().map(|n| n.0).collect::<Vec<_>>()),
            ("elr", ELR.iter().map(|n| n.0).collect()),
            ("lock-table", LOCK_TABLES.iter().map(|n| n.0).collect()),
            ("victim", VICTIMS.iter().map(|n| n.0).collect()),
        ] {
            for n in names {
                let s = Setting::parse(axis, n).unwrap();
                assert_eq!((s.axis(), s.to_string().as_str()), (axis, n));
            }
        }
        assert_eq!(
            Setting::parse("deadlock", "wound-wait"),
            Ok(Setting::Deadlock(DeadlockPolicy::WoundWait))
        );
        assert!(Setting::parse("victim", "kill-nobody").is_err());
    }

    #[test]
    fn apply_sets_only_what_the_point_names() {
        let p = Point(
            [
                ("lock-table", "latched"),
                ("deadlock", "dreadlocks-hybrid"),
                ("elr", "sx"),
                ("log-latency", "10ms"),
                ("checkpoint-interval", "off"),
            ]
            .map(|(a, s)| (a, Setting::value(a, s)))
            .to_vec(),
        );
        let mut o = Options::default().with_checkpoint_interval(Some(Duration::from_secs(1)));
        for s in p.settings() {
            s.apply(&mut o);
        }
        assert_eq!(o.lock_table, LockTableKind::Latched);
        assert_eq!(o.deadlock, DeadlockPolicy::Dreadlocks(WaitStyle::Hybrid));
        assert_eq!(o.elr, Elr::Sx);
        assert_eq!(o.log_latency, Duration::from_millis(10));
        assert_eq!(o.checkpoint_interval, None);
        assert_eq!(o.intent_locks, Options::default().intent_locks);
        let d: Vec<(&str, String)> = Setting::of(&o)
            .iter()
            .map(|s| (s.axis(), s.to_string()))
            .collect();
        for want in [
            ("deadlock", "dreadlocks-hybrid"),
            ("log-latency", "10ms"),
            ("checkpoint-interval", "off"),
            ("admission", "auto"),
            ("admission-quantum", "1ms"),
            ("lock-timeout", "2000ms"),
        ] {
            assert!(d.contains(&(want.0, want.1.to_string())), "{d:?}");
        }
    }

    #[test]
    fn huge_pages_parse_on_and_off_and_reach_the_options() {
        let mut o = Options::default();
        assert!(o.huge_pages);
        let off = Setting::parse("huge-pages", "off").unwrap();
        assert_eq!(off.axis(), "huge-pages");
        off.apply(&mut o);
        assert!(!o.huge_pages);
        assert_eq!(off.to_string(), "off");
        Setting::parse("huge-pages", "ON").unwrap().apply(&mut o);
        assert!(o.huge_pages);
        assert!(Setting::of(&o).contains(&Setting::HugePages(true)));
        assert!(Setting::parse("huge-pages", "maybe").is_err());
    }

    #[test]
    fn admission_quantum_parses_durations_and_reaches_the_options() {
        let mut o = Options::default();
        let set = parse_quantum("4ms").unwrap();
        set.apply(&mut o);
        assert_eq!(o.admission_quantum, Duration::from_millis(4));
        assert_eq!(set.to_string(), "4ms");
        assert_eq!(set.axis(), "admission-quantum");
        assert!(parse_quantum("0").is_err());
        assert!(parse_quantum("soon").is_err());
    }

    #[test]
    fn admission_parses_off_auto_and_numbers() {
        for (s, a) in [
            ("off", Admission::Off),
            ("auto", Admission::Auto),
            ("4", Admission::Limit(4)),
        ] {
            let set = parse_admission(s).unwrap();
            assert_eq!(set, Setting::Admission(a));
            assert_eq!(set.to_string(), s);
        }
        assert!(parse_admission("0").is_err());
        assert!(parse_admission("-2").is_err());
        assert!(parse_admission("lots").is_err());
    }
}
