//! Parameter sweeps: named axes, each with a list of values, and their cartesian product.
//!
//! Every command-line option that picks a variant or a number (`--cc`, `--threads`,
//! `--read-ratio`, `--scale`, `--seed`) is an [`Axis`]. The benchmark runs every point of the
//! product of all axes. Adding a workload option is: one clap field, one [`Axis`] in
//! `main.rs`, one field in [`RunConfig`](crate::config::RunConfig). The named variants travel
//! typed from the command line to the run's configuration: concurrency control, commit
//! logging, key distribution and transaction mix as [`Value::Cc`], [`Value::Log`],
//! [`Value::Dist`] and [`Value::Mix`], engine options as [`Value::Setting`]s (see
//! [`crate::config::engine`]); each prints as the command line names it.

use std::fmt;

use serde::{Serialize, Serializer};

use crate::config::engine::Setting;
use crate::config::{Cc, Log, Mix};
use crate::dist::KeyDist;

/// One value of an axis, typed just enough to print it and to write it to JSON, or typed as
/// the run takes it: a named variant of the harness or an engine option as
/// [`Options`](shoal::Options) takes it. Each is written (in tables, notes and JSON) as the
/// command line names it.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Value {
    /// A count or an id (threads, scale, seed).
    Int(u64),
    /// A fraction (read ratio).
    Float(f64),
    /// A named variant of a workload (`--variant`, `--hotspot`) or a duration as given
    /// (`--hot-move-every`).
    Text(String),
    /// Concurrency control (`--cc`).
    #[serde(serialize_with = "as_text")]
    Cc(Cc),
    /// Commit logging (`--log`).
    #[serde(serialize_with = "as_text")]
    Log(Log),
    /// A key distribution (`--zipf`, `--self-similar`).
    #[serde(serialize_with = "as_text")]
    Dist(KeyDist),
    /// A transaction mix (`--mix`).
    #[serde(serialize_with = "as_text")]
    Mix(Mix),
    /// An engine option.
    #[serde(serialize_with = "as_text")]
    Setting(Setting),
}

fn as_text<T: fmt::Display, S: Serializer>(v: &T, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(v)
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Int(v) => write!(f, "{v}"),
            Value::Float(v) => write!(f, "{v}"),
            Value::Text(v) => f.write_str(v),
            Value::Cc(v) => write!(f, "{v}"),
            Value::Log(v) => write!(f, "{v}"),
            Value::Dist(v) => write!(f, "{v}"),
            Value::Mix(v) => write!(f, "{v}"),
            Value::Setting(v) => write!(f, "{v}"),
        }
    }
}

/// `From<T> for Value` for each typed axis value: `T => Value::Variant(conversion)`.
macro_rules! value_from {
    ($($t:ty => $variant:ident($conv:expr)),* $(,)?) => {
        $(impl From<$t> for Value {
            fn from(v: $t) -> Self {
                Value::$variant($conv(v))
            }
        })*
    };
}

value_from! {
    u64 => Int(std::convert::identity),
    f64 => Float(std::convert::identity),
    &str => Text(str::to_string),
    Cc => Cc(std::convert::identity),
    Log => Log(std::convert::identity),
    KeyDist => Dist(std::convert::identity),
    Mix => Mix(std::convert::identity),
}

/// A named list of values to sweep over.
#[derive(Clone, Debug)]
pub struct Axis {
    /// The command-line option's name without the dashes, e.g. `read-ratio`.
    pub name: &'static str,
    /// The values, duplicates removed, in the order given.
    pub values: Vec<Value>,
    /// Whether the value changes the database (its options or its loaded data): runs that
    /// differ in such an axis cannot share a loaded database.
    pub db: bool,
}

impl Axis {
    /// An axis over `values`, dropping repeated values (the first occurrence stays).
    pub fn new<T: Into<Value>>(
        name: &'static str,
        db: bool,
        values: impl IntoIterator<Item = T>,
    ) -> Axis {
        let mut out: Vec<Value> = Vec::new();
        for v in values {
            let v = v.into();
            if !out.contains(&v) {
                out.push(v);
            }
        }
        Axis {
            name,
            values: out,
            db,
        }
    }
}

/// The JSON key of an option: its name with dashes turned into underscores.
pub fn json_name(option: &str) -> String {
    option.replace('-', "_")
}

