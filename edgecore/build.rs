//! Generates the CRI v1 gRPC client (and server stubs for fakes in tests) from the vendored
//! `proto/api.proto` with protox, a pure-Rust protobuf compiler: no `protoc` on the machine.

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
