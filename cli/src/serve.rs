//! `meshfeed serve`: one read of a dataset for many jobs (the library's `feed`).

use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::Arc;

use meshfeed::dataset::DatasetOptions;
use meshfeed::feed::server::Feeder;
use meshfeed::feed::{new_token, Source, RENDEZVOUS_SUFFIX, TOKEN_VAR};
use meshfeed::{Error, Result};

#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    /// Dataset files or directories, as for `meshfeed run`.
    #[arg(long, num_args = 1.., required = true, value_name = "PATH")]
    pub data: Vec<PathBuf>,
    /// HDF5 group that holds the datasets (default: the file root).
    #[arg(long, value_name = "GROUP")]
    pub group: Option<String>,
    /// The name clients ask for (default: the first data path's last component).
    #[arg(long)]
    pub name: Option<String>,
    /// Where to listen: HOST:PORT (port 0: any free port; the rendezvous file tells which).
    #[arg(long, default_value = "127.0.0.1:0", value_name = "HOST:PORT")]
    pub listen: String,
    /// The host name clients reach this feeder by, where it differs from the listening
    /// address (listening on 0.0.0.0) [default: this host's name].
    #[arg(long, value_name = "HOST")]
    pub advertise: Option<String>,
    /// Where to write the rendezvous file clients give as their data path (the address,
    /// the name and the token; readable by its owner only) [default: NAME.feeder.json].
    #[arg(long, value_name = "FILE")]
    pub rendezvous: Option<PathBuf>,
    /// One JSON line when serving starts, instead of text.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: ServeArgs) -> Result<()> {
    let name = match &args.name {
        Some(n) => n.clone(),
        None => args.data[0]
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .ok_or_else(|| Error::Config("--name is needed: the data path has no last component".into()))?,
    };
    if name.is_empty() || name.contains('/') {
        return Err(Error::Config(format!("--name '{name}': a name is non-empty and has no '/'")));
    }
    let token = match std::env::var(TOKEN_VAR) {
        Ok(t) if !t.is_empty() => t,
        _ => new_token()?,
    };
    // Bind first: a port in use is an error before minutes of loading.
    let listener =
        TcpListener::bind(&args.listen).map_err(|e| Error::Config(format!("--listen {}: {e}", args.listen)))?;
    let bound = listener.local_addr().map_err(|e| Error::Transport(format!("listening socket: {e}")))?;
    let host = match (&args.advertise, bound.ip().is_unspecified()) {
        (Some(h), _) => h.clone(),
        (None, true) => hostname()?,
        (None, false) => bound.ip().to_string(),
    };
    let options = DatasetOptions { hdf5_group: args.group.clone(), ..Default::default() };
    let feeder = Feeder::load(&args.data, options, &name, token.clone())?;
    let (bytes, took) = feeder.loaded();
    let source = Source { address: format!("{host}:{}", bound.port()), name: name.clone(), token };
    let rendezvous = args.rendezvous.clone().unwrap_or_else(|| PathBuf::from(format!("{name}{RENDEZVOUS_SUFFIX}")));
    source.write(&rendezvous)?;
    if args.json {
        let v = serde_json::json!({
            "kind": "serving", "name": name, "url": source.url(), "rendezvous": rendezvous,
            "samples": feeder.samples(), "files": feeder.files(), "bytes_read": bytes, "load_s": took.as_secs_f64(),
        });
        out!("{v}");
    } else {
        out!(
            "meshfeed serve: {name}: {} samples in {} files, {bytes} bytes read in {:.2} s; serving at {} \
             (rendezvous file {})",
            feeder.samples(),
            feeder.files(),
            took.as_secs_f64(),
            source.url(),
            rendezvous.display()
        );
    }
    Arc::new(feeder).serve(listener)
}

fn hostname() -> Result<String> {
    let name =
        std::fs::read_to_string("/proc/sys/kernel/hostname").map_err(|e| Error::io("/proc/sys/kernel/hostname", e))?;
    Ok(name.trim().to_string())
}
