//! Which launcher started this process, and what that means for the transport: the rule
//! of `--transport auto` ([`choose_transport`]) and the sizes the MPI world is checked
//! against ([`launcher_sizes`]).
//!
//! Why (issue 42): with MPI as the only default, each process of a `torchrun` or
//! `meshfeed launch` job initialised MPI alone — N worlds of one rank, each loading every
//! batch — and nothing said so. The launcher's environment tells which launcher it is:
//! MPI launchers hand a process its place through `OMPI_COMM_WORLD_*`, PMI or PMIx
//! variables; torchrun, `meshfeed launch`, Ray and Kubernetes entrypoints through `RANK`
//! and `WORLD_SIZE`. These functions read the environment through a closure, so that they
//! stay pure and are unit-tested on one process.

use crate::config::TransportKind;
use crate::error::{Error, Result};

/// Variables by which an MPI launcher hands a process its place in a job: Open MPI's
/// `mpirun` (`OMPI_COMM_WORLD_SIZE`, and PMIx's), `srun --mpi=pmix` (PMIx's), `srun
/// --mpi=pmi2` and MPICH's Hydra (PMI's). A process with none of them initialises MPI as a
/// singleton: a job of one process, started without a launcher.
pub(crate) const MPI_LAUNCHER_VARS: [&str; 7] =
    ["OMPI_COMM_WORLD_SIZE", "PMIX_NAMESPACE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE", "PMI_FD", "PMI_PORT"];

/// Whether an MPI launcher (mpirun, srun with an MPI plugin) started this process: one of
/// [`MPI_LAUNCHER_VARS`] is set. (`--transport auto` then joins over MPI.)
pub fn launched_by_mpi(var: impl Fn(&str) -> Option<String>) -> bool {
    MPI_LAUNCHER_VARS.iter().any(|v| var(v).is_some())
}

/// Variables by which a launcher without MPI (torchrun, `meshfeed launch`, Ray, a
/// Kubernetes entrypoint) hands a process its place in a job.
const RENDEZVOUS_VARS: [&str; 2] = ["WORLD_SIZE", "RANK"];

/// What a process joins its job over, as [`choose_transport`] decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Choice {
    /// MPI: initialised (or adopted), then its world size checked against the launcher's.
    Mpi,
    /// The TCP rendezvous + UCX, configured from the environment.
    Ucx,
    /// No launcher: a job of one process (an MPI singleton where MPI is built in).
    Alone,
}

