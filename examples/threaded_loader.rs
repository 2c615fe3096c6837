//! A training job's shape: the loader lives in a struct that is moved to a worker thread
//! and iterated there, while the main thread runs collectives of its own on the world
//! communicator (as a training framework would), concurrently with the loader's producer
//! thread on the loader's duplicate of it. Checks its own results: every epoch delivers
//! each sample of its full batches exactly once over all ranks, every delivered value
//! equals the generator's, and the main thread's all-reduces are all right. Then, back on
//! the main thread: a seek in the middle of an epoch (the producer running ahead is
//! stopped on every rank and restarted) continues exactly as the stream did, and a loader
//! dropped in the middle of an epoch stops without hanging any rank.
//!
//! ```sh
//! meshfeed gen --format npy --samples 2000 --files 3 --field x:f32:4 --field y:i64 --out /tmp/d
//! mpirun -np 4 target/release/examples/threaded_loader /tmp/d          # MPI
//! meshfeed launch -n 4 --exe target/release/examples/threaded_loader -- /tmp/d ucx
//! ```

use std::collections::BTreeSet;
use std::path::PathBuf;

use meshfeed::config::{LoaderOptions, TransportKind};
use meshfeed::dataset::gen;
use meshfeed::loader::Loader;
use meshfeed::runtime::Runtime;
use meshfeed::transport::ReduceOp;
use meshfeed::types::Epoch;
use meshfeed::{Error, Result};

const EPOCHS: u64 = 2;

/// What a training loop owns: its data and what it learned from it.
struct Trainer {
    loader: Loader,
    manifest: gen::Manifest,
    /// Per epoch: the sample ids this rank received.
    seen: Vec<Vec<u64>>,
    values_checked: u64,
}

impl Trainer {
    /// Runs `EPOCHS` epochs, checking every delivered value against the generator.
    fn train(mut self) -> Result<Trainer> {
        let fields = self.loader.dataset().fields().to_vec();
        let mut want = Vec::new();
        for e in 0..EPOCHS {
            self.loader.set_epoch(Epoch(e))?;
            let mut ids = Vec::new();
            for batch in &mut self.loader {
                let batch = batch?;
                for fd in batch.fields() {
                    let fi = fields.iter().position(|f| f.name == fd.field().name).expect("a dataset field");
                    let mi = self.manifest.fields.iter().position(|f| *f == fields[fi]).expect("a generated field");
                    for (row, id) in batch.ids().iter().enumerate() {
                        want.clear();
                        gen::value(&self.manifest.fields, id.0, mi, &mut want);
                        if fd.row(row) != want.as_slice() {
                            return Err(Error::Verify(format!("sample {} field '{}' differs", id.0, fd.field().name)));
                        }
                        self.values_checked += 1;
                    }
                }
                ids.extend(batch.ids().iter().map(|id| id.0));
            }
            self.seen.push(ids);
        }
        Ok(self)
    }
}

fn run(runtime: &Runtime, data: PathBuf) -> Result<String> {
    let world = runtime.world();
    let (rank, size) = (runtime.rank(), world.size());
    let manifest = gen::find_manifest(std::slice::from_ref(&data))?
        .ok_or_else(|| Error::Config(format!("{}: not written by meshfeed gen", data.display())))?;
    let options = LoaderOptions { batch_size: 8 * size, seed: 11, window_bytes: 4 << 10, ..Default::default() };
    let loader = Loader::open(world, &[data], Default::default(), options)?;
    let steps = loader.steps_per_epoch();
    let trainer = Trainer { loader, manifest, seen: Vec::new(), values_checked: 0 };

    // The loader moves to a worker thread; the main thread keeps the world communicator
    // busy meanwhile, as the training framework's own collectives would.
    let worker = std::thread::spawn(move || trainer.train());
    let mut reductions = 0u64;
    for i in 0..200u64 {
        let mut v = [rank as u64 + i];
        world.all_reduce_u64(&mut v, ReduceOp::Sum)?;
        let want = (size * (size - 1) / 2) as u64 + i * size as u64;
        if v[0] != want {
            return Err(Error::Verify(format!("the main thread's all-reduce {i} gave {} instead of {want}", v[0])));
        }
        reductions += 1;
    }
    let Trainer { mut loader, seen, values_checked, .. } =
        worker.join().map_err(|_| Error::Internal("the training thread panicked".into()))??;

    // Stop in the middle of epoch 2 and go back to step 3 of epoch 1: the batches from
    // there on are the ones epoch 1 delivered.
    loader.set_epoch(Epoch(EPOCHS))?;
    for batch in loader.by_ref().take(5) {
        batch?;
    }
    let per_step = seen[1].len() / steps as usize;
    loader.seek(&loader.state_at(meshfeed::loader::Position::new(1, 3)))?;
    let again: Vec<u64> = loader
        .by_ref()
        .map(|b| b.map(|b| b.ids().iter().map(|id| id.0).collect::<Vec<_>>()))
        .collect::<Result<Vec<_>>>()?
        .concat();
    if again != seen[1][3 * per_step..] {
        return Err(Error::Verify("after a seek to epoch 1 step 3 the stream differs from epoch 1's".into()));
    }
    // Drop the loader in the middle of an epoch, with its producer running ahead.
    loader.set_epoch(Epoch(7))?;
    loader.next_batch()?;
    drop(loader);

    // Exactly once over all ranks, per epoch.
    let batch = 8 * size as u64;
    for (e, ids) in seen.iter().enumerate() {
        let mine: Vec<u8> = ids.iter().flat_map(|id| id.to_le_bytes()).collect();
        let all: Vec<u64> = world
            .all_gather(&mine)?
            .iter()
            .flat_map(|b| {
                b.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes"))).collect::<Vec<_>>()
            })
            .collect();
        let distinct: BTreeSet<u64> = all.iter().copied().collect();
        if all.len() as u64 != steps * batch || distinct.len() != all.len() {
            return Err(Error::Verify(format!(
                "epoch {e}: {} rows delivered, {} distinct, {} expected",
                all.len(),
                distinct.len(),
                steps * batch
            )));
        }
    }
    Ok(format!(
        "threaded_loader: OK: {EPOCHS} epochs of {steps} steps on {size} ranks, every sample once per epoch, {values_checked} values checked on rank {rank}, {reductions} all-reduces on the world communicator alongside; a mid-epoch seek continued exactly, a mid-epoch drop returned"
    ))
}

fn main() {
    let mut args = std::env::args().skip(1);
    let Some(data) = args.next() else {
        eprintln!("usage: threaded_loader DATA_DIR [mpi|ucx]");
        std::process::exit(2);
    };
    let kind = match args.next().as_deref().map(str::parse::<TransportKind>).transpose() {
        Ok(k) => k.unwrap_or(TransportKind::Mpi),
        Err(e) => {
            eprintln!("threaded_loader: {e}");
            std::process::exit(2);
        }
    };
    let runtime = match Runtime::from_env(kind) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("threaded_loader: {e}");
            std::process::exit(1);
        }
    };
    runtime.abort_on_panic();
    let code = match run(&runtime, data.into()) {
        Ok(line) => {
            println!("{line}");
            0
        }
        Err(e) => {
            eprintln!("threaded_loader: rank {}: FAILED: {e}", runtime.rank());
            1
        }
    };
    drop(runtime); // finalises MPI
    std::process::exit(code);
}
