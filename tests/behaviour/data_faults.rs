//! Data faults (issue 9): files that change under a running job, directory entries the job
//! cannot use, colliding field names, hostile names and shapes, many files under a low
//! open-file limit, and HDF5 files the library cannot decode. Every fault is an agreed
//! error naming the file and the reason on every rank — never zeros, a skip, a panic or a
//! hang; over MPI and over UCX.

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::common::*;

fn data(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Checks a failure every rank agreed on: non-zero exit, no panic, no success line, the
/// root cause printed once holding every needle. Returns rank 0's line.
fn agreed<'a>(t: Transport, run: &'a Run, np: usize, needles: &[&str]) -> &'a str {
    assert_ne!(run.code, 0, "{t:?}: expected failure:\nstdout:\n{}\nstderr:\n{}", run.stdout, run.stderr);
    assert!(!run.stderr.contains("panicked") && !run.stderr.contains("internal error"), "{}", run.stderr);
    assert!(!run.stdout.contains("done:"), "no success line: {}", run.stdout);
    let line = agreed_failure(run, np);
    for n in needles {
        assert!(line.contains(n), "{t:?}: the error lacks '{n}': {line}");
    }
    line
}

/// Starts `meshfeed ARGS` (a `run`) on `np` ranks over `t` without waiting for it, with
/// piped output, as [`Transport::run`] would run it.
fn spawn_run(t: Transport, np: usize, args: &[&str]) -> Child {
    let mut cmd = match t {
        Transport::Mpi => {
            let mut c = Command::new("mpirun");
            c.args(MPIRUN_FLAGS).args(["-np", &np.to_string(), bin()]).args(args);
            c
        }
        Transport::Ucx => {
            let mut c = Command::new(bin());
            c.args(["launch", "-n", &np.to_string(), "--"]).args(args).args(["--transport", "ucx"]);
            c.env("UCX_NET_DEVICES", "lo").env_remove("MESHFEED_JOB_TOKEN");
            c
        }
    };
    cmd.env("HDF5_USE_FILE_LOCKING", "FALSE")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the job")
}