/// The transport a process asking for `requested` joins over, given its environment
/// (`var`: a variable's value, `None` when unset) and whether UCX is built in. An
/// explicit `mpi` or `ucx` is taken as asked (MPI's world is checked after it starts,
/// [`launcher_sizes`]). `auto`:
///
/// 1. an MPI launcher's variable ([`MPI_LAUNCHER_VARS`]) → MPI, unless `WORLD_SIZE` is
///    set and disagrees with the MPI launcher's size: refused, naming both (two launchers
///    nested, e.g. `srun --mpi=pmix torchrun`, cannot both be right);
/// 2. else `WORLD_SIZE=1` → alone (a world of one needs no rendezvous, nor its token);
///    else `WORLD_SIZE` or `RANK` → the rendezvous + UCX, refused up front when it cannot
///    work: UCX not built in, no `MESHFEED_JOB_TOKEN`, or under torchrun (its
///    `TORCHELASTIC_RUN_ID`) no `MESHFEED_MASTER_PORT` (torchrun's store holds
///    `MASTER_PORT`);
/// 3. else Slurm's `SLURM_STEP_NUM_TASKS` (srun without an MPI plugin) → MPI, whose check
///    then refuses N singletons;
/// 4. else alone.
pub fn choose_transport(
    requested: TransportKind,
    var: impl Fn(&str) -> Option<String>,
    ucx_built: bool,
) -> Result<Choice> {
    match requested {
        TransportKind::Mpi => return Ok(Choice::Mpi),
        TransportKind::Ucx => return Ok(Choice::Ucx),
        TransportKind::Auto => {}
    }
    let world_size = var("WORLD_SIZE");
    if launched_by_mpi(&var) {
        if let Some(ws) = world_size.as_deref().and_then(|w| w.trim().parse::<usize>().ok()) {
            if let Some((name, n)) =
                launcher_sizes_from(&var).into_iter().find(|&(name, n)| name != "WORLD_SIZE" && n != ws)
            {
                return Err(Error::Config(format!(
                    "WORLD_SIZE={ws} but {name}={n}: an MPI launcher ({name}) and a launcher without MPI \
                     (WORLD_SIZE: torchrun, meshfeed launch, Ray) disagree on the number of processes, so \
                     --transport auto cannot tell which one started this process. Fix: for a job started by \
                     mpirun or srun, pass --transport mpi and unset WORLD_SIZE (or set it to {n}); for one \
                     started by torchrun or meshfeed launch, pass --transport ucx (under srun, with --mpi=none)"
                )));
            }
        }
        return Ok(Choice::Mpi);
    }
    // A world of one (torchrun --nproc-per-node 1, a lone pod) needs no rendezvous.
    if world_size.as_deref().is_some_and(|w| w.trim() == "1") {
        return Ok(Choice::Alone);
    }
    if let Some(set) = RENDEZVOUS_VARS.iter().find(|v| var(v).is_some()) {
        let value = var(set).unwrap_or_default();
        let why = format!(
            "{set}={value} is set and no MPI launcher's variables are, so --transport auto joins the \
             processes over the TCP rendezvous + UCX (as torchrun, meshfeed launch, Ray and Kubernetes \
             start them)"
        );
        if !ucx_built {
            return Err(Error::feature_disabled(
                "ucx",
                format!(
                    "the TCP rendezvous + UCX, which --transport auto picks because {set}={value} is set and \
                     no MPI launcher's variables are (torchrun, meshfeed launch, Ray, Kubernetes); or start \
                     the job with mpirun/srun and --transport mpi"
                ),
            ));
        }
        let fix = "or start the job with mpirun or srun (MPI). Running each process alone instead would \
                   load every batch on each";
        if var("MESHFEED_JOB_TOKEN").is_none_or(|t| t.is_empty()) {
            return Err(Error::Config(format!(
                "{why}, which needs MESHFEED_JOB_TOKEN, a secret every rank of the job shares: it is not \
                 set. Fix: e.g. MESHFEED_JOB_TOKEN=$(openssl rand -hex 16) in the launcher's environment \
                 (under torchrun also MESHFEED_MASTER_PORT, a free port: torchrun's store holds \
                 MASTER_PORT); `meshfeed launch` sets it itself; {fix}"
            )));
        }
        if var("TORCHELASTIC_RUN_ID").is_some() && var("MESHFEED_MASTER_PORT").is_none() {
            return Err(Error::Config(format!(
                "{why}; under torchrun (TORCHELASTIC_RUN_ID is set) MASTER_PORT is torchrun's own store's, \
                 so the rendezvous needs a port of its own: MESHFEED_MASTER_PORT is not set. Fix: set \
                 MESHFEED_MASTER_PORT to a free port in torchrun's environment; {fix}"
            )));
        }
        return Ok(Choice::Ucx);
    }
    if var("SLURM_STEP_NUM_TASKS").is_some() {
        return Ok(Choice::Mpi);
    }
    Ok(Choice::Alone)
}

/// What the launchers' environment says about the number of processes they started, for
/// MPI's world size to be checked against: Open MPI's `mpirun` sets
/// `OMPI_COMM_WORLD_SIZE`; MPICH's and PMI-2 `srun`, `PMI_SIZE`; `srun`,
/// `SLURM_STEP_NUM_TASKS` (the step's tasks), so that a wrong `--mpi` plugin that starts N
/// singletons is refused; torchrun, `meshfeed launch`, Ray and Kubernetes, `WORLD_SIZE`,
/// so that `--transport mpi` under them, N singletons again, is refused (issue 42).
pub fn launcher_sizes() -> Vec<(&'static str, usize)> {
    launcher_sizes_from(|var| std::env::var(var).ok())
}

