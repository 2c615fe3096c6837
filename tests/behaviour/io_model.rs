//! The read planner's cost model (`meshfeed::plan::io::predict`) against the cold-storage
//! benchmark's measurements, committed in `docs/perf/cold/results.jsonl`
//! (`bash bench/run.sh --cold`): for every meshfeed run on throttled storage, the model
//! given the storage's measured sequential rate, its read rate and the run's memory budget
//! predicts the first epoch and the later ones within 1.5× of what was measured. Left out:
//! the spill tier's later epochs (the model assumes an NVMe device's random reads,
//! `SPILL_BYTES_PER_S`, which the benchmark's loop device is not), later epochs the page
//! cache served in good part (the model does not know of it; there it must not be
//! optimistic), and the reference runs on the unthrottled device.

use meshfeed::plan::io::{predict, HostShare, IoInputs, Prediction, StorageRates};
use meshfeed::plan::Strategy;
use serde_json::Value;

const RESULTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/perf/cold/results.jsonl");

/// How far a prediction may be from the measurement, either way.
const WITHIN: f64 = 1.5;

fn records() -> Vec<Value> {
    let text = std::fs::read_to_string(RESULTS).unwrap_or_else(|e| panic!("{RESULTS}: {e}"));
    text.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{RESULTS}: {e}: {l}"))).collect()
}

fn strategy(epoch: &Value) -> Strategy {
    match epoch["read_strategy"].as_str().unwrap() {
        "resident" => Strategy::Resident,
        "random" => Strategy::Random,
        "passes" => Strategy::Passes { passes: epoch["passes"].as_u64().unwrap() },
        other => panic!("unknown strategy {other}"),
    }
}

/// The model's prediction for one measured run, from the storage's limits of its dataset.
fn prediction(run: &Value, limit: &Value) -> Prediction {
    let first = &run["epochs"][0];
    let ranks = first["ranks"].as_u64().unwrap() as usize;
    let samples = run["samples"].as_u64().unwrap();
    let host = HostShare {
        ranks: (0..ranks)
            .map(|r| (r, samples / ranks as u64 + u64::from((r as u64) < samples % ranks as u64)))
            .collect(),
        budget: first["memory_budget"].as_u64().unwrap(),
    };
    let kept = first["resident_rows"].as_u64().unwrap();
    let resident: Vec<u64> =
        (0..ranks as u64).map(|r| kept / ranks as u64 + u64::from(r < kept % ranks as u64)).collect();
    let inputs = IoInputs {
        requested: meshfeed::config::ReadStrategy::Auto,
        hosts: vec![host.clone()],
        sample_bytes: run["sample_bytes"].as_u64().unwrap(),
        fixed: true,
        storage: Some(StorageRates {
            bandwidth: limit["sequential"]["bytes_per_s"].as_f64().unwrap(),
            iops: limit["iops"].as_f64().unwrap(),
        }),
        spill: first["spill"].as_bool().unwrap(),
    };
    predict(&inputs, &host, strategy(first), &resident, inputs.spill)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[test]
fn the_cost_model_predicts_the_measured_cold_epochs_within_one_and_a_half_times() {
    let records = records();
    let limit = |r: &Value| {
        records
            .iter()
            .find(|l| l["kind"] == "limit" && l["size"] == r["size"] && l["format"] == r["format"])
            .unwrap_or_else(|| panic!("no storage limit measured for {} {}", r["size"], r["format"]))
    };
    let mut checked = 0;
    let mut misses = Vec::new();
    for run in records.iter().filter(|r| {
        r["kind"] == "run"
            // meshfeed:local reads a copy on the unthrottled device: not this storage.
            && r["loader"].as_str().is_some_and(|l| l.starts_with("meshfeed") && !matches!(l, "meshfeed:today" | "meshfeed:local"))
            && matches!(r["scenario"].as_str(), Some("fits" | "over" | "spill"))
            && r["ok"] == true
            && r["stopped"] != true
    }) {
        let p = prediction(run, limit(run));
        let epochs = run["epochs"].as_array().unwrap();
        let seconds = |e: &Value| e["seconds"].as_f64().unwrap();
        let name = format!("{} {} {} {}", run["size"], run["format"], run["scenario"], run["loader"]);
        let mut check = |what: &str, predicted: f64, measured: f64| {
            let ratio = predicted / measured;
            eprintln!("{name} {what}: predicted {predicted:.2} s, measured {measured:.2} s ({ratio:.2}×)");
            checked += 1;
            if !(1.0 / WITHIN..=WITHIN).contains(&ratio) {
                misses
                    .push(format!("{name} {what}: predicted {predicted:.2} s, measured {measured:.2} s ({ratio:.2}×)"));
            }
        };
        check("epoch 0", p.first_epoch_s, seconds(&epochs[0]));
        // Later epochs, except the spill tier's and those the page cache served in good
        // part: a run that read under two thirds of what the model reads from storage
        // measured the cache too (memory past the budget holds part of the data), which
        // the model leaves out. There it must be pessimistic, never optimistic.
        let later = &epochs[1.min(epochs.len())..];
        if later.is_empty() || epochs[0]["spill"] == true {
            continue;
        }
        let measured = median(later.iter().map(seconds).collect());
        let stored =
            later.iter().map(|e| e["storage_bytes"].as_f64().unwrap()).sum::<f64>() / later.len() as f64;
        if stored >= 2.0 / 3.0 * p.later_storage_bytes {
            check("later epochs", p.later_epoch_s, measured);
        } else {
            assert!(p.later_epoch_s * WITHIN >= measured, "{name}: partly cached epochs slower than predicted");
        }
    }
    assert!(checked >= 10, "only {checked} measured epochs in {RESULTS}");
    assert!(
        misses.is_empty(),
        "{} of {checked} predictions off by more than {WITHIN}×:\n{}",
        misses.len(),
        misses.join("\n")
    );
}
