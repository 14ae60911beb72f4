//! `ironhorn-trim-latency`: how a large trim disturbs other writes on the
//! same store. Every block of the range to trim is written (so mapped);
//! then a writer at queue depth 1 writes 4 KiB
//! blocks outside that range, first alone (baseline), then while one trim
//! of the whole range runs. Prints write latency percentiles of both phases
//! side by side, with ratios.
//!
//!     cargo run --release -p ironhorn-replica --bin ironhorn-trim-latency -- [--dir DIR] [--trim 4GiB]

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use ironhorn_replica::device::StoreLocation;
use ironhorn_replica::parse_size;
use ironhorn_replica::store::{Store, StoreConfig};

#[derive(Parser)]
struct Args {
    #[arg(long, default_value = "/var/tmp")]
    dir: PathBuf,
    /// Bytes trimmed in one request.
    #[arg(long, value_parser = parse_size, default_value = "4GiB")]
    trim: u64,
    /// Seconds of the baseline phase.
    #[arg(long, default_value_t = 3)]
    seconds: u64,
}

const BLOCK: u64 = 4096;
/// Where the latency writer writes: past the trimmed range.
const WRITER_SPAN: u64 = 256 << 20;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// QD1 4 KiB writes past `base` until `stop`; their latencies. `done`
/// counts them as they complete.
async fn writer(store: Arc<Store>, base: u64, stop: Arc<AtomicBool>, done: Arc<AtomicU64>) -> Vec<Duration> {
    let data = vec![0x5au8; BLOCK as usize];
    let mut latencies = Vec::new();
    let mut i = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let offset = base + (i * 7919 % (WRITER_SPAN / BLOCK)) * BLOCK;
        let started = Instant::now();
        store.write(1, offset, &data, false).await.expect("write");
        latencies.push(started.elapsed());
        done.fetch_add(1, Ordering::SeqCst);
        i += 1;
    }
    latencies
}

async fn run(args: Args) -> Result<(), String> {
    let path = args.dir.join(format!("ironhorn-trim-latency-{}.img", std::process::id()));
    let size = args.trim + WRITER_SPAN;
    let config = StoreConfig::new(StoreLocation::File(path.clone()), size);
    let store = Arc::new(Store::open(&config).await.map_err(|e| e.to_string())?);
    let result = measure(&args, store.clone()).await;
    store.close().await.map_err(|e| e.to_string())?;
    std::fs::remove_file(&path).map_err(|e| e.to_string())?;
    result
}

async fn measure(args: &Args, store: Arc<Store>) -> Result<(), String> {
    // Map every block of the range to trim: 1 MiB writes, 8 at once.
    const FILL: u64 = 1 << 20;
    let data = Arc::new(vec![0xa5u8; FILL as usize]);
    let mapped = args.trim / BLOCK;
    let mut tasks = tokio::task::JoinSet::new();
    for lane in 0..8u64 {
        let (store, data, chunks) = (store.clone(), data.clone(), args.trim / FILL);
        tasks.spawn(async move {
            let mut n = lane;
            while n < chunks {
                store.write(1, n * FILL, &data, false).await.expect("fill");
                n += 8;
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    store.flush().await.map_err(|e| e.to_string())?;

    let stop = Arc::new(AtomicBool::new(false));
    let baseline = tokio::spawn(writer(store.clone(), args.trim, stop.clone(), Arc::default()));
    tokio::time::sleep(Duration::from_secs(args.seconds)).await;
    stop.store(true, Ordering::Relaxed);
    let mut baseline = baseline.await.map_err(|e| e.to_string())?;

    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let during = tokio::spawn(writer(store.clone(), args.trim, stop.clone(), done.clone()));
    // The trim starts once the writer is writing.
    while done.load(Ordering::SeqCst) < 10 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let before_trim = done.load(Ordering::SeqCst) as usize;
    let started = Instant::now();
    store.trim(1, 0, args.trim).await.map_err(|e| e.to_string())?;
    let trim_took = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    let mut during = during.await.map_err(|e| e.to_string())?.split_off(before_trim);

    baseline.sort();
    during.sort();
    println!(
        "trim of {} MiB ({mapped} blocks mapped) took {:.2} s; QD1 4 KiB writes: {} alone, {} during the trim",
        args.trim >> 20,
        trim_took.as_secs_f64(),
        baseline.len(),
        during.len()
    );
    println!("| write latency | alone (µs) | during trim (µs) | ratio |");
    println!("|---|---:|---:|---:|");
    for (name, p) in [("p50", 0.5), ("p99", 0.99), ("max", 1.0)] {
        let (a, b) = (percentile(&baseline, p), percentile(&during, p));
        let ratio = b.as_secs_f64() / a.as_secs_f64().max(1e-9);
        println!("| {name} | {} | {} | {ratio:.1} |", a.as_micros(), b.as_micros());
    }
    Ok(())
}

fn main() {
    let args = Args::parse();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    if let Err(e) = runtime.block_on(run(args)) {
        eprintln!("ironhorn-trim-latency: {e}");
        std::process::exit(1);
    }
}
