//! Which ranks share a host, and so a page cache: every rank contributes its host name
//! (`MESHFEED_HOST` when set, else the kernel's host name) to one all-gather, and ranks
//! with the same name are grouped. `MESHFEED_HOST` serves containers on one machine whose
//! host names differ (Kubernetes pods on one node) and tests that pose as several hosts.

use super::api::Transport;
use crate::error::Result;

/// Environment variable naming this process's host; overrides the kernel's host name.
pub const HOST_ENV: &str = "MESHFEED_HOST";

/// The host index of every rank of `comm` (hosts numbered in order of their first rank).
/// Collective.
pub fn host_groups(comm: &dyn Transport) -> Result<Vec<usize>> {
    let names = comm.all_gather(this_host().as_bytes())?;
    Ok(group(&names))
}

/// This process's host name. A process that cannot read it (which never fails on Linux)
/// gets a name of its own, and so shares a host with no other rank: every rank still
/// joins the all-gather.
pub fn this_host() -> String {
    if let Some(name) = std::env::var_os(HOST_ENV) {
        return name.to_string_lossy().into_owned();
    }
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most `buf.len()` bytes into the buffer it is given.
    if unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } != 0 {
        return format!("unnamed host of process {}", std::process::id());
    }
    let len = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..len]).into_owned()
}

/// Numbers distinct names in order of first appearance.
fn group(names: &[Vec<u8>]) -> Vec<usize> {
    let mut seen: Vec<&[u8]> = Vec::new();
    names
        .iter()
        .map(|n| match seen.iter().position(|s| *s == &n[..]) {
            Some(i) => i,
            None => {
                seen.push(n);
                seen.len() - 1
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_with_one_name_share_a_host() {
        let names: Vec<Vec<u8>> = ["b", "a", "b", "c", "a"].iter().map(|s| s.as_bytes().to_vec()).collect();
        assert_eq!(group(&names), vec![0, 1, 0, 2, 1]);
        assert_eq!(group(&[]), Vec::<usize>::new());
    }

    #[test]
    fn one_process_is_on_one_host() {
        let hosts = host_groups(&crate::transport::LocalTransport::new()).unwrap();
        assert_eq!(hosts, vec![0]);
        assert!(!this_host().is_empty());
    }
}
