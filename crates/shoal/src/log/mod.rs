//! Write-ahead log: redo-only logical records ([`record`]), a log buffer whose insert critical
//! section only claims space, with a group-commit flush daemon (`buffer`), segment files and
//! replay (`segment`), and fuzzy checkpoints (`checkpoint`).

pub(crate) mod buffer;
pub(crate) mod checkpoint;
#[cfg(test)]
mod group_tests;
pub mod record;
pub(crate) mod segment;
#[cfg(test)]
mod stress_tests;