/// [`launcher_sizes`] from `var` (the environment). Slurm's count is used only when no MPI
/// launcher's is: `mpirun` inside an allocation starts its daemons as an `srun` step (one
/// task per node), and its ranks inherit that step's variables.
pub(crate) fn launcher_sizes_from(var: impl Fn(&str) -> Option<String>) -> Vec<(&'static str, usize)> {
    let size = |name: &'static str| var(name)?.trim().parse().ok().map(|n| (name, n));
    let mut sizes: Vec<(&'static str, usize)> =
        ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE"].into_iter().filter_map(size).collect();
    if sizes.is_empty() {
        sizes.extend(size("SLURM_STEP_NUM_TASKS"));
    }
    sizes.extend(size("WORLD_SIZE"));
    sizes
}

/// Refuses to run when the launcher started a different number of processes than the MPI
/// world has `world` ranks — `launched` is what the launcher's environment says (variable,
/// count: [`launcher_sizes`]). A binary built against one MPI and started by another MPI's
/// `mpirun`, or srun with the wrong PMI plugin, runs as N separate worlds of one rank each,
/// which would silently repeat the whole job N times; so does `--transport mpi` under
/// torchrun or `meshfeed launch` (`WORLD_SIZE`).
pub fn check_launcher(world: usize, launched: &[(&str, usize)]) -> Result<()> {
    for &(var, n) in launched {
        if n != world {
            return Err(Error::Transport(launcher_mismatch(var, n, world)));
        }
    }
    Ok(())
}

/// Why MPI's world of `world` rank(s) is refused when launcher variable `var` says `n`
/// processes were started: the message [`check_launcher`] fails with, naming both sizes,
/// the variable and the fix.
pub fn launcher_mismatch(var: &str, n: usize, world: usize) -> String {
    if var == "WORLD_SIZE" {
        return format!(
            "WORLD_SIZE={n} but MPI_COMM_WORLD has {world} rank(s) (--transport mpi): WORLD_SIZE is set \
             by launchers that start processes without MPI (torchrun, meshfeed launch, Ray, Kubernetes), \
             under which each process joins MPI alone and would load every batch itself. Fix: under such \
             a launcher use --transport auto (the default) or ucx (Python: transport=\"ucx\"); under \
             mpirun or srun, unset WORLD_SIZE or set it to {world}"
        );
    }
    format!(
        "the launcher started {n} processes ({var}) but MPI_COMM_WORLD has {world} rank(s): meshfeed was \
         built against a different MPI than the launcher that started it, or srun used the wrong --mpi \
         plugin"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |v| pairs.iter().find(|(k, _)| *k == v).map(|(_, x)| x.to_string())
    }

    fn auto(pairs: &'static [(&'static str, &'static str)]) -> Result<Choice> {
        choose_transport(TransportKind::Auto, env(pairs), true)
    }

    const TORCHRUN: &[(&str, &str)] = &[
        ("RANK", "1"),
        ("WORLD_SIZE", "2"),
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", "29500"),
        ("TORCHELASTIC_RUN_ID", "abc"),
        ("MESHFEED_JOB_TOKEN", "t"),
        ("MESHFEED_MASTER_PORT", "29611"),
    ];

    #[test]
    fn auto_picks_the_launchers_transport() {
        // mpirun, srun --mpi=pmix / pmi2, MPICH's Hydra: MPI.
        assert_eq!(auto(&[("OMPI_COMM_WORLD_SIZE", "2"), ("OMPI_COMM_WORLD_RANK", "0")]).unwrap(), Choice::Mpi);
        assert_eq!(auto(&[("PMIX_RANK", "0"), ("SLURM_STEP_NUM_TASKS", "4")]).unwrap(), Choice::Mpi);
        assert_eq!(auto(&[("PMI_RANK", "1"), ("PMI_SIZE", "2")]).unwrap(), Choice::Mpi);
        // A script under mpirun that sets WORLD_SIZE for torch.distributed, rightly: MPI.
        assert_eq!(auto(&[("OMPI_COMM_WORLD_SIZE", "4"), ("WORLD_SIZE", "4"), ("RANK", "2")]).unwrap(), Choice::Mpi);
        // meshfeed launch, Ray, Kubernetes: RANK/WORLD_SIZE and a token.
        let launch = &[("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_PORT", "4"), ("MESHFEED_JOB_TOKEN", "t")];
        assert_eq!(auto(launch).unwrap(), Choice::Ucx);
        // torchrun, with meshfeed's token and port: UCX; under srun --mpi=none too.
        assert_eq!(auto(TORCHRUN).unwrap(), Choice::Ucx);
        assert_eq!(
            auto(&[("SLURM_STEP_NUM_TASKS", "1"), ("WORLD_SIZE", "8"), ("MESHFEED_JOB_TOKEN", "t")]).unwrap(),
            Choice::Ucx
        );
        // srun --mpi=none without WORLD_SIZE: MPI, whose world check refuses N singletons.
        assert_eq!(auto(&[("SLURM_STEP_NUM_TASKS", "2")]).unwrap(), Choice::Mpi);
        // A world of one under torchrun or a lone pod, with no token: alone.
        assert_eq!(auto(&[("RANK", "0"), ("WORLD_SIZE", "1"), ("TORCHELASTIC_RUN_ID", "x")]).unwrap(), Choice::Alone);
        // Nothing: alone. Unrelated variables change nothing.
        assert_eq!(auto(&[]).unwrap(), Choice::Alone);
        assert_eq!(auto(&[("MASTER_ADDR", "h"), ("OMPI_ALLOW_RUN_AS_ROOT", "1")]).unwrap(), Choice::Alone);
    }

    #[test]
    fn explicit_transports_are_taken_as_asked() {
        for pairs in [TORCHRUN, &[("OMPI_COMM_WORLD_SIZE", "2")], &[]] {
            assert_eq!(choose_transport(TransportKind::Mpi, env(pairs), true).unwrap(), Choice::Mpi);
            assert_eq!(choose_transport(TransportKind::Ucx, env(pairs), false).unwrap(), Choice::Ucx);
        }
    }

    #[test]
    fn auto_refuses_what_cannot_be_the_right_job() {
        let err = |pairs, ucx| choose_transport(TransportKind::Auto, env(pairs), ucx).unwrap_err().to_string();
        // Two launchers disagreeing on the size: both named, with the fix.
        let e = err(&[("PMIX_RANK", "0"), ("SLURM_STEP_NUM_TASKS", "2"), ("WORLD_SIZE", "8")], true);
        assert!(e.contains("WORLD_SIZE=8 but SLURM_STEP_NUM_TASKS=2") && e.contains("--transport mpi"), "{e}");
        let e = err(&[("OMPI_COMM_WORLD_SIZE", "4"), ("WORLD_SIZE", "2")], true);
        assert!(e.contains("WORLD_SIZE=2 but OMPI_COMM_WORLD_SIZE=4") && e.contains("--transport ucx"), "{e}");
        // torchrun without meshfeed's token, or without its own port.
        let e = err(&[("RANK", "1"), ("WORLD_SIZE", "2"), ("TORCHELASTIC_RUN_ID", "x")], true);
        assert!(e.contains("WORLD_SIZE=2 is set") && e.contains("MESHFEED_JOB_TOKEN") && e.contains("mpirun"), "{e}");
        let e = err(&[("WORLD_SIZE", "2"), ("MESHFEED_JOB_TOKEN", ""), ("RANK", "0")], true);
        assert!(e.contains("MESHFEED_JOB_TOKEN"), "an empty token counts as unset: {e}");
        let e = err(&[("WORLD_SIZE", "2"), ("MESHFEED_JOB_TOKEN", "t"), ("TORCHELASTIC_RUN_ID", "x")], true);
        assert!(e.contains("MESHFEED_MASTER_PORT is not set") && e.contains("torchrun"), "{e}");
        // Without UCX built in: the feature is named, with why auto wanted it.
        let e = err(TORCHRUN, false);
        assert!(e.contains("built without the `ucx` feature") && e.contains("WORLD_SIZE=2"), "{e}");
    }

    #[test]
    fn launcher_sizes_prefer_the_mpi_launchers_over_slurms() {
        let sizes = |pairs| launcher_sizes_from(env(pairs));
        // srun --mpi=pmix: only Slurm's count.
        assert_eq!(sizes(&[("SLURM_STEP_NUM_TASKS", "4")]), vec![("SLURM_STEP_NUM_TASKS", 4)]);
        // mpirun -np 4 inside a 2-node allocation: the ranks inherit the daemons' step.
        assert_eq!(
            sizes(&[("OMPI_COMM_WORLD_SIZE", "4"), ("SLURM_STEP_NUM_TASKS", "2")]),
            vec![("OMPI_COMM_WORLD_SIZE", 4)]
        );
        assert_eq!(sizes(&[("PMI_SIZE", "3"), ("SLURM_STEP_NUM_TASKS", "3")]), vec![("PMI_SIZE", 3)]);
        assert!(sizes(&[]).is_empty());
        // WORLD_SIZE is checked too, whoever else speaks (torchrun, meshfeed launch).
        assert_eq!(sizes(&[("WORLD_SIZE", "2")]), vec![("WORLD_SIZE", 2)]);
        assert_eq!(
            sizes(&[("OMPI_COMM_WORLD_SIZE", "2"), ("WORLD_SIZE", "2")]),
            vec![("OMPI_COMM_WORLD_SIZE", 2), ("WORLD_SIZE", 2)]
        );
    }

    #[test]
    fn a_world_size_mismatch_names_both_sizes_and_the_fix() {
        let m = launcher_mismatch("WORLD_SIZE", 2, 1);
        assert!(m.starts_with("WORLD_SIZE=2 but MPI_COMM_WORLD has 1 rank(s)"), "{m}");
        assert!(m.contains("--transport auto") && m.contains("unset WORLD_SIZE or set it to 1"), "{m}");
        let m = launcher_mismatch("SLURM_STEP_NUM_TASKS", 4, 1);
        assert!(m.contains("started 4 processes (SLURM_STEP_NUM_TASKS)") && m.contains("--mpi plugin"), "{m}");
    }
}
