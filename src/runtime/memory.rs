//! How much memory this process may really use: the tightest cgroup memory limit above it
//! (cgroup v1 or v2 — what Slurm's `--mem`, Kubernetes' `resources.limits.memory` and
//! `docker --memory` set) less what the cgroup already holds that cannot be reclaimed,
//! and never more than the host's available memory (`MemAvailable`).
//!
//! A cgroup limit counts the page cache too, but the kernel reclaims clean file pages
//! before it kills anything; anonymous and shared memory (what the loader's resident data
//! and buffers are) it cannot reclaim without swap. So the headroom is the limit minus the
//! cgroup's usage that is *not* the file LRU — exceeding it is an OOM kill, the worst
//! thing a loader can do to a training job.
//!
//! The parsers are pure functions of the files' text (unit-tested on real samples of v1
//! and v2); [`MemoryLimits::of_this_process`] reads the live files.

use std::path::{Path, PathBuf};

use crate::error::Result;
use crate::transport::Transport;

/// What bounds this process's memory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryLimits {
    /// The tightest memory limit of this process's cgroup and its ancestors (bytes), if
    /// any, and the cgroup directory it was read from.
    pub cgroup: Option<CgroupMemory>,
    /// The host's `MemAvailable` (bytes): free memory plus what can be reclaimed.
    pub available: u64,
}

/// A cgroup's memory limit and what it holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CgroupMemory {
    /// `v1` or `v2`.
    pub version: u8,
    pub dir: PathBuf,
    pub limit: u64,
    /// Usage that is not reclaimable page cache (anonymous, shared memory, kernel).
    pub unreclaimable: u64,
}

impl MemoryLimits {
    /// Bytes this process can still allocate without reaching a cgroup limit or running
    /// the host out of memory.
    pub fn headroom(&self) -> u64 {
        match &self.cgroup {
            Some(c) => c.limit.saturating_sub(c.unreclaimable).min(self.available),
            None => self.available,
        }
    }

    /// Where the headroom comes from, for summaries: `cgroup v1 limit 4.0 GiB (2.1 GiB in
    /// use)` or `MemAvailable`.
    pub fn describe(&self) -> String {
        match &self.cgroup {
            Some(c) if c.limit.saturating_sub(c.unreclaimable) <= self.available => format!(
                "cgroup v{} limit {} ({} in use)",
                c.version,
                crate::plan::io::show_bytes(c.limit),
                crate::plan::io::show_bytes(c.unreclaimable)
            ),
            _ => format!("MemAvailable {}", crate::plan::io::show_bytes(self.available)),
        }
    }

    /// Reads this process's limits from `/proc` and `/sys/fs/cgroup`. Where a file cannot
    /// be read (no cgroup filesystem, a sandbox), that bound is left out; where even
    /// `/proc/meminfo` cannot be read, nothing is known and the headroom is 0.
    pub fn of_this_process() -> MemoryLimits {
        let read = |p: &Path| std::fs::read_to_string(p).ok();
        let available = read(Path::new("/proc/meminfo")).and_then(|t| mem_available(&t)).unwrap_or(0);
        let cgroup = match (read(Path::new("/proc/self/cgroup")), read(Path::new("/proc/self/mountinfo"))) {
            (Some(cgroups), Some(mounts)) => cgroup_memory(&cgroups, &mounts, &read),
            _ => None,
        };
        MemoryLimits { cgroup, available }
    }
}

/// Of the memory a host's ranks may still use when the loader starts, this share (at least
/// [`MIN_MARGIN`]) is left to the rest of the program: the training framework, the model,
/// the allocator's slack. The loader's data takes at most the remainder, less its own
/// pipeline's bound.
pub const MARGIN_FRACTION: f64 = 0.25;
/// See [`MARGIN_FRACTION`].
pub const MIN_MARGIN: u64 = 256 << 20;

/// Every rank's memory headroom (`limits`: this rank's), by rank; ranks of one cgroup
/// report the same. Collective.
pub fn all_headrooms(comm: &dyn Transport, limits: &MemoryLimits) -> Result<Vec<u64>> {
    Ok(comm
        .all_gather(&limits.headroom().to_le_bytes())?
        .iter()
        .map(|b| b.get(..8).map_or(0, |b| u64::from_le_bytes(b.try_into().expect("8 bytes"))))
        .collect())
}

/// The data budget of a host from the headroom of its ranks (the least any reports: ranks
/// of a host normally share one cgroup), for `ranks` ranks each holding up to `pipeline`
/// bytes besides their data (the window pipeline's bound and one streaming read).
pub fn auto_budget(headroom: u64, ranks: usize, pipeline: u64) -> u64 {
    let margin = ((headroom as f64 * MARGIN_FRACTION) as u64).max(MIN_MARGIN);
    headroom.saturating_sub(margin).saturating_sub(pipeline.saturating_mul(ranks as u64))
}

