//! The baseline most users start from: PyTorch's `DistributedSampler`, in Rust. Every rank
//! walks the same global permutation of the epoch (meshfeed's [`Permutation`]) and takes
//! positions `r, r + P, r + 2P, …` of it; its batch `j` is the `j`-th run of `B / P` of
//! them — exactly the samples of meshfeed's step `j` that DistributedSampler would give
//! rank `r`. Each sample is read by its own call to the dataset's reader (one `pread` per
//! field for npy and Arrow, one hyperslab per field for HDF5) and copied into a freshly
//! allocated batch buffer (the collate step). No communication but the timing.

use meshfeed::config::Job;
use meshfeed::dataset::{Dataset, FileReader};
use meshfeed::plan::Permutation;
use meshfeed::transport::{agree, Transport};
use meshfeed::types::SampleId;
use meshfeed::{Error, Result};

use super::record::{sum_u64, Record, Setting};
use super::timed_max;

/// What one rank delivered in an epoch.
struct Delivered {
    samples: u64,
    bytes: u64,
}

/// One rank's epoch: `steps` batches of `per_rank` samples.
fn epoch(
    dataset: &Dataset,
    readers: &mut [Option<Box<dyn FileReader>>],
    perm: &Permutation,
    (rank, ranks): (u64, u64),
    steps: u64,
    per_rank: u64,
) -> Result<Delivered> {
    let global = per_rank * ranks;
    let mut delivered = Delivered { samples: 0, bytes: 0 };
    let mut row_bytes = 0usize;
    for j in 0..steps {
        let mut batch: Vec<u8> = Vec::with_capacity(row_bytes * per_rank as usize);
        for i in 0..per_rank {
            let id = SampleId(perm.apply(j * global + i * ranks + rank));
            let (file, row) = dataset.locate(id);
            let reader = match &mut readers[file] {
                Some(r) => r,
                slot => slot.insert(dataset.open_reader(file)?),
            };
            let chunk = reader.read_rows(&[row])?;
            for f in 0..dataset.fields().len() {
                batch.extend_from_slice(chunk.value(0, f));
            }
        }
        row_bytes = batch.len() / per_rank.max(1) as usize;
        delivered.samples += per_rank;
        delivered.bytes += batch.len() as u64;
        std::hint::black_box(&batch);
    }
    Ok(delivered)
}

pub fn measure(t: &dyn Transport, dataset: &Dataset, job: &Job, setting: &Setting) -> Result<Record> {
    let (rank, ranks) = (t.rank().0 as u64, t.size() as u64);
    let batch = job.loader.batch_size as u64;
    let layout = &job.loader.layout;
    let checked = if layout.mesh.is_some() || !layout.shard.is_empty() || !layout.stages.is_empty() {
        Err(Error::Config(
            "random-access measures the data-parallel pattern (every rank whole samples): run it without \
             --mesh, --shard and --stages"
                .into(),
        ))
    } else if batch % ranks != 0 {
        Err(Error::Config(format!("random-access: the batch size {batch} is not divisible by {ranks} ranks")))
    } else if dataset.is_empty() {
        Err(Error::Config("random-access: the dataset is empty".into()))
    } else {
        Ok(())
    };
    agree(t, checked)?;
    let per_rank = batch / ranks;
    // As the loader's `drop` tail policy: full global batches only.
    let steps = dataset.len() / batch;
    let mut readers: Vec<Option<Box<dyn FileReader>>> = (0..dataset.files().len()).map(|_| None).collect();
    let (seed, shared) = (job.loader.seed, job.loader.shared_order);
    let n = dataset.len();
    // Warm-up epoch 0 (page cache, open files), then timed epochs 1..=epochs.
    agree(t, epoch(dataset, &mut readers, &Permutation::of(n, seed, shared, 0), (rank, ranks), steps, per_rank))?;
    let mut times = Vec::new();
    let mut last = Delivered { samples: 0, bytes: 0 };
    for e in 1..=job.epochs.max(1) {
        let perm = Permutation::of(n, seed, shared, e);
        let (s, d) = timed_max(t, || epoch(dataset, &mut readers, &perm, (rank, ranks), steps, per_rank))?;
        times.push(s);
        last = d;
    }
    let [samples, bytes] = sum_u64(t, [last.samples, last.bytes])?;
    let mut row = setting.record("random-access", &times, samples);
    row.steps_per_epoch = steps;
    row.delivered_bytes = bytes;
    row.bytes_needed = samples * setting.sample_bytes;
    row.gb_per_s = bytes as f64 / 1e9 / row.epoch_s_best.max(1e-9);
    Ok(row)
}