/// One point of a sweep: a value for every axis, in axis order.
#[derive(Clone, Debug, PartialEq)]
pub struct Point(pub Vec<(&'static str, Value)>);

impl Point {
    /// The value of axis `name`, if the sweep has that axis.
    pub fn get(&self, name: &str) -> Option<&Value> {
        self.0.iter().find(|(n, _)| *n == name).map(|(_, v)| v)
    }

    /// The engine options set at this point.
    pub fn settings(&self) -> impl Iterator<Item = &Setting> {
        self.0.iter().filter_map(|(_, v)| match v {
            Value::Setting(s) => Some(s),
            _ => None,
        })
    }

    /// `name=value` pairs joined by spaces, for notes and errors.
    pub fn describe(&self) -> String {
        self.0
            .iter()
            .map(|(n, v)| format!("{n}={v}"))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// A set of axes whose cartesian product is the list of runs.
#[derive(Clone, Debug, Default)]
pub struct Sweep {
    /// The axes; the first one varies slowest.
    pub axes: Vec<Axis>,
}

impl Sweep {
    /// Every combination of axis values; the first axis is the outermost loop. Axes that
    /// change the database should come first so that runs sharing a database are adjacent.
    pub fn points(&self) -> Vec<Point> {
        let mut points = vec![Point(Vec::new())];
        for axis in &self.axes {
            let mut next = Vec::with_capacity(points.len() * axis.values.len());
            for p in &points {
                for v in &axis.values {
                    let mut q = p.clone();
                    q.0.push((axis.name, v.clone()));
                    next.push(q);
                }
            }
            points = next;
        }
        points
    }

    /// The values of the database-changing axes at `p`: runs with equal keys can share a
    /// loaded database.
    pub fn db_key(&self, p: &Point) -> Point {
        Point(
            self.axes
                .iter()
                .filter(|a| a.db)
                .filter_map(|a| p.get(a.name).map(|v| (a.name, v.clone())))
                .collect(),
        )
    }

    /// The axis called `name`.
    #[cfg(test)]
    pub fn axis(&self, name: &str) -> Option<&Axis> {
        self.axes.iter().find(|a| a.name == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sweep() -> Sweep {
        Sweep {
            axes: vec![
                Axis::new("cc", true, [Cc::TwoPl, Cc::None]),
                Axis::new("threads", false, [1u64, 2, 1]),
                Axis::new("read-ratio", false, [0.0, 0.5]),
            ],
        }
    }

    #[test]
    fn product_has_every_combination_first_axis_outermost() {
        let s = sweep();
        assert_eq!(s.axes[1].values, vec![Value::Int(1), Value::Int(2)]);
        let pts = s.points();
        assert_eq!(pts.len(), 2 * 2 * 2);
        assert_eq!(pts[0].describe(), "cc=2pl threads=1 read-ratio=0");
        assert_eq!(pts[1].describe(), "cc=2pl threads=1 read-ratio=0.5");
        assert_eq!(pts[2].describe(), "cc=2pl threads=2 read-ratio=0");
        assert_eq!(pts[7].describe(), "cc=none threads=2 read-ratio=0.5");
        assert_eq!(s.db_key(&pts[3]).describe(), "cc=2pl");
        assert_eq!(s.db_key(&pts[4]).describe(), "cc=none");
    }

    #[test]
    fn empty_sweep_is_one_point() {
        assert_eq!(Sweep::default().points(), vec![Point(vec![])]);
    }

    #[test]
    fn json_names_use_underscores() {
        assert_eq!(json_name("read-ratio"), "read_ratio");
        assert_eq!(json_name(sweep().axes[2].name), "read_ratio");
        assert_eq!(
            serde_json::to_string(&vec![Value::Int(3), Value::Float(0.5), Value::from("on")])
                .unwrap(),
            r#"[3,0.5,"on"]"#
        );
    }

    #[test]
    fn typed_variants_print_and_serialize_as_the_command_line_names_them() {
        use crate::workloads::{tpcc, ycsb};
        let values = [
            Value::Cc(Cc::TwoPl),
            Value::Cc(Cc::None),
            Value::Log(Log::Pipelined),
            Value::Dist(KeyDist::Zipf(0.99)),
            Value::Dist(KeyDist::SelfSimilar(0.2)),
            Value::Mix(Mix::Tpcc(tpcc::Mix::NewOrder)),
            Value::Mix(Mix::Ycsb(ycsb::Mix::E)),
        ];
        let text = [
            "2pl",
            "none",
            "pipelined",
            "zipf:0.99",
            "self-similar:0.2",
            "new-order",
            "e",
        ];
        let shown: Vec<String> = values.iter().map(Value::to_string).collect();
        assert_eq!(shown, text);
        assert_eq!(
            serde_json::to_string(&values).unwrap(),
            serde_json::to_string(&text).unwrap()
        );
    }
}
