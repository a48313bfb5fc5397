//! Storage: each table is an ordered index ([`btree::BTree`]) over byte keys holding
//! [`btree::Record`]s, with fence keys per node and ghost records (Kimura §2.2).

pub mod btree;
