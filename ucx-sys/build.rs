// Generates bindings to <ucp/api/ucp.h> of the UCX found by pkg-config (Debian 12:
// libucx-dev, UCX 1.13). Only the UCP API is bound: the allowlists below keep the
// bindings to what the transport uses.
fn main() {
    let ucx = pkg_config::Config::new().atleast_version("1.10").probe("ucx").unwrap_or_else(|e| {
        panic!("UCX development files not found ({e}); install libucx-dev or build meshfeed without the `ucx` feature")
    });
    let mut builder = bindgen::Builder::default()
        .header_contents("wrapper.h", "#include <ucp/api/ucp.h>\n")
        .allowlist_function("ucp_.*|ucs_status_string")
        .allowlist_type("ucp_.*|ucs_status_t|ucs_status_ptr_t")
        .allowlist_var("UCP_.*|UCS_.*")
        .rustified_non_exhaustive_enum("ucs_status_t")
        .derive_default(true)
        .layout_tests(false)
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()));
    for p in &ucx.include_paths {
        builder = builder.clang_arg(format!("-I{}", p.display()));
    }
    let bindings = builder.generate().expect("bindgen failed on <ucp/api/ucp.h>");
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    bindings.write_to_file(out.join("bindings.rs")).expect("write bindings");
}
