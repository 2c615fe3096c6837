// Tiny by design (as in rsmpi): MPI is found by mpi-sys through `mpicc -show`, HDF5 by
// hdf5-sys through pkg-config. We only record the git revision for `meshfeed --version`.
fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=MESHFEED_GIT_REV");
    let rev = std::env::var("MESHFEED_GIT_REV").unwrap_or_else(|_| "unknown".into());
    println!("cargo:rustc-env=MESHFEED_GIT_REV={rev}");
}
