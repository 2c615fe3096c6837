//! The benchmark's records and what `meshfeed bench report` makes of them: one result per
//! measurement as a JSON line ([`record::Record`], written by `meshfeed bench --out` and
//! `bench/torch_loader.py`), the suite's table of ratios ([`report`]) and its plots
//! ([`plots`], also drawing `meshfeed report --plots`).

pub mod plots;
pub mod record;
pub mod report;

/// The median of some measurements (the upper one of an even count; 0 for none).
pub fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}
