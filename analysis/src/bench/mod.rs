//! The benchmark's records and what `meshfeed bench report` makes of them: one result per
//! measurement as a JSON line ([`record::Record`], written by `meshfeed bench --out` and
//! `bench/torch_loader.py`), the suite's table of ratios ([`suite`]) and its plots
//! ([`plots`], also drawing `meshfeed report --plots`).

pub mod plots;
pub mod record;
pub mod suite;