/// Stops a job that failed the test: SIGTERM first, which mpirun and `meshfeed launch`
/// pass on to the ranks (SIGKILL would leave a launcher's ranks running), then SIGKILL.
fn stop(child: &mut Child) {
    // SAFETY: kill(2) with the id of a child this process started and has not reaped.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    for _ in 0..250 {
        if child.try_wait().ok().flatten().is_some() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// Runs a job, calls `during` once rank 0 has printed its first epoch summary (so the job
/// is mid-stream, past the scan), then waits for the job (bounded by the hang limit).
fn run_and_meddle(t: Transport, np: usize, args: &[&str], during: impl FnOnce()) -> Run {
    let start = Instant::now();
    let mut child = spawn_run(t, np, args);
    let (tx, rx) = mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    let out_thread = std::thread::spawn(move || {
        let mut all = String::new();
        for line in std::io::BufReader::new(stdout).lines() {
            let line = line.unwrap_or_default();
            let _ = tx.send(line.clone());
            all.push_str(&line);
            all.push('\n');
        }
        all
    });
    let mut stderr = child.stderr.take().unwrap();
    let err_thread = std::thread::spawn(move || {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut stderr, &mut s).ok();
        s
    });
    // The first epoch summary (a JSON line with "epoch").
    loop {
        match rx.recv_timeout(HANG_LIMIT) {
            Ok(line) if line.starts_with("{\"epoch\"") => break,
            Ok(_) => {}
            Err(_) => {
                stop(&mut child);
                panic!("{t:?}: the job printed no epoch summary (stderr: {})", err_thread.join().unwrap());
            }
        }
    }
    during();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > HANG_LIMIT {
            stop(&mut child);
            panic!("{t:?}: the job hung for more than {HANG_LIMIT:?} after its data changed");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Run {
        code: status.code().unwrap_or(-1),
        stdout: out_thread.join().unwrap(),
        stderr: err_thread.join().unwrap(),
        elapsed: start.elapsed(),
    }
}

/// A long job (many epochs of ~125 steps of 5 ms) over `dir`: it only ends by failing.
fn long_job(dir: &Path) -> Job {
    Job::new(dir).batch(32).epochs(1000).compute_ms(5).json()
}

fn first_file(dir: &Path, ext: &str) -> PathBuf {
    dir.join(format!("part-00000.{ext}"))
}

over_transports! {
    /// A file truncated while the job reads it: every format, every rank exits 1 naming the
    /// file and the change (HDF5 used to deliver zero-filled rows and exit 0). Samples of
    /// 1 KiB and more of .npy, raw, Arrow and contiguous HDF5 files are read by the
    /// receivers on the owner's host straight into their batches (local reads), or, with
    /// those off, straight into send buffers: those too.
    fn a_file_truncated_mid_job_stops_every_rank(t: Transport) {
        let (small, large) = (["x:f32:64", "y:i64"], ["x:f32:1024", "y:i64"]);
        let (local, sent) = ("auto", "off");
        for (format, ext, fields, reads) in [
            ("hdf5", "h5", small, local),
            ("npy", "npy", small, local),
            ("arrow", "arrow", small, local),
            ("raw", "raw", small, local),
            ("npy", "npy", large, local),
            ("raw", "raw", large, local),
            ("arrow", "arrow", large, local),
            ("hdf5", "h5", large, local),
            ("npy", "npy", large, sent),
        ] {
            let out = tempdir();
            Dataset::gen(format, 4000).files(4).fields(fields).write(out.path());
            let victim = first_file(out.path(), ext);
            let before = std::fs::metadata(&victim).unwrap().len();
            let job = long_job(out.path()).opt("--local-reads", reads);
            let run = run_and_meddle(t, 2, &job.argv(), || {
                let f = std::fs::OpenOptions::new().write(true).open(&victim).unwrap();
                f.set_len(before / 2).unwrap();
            });
            let change = format!("changed since the dataset was opened: {before} → {} bytes", before / 2);
            agreed(t, &run, 2, &["part-00000", &change]);
        }
    }

    /// A file rewritten in place with other contents of the same size: the modification
    /// time gives it away.
    fn a_file_rewritten_mid_job_stops_every_rank(t: Transport) {
        for (format, ext, x, reads) in [
            ("hdf5", "h5", "x:f32:64", "auto"),
            ("npy", "npy", "x:f32:64", "auto"),
            ("npy", "npy", "x:f32:1024", "auto"),
            ("npy", "npy", "x:f32:1024", "off"),
        ] {
            let out = tempdir();
            Dataset::gen(format, 4000).files(4).field(x).field("y:i64").write(out.path());
            let victim = first_file(out.path(), ext);
            let len = std::fs::metadata(&victim).unwrap().len() as usize;
            let job = long_job(out.path()).opt("--local-reads", reads);
            let run = run_and_meddle(t, 2, &job.argv(), || {
                use std::os::unix::fs::FileExt;
                let f = std::fs::OpenOptions::new().write(true).open(&victim).unwrap();
                // Zeros over the second half: the header survives, the size does not change.
                f.write_all_at(&vec![0u8; len - len / 2], (len / 2) as u64).unwrap();
            });
            agreed(t, &run, 2, &["part-00000", "changed since the dataset was opened: modified (mtime"]);
        }
    }

    /// A dangling link, a link loop or a FIFO among the files of a `--data` directory is an
    /// error naming it (they used to be skipped silently); a FIFO given directly fails at
    /// once instead of blocking every rank in open().
    fn unusable_entries_of_a_data_directory_are_errors(t: Transport) {
        let out = tempdir();
        Dataset::gen("npy", 40).files(2).field("x:f32:4").write(out.path());
        std::fs::write(out.path().join("README.txt"), "ignored: not a dataset extension").unwrap();
        let link = out.path().join("part-00002.npy");
        std::os::unix::fs::symlink(out.path().join("moved-away.npy"), &link).unwrap();
        agreed(
            t,
            &Job::new(out.path()).batch(4).over(t, 2),
            2,
            &["part-00002.npy", "dangling symbolic link"],
        );
        std::fs::remove_file(&link).unwrap();
        std::os::unix::fs::symlink(&link, &link).unwrap();
        agreed(
            t,
            &Job::new(out.path()).batch(4).over(t, 2),
            2,
            &["part-00002.npy", "symbolic link loop"],
        );
        std::fs::remove_file(&link).unwrap();
        let fifo = out.path().join("part-00002.npy");
        let status = Command::new("mkfifo").arg(&fifo).status().unwrap();
        assert!(status.success());
        for target in [out.path(), fifo.as_path()] {
            let run = Job::new(target).batch(4).over(t, 2);
            agreed(t, &run, 2, &["part-00002.npy", "is a FIFO (named pipe), not a regular file"]);
            assert!(run.elapsed < Duration::from_secs(30), "{t:?}: took {:?}", run.elapsed);
        }
    }

    /// Two Arrow columns of one name: refused at open, naming the file and the field.
    fn arrow_columns_of_one_name_are_refused(t: Transport) {
        let out = tempdir();
        write_arrow_with_duplicate_columns(&out.path().join("dup.arrow"));
        agreed(
            t,
            &Job::new(out.path()).batch(2).over(t, 2),
            2,
            &["dup.arrow", "two fields are named 'x'"],
        );
    }

    /// 3000 files under `ulimit -n 256`: readers are opened on demand and closed least
    /// recently used first, so the job never runs out of file descriptors; --verify checks
    /// every delivered byte.
    fn thousands_of_files_under_a_low_open_file_limit(t: Transport) {
        let out = tempdir();
        Dataset::gen("npy", 6000).files(3000).field("x:u8:16").field("y:i32").write(out.path());
        let job = Job::new(out.path()).batch(64).epochs(2).verify().window("64K");
        let run = under_ulimit(t, 256, 2, &job);
        ok(&run);
        assert_eq!(run.stdout.matches("delivered exactly once").count(), 2, "{}", run.stdout);
    }
}

/// `sh -c 'ulimit -n LIMIT; exec mpirun ... meshfeed JOB'` (or `meshfeed launch`); the
/// job's arguments go through the shell as they are (test paths have no spaces).
fn under_ulimit(t: Transport, limit: u32, np: usize, job: &Job) -> Run {
    let job = job.argv().join(" ");
    let launcher = match t {
        Transport::Mpi => format!("mpirun {} -np {np} {} {job}", MPIRUN_FLAGS.join(" "), bin()),
        Transport::Ucx => format!("{} launch -n {np} -- {job} --transport ucx", bin()),
    };
    let script = format!("ulimit -n {limit} && exec {launcher}");
    let start = Instant::now();
    let out = Command::new("sh")
        .args(["-c", &script])
        .env("HDF5_USE_FILE_LOCKING", "FALSE")
        .env("UCX_NET_DEVICES", "lo")
        .env_remove("MESHFEED_JOB_TOKEN")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let run = finish(out, &script);
    assert!(start.elapsed() < HANG_LIMIT);
    run
}

/// An Arrow IPC file with two columns named `x` (arrow-rs writes it; pyarrow would too).
fn write_arrow_with_duplicate_columns(path: &Path) {
    use std::sync::Arc;

    use arrow_array::{ArrayRef, Int32Array, RecordBatch};
    use arrow_schema::{DataType, Field, Schema};
    let schema = Arc::new(Schema::new(vec![
        Field::new("x", DataType::Int32, false),
        Field::new("y", DataType::Int32, false),
        Field::new("x", DataType::Int32, false),
    ]));
    let col = || Arc::new(Int32Array::from((0..10).collect::<Vec<i32>>())) as ArrayRef;
    let batch = RecordBatch::try_new(schema.clone(), vec![col(), col(), col()]).unwrap();
    let file = std::fs::File::create(path).unwrap();
    let mut w = arrow_ipc::writer::FileWriter::try_new(file, &schema).unwrap();
    w.write(&batch).unwrap();
    w.finish().unwrap();
}

#[test]
fn inspect_json_takes_file_names_that_are_not_utf8() {
    use std::os::unix::ffi::OsStrExt;
    let out = tempdir();
    Dataset::gen("npy", 10).files(1).field("x:f32:2").write(out.path());
    let odd = out.path().join(std::ffi::OsStr::from_bytes(b"part-\xff\xfe.npy"));
    std::fs::rename(out.path().join("part-00000.npy"), &odd).unwrap();
    let run = meshfeed(&["inspect", "--json", "--data", data(out.path())]);
    ok(&run);
    let v: serde_json::Value = serde_json::from_str(&run.stdout).unwrap();
    let file = &v["files"][0];
    assert!(file["path"].as_str().unwrap().ends_with("part-\u{fffd}\u{fffd}.npy"), "{file}");
    let bytes: Vec<u8> = file["path_bytes"].as_array().unwrap().iter().map(|b| b.as_u64().unwrap() as u8).collect();
    assert_eq!(bytes, odd.as_os_str().as_bytes());
    assert_eq!(v["samples"], 10);
    // A UTF-8 name has no path_bytes.
    let plain = tempdir();
    Dataset::gen("npy", 10).files(1).field("x:f32:2").write(plain.path());
    let v: serde_json::Value =
        serde_json::from_str(&meshfeed(&["inspect", "--json", "--data", data(plain.path())]).stdout).unwrap();
    assert!(v["files"][0].get("path_bytes").is_none(), "{v}");
}

#[test]
fn gen_refuses_shapes_whose_size_overflows() {
    let out = tempdir();
    for (format, samples, field, needle) in [
        (
            "npy",
            "10",
            "x:f64:99999999999x99999999999",
            "field 'x': a sample of shape 99999999999x99999999999 is too large",
        ),
        ("npy", "10", "x:u8:4294967296x4294967296", "is too large"),
        // Fits one sample, but not a file of them.
        ("npy", "18446744073709551615", "x:u8:1024x1024", "too large to write"),
        // Arrow lists have an i32 length.
        ("arrow", "1", "x:u8:3000000000", "at most 2147483647 values per dimension"),
    ] {
        let r =
            meshfeed(&["gen", "--format", format, "--samples", samples, "--field", field, "--out", data(out.path())]);
        assert_eq!(r.code, 1, "{field}: {}", r.stderr);
        assert!(r.stderr.contains(needle) && !r.stderr.contains("panicked"), "{field}: {}", r.stderr);
    }
}

/// Writes HDF5 files with h5py: `script` gets `d` (the output directory) and `np`, `h5py`.
fn h5py(dir: &Path, script: &str) {
    let full = format!("import sys, numpy as np, h5py\nd = sys.argv[1]\n{script}\n");
    let out = Command::new(python()).args(["-c", &full, data(dir)]).output().unwrap();
    assert!(out.status.success(), "h5py failed:\n{}", String::from_utf8_lossy(&out.stderr));
}

over_transports! {
    /// A float16 HDF5 dataset names the dataset and the type (it used to say only
    /// "Invalid size of float datatype"); a dataset compressed with a filter this HDF5
    /// library lacks (h5py's lzf) names the dataset and the filter at open, not a failed
    /// read naming a plugin directory.
    fn hdf5_types_and_filters_that_cannot_be_read_are_named(t: Transport) {
        let f16 = tempdir();
        h5py(
            f16.path(),
            "with h5py.File(d + '/half.h5', 'w') as f:\n    f['x'] = np.zeros((20, 4), 'f4')\n    f['h'] = np.zeros(20, 'f2')",
        );
        agreed(
            t,
            &Job::new(f16.path()).batch(2).over(t, 2),
            2,
            &["half.h5", "dataset 'h' has unsupported type 16-bit float", "float16 is not supported"],
        );
        let lzf = tempdir();
        h5py(
            lzf.path(),
            "with h5py.File(d + '/lzf.h5', 'w') as f:\n    f.create_dataset('x', data=np.arange(400, dtype='f4').reshape(100, 4), chunks=(10, 4), compression='lzf')",
        );
        agreed(
            t,
            &Job::new(lzf.path()).batch(2).over(t, 2),
            2,
            &["lzf.h5", "dataset 'x'", "HDF5 filter 32000 (lzf)", "cannot decode", "HDF5_PLUGIN_PATH"],
        );
    }
}

/// Peak RSS and bytes read per epoch (the last epoch's summary) of a 4-rank job.
fn arrow_epoch(data_dir: &Path, window: &str) -> (u64, u64) {
    // Nothing kept in memory: every row is read where a window needs it.
    let job = Job::new(data_dir).batch(32).window(window).epochs(2).json();
    let run = job.opt("--memory-budget", 0).mpirun(4);
    ok(&run);
    let last: serde_json::Value = serde_json::from_str(run.stdout.lines().last().unwrap()).unwrap();
    (last["max_rss_bytes"].as_u64().unwrap(), last["bytes_read"].as_u64().unwrap())
}

fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().metadata().unwrap().len()).sum()
}

