//! The Kubeflow MPIJob (launch/k8s/meshfeed-mpijob.yaml) run on the image, on emulated
//! pods, with a worker preempted mid-epoch: the job restarts and resumes exactly.
//!
//! No Kubernetes or container engine runs here. Each pod is one container emulated by
//! tests/launch/pod.sh: the Dockerfile's runtime stage (its files, written out by
//! tests/emulation/recipe.rs; its packages: this machine's, the same Debian release) with
//! the pod's own network namespace on a bridge (10.79.7.0/24), host name, PID namespace
//! and /tmp, the manifest's volumes, as the image's user. The containers run the
//! manifest's own commands, arguments and environment. The test does mpi-operator's part
//! as the operator (v2beta1, OpenMPI) does it:
//!
//! * the job's SSH key (ECDSA P-521) as a secret mounted at sshAuthMountPath: `id_rsa`,
//!   `id_rsa.pub`, `authorized_keys`, root's files of mode 0644;
//! * the hostfile `/etc/mpi/hostfile` on the launcher, one `<job>-worker-<i>.<job>-worker.
//!   <namespace>.svc slots=<slotsPerWorker>` line per worker, names every pod resolves
//!   (the headless Service's DNS: here each pod's /etc/hosts);
//! * the launcher's environment (`OMPI_MCA_orte_default_hostfile`, `..._keep_fqdn_hostnames`,
//!   `..._plm_rsh_args`, `..._set_default_slots`, `K_MPI_JOB_ROLE`);
//! * the workers first, the launcher once they accept connections; a worker pod that ends
//!   is recreated, a launcher that fails is run again (its restartPolicy OnFailure, at
//!   most runPolicy.backoffLimit times); at the end the workers are deleted.
//!
//! The test's own changes to the manifest: the meshfeed arguments after `run` (a small
//! dataset, two epochs, a 2x2 mesh, 150 ms of compute a step, and `--dump` into the state
//! volume, a directory per launcher attempt), the volumes' contents, and
//! `OMPI_MCA_mpi_yield_when_idle=1` for the launcher (4 ranks share 2 cores here).
//!
//! Needs root (namespaces, bind mounts), iproute2, openssh-server and -client, OpenMPI,
//! and the project's .venv (PyYAML reads the manifest).

use std::fs::File;
use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;
use crate::recipe::*;
use serde_json::Value;

/// Keeps these pods' network apart from other tests' (Ray's nodes use 10.78.8.0/24).
const NET: &str = "10.79.7";
const BRIDGE: &str = "mfmb7";
/// The namespace the manifest's objects land in when applied without `-n`.
const NAMESPACE: &str = "default";
/// The worker's sshd port (launch/k8s/mpijob-sshd.conf, mpijob-ssh.conf).
const SSH_PORT: u16 = 2222;

fn sh(args: &[&str]) -> bool {
    Command::new(args[0]).args(&args[1..]).stderr(Stdio::null()).status().is_ok_and(|s| s.success())
}

/// The pods' network: a bridge on the host (NET.1) and one namespace per pod, with a veth
/// named eth0 in the pod, made and removed by launch/netns.sh (every emulation's network).
/// Dropping it kills whatever runs in the pods' namespaces and removes them.
struct Network {
    pods: Vec<String>,
}

/// `bash launch/netns.sh COMMAND ARGS...`; true if it succeeded.
fn netns(command: &str, args: &[&str]) -> bool {
    let script = repo().join("launch/netns.sh");
    let mut all = vec!["bash", script.to_str().unwrap(), command];
    all.extend(args);
    sh(&all)
}

impl Network {
    fn new(max_pods: usize) -> Network {
        let net = Network { pods: (0..max_pods).map(|i| format!("mfmpi7-{i}")).collect() };
        net.teardown(); // what a killed earlier run may have left
        assert!(netns("bridge", &[BRIDGE, &format!("{NET}.1/24")]), "cannot create bridge {BRIDGE} (root? iproute2?)");
        net
    }

