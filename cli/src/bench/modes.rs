//! The measurements `meshfeed bench --modes` names.

use meshfeed::config::ExchangeMode;
use meshfeed::{Error, Result};

/// One measurement of `meshfeed bench`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// meshfeed's loader with this exchange (`None`: the job's own, `auto` by default).
    /// `Some(Broadcast)` is the single-loader baseline (`naive`).
    Loader(Option<ExchangeMode>),
    /// Every rank reads its own shuffled samples, one read per sample (DistributedSampler).
    RandomAccess,
    /// Sequential reads of each rank's home range.
    ReadLimit,
    /// A bare all-to-all-v of one loader epoch's exchange, window by window.
    ExchangeLimit,
    /// Copying the bytes each rank receives, in window-sized chunks.
    MemcpyLimit,
}

/// Every mode, in the order `--modes all` runs them.
const ALL: [&str; 8] =
    ["meshfeed", "fused", "two-phase", "naive", "random-access", "read-limit", "exchange-limit", "memcpy-limit"];

impl Mode {
    pub fn parse(s: &str) -> Result<Mode> {
        Ok(match s {
            "meshfeed" => Mode::Loader(None),
            "fused" => Mode::Loader(Some(ExchangeMode::Fused)),
            "two-phase" => Mode::Loader(Some(ExchangeMode::TwoPhase)),
            "naive" | "broadcast" => Mode::Loader(Some(ExchangeMode::Broadcast)),
            "random-access" => Mode::RandomAccess,
            "read-limit" => Mode::ReadLimit,
            "exchange-limit" => Mode::ExchangeLimit,
            "memcpy-limit" => Mode::MemcpyLimit,
            other => {
                return Err(Error::Config(format!("--modes: unknown mode '{other}' ({}, or all)", ALL.join(", "))))
            }
        })
    }

    /// `--modes`: a comma-separated list, `all` for every mode; no mode twice.
    pub fn parse_list(names: &[String]) -> Result<Vec<Mode>> {
        let mut modes = Vec::new();
        for name in names {
            let expanded: Vec<&str> = if name == "all" { ALL.to_vec() } else { vec![name.as_str()] };
            for n in expanded {
                let m = Mode::parse(n)?;
                if modes.contains(&m) {
                    return Err(Error::Config(format!("--modes: '{n}' is named twice")));
                }
                modes.push(m);
            }
        }
        if modes.is_empty() {
            return Err(Error::Config("--modes: no mode given".into()));
        }
        Ok(modes)
    }

    /// The name printed and stored in the results (`naive` for the broadcast baseline).
    pub fn name(self) -> &'static str {
        match self {
            Mode::Loader(None) => "meshfeed",
            Mode::Loader(Some(ExchangeMode::Fused)) => "fused",
            Mode::Loader(Some(ExchangeMode::TwoPhase)) => "two-phase",
            Mode::Loader(Some(ExchangeMode::Broadcast)) => "naive",
            Mode::Loader(Some(ExchangeMode::Auto)) => "meshfeed",
            Mode::RandomAccess => "random-access",
            Mode::ReadLimit => "read-limit",
            Mode::ExchangeLimit => "exchange-limit",
            Mode::MemcpyLimit => "memcpy-limit",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_expand_and_refuse_unknown_or_repeated_modes() {
        let list = |s: &str| Mode::parse_list(&s.split(',').map(String::from).collect::<Vec<_>>());
        let all = list("all").unwrap();
        assert_eq!(all.iter().map(|m| m.name()).collect::<Vec<_>>(), ALL);
        assert_eq!(
            list("broadcast,read-limit").unwrap(),
            [Mode::Loader(Some(ExchangeMode::Broadcast)), Mode::ReadLimit]
        );
        assert!(list("fused,bogus").unwrap_err().to_string().contains("unknown mode 'bogus'"));
        assert!(list("fused,all").unwrap_err().to_string().contains("'fused' is named twice"));
    }
}
