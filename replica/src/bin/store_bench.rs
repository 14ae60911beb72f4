//! `ironhorn-store-bench`: 4 KiB random write and read IOPS of the replica's
//! block store (io_uring backend, O_DIRECT, in-process, no network) beside
//! fio with io_uring and O_DIRECT on a file of the same size on the same
//! filesystem, in one run, printed as a table with ratios.
//!
//!     cargo run --release -p ironhorn-replica --bin ironhorn-store-bench -- [--dir DIR] [--size 1GiB] [--seconds 10] [--iodepth 32]

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use ironhorn_replica::device::StoreLocation;
use ironhorn_replica::io::BackendKind;
use ironhorn_replica::parse_size;
use ironhorn_replica::store::{Store, StoreConfig};

#[derive(Parser, Clone)]
struct Args {
    /// Directory for the test files (same filesystem for both).
    #[arg(long, default_value = "/var/tmp")]
    dir: PathBuf,
    #[arg(long, value_parser = parse_size, default_value = "1GiB")]
    size: u64,
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    #[arg(long, default_value_t = 32)]
    iodepth: usize,
}

const BLOCK: u64 = 4096;

/// Runs fio; `timed` runs for `args.seconds`, otherwise one pass over the file.
fn fio(file: &str, rw: &str, bs: &str, timed: bool, args: &Args) -> Result<f64, String> {
    let mut cmd = Command::new("fio");
    cmd.args([
        "--name=bench",
        &format!("--filename={file}"),
        &format!("--size={}", args.size),
        &format!("--rw={rw}"),
        &format!("--bs={bs}"),
        "--direct=1",
        "--ioengine=io_uring",
        &format!("--iodepth={}", args.iodepth),
        "--randrepeat=0",
        "--zero_buffers",
        "--output-format=json",
    ]);
    if timed {
        cmd.args([format!("--runtime={}", args.seconds), "--time_based".to_string()]);
    }
    let out = cmd.output().map_err(|e| format!("fio: {e} (install the fio package)"))?;
    if !out.status.success() {
        return Err(format!("fio failed: {}", String::from_utf8_lossy(&out.stderr)));
    }
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).map_err(|e| format!("fio output: {e}"))?;
    let side = if rw.contains("write") { "write" } else { "read" };
    json["jobs"][0][side]["iops"].as_f64().ok_or_else(|| "fio output has no iops".into())
}

async fn store_run(store: Arc<Store>, write: bool, args: &Args) -> f64 {
    let blocks = args.size / BLOCK;
    let done = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let data: Arc<Vec<u8>> = Arc::new((0..BLOCK as usize).map(|i| (i * 7 + 3) as u8).collect());
    let mut tasks = Vec::new();
    let start = Instant::now();
    for worker in 0..args.iodepth {
        let (store, done, stop, data) = (store.clone(), done.clone(), stop.clone(), data.clone());
        tasks.push(tokio::spawn(async move {
            let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ (worker as u64 + 1);
            while !stop.load(Ordering::Relaxed) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let offset = (x % blocks) * BLOCK;
                if write {
                    store.write(1, offset, &data, false).await.expect("store write");
                } else {
                    store.read(1, offset, BLOCK).await.expect("store read");
                }
                done.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(args.seconds)).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.expect("worker");
    }
    done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
}

fn main() {
    let args = Args::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let tag = std::process::id();
    let fio_file = args.dir.join(format!("ironhorn-bench-fio-{tag}.img"));
    let store_file = args.dir.join(format!("ironhorn-bench-store-{tag}.img"));
    let result = runtime.block_on(async {
        // Baseline: lay the file out fully first so reads hit real blocks.
        let fio_path = fio_file.to_str().unwrap().to_string();
        fio(&fio_path, "write", "1m", false, &args)?;
        let fio_write = fio(&fio_path, "randwrite", "4k", true, &args)?;
        let fio_read = fio(&fio_path, "randread", "4k", true, &args)?;

        // Lay the store file out like fio's (holes cost filesystem
        // allocation on first write; an LV has none).
        let capacity = ironhorn_replica::store::default_capacity(
            args.size,
            ironhorn_replica::store::default_journal_blocks(args.size),
        );
        fio(store_file.to_str().unwrap(), "write", "1m", false, &Args { size: capacity, ..args.clone() })?;
        let mut config = StoreConfig::new(StoreLocation::File(store_file.clone()), args.size);
        config.backend = BackendKind::Uring;
        let store = Arc::new(Store::open(&config).await.map_err(|e| e.to_string())?);
        // Fill the volume so random reads hit data, as fio's do.
        let chunk = vec![0x5au8; 1 << 20];
        for offset in (0..args.size).step_by(chunk.len()) {
            let len = chunk.len().min((args.size - offset) as usize);
            store.write(1, offset, &chunk[..len], false).await.map_err(|e| e.to_string())?;
        }
        store.flush().await.map_err(|e| e.to_string())?;
        let store_write = store_run(store.clone(), true, &args).await;
        store.flush().await.map_err(|e| e.to_string())?;
        let store_read = store_run(store.clone(), false, &args).await;
        store.close().await.map_err(|e| e.to_string())?;
        Ok::<_, String>([("4k randwrite", fio_write, store_write), ("4k randread", fio_read, store_read)])
    });
    let _ = std::fs::remove_file(&fio_file);
    let _ = std::fs::remove_file(&store_file);
    match result {
        Ok(rows) => {
            println!(
                "store benchmark: {} file on {}, iodepth {}, {} s per run",
                args.size,
                args.dir.display(),
                args.iodepth,
                args.seconds
            );
            println!(
                "| workload | fio io_uring O_DIRECT (IOPS) | ironhorn store io_uring O_DIRECT (IOPS) | store / fio |"
            );
            println!("|---|---:|---:|---:|");
            for (name, baseline, ours) in rows {
                println!("| {name} | {baseline:.0} | {ours:.0} | {:.2} |", ours / baseline);
            }
        }
        Err(e) => {
            eprintln!("ironhorn-store-bench: {e}");
            std::process::exit(1);
        }
    }
}
