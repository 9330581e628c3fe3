//! Generates the CRI v1 gRPC client (and server stubs for fakes in tests) from the vendored
//! `proto/api.proto` with protox, a pure-Rust protobuf compiler: no `protoc` on the machine.
//!
//! `proto/api.proto` is k8s.io/cri-api `pkg/apis/runtime/v1/api.proto` (Kubernetes 1.31 era: no
//! gogo imports), byte for byte as shipped in the `k8s-cri` 0.11.0 crate on crates.io. Newer
//! upstream versions only add fields and RPCs; replace the file to update.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    const PROTO: &str = "proto/api.proto";
    println!("cargo:rerun-if-changed={PROTO}");
    let descriptors = protox::compile([PROTO], ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // Every RPC a fake runtime does not implement answers UNIMPLEMENTED.
        .generate_default_stubs(true)
        // The transport helpers (`XClient::connect`) need tonic's `transport` feature; we dial
        // the unix socket ourselves.
        .build_transport(false)
        .emit_rerun_if_changed(false)
        .compile_fds(descriptors)?;
    Ok(())
}