/// `MemAvailable` of `/proc/meminfo`, in bytes.
pub fn mem_available(meminfo: &str) -> Option<u64> {
    meminfo.lines().find_map(|l| {
        let rest = l.strip_prefix("MemAvailable:")?;
        let kb: u64 = rest.trim().trim_end_matches("kB").trim().parse().ok()?;
        kb.checked_mul(1024)
    })
}

/// Limits at or above this are "no limit" (cgroup v1 writes `PAGE_COUNTER_MAX` pages,
/// 9223372036854771712).
const UNLIMITED: u64 = 1 << 62;

/// The memory cgroup of this process from `/proc/self/cgroup` and `/proc/self/mountinfo`,
/// reading the cgroup's files with `read`: v1 where a v1 hierarchy has the memory
/// controller, else v2. `None` where no limit applies.
pub fn cgroup_memory(
    proc_cgroup: &str,
    mountinfo: &str,
    read: &dyn Fn(&Path) -> Option<String>,
) -> Option<CgroupMemory> {
    // v1: "4:memory:/path"; v2: "0::/path".
    let v1 = proc_cgroup.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        controllers.split(',').any(|c| c == "memory").then(|| path.to_string())
    });
    if let Some(path) = v1 {
        let dir = cgroup_dir(mountinfo, &path, |fstype, options| fstype == "cgroup" && has_option(options, "memory"))?;
        let stat = read(&dir.join("memory.stat")).unwrap_or_default();
        // With use_hierarchy (always on since Linux 5.x), `hierarchical_memory_limit` is
        // the tightest limit of the cgroup and its ancestors.
        let limit =
            [stat_value(&stat, "hierarchical_memory_limit"), read_number(read, &dir.join("memory.limit_in_bytes"))]
                .into_iter()
                .flatten()
                .min()
                .filter(|&l| l < UNLIMITED)?;
        let usage = read_number(read, &dir.join("memory.usage_in_bytes")).unwrap_or(0);
        let file =
            ["total_inactive_file", "total_active_file"].iter().filter_map(|k| stat_value(&stat, k)).sum::<u64>();
        return Some(CgroupMemory { version: 1, dir, limit, unreclaimable: usage.saturating_sub(file) });
    }
    let path = proc_cgroup.lines().find_map(|l| l.strip_prefix("0::"))?;
    let dir = cgroup_dir(mountinfo, path, |fstype, _| fstype == "cgroup2")?;
    let mount = mount_point(mountinfo, |fstype, _| fstype == "cgroup2")?;
    // The tightest `memory.max` from the cgroup up to the mount's root.
    let mut limit: Option<(u64, PathBuf)> = None;
    let mut at = Some(dir.as_path());
    while let Some(d) = at.filter(|d| d.starts_with(&mount.0)) {
        if let Some(l) = read_number(read, &d.join("memory.max")).filter(|&l| l < UNLIMITED) {
            if limit.as_ref().is_none_or(|(m, _)| l < *m) {
                limit = Some((l, d.to_path_buf()));
            }
        }
        at = d.parent();
    }
    let (limit, _) = limit?;
    let stat = read(&dir.join("memory.stat")).unwrap_or_default();
    let usage = read_number(read, &dir.join("memory.current")).unwrap_or(0);
    let file = ["inactive_file", "active_file"].iter().filter_map(|k| stat_value(&stat, k)).sum::<u64>();
    Some(CgroupMemory { version: 2, dir, limit, unreclaimable: usage.saturating_sub(file) })
}

fn has_option(options: &str, name: &str) -> bool {
    options.split(',').any(|o| o == name)
}

/// The mount point and root of the first mount whose filesystem type and super options
/// `wanted` accepts. A mountinfo line is `id parent dev root point options [tags] - fstype
/// source superoptions`.
fn mount_point(mountinfo: &str, wanted: impl Fn(&str, &str) -> bool) -> Option<(PathBuf, String)> {
    mountinfo.lines().find_map(|l| {
        let (head, tail) = l.split_once(" - ")?;
        let head: Vec<&str> = head.split(' ').collect();
        let tail: Vec<&str> = tail.split(' ').collect();
        let (root, point) = (*head.get(3)?, *head.get(4)?);
        let (fstype, superoptions) = (*tail.first()?, tail.get(2).copied().unwrap_or(""));
        wanted(fstype, superoptions).then(|| (PathBuf::from(unescape(point)), unescape(root)))
    })
}

/// The directory of cgroup `path` under the mount `wanted` accepts: the mount point plus
/// `path` relative to the mount's root (a container sees its own cgroup as the root).
fn cgroup_dir(mountinfo: &str, path: &str, wanted: impl Fn(&str, &str) -> bool) -> Option<PathBuf> {
    let (point, root) = mount_point(mountinfo, wanted)?;
    let relative = path.strip_prefix(root.as_str()).unwrap_or(path).trim_start_matches('/');
    Some(if relative.is_empty() { point } else { point.join(relative) })
}

/// Mountinfo escapes spaces and the like as `\040`.
fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c)) {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v as char);
            i += 4;
        } else {
            out.push(b[i] as char);
            i += 1;
        }
    }
    out
}

