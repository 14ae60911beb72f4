//! The web UI in a real headless Chromium (Debian's chromium and
//! chromium-driver), driven over WebDriver: a volume created from the form
//! (the API's errors shown beside the fields), attached, seen healthy; one
//! of its replicas killed under writes: the page shows degraded, a moving
//! rebuild progress bar, then healthy, all without a reload; the volume
//! deleted through the confirmation. Screenshots of each step are saved
//! (the test prints where). Alongside: the volume page's live I/O chart
//! under writes; `ironhorn volume get --watch` (stdout a pipe) printing the
//! rebuild's progress lines and ending in healthy; a node's scheduling
//! toggle and tags; the pages at a phone's width.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use ironhorn_tests::*;

const VOLUME: &str = "ui-vol";

/// chromedriver on a free port, killed by its pid when dropped.
struct Driver {
    child: Child,
    port: u16,
}

impl Driver {
    fn start(dir: &Path) -> Driver {
        require_tool("chromium", "chromium");
        require_tool("chromedriver", "chromium-driver");
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let log = std::fs::File::create(dir.join("chromedriver.log")).unwrap();
        let child = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::from(log.try_clone().unwrap()))
            .stderr(Stdio::from(log))
            .spawn()
            .expect("start chromedriver");
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "chromedriver did not listen on {port}");
            std::thread::sleep(Duration::from_millis(50));
        }
        Driver { child, port }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        kill9(self.child.id());
        let _ = self.child.wait();
    }
}

async fn browser(driver: &Driver) -> Client {
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        serde_json::json!({
            "binary": "/usr/bin/chromium",
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,1000"],
        }),
    );
    let connector = hyper_util::client::legacy::connect::HttpConnector::new();
    ClientBuilder::new(connector)
        .capabilities(caps)
        .connect(&format!("http://127.0.0.1:{}", driver.port))
        .await
        .expect("a Chromium session through chromedriver")
}

struct Shots {
    dir: PathBuf,
    n: usize,
}

impl Shots {
    async fn take(&mut self, c: &Client, what: &str) {
        self.n += 1;
        let path = self.dir.join(format!("{:02}-{what}.png", self.n));
        std::fs::write(&path, c.screenshot().await.expect("screenshot")).unwrap();
        println!("screenshot: {}", path.display());
    }
}

