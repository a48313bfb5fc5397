//! The configuration of the portable path (`shoal bench --engine LIST`, [`crate::portable`]):
//! its command-line option ([`PeerArgs`]), the settings of a whole sweep ([`PortableParams`]),
//! the data options of one load ([`LoadCfg`]) and the options of one run on it ([`RunCfg`]).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use super::{Log, Mix};
use crate::dist::KeyDist;
use crate::engines::EngineKind;
use crate::workloads::WorkloadKind;

/// The options of `shoal bench` that only the portable path reads.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct PeerArgs {
    /// Run the workload through the portable path on each of these engines:
    /// `shoal-2pl`, `shoal-occ`, `rocksdb-pessimistic`, `rocksdb-optimistic`, `sqlite`
    /// (the peers need the cargo features `rocksdb` / `sqlite`, or `peers` for both).
    /// Workloads: tpcb, ycsb (mixes a, b, c, f), incr1.
    #[arg(long, value_delimiter = ',', value_name = "LIST", value_parser = crate::engines::parse_engine)]
    pub engine: Vec<EngineKind>,
}

/// Everything a portable sweep needs from the command line.
#[derive(Debug, Clone)]
pub struct PortableParams {
    /// The workload (tpcb, ycsb or incr1).
    pub workload: WorkloadKind,
    /// Engines, in the order given.
    pub engines: Vec<EngineKind>,
    /// `--log` values (none and sync only).
    pub logs: Vec<Log>,
    /// Worker thread counts.
    pub threads: Vec<u64>,
    /// TPC-B scales.
    pub scales: Vec<u64>,
    /// YCSB records / INCR1 keys (`None`: the workload's default).
    pub records: Option<Vec<u64>>,
    /// YCSB bytes per field (ten fields).
    pub field_sizes: Vec<u64>,
    /// YCSB mixes (`None`: `a`).
    pub mixes: Option<Vec<Mix>>,
    /// INCR1 hot fractions (`None`: 0.1).
    pub hot_fractions: Option<Vec<f64>>,
    /// YCSB key distribution (`None`: Zipfian 0.99).
    pub dist: Option<KeyDist>,
    /// Seeds.
    pub seeds: Vec<u64>,
    /// Warm-up per run.
    pub warmup: Duration,
    /// Measurement window per run.
    pub duration: Duration,
    /// Parent directory of the databases (`None`: a temporary directory each).
    pub db_dir: Option<PathBuf>,
    /// JSON output file.
    pub json: Option<PathBuf>,
}

/// The data options of one load (one database).
#[derive(Clone, Debug, PartialEq)]
pub struct LoadCfg {
    /// TPC-B scale (branches).
    pub scale: u64,
    /// YCSB records / INCR1 keys.
    pub records: u64,
    /// YCSB bytes per field.
    pub field_size: usize,
}

/// The options of one run on a loaded database.
#[derive(Clone, Debug)]
pub struct RunCfg {
    /// Worker threads.
    pub threads: usize,
    /// YCSB mix (unused by the other workloads).
    pub mix: crate::workloads::ycsb::Mix,
    /// INCR1 hot fraction.
    pub hot_fraction: f64,
    /// YCSB key distribution.
    pub dist: KeyDist,
    /// Seed.
    pub seed: u64,
    /// Run number on its database (part of TPC-B's history keys).
    pub run: u16,
}

impl RunCfg {
    /// The workload options of this run on the database `load` (a record's `options`): TPC-B
    /// its scale; YCSB its records, field size, mix and key distribution; INCR1 its
    /// counters and hot fraction.
    pub fn options(&self, workload: WorkloadKind, load: &LoadCfg) -> BTreeMap<String, String> {
        let o: Vec<(&str, String)> = match workload {
            WorkloadKind::Tpcb => vec![("scale", load.scale.to_string())],
            WorkloadKind::Ycsb => vec![
                ("records", load.records.to_string()),
                ("field_size", load.field_size.to_string()),
                ("mix", self.mix.name().to_string()),
                ("dist", self.dist.to_string()),
            ],
            _ => vec![
                ("records", load.records.to_string()),
                ("hot_fraction", self.hot_fraction.to_string()),
            ],
        };
        o.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
    }
}
