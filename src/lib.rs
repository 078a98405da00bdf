//! tether (work in progress)
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod connection;
pub mod wire;
pub mod worker;
