//! MPI initialised by someone else — here the program itself, through rsmpi, as mpi4py or
//! a training framework would — is adopted by meshfeed's runtime, not initialised again:
//!
//! * the loader runs its collectives on its own duplicate of `MPI_COMM_WORLD`, so the
//!   program's all-reduces on `MPI_COMM_WORLD`, issued at every step while the loader's
//!   producer thread exchanges windows, neither mix with the loader's nor hang;
//! * when the loader and the runtime are dropped, MPI is still initialised (meshfeed never
//!   finalises MPI it did not initialise): the program keeps using it and finalises it;
//! * with `serialized`, MPI gives only `MPI_THREAD_SERIALIZED`: a loader with a producer
//!   thread is refused with a message saying why, and `prefetch = 0` works.
//!
//! Checks its own results; run under `mpirun -np N target/release/examples/adopt_mpi DATA
//! [multiple|serialized]` with a dataset written by `meshfeed gen`.

use mpi::traits::*;

use meshfeed::config::LoaderOptions;
use meshfeed::loader::Loader;
use meshfeed::runtime::Runtime;
use meshfeed::types::Epoch;
use meshfeed::{Error, Result};

fn check(what: &str, ok: bool) -> Result<()> {
    if ok {
        Ok(())
    } else {
        Err(Error::Verify(what.to_string()))
    }
}

fn run(world: &mpi::topology::SimpleCommunicator, data: &str, serialized: bool) -> Result<String> {
    let runtime = Runtime::mpi(None)?; // adopts: MPI is initialised already
    let size = world.size() as usize;
    let options =
        |prefetch| LoaderOptions { batch_size: 4 * size, window_bytes: 2 << 10, prefetch, ..Default::default() };
    let open = |prefetch| Loader::open(runtime.world(), &[data.into()], Default::default(), options(prefetch));
    if serialized {
        let refused = open(2).err().map(|e| e.to_string()).unwrap_or_default();
        check(
            &format!("a producer thread must be refused under MPI_THREAD_SERIALIZED, got '{refused}'"),
            refused.contains("MPI_THREAD_MULTIPLE"),
        )?;
    }
    let mut loader = open(if serialized { 0 } else { 2 })?;
    let mut steps = 0u64;
    for batch in loader.epoch(Epoch(0)) {
        let batch = batch?;
        check("every rank gets 4 rows", batch.ids().len() == 4)?;
        // The program's own collective on MPI_COMM_WORLD, while the loader's producer
        // thread runs its own on the loader's duplicate.
        let mut sum = 0u64;
        world.all_reduce_into(&(steps + world.rank() as u64), &mut sum, mpi::collective::SystemOperation::sum());
        check("the program's all-reduce", sum == steps * size as u64 + (size * (size - 1) / 2) as u64)?;
        steps += 1;
    }
    check("a whole epoch", steps == loader.steps_per_epoch())?;
    drop(loader);
    drop(runtime);
    check("MPI is still initialised after the runtime is dropped", !mpi::environment::is_finalized())?;
    world.barrier();
    Ok(format!(
        "adopt_mpi: OK: {steps} steps on {size} ranks with the program's all-reduce at each; MPI left initialised"
    ))
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(data), mode) = (args.first(), args.get(1).map(String::as_str).unwrap_or("multiple")) else {
        eprintln!("usage: adopt_mpi DATA_DIR [multiple|serialized]");
        std::process::exit(2);
    };
    let serialized = mode == "serialized";
    let threading = if serialized { mpi::Threading::Serialized } else { mpi::Threading::Multiple };
    let (universe, provided) = mpi::initialize_with_threading(threading).expect("MPI is not initialised yet");
    let world = universe.world();
    let code = match run(&world, data, serialized && provided != mpi::Threading::Multiple) {
        Ok(line) => {
            if world.rank() == 0 {
                println!("{line} (thread level {provided:?})");
            }
            0
        }
        Err(e) => {
            eprintln!("adopt_mpi: rank {}: FAILED: {e}", world.rank());
            1
        }
    };
    drop(universe); // the program finalises MPI, as its owner
    assert!(mpi::environment::is_finalized());
    std::process::exit(code);
}
