//! Wire types for ironhorn's gRPC services, generated from `proto/*.proto`.
//! Nothing but generated code lives here.

pub mod replica {
    tonic::include_proto!("ironhorn.replica.v1");
}

pub mod engine {
    tonic::include_proto!("ironhorn.engine.v1");
}
