//! Generates the gRPC client of the part of etcd's API that vnet-etcd uses
//! (proto/etcd.proto) with tonic's code generator; needs `protoc` (Debian's protobuf-compiler,
//! installed by scripts/setup.sh).

fn main() {
    println!("cargo:rerun-if-changed=proto/etcd.proto");
    if let Err(e) = tonic_prost_build::configure()
        .build_server(false)
        .compile_protos(&["proto/etcd.proto"], &["proto"])
    {
        panic!("generating etcd's gRPC client from proto/etcd.proto (is protoc installed? scripts/setup.sh installs protobuf-compiler): {e}");
    }
}
