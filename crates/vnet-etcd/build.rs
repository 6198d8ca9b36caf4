//! Generates the gRPC client of the part of etcd's API that vnet-etcd uses with tonic's code
//! generator, from third_party/etcd/etcd.proto (etcd's own message and service definitions,
//! vendored: see third_party/etcd/README.md); needs `protoc` (Debian's protobuf-compiler,
//! installed by scripts/setup.sh).

const PROTO: &str = "third_party/etcd/etcd.proto";

fn main() {
    println!("cargo:rerun-if-changed={PROTO}");
    if let Err(e) = tonic_prost_build::configure()
        .build_server(false)
        .compile_protos(&[PROTO], &["third_party/etcd"])
    {
        panic!("generating etcd's gRPC client from {PROTO} (is protoc installed? scripts/setup.sh installs protobuf-compiler): {e}");
    }
}
