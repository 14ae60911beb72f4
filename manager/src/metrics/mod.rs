//! `GET /metrics`: the cluster in Prometheus' text format, for scraping, and
//! a volume's live I/O figures for the UI (`GET /v1/volumes/NAME/io`).
//!
//! A scrape reads the objects from the datastore and asks, all at once and
//! each bounded by [`ASK_TIMEOUT`], every running engine for its counters,
//! every running replica for the bytes its store holds and every instance
//! manager for its processes' CPU and memory. Something that does not
//! answer leaves its figures out (an engine shows as
//! `ironhorn_volume_metrics_up 0`); the rest of the page is still served.
//! `families` decides what the page says, `encode` writes it, `rates`
//! turns counters into rates.

pub mod encode;
pub mod families;
pub mod rates;

use std::collections::BTreeMap;
use std::future::Future;
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use ironhorn_proto::engine::MetricsRequest;
use ironhorn_proto::engine::engine_client::EngineClient;
use ironhorn_proto::instance::ListRequest;
use ironhorn_proto::instance::instance_manager_client::InstanceManagerClient;
use ironhorn_proto::replica::InfoRequest;
use ironhorn_proto::replica::replica_client::ReplicaClient;
use kube::ResourceExt;

pub use families::{IoRates, Scrape};
pub use rates::Sampler;

use crate::crd::{Engine, InstanceManager, Node, Replica, Volume};
use crate::datastore::{self, Datastore};

pub const ASK_TIMEOUT: Duration = Duration::from_secs(2);

/// Asks `address` through `ask`, bounded by [`ASK_TIMEOUT`].
async fn ask<C, T, F, Fut>(address: String, connect: fn(tonic::transport::Channel) -> C, ask: F) -> Result<T, String>
where
    F: FnOnce(C) -> Fut,
    Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
{
    let call = async {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{address}"))
            .map_err(|e| e.to_string())?
            .connect()
            .await
            .map_err(|e| e.to_string())?;
        ask(connect(channel)).await.map(tonic::Response::into_inner).map_err(|s| s.message().to_string())
    };
    tokio::time::timeout(ASK_TIMEOUT, call).await.map_err(|_| format!("no answer within {ASK_TIMEOUT:?}"))?
}

/// (volume, engine address) of every running engine.
fn running_engines(engines: &[Engine]) -> Vec<(String, String)> {
    engines
        .iter()
        .filter_map(|e| {
            let status = e.status.as_ref()?;
            (status.current_state == "running" && !status.address.is_empty())
                .then(|| (e.spec.volume_name.clone(), status.address.clone()))
        })
        .collect()
}

/// What every running engine answers now, by volume.
async fn engine_answers(
    engines: &[Engine],
) -> BTreeMap<String, Result<ironhorn_proto::engine::MetricsResponse, String>> {
    let running = running_engines(engines);
    let answers = join_all(running.iter().map(|(_, address)| {
        ask(address.clone(), EngineClient::new, |mut c| async move { c.metrics(MetricsRequest {}).await })
    }))
    .await;
    running.into_iter().map(|(v, _)| v).zip(answers).collect()
}

/// Each engine answer's counters through the sampler: the I/O rates of
/// the latest interval, by volume.
fn io_deltas(
    sampler: &Sampler,
    answers: &BTreeMap<String, Result<ironhorn_proto::engine::MetricsResponse, String>>,
    now: Instant,
) -> BTreeMap<String, rates::Delta> {
    answers
        .iter()
        .filter_map(|(volume, answer)| {
            let m = answer.as_ref().ok()?;
            Some((volume.clone(), sampler.observe(&format!("io/{volume}"), families::io_counters(m), now)?))
        })
        .collect()
}

/// Gathers everything a page needs.
pub async fn gather<D: Datastore>(store: &D, sampler: &Sampler) -> Result<Scrape, datastore::Error> {
    let volumes = store.list::<Volume>().await?;
    let nodes = store.list::<Node>().await?;
    let engines = store.list::<Engine>().await?;
    let replicas = store.list::<Replica>().await?;
    let instance_managers = store.list::<InstanceManager>().await?;

    let running_replicas: Vec<(String, String)> = replicas
        .iter()
        .filter_map(|r| {
            let status = r.status.as_ref()?;
            (status.current_state == "running" && !status.address.is_empty())
                .then(|| (r.name_any(), status.address.clone()))
        })
        .collect();
    let ims: Vec<(String, String)> =
        instance_managers.iter().map(|im| (im.name_any(), im.spec.address.clone())).collect();
    let (engine_answers, replica_infos, im_lists) = tokio::join!(
        engine_answers(&engines),
        join_all(running_replicas.iter().map(|(_, address)| {
            ask(address.clone(), ReplicaClient::new, |mut c| async move { c.info(InfoRequest {}).await })
        })),
        join_all(ims.iter().map(|(_, address)| {
            ask(address.clone(), InstanceManagerClient::new, |mut c| async move { c.list(ListRequest {}).await })
        })),
    );
    let now = Instant::now();
    let replica_used = running_replicas
        .into_iter()
        .zip(replica_infos)
        .filter_map(|((name, _), info)| Some((name, info.ok()?.used_bytes)))
        .collect();
    let im_usage = ims
        .into_iter()
        .zip(im_lists)
        .filter_map(|((name, _), list)| {
            let usage = list.ok()?.usage?;
            let cpu = sampler.observe(&format!("cpu/{name}"), vec![usage.cpu_time_ms], now);
            Some((name, (cpu, usage.rss_bytes)))
        })
        .collect();
    let io = io_deltas(sampler, &engine_answers, now);
    Ok(Scrape {
        volumes,
        nodes,
        engines,
        replicas,
        instance_managers,
        engine_answers,
        io,
        replica_used,
        im_usage,
        passes: crate::controller::PASSES.read(),
        now: jiff::Timestamp::now(),
    })
}

/// The page.
pub async fn page<D: Datastore>(store: &D, sampler: &Sampler) -> Result<String, datastore::Error> {
    Ok(encode::text(families::families(&gather(store, sampler).await?)))
}

/// One volume's I/O rates now (None: it is not attached or its engine did
/// not answer; the rates are zero until a whole interval was seen).
pub async fn volume_io<D: Datastore>(
    store: &D,
    sampler: &Sampler,
    volume: &str,
) -> Result<Option<IoRates>, datastore::Error> {
    let engines: Vec<Engine> =
        store.list::<Engine>().await?.into_iter().filter(|e| e.spec.volume_name == volume).collect();
    let answers = engine_answers(&engines).await;
    if !answers.get(volume).is_some_and(|a| a.is_ok()) {
        return Ok(None);
    }
    let deltas = io_deltas(sampler, &answers, Instant::now());
    Ok(Some(deltas.get(volume).map(IoRates::from_delta).unwrap_or_default()))
}

#[cfg(test)]
mod tests;