/// A `key value` line of a `memory.stat` file.
fn stat_value(stat: &str, key: &str) -> Option<u64> {
    stat.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// A file holding one number (`max` and unreadable files give `None`).
fn read_number(read: &dyn Fn(&Path) -> Option<String>, path: &Path) -> Option<u64> {
    read(path)?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn files(entries: &[(&str, &str)]) -> impl Fn(&Path) -> Option<String> {
        let map: HashMap<PathBuf, String> = entries.iter().map(|(p, t)| (PathBuf::from(p), t.to_string())).collect();
        move |p: &Path| map.get(p).cloned()
    }

    // Taken from a Debian 12 VM with cgroup v1 controllers and an empty v2 hierarchy.
    const V1_CGROUP: &str = "9:name=systemd:/\n8:pids:/\n7:blkio:/\n4:memory:/process_api/ba9e\n0::/\n";
    const V1_MOUNTS: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
38 31 0:35 / /sys/fs/cgroup/blkio rw,relatime - cgroup cgroup rw,blkio
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    #[test]
    fn v1_reads_the_hierarchical_limit_and_leaves_out_the_page_cache() {
        let dir = "/sys/fs/cgroup/memory/process_api/ba9e";
        let stat = "cache 6789812224\nrss 367235072\nhierarchical_memory_limit 4294967296\ntotal_inactive_file 1000\ntotal_active_file 24\n";
        let read = files(&[
            (&format!("{dir}/memory.stat"), stat),
            (&format!("{dir}/memory.limit_in_bytes"), "9223372036854771712\n"),
            (&format!("{dir}/memory.usage_in_bytes"), "5024\n"),
        ]);
        let c = cgroup_memory(V1_CGROUP, V1_MOUNTS, &read).unwrap();
        assert_eq!(c, CgroupMemory { version: 1, dir: dir.into(), limit: 4 << 30, unreclaimable: 4000 });
        let m = MemoryLimits { cgroup: Some(c), available: 20 << 30 };
        assert_eq!(m.headroom(), (4 << 30) - 4000);
        assert!(m.describe().starts_with("cgroup v1 limit 4.0 GiB"), "{}", m.describe());
        // The host's available memory bounds it too.
        let m = MemoryLimits { available: 1 << 30, ..m };
        assert_eq!((m.headroom(), m.describe()), (1 << 30, "MemAvailable 1.0 GiB".to_string()));
        // No limit anywhere: no cgroup bound.
        let unlimited = stat.replace("4294967296", "9223372036854771712");
        let read = files(&[
            (&format!("{dir}/memory.stat"), &unlimited),
            (&format!("{dir}/memory.limit_in_bytes"), "9223372036854771712\n"),
        ]);
        assert_eq!(cgroup_memory(V1_CGROUP, V1_MOUNTS, &read), None);
    }

    #[test]
    fn v2_takes_the_tightest_ancestor_limit() {
        // A Slurm step under a job with --mem, cgroup v2 (unified at /sys/fs/cgroup).
        let cgroup = "0::/system.slice/slurmstepd.scope/job_42/step_0/user/task_0\n";
        let mounts = "25 1 0:22 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n";
        let job = "/sys/fs/cgroup/system.slice/slurmstepd.scope/job_42";
        let task = format!("{job}/step_0/user/task_0");
        let read = files(&[
            (&format!("{task}/memory.max"), "max\n"),
            (&format!("{job}/step_0/memory.max"), "max\n"),
            (&format!("{job}/memory.max"), "8589934592\n"),
            ("/sys/fs/cgroup/memory.max", "max\n"),
            (&format!("{task}/memory.current"), "3000000\n"),
            (&format!("{task}/memory.stat"), "anon 100\nfile 2999900\nactive_file 1000000\ninactive_file 1999000\n"),
        ]);
        let c = cgroup_memory(cgroup, mounts, &read).unwrap();
        assert_eq!((c.version, c.limit, c.unreclaimable), (2, 8 << 30, 1000));
        assert_eq!(c.dir, PathBuf::from(task));
        // A container sees its own cgroup as the mount's root.
        let mounts = "25 1 0:22 /kubepods/pod1/c1 /sys/fs/cgroup ro - cgroup2 cgroup2 rw\n";
        let read = files(&[("/sys/fs/cgroup/memory.max", "2147483648\n")]);
        let c = cgroup_memory("0::/kubepods/pod1/c1\n", mounts, &read).unwrap();
        assert_eq!((c.dir, c.limit), (PathBuf::from("/sys/fs/cgroup"), 2 << 30));
    }

    #[test]
    fn meminfo_and_escapes() {
        assert_eq!(mem_available("MemTotal: 5 kB\nMemAvailable:   23696148 kB\n"), Some(23696148 * 1024));
        assert_eq!(mem_available("MemTotal: 5 kB\n"), None);
        assert_eq!(unescape(r"/mnt/a\040b"), "/mnt/a b");
        // Whatever this machine has, reading it never fails.
        let here = MemoryLimits::of_this_process();
        assert!(here.headroom() <= here.available);
    }
}
