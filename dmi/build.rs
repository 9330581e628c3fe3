//! Generates the DMI v1beta1 client and server (both services) from the vendored
//! `proto/v1beta1/api.proto` with protox, a pure-Rust protobuf compiler: no `protoc` needed.
//! `google/protobuf/any.proto` comes with protox; `Any` maps to `prost_types::Any`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    const PROTO: &str = "proto/v1beta1/api.proto";
    println!("cargo:rerun-if-changed={PROTO}");
    let descriptors = protox::compile([PROTO], ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // A fake edgecore or mapper in tests implements only the RPCs it needs.
        .generate_default_stubs(true)
        // `XClient::connect` needs tonic's `transport` feature; we dial unix sockets ourselves.
        .build_transport(false)
        .emit_rerun_if_changed(false)
        .compile_fds(descriptors)?;
    Ok(())
}
