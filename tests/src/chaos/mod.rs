//! The chaos suite: simulated nodes in network namespaces, real faults
//! (signals, iptables, qdiscs, link state, the replicas' disk fault
//! injection), and a checker that knows every acknowledged and flushed write
//! and judges every block at the end. `ironhorn-chaos` runs it by hand;
//! `tests/chaos.rs` runs the quick matrix in the test suite.

pub mod ctx;
pub mod faults;
pub mod nbd;
pub mod relay;
pub mod rng;
pub mod run;
pub mod scenarios;
pub mod stamp;
pub mod workload;