/// Arrow reads are proportional to the rows a window needs, not to the record batches
/// holding them: peak RSS stays within the documented bound for data 12× and 48× the
/// window per rank (as for .npy in tests/behaviour/reliability.rs), and an epoch reads at
/// most about twice the dataset (it used to decode every batch a window touched: 60×
/// here).
#[test]
fn arrow_memory_and_reads_are_bounded_by_the_window() {
    let out = tempdir();
    let (tiny, big, bigger) = (out.path().join("tiny"), out.path().join("big"), out.path().join("bigger"));
    let fields = ["x:f32:1024", "t:utf8"];
    Dataset::gen("arrow", 200).files(1).fields(fields).write(&tiny);
    Dataset::gen("arrow", 12000).files(4).fields(fields).write(&big); // 12 MB per rank, 12x the window
    Dataset::gen("arrow", 48000).files(4).fields(fields).write(&bigger); // 48 MB per rank, 48x the window
    let window = 1u64 << 20;
    let (base, _) = arrow_epoch(&tiny, "1M");
    let (b1, read1) = arrow_epoch(&big, "1M");
    let (b2, read2) = arrow_epoch(&bigger, "1M");
    // Prefetch 2 (the default): at most 3 × --window-bytes, with the same slack as npy.
    let bound = base + 3 * window * 3 / 2 + (2 << 20);
    assert!(b1 <= bound && b2 <= bound, "peak RSS {b1} / {b2} bytes exceeds {bound} (baseline {base})");
    assert!(b2 <= b1 + (2 << 20), "4x the data must not need more memory: {b1} → {b2}");
    for (read, dir) in [(read1, &big), (read2, &bigger)] {
        let size = dir_bytes(dir);
        assert!(read <= 2 * size + size / 4, "an epoch read {read} bytes of a {size}-byte dataset");
        assert!(read >= size / 2, "an epoch read only {read} bytes of a {size}-byte dataset");
    }
}