/// Waits until the text of the first element matching `css` satisfies
/// `check` (the page updates itself; nothing here reloads it).
async fn wait_text(c: &Client, css: &str, what: &str, timeout: Duration, check: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(e) = c.find(Locator::Css(css)).await
            && let Ok(text) = e.text().await
            && check(&text)
        {
            return text;
        }
        assert!(Instant::now() < deadline, "timed out after {timeout:?} waiting for {what} ({css})");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Clicks the element `css` names, finding it again if the page re-drew
/// it in between (live updates replace table rows).
async fn click(c: &Client, css: &str) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let clicked = match c.find(Locator::Css(css)).await {
            Ok(e) => e.click().await.is_ok(),
            Err(_) => false,
        };
        if clicked {
            return;
        }
        assert!(Instant::now() < deadline, "could not click {css}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Types `text` into the input `css` on a page that re-renders itself: the
/// input is clicked first (a focused tags form is left alone by the live
/// refresh), and the whole step is tried again when a refresh replaced the
/// element between finding it and typing.
async fn type_into(c: &Client, css: &str, text: &str) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let typed = async {
            let input = c.find(Locator::Css(css)).await?;
            input.click().await?;
            input.clear().await?;
            input.send_keys(text).await?;
            input.prop("value").await
        }
        .await;
        match typed {
            Ok(Some(value)) if value == text => return,
            other => assert!(Instant::now() < deadline, "could not type {text:?} into {css}: {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn fill_create(c: &Client, name: &str, size: &str) {
    for (field, value) in [("name", name), ("size", size)] {
        let input = c.find(Locator::Css(&format!("#create input[name={field}]"))).await.unwrap();
        input.clear().await.unwrap();
        input.send_keys(value).await.unwrap();
    }
    click(c, "#create-submit").await;
}

/// `ironhorn volume get NAME --watch` with stdout a pipe: its lines, as
/// they come, collected by a thread. Killed by its pid when dropped.
struct Watcher {
    child: Child,
    lines: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Watcher {
    fn start(api: &str, volume: &str) -> Watcher {
        use std::io::BufRead;
        let mut child = Command::new(binary("ironhorn"))
            .args(["--api", api, "volume", "get", volume, "--watch"])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("ironhorn volume get --watch");
        let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let out = child.stdout.take().unwrap();
        let sink = lines.clone();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                sink.lock().unwrap().push(line);
            }
        });
        Watcher { child, lines }
    }

    fn lines(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The percent a watch line gives for `replica`'s rebuild.
fn rebuild_percent(line: &str, replica: &str) -> Option<u32> {
    let rest = line.split(&format!("rebuilding {replica}: ")).nth(1)?;
    rest.split('%').next()?.parse().ok()
}

/// The page is no wider than the window (tables scroll inside their
/// panels), at whatever size the window has.
async fn fits_the_window(c: &Client, page: &str) {
    let sizes = c
        .execute("return [document.documentElement.scrollWidth, window.innerWidth]", vec![])
        .await
        .expect("page widths");
    let (page_width, window) = (sizes[0].as_u64().unwrap(), sizes[1].as_u64().unwrap());
    assert!(page_width <= window, "{page}: the page is {page_width} px wide in a {window} px window");
}

/// A promise that polls `check` (a JS expression) every 100 ms and resolves
/// to its value once truthy, or rejects naming `what` after 15 s.
fn poll_js(check: &str, what: &str) -> String {
    let what = serde_json::to_string(&format!("timed out waiting for {what}")).unwrap();
    format!(
        "new Promise((resolve, reject) => {{ const t0 = Date.now(); const tick = () => {{ let v = null; \
         try {{ v = ({check}); }} catch (_) {{}} if (v) resolve(v); \
         else if (Date.now() - t0 > 15000) reject(new Error({what})); \
         else setTimeout(tick, 100); }}; tick(); }})"
    )
}

/// The same UI in Firefox (WebDriver BiDi): the volumes list live and
/// healthy, the volume page's replicas, a phone's width.
fn firefox_shows_the_volume(base: &str, log_dir: &Path) {
    use ironhorn_tests::bidi::{Bidi, Firefox};
    let firefox = Firefox::start(log_dir);
    let mut b = Bidi::connect(firefox.port, Duration::from_secs(60)).expect("a BiDi session with Firefox");
    let ctx = b.context().unwrap();
    let go = |b: &mut Bidi, url: String| {
        b.command("browsingContext.navigate", serde_json::json!({ "context": ctx, "url": url, "wait": "complete" }))
            .unwrap()
    };
    go(&mut b, format!("{base}/#/volumes"));
    let robustness = b
        .evaluate(
            &ctx,
            &poll_js(
                &format!("document.querySelector('#live').textContent === 'live' && document.querySelector('tr[data-volume={VOLUME}] td.robustness').textContent"),
                "the volume's row",
            ),
        )
        .expect("the volumes page in Firefox");
    assert_eq!(robustness, "healthy");
    go(&mut b, format!("{base}/#/volume/{VOLUME}"));
    let rw = b
        .evaluate(
            &ctx,
            &poll_js(
                "[...document.querySelectorAll('#replicas td.mode')].filter((td) => td.textContent === 'RW').length === 3 && 3",
                "three RW replicas",
            ),
        )
        .expect("the volume page in Firefox");
    assert_eq!(rw, 3);
    b.command(
        "browsingContext.setViewport",
        serde_json::json!({ "context": ctx, "viewport": { "width": 390, "height": 844 } }),
    )
    .unwrap();
    for page in ["#/", "#/volumes", "#/nodes"] {
        go(&mut b, format!("{base}/{page}"));
        let widths = b
            .evaluate(&ctx, &poll_js("document.querySelector('#live').textContent === 'live' && [document.documentElement.scrollWidth, window.innerWidth]", "the live stream"))
            .unwrap();
        let (page_width, window) = (widths[0]["value"].as_u64().unwrap(), widths[1]["value"].as_u64().unwrap());
        assert!(page_width <= window, "Firefox, {page}: the page is {page_width} px wide in a {window} px window");
    }
    println!("Firefox: volumes, volume page and phone width checked");
}

fn fio_writes(endpoint: &str, seconds: u64) -> Child {
    require_tool("fio", "fio");
    Command::new("fio")
        .args([
            "--name=ui",
            "--ioengine=nbd",
            &format!("--uri={endpoint}"),
            "--rw=randwrite",
            "--bs=64k",
            "--size=128M",
            "--iodepth=8",
            "--time_based",
            &format!("--runtime={seconds}"),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("fio")
}

#[test]
fn the_ui_creates_attaches_shows_a_rebuild_live_and_deletes() {
    require_root();
    let cluster = StandaloneCluster::start("ui", 3, 19500, "1GiB");
    // A slow rebuild, so its progress bar is seen moving.
    cluster.cli(&["setting", "set", "replica-rebuild-max-mib-per-sec", "8"]).expect("rate setting");
    cluster.cli(&["setting", "set", "replica-rebuild-backoff-initial", "2"]).expect("backoff setting");
    // Kept after the test (the cluster's own directory is not).
    let shots_dir = std::env::temp_dir().join("ironhorn-ui-screenshots");
    let _ = std::fs::remove_dir_all(&shots_dir);
    std::fs::create_dir_all(&shots_dir).unwrap();
    let driver = Driver::start(cluster.dir.path());
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let c = browser(&driver).await;
        let mut shots = Shots { dir: shots_dir.clone(), n: 0 };
        let base = cluster.api.clone();
        c.goto(&format!("{base}/#/volumes")).await.unwrap();
        wait_text(&c, "#live", "the live stream", Duration::from_secs(10), |t| t == "live").await;

        // The API's errors beside the fields: a bad size, then a taken name.
        fill_create(&c, VOLUME, "12 parsecs").await;
        let e = wait_text(&c, ".field-error[data-for=size]", "size error", Duration::from_secs(10), |t| !t.is_empty())
            .await;
        println!("bad size: {e}");
        shots.take(&c, "bad-size").await;
        fill_create(&c, VOLUME, "256MiB").await;
        wait_text(&c, &format!("tr[data-volume={VOLUME}] td.name"), "the new row", Duration::from_secs(10), |t| {
            t == VOLUME
        })
        .await;
        fill_create(&c, VOLUME, "256MiB").await;
        let e = wait_text(&c, ".field-error[data-for=name]", "name error", Duration::from_secs(10), |t| !t.is_empty())
            .await;
        assert!(e.contains("exists"), "{e}");
        shots.take(&c, "name-taken").await;

        // Attach from the volume page; healthy without a reload.
        click(&c, &format!("tr[data-volume={VOLUME}] td.name a")).await;
        wait_text(&c, "#attach-node", "the node list", Duration::from_secs(10), |t| t.contains("n-1")).await;
        c.find(Locator::Css("#attach-node")).await.unwrap().select_by_value("n-1").await.unwrap();
        click(&c, "#attach").await;
        wait_text(&c, "#robustness", "healthy", Duration::from_secs(60), |t| t == "healthy").await;
        shots.take(&c, "attached-healthy").await;
        let watcher = Watcher::start(&base, VOLUME);

        // Kill a replica off the engine's node while writes run.
        let endpoint = cluster.volume(VOLUME)["status"]["endpoint"].as_str().unwrap().to_string();
        let mut fio = fio_writes(&endpoint, 20);
        let engine = cluster.engine_address(VOLUME);
        let writes = || {
            let m: serde_json::Value =
                serde_json::from_str(&engine_cli(&["metrics", "--engine", &engine]).unwrap()).unwrap();
            m["ops"].as_array().unwrap().iter().find(|o| o["op"] == "write").unwrap()["requests"].as_u64().unwrap()
        };
        let before = writes();
        let deadline = Instant::now() + Duration::from_secs(30);
        while writes() < before + 200 {
            assert!(fio.try_wait().unwrap().is_none(), "fio ended before the fault");
            assert!(Instant::now() < deadline, "no writes in flight");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // The page's I/O chart shows the writes (a sample a second).
        wait_text(&c, "#io-note", "I/O samples", Duration::from_secs(10), |t| t.starts_with("last")).await;
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let last = c.find(Locator::Css("#chart-iops")).await.unwrap().attr("data-last").await.unwrap();
            if last.and_then(|v| v.parse::<f64>().ok()).is_some_and(|v| v > 0.0) {
                break;
            }
            assert!(Instant::now() < deadline, "the IOPS chart shows no writes while fio writes");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        shots.take(&c, "io-chart").await;
        let victim =
            cluster.replicas_of(VOLUME).into_iter().find(|r| r["spec"]["nodeID"] != "n-1").expect("a remote replica");
        let (name, node) = (victim["metadata"]["name"].as_str().unwrap(), victim["spec"]["nodeID"].as_str().unwrap());
        // (Its own runtime: not inside this one.)
        let found = std::thread::scope(|s| s.spawn(|| cluster.instance(node, name)).join().unwrap());
        let (pid, _) = found.expect("the replica's process");
        kill9(pid);
        wait_text(&c, "#robustness", "degraded", Duration::from_secs(30), |t| t == "degraded").await;
        shots.take(&c, "degraded").await;
        // The rebuild's bar, moving.
        let bar = format!("tr[data-replica={name}] div.rebuild");
        let deadline = Instant::now() + Duration::from_secs(120);
        let first = loop {
            if let Ok(e) = c.find(Locator::Css(&bar)).await
                && let Ok(Some(p)) = e.attr("data-percent").await
            {
                break p.parse::<u32>().unwrap();
            }
            if Instant::now() > deadline {
                shots.take(&c, "no-progress-bar").await;
                let table = c.execute("return document.querySelector('#replicas').innerHTML", vec![]).await;
                panic!(
                    "no rebuild progress bar for {name}: the page's replicas {table:?}; the engines {}",
                    std::thread::scope(|s| s.spawn(|| cluster.json(&["engine", "list"])).join().unwrap())
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        shots.take(&c, "rebuilding").await;
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut moved = false;
        while !moved {
            match c.find(Locator::Css(&bar)).await {
                // (A row the page just re-drew is stale: read it again.)
                Ok(e) => {
                    moved =
                        e.attr("data-percent").await.ok().flatten().and_then(|p| p.parse::<u32>().ok()) > Some(first)
                }
                // The bar is gone: the rebuild finished after `first`.
                Err(_) => moved = true,
            }
            assert!(Instant::now() < deadline, "the progress bar stayed at {first}%");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        wait_text(&c, "#robustness", "healthy again", Duration::from_secs(180), |t| t == "healthy").await;
        wait_text(&c, &format!("tr[data-replica={name}] td.mode"), "the replica RW", Duration::from_secs(30), |t| {
            t == "RW"
        })
        .await;
        shots.take(&c, "healthy-again").await;
        let _ = fio.kill();
        let _ = fio.wait();

        // The terminal watch saw it too: degraded, the rebuild's progress
        // moving, then healthy.
        let deadline = Instant::now() + Duration::from_secs(10);
        while !watcher.lines().last().is_some_and(|l| l.contains(" healthy") && !l.contains("rebuilding")) {
            assert!(Instant::now() < deadline, "the watch did not end in healthy: {:#?}", watcher.lines());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let lines = watcher.lines();
        drop(watcher);
        println!("volume get --watch printed:\n{}", lines.join("\n"));
        let percents: Vec<u32> = lines.iter().filter_map(|l| rebuild_percent(l, name)).collect();
        assert!(percents.len() >= 2, "fewer than two progress lines for {name}: {lines:#?}");
        assert!(percents.windows(2).all(|w| w[0] <= w[1]) && percents.last() > percents.first(), "{percents:?}");
        let degraded = lines.iter().position(|l| l.contains(" degraded")).expect("a degraded line");
        let rebuilding = lines.iter().position(|l| rebuild_percent(l, name).is_some()).unwrap();
        assert!(degraded <= rebuilding, "{lines:#?}");

        // The dashboard and the other pages render.
        c.goto(&format!("{base}/#/")).await.unwrap();
        wait_text(&c, ".card[data-robustness=healthy] .n", "one healthy", Duration::from_secs(10), |t| t == "1").await;
        shots.take(&c, "dashboard").await;
        c.goto(&format!("{base}/#/nodes")).await.unwrap();
        wait_text(&c, "tr[data-node=n-3] td.ready", "node n-3 ready", Duration::from_secs(10), |t| t == "True").await;
        shots.take(&c, "nodes").await;
        // Scheduling off and on again, and a tag, from the nodes page.
        let node = || {
            cluster
                .json(&["node", "list"])
                .as_array()
                .unwrap()
                .iter()
                .find(|n| n["metadata"]["name"] == "n-3")
                .cloned()
                .unwrap()
        };
        click(&c, "input[data-node-scheduling=n-3]").await;
        wait_text(&c, "tr[data-node=n-3] td.allow", "scheduling off", Duration::from_secs(10), |t| {
            t.contains("disabled")
        })
        .await;
        assert_eq!(node()["spec"]["allowScheduling"], false);
        click(&c, "input[data-node-scheduling=n-3]").await;
        wait_text(&c, "tr[data-node=n-3] td.allow", "scheduling on", Duration::from_secs(10), |t| {
            t.contains("allowed")
        })
        .await;
        assert_eq!(node()["spec"]["allowScheduling"], true);
        type_into(&c, "form[data-node-tags=n-3] input[name=tags]", "ssd, fast").await;
        click(&c, "form[data-node-tags=n-3] button").await;
        cluster.wait(Duration::from_secs(10), "n-3 tagged", || {
            node()["spec"]["tags"] == serde_json::json!(["ssd", "fast"])
        });
        // A bad tag gets the API's error beside the field.
        type_into(&c, "form[data-node-tags=n-3] input[name=tags]", "no spaces please").await;
        click(&c, "form[data-node-tags=n-3] button").await;
        wait_text(&c, "form[data-node-tags=n-3] .field-error", "tag error", Duration::from_secs(10), |t| {
            t.contains("tag")
        })
        .await;

        // A phone's width: every page fits, the tables scroll inside.
        c.set_window_size(390, 844).await.unwrap();
        for page in ["#/", "#/volumes", &format!("#/volume/{VOLUME}"), "#/nodes", "#/settings", "#/events"] {
            c.goto(&format!("{base}/{page}")).await.unwrap();
            wait_text(&c, "#live", "the live stream", Duration::from_secs(10), |t| t == "live").await;
            tokio::time::sleep(Duration::from_millis(500)).await;
            fits_the_window(&c, page).await;
        }
        shots.take(&c, "phone-events").await;
        c.goto(&format!("{base}/#/volume/{VOLUME}")).await.unwrap();
        wait_text(&c, "#robustness", "healthy", Duration::from_secs(10), |t| t == "healthy").await;
        shots.take(&c, "phone-volume").await;
        c.set_window_size(1280, 900).await.unwrap();

        // The same pages in Firefox.
        let log_dir = cluster.dir.path().to_path_buf();
        let firefox_base = base.clone();
        std::thread::spawn(move || firefox_shows_the_volume(&firefox_base, &log_dir))
            .join()
            .expect("the Firefox check");

        // Delete with the confirmation naming the volume.
        c.goto(&format!("{base}/#/volume/{VOLUME}")).await.unwrap();
        c.wait().for_element(Locator::Css("#delete")).await.unwrap().click().await.unwrap();
        let confirm = c.wait().for_element(Locator::Css("#confirm-delete")).await.unwrap();
        assert!(confirm.text().await.unwrap().contains(VOLUME));
        confirm.click().await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        while c.find(Locator::Css(&format!("tr[data-volume={VOLUME}]"))).await.is_ok() {
            assert!(Instant::now() < deadline, "the volume's row did not go");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        shots.take(&c, "deleted").await;
        c.close().await.unwrap();
    });
    println!("screenshots in {}", shots_dir.display());
}
