//! The loader's behaviour tests, in one test binary (one link of the library and its
//! dependencies, not one per file): multi-rank runs under real `mpirun` and the UCX
//! launcher at 1–4 ranks, the mesh, memory bounds, faults, hostile input, the readers'
//! bounds on tools' files, the checks of jobs, reports and sweeps, the I/O model, the
//! examples and the benchmark suite.
//!
//! One module per subject; `cargo test --release --test behaviour -- mesh::` runs one.
//! The deployment emulations (image, MPIJob, Kubernetes, Ray nodes, Slurm) are a tier of
//! their own: tests/emulation, run by tests/ci.sh after this one.

#[path = "../common/mod.rs"]
mod common;

mod bad_input;
mod bench_suite;
mod console;
mod data_faults;
mod default_transport;
mod examples;
mod feeder;
mod hostile;
mod hub;
mod io_model;
mod job_checks;
mod launcher_faults;
mod memory;
mod mesh;
mod readers;
mod reliability;
mod report_checks;
mod run;
mod sweep_checks;
mod ucx;
