//! Compiles our own copies of the kubelet device plugin API, the
//! PodResources API, the DRA plugin API (v1, v1beta1), the plugin
//! registration API and the DRA resource-health API with protox (pure
//! Rust), so building needs no `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = [
        "proto/deviceplugin_v1beta1.proto",
        "proto/podresources_v1.proto",
        "proto/dra_v1.proto",
        "proto/dra_v1beta1.proto",
        "proto/pluginregistration_v1.proto",
        "proto/drahealth_v1.proto",
    ];
    for p in protos {
        println!("cargo:rerun-if-changed={p}");
    }
    let fds = protox::compile(protos, ["proto"])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(fds)?;
    Ok(())
}