    /// Pod `i`'s namespace, with the address NET.<i+2>.
    fn pod(&self, i: usize) -> (String, String) {
        let (ns, veth, ip) = (&self.pods[i], format!("mfmv7-{i}"), format!("{NET}.{}", i + 2));
        assert!(netns("node", &[BRIDGE, ns, &veth, &format!("{ip}/24")]), "cannot create pod {i}'s namespace {ns}");
        (ns.clone(), ip)
    }

    /// How many processes named `comm` run in pod `i`'s network namespace.
    fn processes(&self, i: usize, comm: &str) -> usize {
        let out = Command::new("ip").args(["netns", "pids", &self.pods[i]]).output().unwrap();
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .filter(|p| std::fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c.trim() == comm))
            .count()
    }

    fn teardown(&self) {
        let pods: Vec<&str> = self.pods.iter().map(String::as_str).collect();
        netns("kill", &pods);
        netns("remove", &[&[BRIDGE], &pods[..]].concat());
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        self.teardown();
    }
}

/// The image's account (the runtime stage's `useradd`): its /etc/passwd and /etc/group
/// lines, and its home.
fn image_account() -> (String, String, String) {
    let df = dockerfile();
    let cmds: Vec<String> = df.runtime().all("RUN").flat_map(run_commands).collect();
    let words = |prog: &str| -> Vec<String> {
        let c =
            cmds.iter().find(|c| c.starts_with(&format!("{prog} "))).unwrap_or_else(|| panic!("the image runs {prog}"));
        c.split_whitespace().map(String::from).collect()
    };
    let flag = |w: &[String], f: &str| w.iter().position(|x| x == f).map(|i| w[i + 1].clone());
    let user = words("useradd");
    let group = words("groupadd");
    let (uid, gid) = image_user(df);
    let name = user.last().unwrap().clone();
    assert_eq!(flag(&user, "--uid"), Some(uid.to_string()), "useradd --uid is the USER's");
    assert_eq!(flag(&group, "--gid"), Some(gid.to_string()), "groupadd --gid is the USER's group");
    let home = flag(&user, "--home-dir").expect("useradd --home-dir");
    let shell = flag(&user, "--shell").expect("useradd --shell");
    let group_name = group.last().unwrap();
    (format!("{name}:x:{uid}:{gid}::{home}:{shell}\n"), format!("{group_name}:x:{gid}:\n"), home)
}

/// One pod of the job, running.
struct Pod {
    name: String,
    dir: PathBuf,
    child: Child,
}

