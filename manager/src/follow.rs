//! Following a volume from the terminal (`ironhorn volume get NAME
//! --watch`, `volume attach`): polls the REST API, asks `watch::view` what
//! to show and prints it. On a terminal: a line for the volume and a
//! progress bar per running rebuild (indicatif), redrawn in place. Else a
//! plain line each time the view changes, for logs and scripts.

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::client::call;
use crate::crd::{Engine, Volume};
use crate::watch::{self, View};

/// How often the API is asked (two small GETs; an attach takes well
/// under a second, and its wait should not add half of one).
pub const POLL: Duration = Duration::from_millis(200);

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

impl Stream {
    fn is_terminal(self) -> bool {
        match self {
            Stream::Stdout => std::io::stdout().is_terminal(),
            Stream::Stderr => std::io::stderr().is_terminal(),
        }
    }

    fn say(self, line: &str) {
        match self {
            Stream::Stdout => ironhorn_proto::say!("{line}"),
            Stream::Stderr => ironhorn_proto::say_err!("{line}"),
        }
    }
}

enum Printer {
    Lines { stream: Stream, last: String },
    Bars(Bars),
}

struct Bars {
    multi: MultiProgress,
    summary: ProgressBar,
    rebuilds: BTreeMap<String, ProgressBar>,
}

impl Printer {
    fn new(stream: Stream) -> Self {
        if !stream.is_terminal() {
            return Printer::Lines { stream, last: String::new() };
        }
        let target = match stream {
            Stream::Stdout => ProgressDrawTarget::stdout(),
            Stream::Stderr => ProgressDrawTarget::stderr(),
        };
        Printer::Bars(Bars::new(target))
    }

    fn show(&mut self, view: &View) {
        match self {
            Printer::Lines { stream, last } => {
                let line = view.to_string();
                if line != *last {
                    stream.say(&line);
                    *last = line;
                }
            }
            Printer::Bars(bars) => bars.show(view),
        }
    }

    fn finish(self) {
        if let Printer::Bars(bars) = self {
            for bar in bars.rebuilds.values() {
                bar.finish_and_clear();
            }
            bars.summary.finish();
        }
    }
}

impl Bars {
    fn new(target: ProgressDrawTarget) -> Bars {
        let multi = MultiProgress::with_draw_target(target);
        let summary = multi.add(ProgressBar::new_spinner());
        summary.set_style(ProgressStyle::with_template("{msg}").expect("template"));
        Bars { multi, summary, rebuilds: BTreeMap::new() }
    }

    fn show(&mut self, view: &View) {
        self.summary.set_message(view.summary());
        for r in &view.rebuilds {
            let bar = self.rebuilds.entry(r.replica.clone()).or_insert_with(|| {
                let bar = self.multi.add(ProgressBar::new(r.total));
                let style = ProgressStyle::with_template(
                    "  {msg} [{bar:30}] {percent:>3}% {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec}",
                )
                .expect("template")
                .progress_chars("=> ");
                bar.set_style(style);
                bar
            });
            bar.set_length(r.total);
            bar.set_position(r.done);
            bar.set_message(format!("rebuilding {} ({})", r.replica, r.method));
        }
        let multi = &self.multi;
        self.rebuilds.retain(|replica, bar| {
            let running = view.rebuilds.iter().any(|r| &r.replica == replica);
            if !running {
                bar.finish_and_clear();
                multi.remove(bar);
            }
            running
        });
    }
}

/// The volume's view now; None once it is gone.
async fn fetch(api: &str, name: &str) -> Result<Option<View>, String> {
    let volume = match call(api, "GET", &format!("/v1/volumes/{name}"), None).await {
        Ok(v) => v,
        Err(e) if e.is_not_found() => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let volume: Volume = serde_json::from_value(volume).map_err(|e| format!("volume {name}: {e}"))?;
    let engines: Vec<Engine> =
        serde_json::from_value(call(api, "GET", "/v1/engines", None).await?).map_err(|e| format!("engines: {e}"))?;
    let engine = engines.iter().find(|e| e.spec.volume_name == name);
    Ok(Some(watch::view(&volume, engine, jiff::Timestamp::now())))
}

/// Shows volume `name` on `stream` as it changes until `until` holds for
/// its view (returned) or `timeout` passes (None: no limit). A volume that
/// goes away ends the watch with an error saying so.
pub async fn follow(
    api: &str,
    name: &str,
    stream: Stream,
    until: impl Fn(&View) -> bool,
    timeout: Option<Duration>,
) -> Result<View, String> {
    let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
    let mut printer = Printer::new(stream);
    let result = loop {
        let view = match fetch(api, name).await {
            Ok(Some(view)) => view,
            Ok(None) => break Err(format!("volume {name} not found (deleted?)")),
            Err(e) => break Err(e),
        };
        printer.show(&view);
        if until(&view) {
            break Ok(view);
        }
        if deadline.is_some_and(|d| tokio::time::Instant::now() >= d) {
            break Err(format!("volume {name}: still \"{view}\" after {}s", timeout.unwrap_or_default().as_secs()));
        }
        tokio::time::sleep(POLL).await;
    };
    printer.finish();
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::watch::Rebuild;

    #[test]
    fn bars_come_and_go_with_the_rebuilds() {
        let mut bars = Bars::new(ProgressDrawTarget::hidden());
        let rebuild = Rebuild {
            replica: "v1-r-2".into(),
            method: "dirty-map".into(),
            percent: 25,
            done: 64 << 20,
            total: 256 << 20,
            rate: 16 << 20,
        };
        let mut view = View {
            name: "v1".into(),
            state: "attached".into(),
            robustness: "degraded".into(),
            rw: 2,
            wanted: 3,
            rebuilds: vec![rebuild],
        };
        bars.show(&view);
        assert_eq!(bars.rebuilds["v1-r-2"].position(), 64 << 20);
        assert_eq!(bars.rebuilds["v1-r-2"].length(), Some(256 << 20));
        assert_eq!(bars.summary.message(), "v1 attached degraded, 2/3 replicas RW");
        view.rebuilds.clear();
        view.robustness = "healthy".into();
        view.rw = 3;
        bars.show(&view);
        assert!(bars.rebuilds.is_empty());
        assert_eq!(bars.summary.message(), "v1 attached healthy, 3/3 replicas RW");
    }
}
