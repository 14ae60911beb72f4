//! The `Faults` gRPC service: arms and clears device faults of a running
//! replica (see [`crate::faults`]), so tests of whole processes can fail a
//! disk on demand. Registered only when the replica runs with
//! `--fault-injection`.

use std::sync::Arc;
use std::time::Duration;

use ironhorn_proto::replica::faults_server::{Faults as FaultsRpc, FaultsServer};
use ironhorn_proto::replica::{
    self as pb, ArmFaultRequest, ClearFaultsRequest, FaultState, FlipBitsRequest, FlipBitsResponse,
};
use tonic::{Request, Response, Status};

use crate::faults::{Fault, FaultAction, FaultOp, Faults};
use crate::store::Store;

/// Longest delay a fault may add to one operation.
const MAX_DELAY: Duration = Duration::from_secs(60);

/// Most blocks one FlipBits call may damage.
const MAX_FLIPS: u32 = 4096;

pub struct FaultService {
    faults: Arc<Faults>,
    store: Arc<Store>,
}

impl FaultService {
    pub fn new(store: Arc<Store>) -> FaultsServer<Self> {
        FaultsServer::new(Self { faults: store.faults(), store })
    }
}

/// The fault a request describes, or why it describes none.
pub fn fault_of(request: &ArmFaultRequest) -> Result<Fault, String> {
    if request.ops.is_empty() {
        return Err("a fault needs at least one operation (read, write, sync)".into());
    }
    let mut ops = Vec::new();
    for op in &request.ops {
        ops.push(match pb::FaultOp::try_from(*op) {
            Ok(pb::FaultOp::Read) => FaultOp::Read,
            Ok(pb::FaultOp::Write) => FaultOp::Write,
            Ok(pb::FaultOp::Sync) => FaultOp::Sync,
            _ => return Err(format!("unknown fault operation {op}")),
        });
    }
    let delay = Duration::from_millis(request.delay_ms);
    let action = match pb::FaultAction::try_from(request.action) {
        Ok(pb::FaultAction::Eio) => FaultAction::Eio,
        Ok(pb::FaultAction::NoSpace) => FaultAction::NoSpace,
        Ok(pb::FaultAction::Torn) => FaultAction::Torn,
        Ok(pb::FaultAction::Delay) if !delay.is_zero() && delay <= MAX_DELAY => FaultAction::Delay(delay),
        Ok(pb::FaultAction::Delay) => return Err(format!("a delay fault needs 1 to {} ms", MAX_DELAY.as_millis())),
        _ => return Err(format!("unknown fault action {}", request.action)),
    };
    if request.delay_ms != 0 && !matches!(action, FaultAction::Delay(_)) {
        return Err("delay_ms applies only to the delay action".into());
    }
    Ok(Fault::new(&ops, action).skip(request.skip).times(request.times))
}

#[tonic::async_trait]
impl FaultsRpc for FaultService {
    async fn arm(&self, request: Request<ArmFaultRequest>) -> Result<Response<FaultState>, Status> {
        let fault = fault_of(request.get_ref()).map_err(Status::invalid_argument)?;
        tracing::warn!(?fault, "fault armed");
        self.faults.arm(fault);
        Ok(Response::new(FaultState { fired: self.faults.fired() }))
    }

    async fn clear(&self, _: Request<ClearFaultsRequest>) -> Result<Response<FaultState>, Status> {
        let fired = self.faults.fired();
        self.faults.clear();
        tracing::warn!(fired, "faults cleared");
        Ok(Response::new(FaultState { fired }))
    }

    async fn state(&self, _: Request<ClearFaultsRequest>) -> Result<Response<FaultState>, Status> {
        Ok(Response::new(FaultState { fired: self.faults.fired() }))
    }

    async fn flip_bits(&self, request: Request<FlipBitsRequest>) -> Result<Response<FlipBitsResponse>, Status> {
        let r = request.into_inner();
        if r.blocks == 0 || r.blocks > MAX_FLIPS {
            return Err(Status::invalid_argument(format!("blocks must be 1 to {MAX_FLIPS}, not {}", r.blocks)));
        }
        let flipped = self
            .store
            .flip_bits(r.blocks as usize, r.seed, r.offset, r.length, r.sealed_only)
            .await
            .map_err(crate::server::status)?;
        Ok(Response::new(FlipBitsResponse { flipped: flipped.into_iter().map(crate::server::bad_block).collect() }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_map_to_faults_and_bad_ones_are_refused() {
        let request = |ops: Vec<pb::FaultOp>, action: pb::FaultAction, delay_ms: u64| ArmFaultRequest {
            ops: ops.into_iter().map(|o| o as i32).collect(),
            action: action as i32,
            skip: 2,
            times: 1,
            delay_ms,
        };
        let fault = fault_of(&request(vec![pb::FaultOp::Sync], pb::FaultAction::Eio, 0)).unwrap();
        assert_eq!(fault, Fault::new(&[FaultOp::Sync], FaultAction::Eio).skip(2).times(1));
        let delay = fault_of(&request(vec![pb::FaultOp::Read], pb::FaultAction::Delay, 250)).unwrap();
        assert_eq!(delay.action, FaultAction::Delay(Duration::from_millis(250)));
        for bad in [
            request(vec![], pb::FaultAction::Eio, 0),
            request(vec![pb::FaultOp::Unspecified], pb::FaultAction::Eio, 0),
            request(vec![pb::FaultOp::Write], pb::FaultAction::Unspecified, 0),
            request(vec![pb::FaultOp::Write], pb::FaultAction::Delay, 0),
            request(vec![pb::FaultOp::Write], pb::FaultAction::Delay, 61_000),
            request(vec![pb::FaultOp::Write], pb::FaultAction::Eio, 5),
        ] {
            assert!(fault_of(&bad).is_err(), "{bad:?} must be refused");
        }
    }
}