impl Pod {
    /// The container's main process, as the host sees it (written by pod.sh).
    fn main_pid(&self) -> i32 {
        let t = Instant::now();
        loop {
            if let Ok(s) = std::fs::read_to_string(self.dir.join("pid")) {
                if let Ok(p) = s.trim().parse() {
                    return p;
                }
            }
            assert!(t.elapsed() < Duration::from_secs(10), "pod {} wrote no pid", self.name);
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// What the kubelet does to a deleted or preempted pod: SIGTERM to the main process.
    fn terminate(&self) {
        // SAFETY: kill(2) with a pid and a signal number; no memory is involved.
        assert_eq!(unsafe { libc::kill(self.main_pid(), libc::SIGTERM) }, 0, "SIGTERM to pod {}", self.name);
    }

    /// The container's exit code, and its output for messages.
    fn wait(&mut self) -> (i32, String) {
        let t = Instant::now();
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            if t.elapsed() > HANG_LIMIT {
                let _ = self.child.kill();
                panic!("pod {} ran for more than {HANG_LIMIT:?}: a hang is a failure", self.name);
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let log = format!("--- pod {} stdout:\n{}--- stderr:\n{}", self.name, self.stdout(), self.stderr());
        (status.code().unwrap_or(-1), log)
    }

    fn stdout(&self) -> String {
        std::fs::read_to_string(self.dir.with_extension("stdout")).unwrap_or_default()
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(self.dir.with_extension("stderr")).unwrap_or_default()
    }
}

/// The emulated cluster's view of the MPIJob: what the operator reads from it.
struct Job {
    doc: Value,
    name: String,
    work: PathBuf,
    image_root: PathBuf,
    net: Network,
    /// Volume claim name -> the host directory that holds the volume.
    claims: Vec<(String, PathBuf)>,
    secret: PathBuf,
    attempts: usize,
}

impl Job {
    fn spec(&self, replica: &str) -> &Value {
        &self.doc["spec"]["mpiReplicaSpecs"][replica]
    }

    fn workers(&self) -> usize {
        self.spec("Worker")["replicas"].as_u64().unwrap() as usize
    }

    fn worker_host(&self, i: usize) -> String {
        format!("{0}-worker-{i}.{0}-worker.{NAMESPACE}.svc", self.name)
    }

    /// Starts pod `index` (0: the launcher, i + 1: worker i) of role `replica`, with
    /// `extra_env` after the manifest's (the operator's) and `args` for the container's.
    fn start(&mut self, replica: &str, index: usize, args: &[String], extra_env: &[(String, String)]) -> Pod {
        let df = dockerfile();
        let spec = self.spec(replica).clone();
        let pod_spec = &spec["template"]["spec"];
        let c = &pod_spec["containers"][0];
        let name =
            if index == 0 { format!("{}-launcher", self.name) } else { format!("{}-worker-{}", self.name, index - 1) };
        self.attempts += 1;
        // pod-<n>-<name>/ (pod.sh's), with the container's output beside it in .stdout, .stderr.
        let dir = self.work.join(format!("pod-{}-{name}", self.attempts));
        let (netns, _) = self.net.pod(index);

        // /etc: hosts (the Service's DNS), the image's account, the launcher's hostfile.
        let etc = dir.join("etc");
        std::fs::create_dir_all(&etc).unwrap();
        let mut hosts = String::from("127.0.0.1 localhost\n");
        hosts += &format!("{NET}.2 {0}-launcher.{0}-worker.{NAMESPACE}.svc {0}-launcher\n", self.name);
        for i in 0..self.workers() {
            hosts += &format!("{NET}.{} {} {}-worker-{i}\n", i + 3, self.worker_host(i), self.name);
        }
        std::fs::write(etc.join("hosts"), hosts).unwrap();
        let (passwd, group, home) = image_account();
        std::fs::write(etc.join("passwd"), std::fs::read_to_string("/etc/passwd").unwrap() + &passwd).unwrap();
        std::fs::write(etc.join("group"), std::fs::read_to_string("/etc/group").unwrap() + &group).unwrap();
        let slots = self.doc["spec"]["slotsPerWorker"].as_u64().unwrap();
        if replica == "Launcher" {
            let hostfile: String =
                (0..self.workers()).map(|i| format!("{} slots={slots}\n", self.worker_host(i))).collect();
            std::fs::create_dir(etc.join("mpi")).unwrap();
            std::fs::write(etc.join("mpi/hostfile"), hostfile).unwrap();
            std::fs::set_permissions(etc.join("mpi/hostfile"), std::fs::Permissions::from_mode(0o444)).unwrap();
        }
        // The image user's home (useradd --create-home), theirs.
        let (uid, gid) = image_user(df);
        let user_home = dir.join("home").join(home.trim_start_matches("/home/"));
        std::fs::create_dir_all(&user_home).unwrap();
        std::os::unix::fs::chown(&user_home, Some(uid), Some(gid)).unwrap();

        let mut cmd = Command::new("bash");
        cmd.arg(repo().join("tests/launch/pod.sh"));
        cmd.arg("-r").arg(&self.image_root).arg("-d").arg(&dir);
        cmd.args(["-n", &netns, "-h", &name, "-u", &format!("{uid}:{gid}")]);
        if let Some(wd) = c["workingDir"].as_str() {
            cmd.args(["-w", wd]);
        }
        // The environment: the image's, HOME, the container's, the operator's.
        let mut env: Vec<(String, String)> = df.runtime().env().into_iter().collect();
        env.push(("HOME".into(), home.clone()));
        for e in c["env"].as_array().into_iter().flatten() {
            let v = e["value"].as_str().unwrap_or_else(|| panic!("{name}: env {} without a value", e["name"]));
            env.push((e["name"].as_str().unwrap().into(), v.into()));
        }
        env.extend(extra_env.iter().cloned());
        for (k, v) in &env {
            cmd.arg("-e").arg(format!("{k}={v}"));
        }
        // Volumes: the claims' directories, and the SSH key secret.
        let volumes = pod_spec["volumes"].as_array().unwrap();
        for m in c["volumeMounts"].as_array().unwrap() {
            let vol = volumes.iter().find(|v| v["name"] == m["name"]).unwrap();
            let claim = vol["persistentVolumeClaim"]["claimName"].as_str().unwrap();
            let host = &self
                .claims
                .iter()
                .find(|(c, _)| c == claim)
                .unwrap_or_else(|| panic!("no volume for claim {claim}"))
                .1;
            let ro = if m["readOnly"] == true { ":ro" } else { "" };
            cmd.arg("-v").arg(format!("{}:{}{ro}", host.display(), m["mountPath"].as_str().unwrap()));
        }
        let ssh = self.doc["spec"]["sshAuthMountPath"].as_str().unwrap();
        cmd.arg("-v").arg(format!("{}:{ssh}:ro", self.secret.display()));
        cmd.arg("--");
        cmd.args(c["command"].as_array().unwrap().iter().map(|a| a.as_str().unwrap()));
        cmd.args(args);
        cmd.stdin(Stdio::null())
            .stdout(File::create(dir.with_extension("stdout")).unwrap())
            .stderr(File::create(dir.with_extension("stderr")).unwrap());
        let child = cmd.spawn().expect("start pod.sh");
        Pod { name, dir, child }
    }

    /// Worker `i`, started as the operator starts it, and accepting SSH connections.
    fn start_worker(&mut self, i: usize) -> Pod {
        let args: Vec<String> = self.spec("Worker")["template"]["spec"]["containers"][0]["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap().to_string())
            .collect();
        let mut pod = self.start("Worker", i + 1, &args, &[("K_MPI_JOB_ROLE".into(), "worker".into())]);
        let addr: SocketAddr = format!("{NET}.{}:{SSH_PORT}", i + 3).parse().unwrap();
        let t = Instant::now();
        while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
            if pod.child.try_wait().unwrap().is_some() {
                let (code, log) = pod.wait();
                panic!("worker {i} ended (exit {code}) before its sshd listened:\n{log}");
            }
            assert!(t.elapsed() < Duration::from_secs(30), "worker {i}'s sshd does not accept connections on {addr}");
            std::thread::sleep(Duration::from_millis(100));
        }
        pod
    }
}

#[test]
fn mpijob_runs_on_the_image_and_resumes_after_a_worker_preemption() {
    let _alone = crate::one_cluster_at_a_time();
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "the pods' namespaces and mounts need root (CI runs as root)");
    let manifest = repo().join("launch/k8s/meshfeed-mpijob.yaml");
    let docs = yaml_docs(&manifest);
    let doc = docs.iter().find(|d| d["kind"] == "MPIJob").expect("an MPIJob").clone();
    let state_claim = docs.iter().find(|d| d["kind"] == "PersistentVolumeClaim").expect("the state claim");
    let state_claim = state_claim["metadata"]["name"].as_str().unwrap().to_string();
    let name = doc["metadata"]["name"].as_str().unwrap().to_string();
    assert_eq!(doc["spec"]["mpiImplementation"], "OpenMPI");
    let slots = doc["spec"]["slotsPerWorker"].as_u64().unwrap() as usize;
    let workers = doc["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"].as_u64().unwrap() as usize;
    let ranks = workers * slots;
    assert_eq!(ranks, 4, "the manifest's 4 ranks (the stream below is for 4)");
    let backoff = doc["spec"]["runPolicy"]["backoffLimit"].as_u64().unwrap() as usize;
    assert_eq!(doc["spec"]["mpiReplicaSpecs"]["Launcher"]["restartPolicy"], "OnFailure");

    // The stream: 101 samples, batch 4: 25 steps an epoch, 2 epochs, on a 2x2 mesh.
    let data = fixtures().join("hdf5");
    let run_args = |data: &str| -> Vec<String> {
        ["--data", data, "--batch-size", "4", "--epochs", "2", "--mesh", "dp=2,tp=2", "--shard", "x=dp,tp"]
            .iter()
            .map(|s| s.to_string())
            .collect()
    };
    let out = tempdir();
    // The uninterrupted stream, under mpirun on this machine.
    let whole = out.path().join("uninterrupted");
    let mut argv = vec!["run".to_string()];
    argv.extend(run_args(data.to_str().unwrap()));
    argv.extend(["--dump".into(), whole.to_str().unwrap().into()]);
    ok(&mpirun(ranks, &argv.iter().map(String::as_str).collect::<Vec<_>>()));
    let want = dump_bytes(&whole, ranks);
    assert_eq!(read_dump(&whole, ranks)[0].len(), 50, "25 steps an epoch, 2 epochs");

    // The volumes: the dataset (read-only), the state (ReadWriteMany, the image's group),
    // and the job's SSH key as mpi-operator's secret mounts it.
    let image = Image::new();
    let (uid, gid) = image_user(dockerfile());
    let state = out.path().join("state-volume");
    std::fs::create_dir(&state).unwrap();
    std::os::unix::fs::chown(&state, Some(uid), Some(gid)).unwrap();
    let secret = out.path().join("ssh-secret");
    std::fs::create_dir(&secret).unwrap();
    let key = secret.join("id_rsa");
    let keygen = Command::new("ssh-keygen")
        .args(["-q", "-t", "ecdsa", "-b", "521", "-N", "", "-C", "", "-f"])
        .arg(&key)
        .status()
        .unwrap();
    assert!(keygen.success(), "ssh-keygen");
    std::fs::copy(secret.join("id_rsa.pub"), secret.join("authorized_keys")).unwrap();
    for f in ["id_rsa", "id_rsa.pub", "authorized_keys"] {
        std::fs::set_permissions(secret.join(f), std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    let data_claim = doc["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v["persistentVolumeClaim"]["claimName"].as_str())
        .find(|c| *c != state_claim)
        .expect("the dataset's claim")
        .to_string();
    let mut job = Job {
        doc: doc.clone(),
        name: name.clone(),
        work: out.path().join("pods"),
        image_root: image.root.clone(),
        net: Network::new(1 + workers),
        claims: vec![(data_claim, data.clone()), (state_claim, state.clone())],
        secret,
        attempts: 0,
    };
    std::fs::create_dir(&job.work).unwrap();

    // The launcher's arguments: the manifest's, with this test's after `run`.
    let launcher_args: Vec<String> = doc["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
        ["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect();
    let np = launcher_args.iter().position(|a| a == "-np").expect("mpirun -np");
    assert_eq!(launcher_args[np + 1], ranks.to_string(), "-np is Worker replicas x slotsPerWorker");
    let run_at = launcher_args.windows(2).position(|w| w == ["meshfeed", "run"]).expect("`meshfeed run`") + 1;
    let launcher_env = |slots: usize| -> Vec<(String, String)> {
        [
            ("K_MPI_JOB_ROLE", "launcher".to_string()),
            ("OMPI_MCA_orte_keep_fqdn_hostnames", "true".into()),
            ("OMPI_MCA_orte_default_hostfile", "/etc/mpi/hostfile".into()),
            ("OMPI_MCA_plm_rsh_args", "-o ConnectionAttempts=10".into()),
            ("OMPI_MCA_orte_set_default_slots", slots.to_string()),
            ("OMPI_MCA_mpi_yield_when_idle", "1".into()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    };
    let dumps = state.join("dumps");
    std::fs::create_dir(&dumps).unwrap();
    std::os::unix::fs::chown(&dumps, Some(uid), Some(gid)).unwrap();
    let launcher_for = |attempt: usize| -> Vec<String> {
        let mut a = launcher_args[..=run_at].to_vec();
        a.extend(run_args("/data"));
        a.extend(["--compute-ms", "150", "--dump", &format!("/state/dumps/attempt-{attempt}")].map(String::from));
        a
    };

    // The workers, then the launcher.
    let mut pods: Vec<Pod> = (0..workers).map(|i| job.start_worker(i)).collect();
    let mut launcher = job.start("Launcher", 0, &launcher_for(0), &launcher_env(slots));

    // A preemption of worker 1 mid-epoch: 2 s after its rank started (about 13 of the 50
    // steps; the dumps are written in blocks, so they cannot tell), the kubelet sends
    // SIGTERM to the pod's main process (mpijob-worker.sh).
    let t = Instant::now();
    while job.net.processes(2, "meshfeed") == 0 {
        if launcher.child.try_wait().unwrap().is_some() {
            let (code, log) = launcher.wait();
            panic!("the launcher ended (exit {code}) before worker 1 ran a rank:\n{log}");
        }
        assert!(t.elapsed() < HANG_LIMIT, "worker 1 runs no rank:\n{}", launcher.stderr());
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_secs(2));
    pods[1].terminate();
    let (code, worker_log) = pods[1].wait();
    assert_eq!(code, 0, "the preempted worker stops its ranks, then sshd, and exits 0:\n{worker_log}");
    assert!(
        worker_log.contains("mpijob-worker.sh: SIGTERM: stopping the ranks here (pids "),
        "worker 1 ran a rank and passed the SIGTERM on to it:\n{worker_log}"
    );
    let (code, log0) = launcher.wait();
    assert_eq!(code, 75, "mpirun exits 75 when the ranks stopped cleanly:\n{log0}");
    assert!(log0.contains("meshfeed mpijob launcher: starting afresh (no /state/state.json yet)"), "{log0}");
    let stops = stop_points(&log0);
    assert_eq!(stops.len(), 1, "rank 0 reports the stop once:\n{log0}");

    // The operator recreates worker 1; the launcher's restartPolicy runs it again.
    pods[1] = job.start_worker(1);
    let mut launcher = job.start("Launcher", 0, &launcher_for(1), &launcher_env(slots));
    let (code, log1) = launcher.wait();
    assert_eq!(code, 0, "the restarted launcher finishes the job:\n{log1}");
    assert!(1 <= backoff, "one launcher restart is within runPolicy.backoffLimit");
    assert!(log1.contains("meshfeed mpijob launcher: resuming from /state/state.json"), "{log1}");
    assert!(
        log1.lines().any(|l| l.starts_with(&format!("meshfeed: done: 2 epoch(s) on {ranks} ranks"))),
        "rank 0's summary:\n{log1}"
    );
    // The job is done: the workers are deleted (cleanPodPolicy Running).
    for (i, p) in pods.iter_mut().enumerate() {
        p.terminate();
        let (code, log) = p.wait();
        assert_eq!(code, 0, "worker {i} ends with its sshd:\n{log}");
    }

    // The ranks ran as the image's user, on the workers; the attempts' dumps, rank by
    // rank, are the uninterrupted stream's, byte for byte, split where rank 0 stopped.
    use std::os::unix::fs::MetadataExt;
    for r in 0..ranks {
        let owner = std::fs::metadata(dumps.join(format!("attempt-1/rank-{r}.jsonl"))).unwrap().uid();
        assert_eq!(owner, uid, "rank {r} ran as uid {owner}, not the image's USER");
    }
    let attempts: Vec<_> =
        (0..2).map(|k| global_batches(&read_dump(&dumps.join(format!("attempt-{k}")), ranks))).collect();
    assert!(!attempts[0].is_empty() && attempts[0].len() < 50, "attempt 0 delivered {} steps", attempts[0].len());
    assert_eq!(attempts[1][0].0, stops[0], "attempt 1 starts where attempt 0 stopped");
    let got: Vec<Vec<u8>> = (0..ranks)
        .map(|r| {
            (0..2).flat_map(|k| std::fs::read(dumps.join(format!("attempt-{k}/rank-{r}.jsonl"))).unwrap()).collect()
        })
        .collect();
    assert!(got == want, "the attempts' dumps joined differ from the uninterrupted run's");
    assert_eq!(state_position(&state.join("state.json")), (2, 0), "the state marks the end");
}
