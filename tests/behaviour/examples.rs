//! The examples check their own results; here each runs under real `mpirun` and under the
//! UCX launcher at several rank counts, and must report success.

use crate::common::*;

fn generated() -> tempfile::TempDir {
    let dir = tempdir();
    Dataset::gen("npy", 1500).field("x:f32:4").field("y:i64").write(&dir.path().join("d"));
    dir
}

#[test]
fn threaded_loader_over_mpi_and_ucx() {
    let dir = generated();
    let d = dir.path().join("d");
    let d = d.to_str().unwrap();
    let exe = example("threaded_loader");
    for np in [1, 2, 3, 4] {
        let run = mpirun_program(np, &exe, &[d]);
        ok(&run);
        assert_eq!(run.stdout.matches("threaded_loader: OK").count(), np, "{}", run.stdout);
        assert!(run.stdout.contains(&format!("on {np} ranks, every sample once per epoch")), "{}", run.stdout);
    }
    for np in [1, 3, 4] {
        let run = launch_program(np, &exe, &[d, "ucx"]);
        ok(&run);
        assert_eq!(run.stdout.matches("threaded_loader: OK").count(), np, "{}", run.stdout);
    }
}

#[test]
fn adopted_mpi_is_left_initialised_and_its_thread_level_respected() {
    let dir = generated();
    let d = dir.path().join("d");
    let d = d.to_str().unwrap();
    let exe = example("adopt_mpi");
    for np in [1, 2, 4] {
        let run = mpirun_program(np, &exe, &[d, "multiple"]);
        ok(&run);
        assert!(
            run.stdout.contains(&format!("on {np} ranks with the program's all-reduce at each; MPI left initialised")),
            "{}",
            run.stdout
        );
    }
    let run = mpirun_program(2, &exe, &[d, "serialized"]);
    ok(&run);
    assert!(run.stdout.contains("MPI left initialised (thread level Serialized)"), "{}", run.stdout);
}

#[test]
fn transport_conformance_over_mpi_and_ucx() {
    let exe = example("transport_conformance");
    let passed = |run: &Run, kind: &str, np: usize| {
        ok(run);
        assert!(
            run.stdout.contains(&format!("transport_conformance: {kind} on {np} ranks: 81 checks passed")),
            "{}",
            run.stdout
        );
    };
    for np in [1, 2, 3, 4] {
        passed(&mpirun_program(np, &exe, &["mpi"]), "mpi", np);
        passed(&launch_program(np, &exe, &["ucx"]), "ucx", np);
    }
    // Chunked rounds: 64 KiB per round makes the 5 MiB segment hundreds of rounds.
    passed(&mpirun_program(3, &exe, &["mpi", "65536"]), "mpi", 3);
}
