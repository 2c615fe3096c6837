//! How a `run` shows its progress: a bar where a person is looking, else a line now and
//! then (text, or JSON with `--json`) that a log keeps readable.
//!
//! Where a person looks is not simply "stderr is a terminal" (issue 42): `mpirun` (Open
//! MPI) gives every rank a pipe for stderr and a pseudo-terminal of its own for stdout,
//! whatever `mpirun` itself writes to (a terminal, a pipe, a batch job's file). So rank 0
//! draws on stderr where that is a terminal; else on stdout where that is one and, under
//! Open MPI, where the launcher's own stdout (rank 0's parent: mpirun, or the daemon that
//! started the rank) is a terminal too. Everywhere else no bar is drawn, and rank 0
//! prints a progress line every `--heartbeat` seconds instead.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressFinish, ProgressStyle};

/// Where rank 0 draws its progress bar, if anywhere.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Screen {
    Stderr,
    Stdout,
}

impl Screen {
    /// The terminal a person is looking at, if any (see the module's docs).
    pub fn find() -> Option<Screen> {
        if std::io::stderr().is_terminal() {
            return Some(Screen::Stderr);
        }
        let open_mpi = std::env::var_os("OMPI_COMM_WORLD_SIZE").is_some();
        if std::io::stdout().is_terminal() && (!open_mpi || launcher_stdout_is_terminal()) {
            return Some(Screen::Stdout);
        }
        None
    }

    /// A bar for one epoch of `steps` steps, drawn here; dropped (an error ends the epoch),
    /// it is cleared, so that the error's line is not written after it.
    pub fn bar(self, steps: u64, epoch: u64) -> ProgressBar {
        let target = match self {
            Screen::Stderr => ProgressDrawTarget::stderr(),
            Screen::Stdout => ProgressDrawTarget::stdout(),
        };
        let bar = ProgressBar::with_draw_target(Some(steps), target)
            .with_style(
                ProgressStyle::with_template("epoch {prefix} [{bar:30}] {pos}/{len} steps {per_sec} eta {eta}")
                    .expect("valid template")
                    .progress_chars("=> "),
            )
            .with_finish(ProgressFinish::AndClear);
        bar.set_prefix(epoch.to_string());
        bar
    }
}

/// The progress bar of one epoch on `screen` (rank 0, text output), or a hidden one.
pub fn epoch_bar(screen: Option<Screen>, steps: u64, epoch: u64) -> ProgressBar {
    match screen {
        Some(s) => s.bar(steps, epoch),
        None => ProgressBar::hidden(),
    }
}

/// Whether the stdout of this process's parent is a terminal: under Open MPI the parent
/// is the launcher that forwards the rank's output (`mpirun` for ranks on its own host).
/// A terminal is a character device of a terminal's major number: the console and serial
/// lines (4, 5) or a pseudo-terminal (136-143); `/dev/null`, also a character device
/// (major 1), is none.
fn launcher_stdout_is_terminal() -> bool {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let fd = format!("/proc/{}/fd/1", std::os::unix::process::parent_id());
    match std::fs::metadata(fd) {
        Ok(m) if m.file_type().is_char_device() => is_terminal_major(libc::major(m.rdev())),
        _ => false,
    }
}

/// Whether a character device of this major number is a terminal (Linux's
/// Documentation/admin-guide/devices.txt).
fn is_terminal_major(major: u32) -> bool {
    matches!(major, 4 | 5 | 136..=143)
}

/// A heartbeat line of the loader (JSON: `epoch`, `step`, `steps`, `elapsed_s`,
/// `samples_per_s`, `wait_fraction`) as a line of text for a person reading a log:
/// `meshfeed: epoch 0 step 12/25, 3.0 s, 480 samples/s, waiting for data 5% of the time`.
/// A line that is not such JSON is passed on as it is.
pub fn heartbeat_text(json: &str) -> String {
    let Ok(v) = serde_json::from_str::<serde_json::Value>(json) else { return json.to_string() };
    let number = |k: &str| v[k].as_f64();
    match (v["epoch"].as_u64(), v["step"].as_u64(), v["steps"].as_u64(), number("elapsed_s")) {
        (Some(epoch), Some(step), Some(steps), Some(elapsed)) => {
            let mut text = format!("meshfeed: epoch {epoch} step {step}/{steps}, {elapsed:.1} s");
            if let Some(rate) = number("samples_per_s") {
                text.push_str(&format!(", {rate:.0} samples/s"));
            }
            if let Some(wait) = number("wait_fraction") {
                text.push_str(&format!(", waiting for data {:.0}% of the time", wait * 100.0));
            }
            text
        }
        _ => json.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_heartbeat_reads_as_text() {
        let line = r#"{"heartbeat":true,"epoch":1,"step":12,"steps":25,"elapsed_s":3.04,"samples_per_s":479.6,"wait_fraction":0.052}"#;
        assert_eq!(
            heartbeat_text(line),
            "meshfeed: epoch 1 step 12/25, 3.0 s, 480 samples/s, waiting for data 5% of the time"
        );
        // A beat before any time was measured has no waiting part.
        let line = r#"{"heartbeat":true,"epoch":0,"step":1,"steps":4,"elapsed_s":0.0,"samples_per_s":0.0,"wait_fraction":null}"#;
        assert_eq!(heartbeat_text(line), "meshfeed: epoch 0 step 1/4, 0.0 s, 0 samples/s");
        assert_eq!(heartbeat_text("not json"), "not json");
    }

    #[test]
    fn terminals_are_told_from_other_character_devices() {
        // /dev/null (1), /dev/tty (5), a pseudo-terminal (136), a serial line (4).
        assert!(!is_terminal_major(1));
        assert!(is_terminal_major(5) && is_terminal_major(136) && is_terminal_major(4));
        assert!(!is_terminal_major(10)); // misc devices
    }
}
