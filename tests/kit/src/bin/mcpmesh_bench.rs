//! `mcpmesh-bench`: the same stdio MCP server, measured directly, through two hermetic nodes
//! (daemons + `mcpmesh connect`) and through `mcpmesh hub` on the same nodes, in interleaved
//! rounds of one run. Prints the median of each figure over the rounds and the ratios mesh /
//! direct and hub / mesh.
//!
//! Build the release binaries first; this looks for `mcpmesh` and `echo_mcp_stub` beside itself:
//!   cargo build --release && target/release/mcpmesh-bench [--rounds N] [--calls N] [--only PHASE] [--json FILE]
//!
//! `--only open|calls|pipelined|results|requests` runs one phase (for profiling the nodes, whose
//! pids it prints, with `perf record -p`). `--telemetry` also measures a second pair of nodes
//! with metrics on (`[telemetry] metrics`, scraped after each of its passes) and traces on
//! (`[telemetry] otlp`, sent to a collector this binary runs that accepts and counts them) in
//! the same rounds, and prints telemetry on / off. `--rules` serves the service under per-tool
//! rules (bob may call `echo`, `blob` and `size`, the bench's tools), so that each request is
//! decided on as a service with rules decides. `--no-hub` leaves out the hub's passes, so that
//! this bench can drive an older build without `mcpmesh hub` (docs/performance.md, "How to
//! measure").

#![forbid(unsafe_code)]

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::mpsc::sync_channel;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::{Value, json};

use mcpmesh_testkit::bench;

const PIPELINE: usize = 16;
const BIG: usize = 8 << 20;
const MIB: usize = 1 << 20;

/// The phases of one pass, in order.
/// The figure measuring a session opened after the connection was idle, and that pause.
const IDLE_OPEN: usize = 8;
const IDLE_BEFORE_OPEN: std::time::Duration = std::time::Duration::from_millis(500);
const PHASES: [&str; 5] = ["open", "calls", "pipelined", "results", "requests"];

/// The same stdio MCP server, measured directly, through two nodes and through `mcpmesh hub`.
#[derive(clap::Parser)]
#[command(name = "mcpmesh-bench", args_override_self = true)]
struct Args {
    /// Interleaved rounds; each figure is the median over them (at least 1).
    #[arg(long, value_name = "N", default_value_t = 3, value_parser = bench::at_least(1))]
    rounds: usize,
    /// Calls per pass (at least 100).
    #[arg(long, value_name = "N", default_value_t = 2000, value_parser = bench::at_least(100))]
    calls: usize,
    /// Run only this phase.
    #[arg(long, value_name = "PHASE", value_parser = PHASES)]
    only: Option<String>,
    /// Also measure a mesh whose nodes keep metrics and send traces.
    #[arg(long)]
    telemetry: bool,
    /// Serve the service under per-tool rules.
    #[arg(long)]
    rules: bool,
    /// Leave out the hub's passes (to drive a build that has no `mcpmesh hub`).
    #[arg(long)]
    no_hub: bool,
    /// Also write the headline figures there as one JSON object (what `scripts/bench-check`
    /// reads).
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
}

impl Args {
    /// Of `phases`, those this run measures.
    fn phases(&self, phases: &[&'static str]) -> Vec<&'static str> {
        phases
            .iter()
            .copied()
            .filter(|p| self.only.as_deref().is_none_or(|only| only == *p))
            .collect()
    }
}

fn main() -> anyhow::Result<()> {
    let args = <Args as clap::Parser>::parse();
    let (mcpmesh, stub) = bench::sibling_binaries()?;
    bench::read_from_disk(&mcpmesh)?;
    let mesh = Mesh::start(&mcpmesh, &stub, "", args.rules)?;
    // The same two nodes again, keeping metrics (each on a port of its own) and sending
    // traces to a collector of this binary's.
    let collector = args.telemetry.then(Collector::start).transpose()?;
    let metered = collector
        .as_ref()
        .map(|c| Mesh::start(&mcpmesh, &stub, &telemetry_on(c), args.rules))
        .transpose()?;
    if args.rules {
        eprintln!("the service is served under per-tool rules");
    }
    if let [(_, Some(a)), (_, Some(b))] = mesh.pids()[..] {
        eprintln!("nodes: alice pid {a} (serving), bob pid {b} (dialing)");
    }
    if let Some(m) = &metered
        && let [(_, Some(a)), (_, Some(b))] = m.pids()[..]
    {
        eprintln!("metered nodes: alice pid {a} (serving), bob pid {b} (dialing)");
    }
    let direct_cmd = vec![stub.display().to_string()];
    // The same server behind two processes that only copy bytes: the mesh's two process hops
    // without anything else the mesh does.
    let stub_s = stub.display().to_string();
    let relayed_cmd: Vec<String> = [&stub_s, "--relay", "--", &stub_s, "--relay", "--", &stub_s]
        .iter()
        .map(|a| a.to_string())
        .collect();
    // Behind one such process: the mesh's path with its QUIC hop taken out (see "composed").
    let relayed_once_cmd: Vec<String> = [&stub_s, "--relay", "--", &stub_s]
        .iter()
        .map(|a| a.to_string())
        .collect();
    let mesh_cmd = vec![
        mcpmesh.display().to_string(),
        "--home".into(),
        mesh.bob.display().to_string(),
        "connect".into(),
        "alice/bench".into(),
    ];
    // The same service through `mcpmesh hub`, which answers `initialize` itself and opens the
    // session on the first call.
    let hub_cmd = vec![
        mcpmesh.display().to_string(),
        "--home".into(),
        mesh.bob.display().to_string(),
        "hub".into(),
        "alice/bench".into(),
    ];

    let figures = [
        "session open p50 ms",
        "call p50 µs",
        "call p90 µs",
        "call p99 µs",
        "pipelined x16 calls/s",
        "1 MiB result MB/s",
        "8 MiB result MB/s",
        "8 MiB request MB/s",
        "open after 0.5 s idle ms",
    ];
    let mut direct: Vec<Vec<f64>> = vec![Vec::new(); figures.len()];
    let mut meshed: Vec<Vec<f64>> = vec![Vec::new(); figures.len()];
    let mut hubbed: Vec<Vec<f64>> = vec![Vec::new(); figures.len()];
    let mut metered_figures: Vec<Vec<f64>> = vec![Vec::new(); figures.len()];
    let mut metered_cpu = Vec::new();
    // The nodes' CPU per call through `connect` (the hub's passes measure the hub's path).
    let (mut cpu_per_call, mut cpu_per_x16) = (Vec::new(), Vec::new());
    let (mut floors, mut floors1) = (Vec::new(), Vec::new());
    let (mut relayed_p50, mut relayed_x16) = (Vec::new(), Vec::new());
    let (mut once_p50, mut once_x16, mut once_cpu) = (Vec::new(), Vec::new(), Vec::new());
    let (mut bridged_p50, mut bridged_x16) = (Vec::new(), Vec::new());
    let idle = mesh.rss_kib("VmRSS:");
    let idle_anon = mesh.rss_kib("RssAnon:");
    let (mut peak_work, mut peak_requests) = (vec![0u64; 2], vec![0u64; 2]);
    // The figures first, then the 8 MiB requests: a node keeps memory an 8 MiB request
    // needed (see docs/performance.md), which would otherwise show in the next round's peak.
    let passes = [
        (args.phases(&PHASES[..4]), &mut peak_work),
        (args.phases(&PHASES[4..]), &mut peak_requests),
    ];
    for (phases, peaks) in passes {
        if phases.is_empty() {
            continue;
        }
        for round in 1..=args.rounds {
            eprintln!("{} round {round}/{}", phases.join(", "), args.rounds);
            // The metered pair goes first in every other round, so that neither pair is always
            // measured after the other.
            let metered_first = round % 2 == 0;
            if let Some(metered) = metered.as_ref().filter(|_| metered_first) {
                metered_pass(
                    metered,
                    &phases,
                    args.calls,
                    &mut metered_figures,
                    &mut metered_cpu,
                )?;
            }
            for (cmd, into, watch, prefix) in [
                (&direct_cmd, &mut direct, None, ""),
                (&mesh_cmd, &mut meshed, Some(&mesh), ""),
                (&hub_cmd, &mut hubbed, Some(&mesh), "alice__bench__"),
            ] {
                if args.no_hub && !prefix.is_empty() {
                    continue;
                }
                let m = measure(cmd, &phases, args.calls, watch, prefix, false)?;
                for (slot, v) in into.iter_mut().zip(m.figures) {
                    if !v.is_nan() {
                        slot.push(v);
                    }
                }
                if prefix.is_empty() {
                    cpu_per_call.extend(m.cpu_per_call);
                    cpu_per_x16.extend(m.cpu_per_x16);
                }
                for (p, (_, kib)) in peaks.iter_mut().zip(m.peak) {
                    *p = (*p).max(kib);
                }
            }
            if let Some(metered) = metered.as_ref().filter(|_| !metered_first) {
                metered_pass(
                    metered,
                    &phases,
                    args.calls,
                    &mut metered_figures,
                    &mut metered_cpu,
                )?;
            }
            if phases.contains(&"calls") || phases.contains(&"pipelined") {
                floors.push(iroh_floor(args.calls, false)?);
                floors1.push(iroh_floor(args.calls, true)?);
            }
            let relay_phases: Vec<&str> = phases
                .iter()
                .copied()
                .filter(|p| ["calls", "pipelined"].contains(p))
                .collect();
            if !relay_phases.is_empty() {
                let m = measure(&relayed_cmd, &relay_phases, args.calls, None, "", false)?;
                m.keep_call_figures(&mut relayed_p50, &mut relayed_x16);
                let once = &relayed_once_cmd;
                let m = measure(once, &relay_phases, args.calls, None, "", false)?;
                m.keep_call_figures(&mut once_p50, &mut once_x16);
                once_cpu.extend(m.spawned_cpu_per_call);
                if args.no_hub {
                    continue;
                }
                // The hub bridging eras: a 2026-07-28 client over the stub, a 2025 server.
                let m = measure(
                    &hub_cmd,
                    &relay_phases,
                    args.calls,
                    None,
                    "alice__bench__",
                    true,
                )?;
                m.keep_call_figures(&mut bridged_p50, &mut bridged_x16);
            }
        }
    }
    println!(
        "\nmcpmesh-bench: {} rounds, {} sequential calls each, loopback, {}",
        args.rounds,
        args.calls,
        bench::build_label(&mcpmesh)
    );
    println!(
        "{:<24} {:>12} {:>12} {:>10} {:>12} {:>9}",
        "figure (median)", "direct", "mesh", "mesh/direct", "hub", "hub/mesh"
    );
    for (i, name) in figures.iter().enumerate() {
        let (d, m, h) = (median(&direct[i]), median(&meshed[i]), median(&hubbed[i]));
        if d.is_nan() || m.is_nan() {
            continue;
        }
        // The hub answers `initialize` itself: its "session open" is not a session's.
        if i == 0 || i == IDLE_OPEN || h.is_nan() {
            println!("{name:<24} {d:>12.1} {m:>12.1} {:>10.2}x", m / d);
        } else {
            println!(
                "{name:<24} {d:>12.1} {m:>12.1} {:>10.2}x {h:>12.1} {:>8.2}x",
                m / d,
                h / m
            );
        }
    }
    // The same hub and service, the client of the other era: what bridging costs a call.
    let bridged: Vec<String> = [
        ("call p50", median(&bridged_p50), median(&hubbed[1]), " µs"),
        ("x16", median(&bridged_x16), median(&hubbed[4]), "/s"),
    ]
    .into_iter()
    .filter(|(_, v, _, _)| !v.is_nan())
    .map(|(name, v, same, unit)| {
        format!("{name} {v:.1}{unit} ({:.2}x the 2025 client's)", v / same)
    })
    .collect();
    if !bridged.is_empty() {
        println!(
            "hub, 2026-07-28 client over the 2025 stub (bridged): {}",
            bridged.join(", ")
        );
    }
    if !cpu_per_call.is_empty() {
        println!(
            "\nCPU per sequential call, both nodes' processes (connect steps out): {:.1} µs",
            median(&cpu_per_call)
        );
        let of = |floors: &[Floor], f: fn(&Floor) -> f64| {
            median(&floors.iter().map(f).collect::<Vec<_>>())
        };
        println!("transport floor, two bare iroh endpoints echoing 200 bytes over loopback:");
        for (name, fl) in [
            ("on two threads (as two nodes)", &floors),
            ("on one thread", &floors1),
        ] {
            println!(
                "  {name:<30} p50 {:.1} µs, CPU {:.1} µs per round trip, x16 in flight {:.0}/s, \
                 after an 8 MiB answer {:.0}/s ({:.2}x)",
                of(fl, |f| f.p50),
                of(fl, |f| f.cpu),
                of(fl, |f| f.pipelined),
                of(fl, |f| f.after_bulk),
                of(fl, Floor::after_bulk_ratio)
            );
        }
        let ratios: Vec<String> = [
            ("call p50", median(&meshed[1]) / of(&floors, |f| f.p50)),
            (
                "CPU per call",
                median(&cpu_per_call) / of(&floors, |f| f.cpu),
            ),
            (
                "x16 in flight",
                median(&meshed[4]) / of(&floors, |f| f.pipelined),
            ),
        ]
        .into_iter()
        .filter(|(_, r)| !r.is_nan())
        .map(|(name, r)| format!("{name} {r:.2}x"))
        .collect();
        println!("  mesh / floor on two threads: {}", ratios.join(", "));
    }
    if !cpu_per_x16.is_empty() {
        println!(
            "CPU per call with 16 in flight, both nodes' processes: {:.1} µs",
            median(&cpu_per_x16)
        );
    }
    if !relayed_p50.is_empty() || !relayed_x16.is_empty() {
        println!(
            "the server behind two processes that only copy bytes (the mesh's process hops alone):"
        );
        for (name, unit, relayed, i) in [
            ("call p50", "µs", median(&relayed_p50), 1),
            ("x16 in flight", "calls/s", median(&relayed_x16), 4),
        ] {
            if !relayed.is_nan() {
                println!(
                    "  {name} {relayed:.1} {unit}: relayed / direct {:.2}x, mesh / relayed {:.2}x",
                    relayed / median(&direct[i]),
                    median(&meshed[i]) / relayed
                );
            }
        }
    }
    let floor_of = |f: fn(&Floor) -> f64| median(&floors.iter().map(f).collect::<Vec<_>>());
    let composed = Composed::of(
        (median(&once_p50), median(&once_x16), median(&once_cpu)),
        (
            floor_of(|f| f.p50),
            floor_of(|f| f.pipelined),
            floor_of(|f| f.cpu),
        ),
    );
    if !once_p50.is_empty() || !once_x16.is_empty() {
        println!(
            "the server behind one process that only copies bytes, and that relay's hand-off \
             replaced by the floor's QUIC round trip (the mesh's path, composed of this run's parts):"
        );
        for (name, unit, once, whole, mesh) in [
            (
                "call p50",
                "µs",
                median(&once_p50),
                composed.p50,
                median(&meshed[1]),
            ),
            (
                "x16 in flight",
                "calls/s",
                median(&once_x16),
                composed.x16,
                median(&meshed[4]),
            ),
            (
                "CPU per call",
                "µs",
                median(&once_cpu),
                composed.cpu,
                median(&cpu_per_call),
            ),
        ] {
            if !once.is_nan() {
                println!(
                    "  {name}: relayed once {once:.1} {unit}, composed {whole:.1} {unit}, mesh / composed {:.2}x",
                    mesh / whole
                );
            }
        }
    }
    if metered.is_some() {
        println!(
            "\nmetrics and traces on both nodes (another pair of nodes, same rounds), against both off:"
        );
        println!(
            "{:<24} {:>12} {:>12} {:>12} {:>9} {:>11}",
            "figure (median)", "direct", "mesh", "mesh+telem.", "on/off", "on/direct"
        );
        for (i, name) in figures.iter().enumerate() {
            let (d, m, t) = (
                median(&direct[i]),
                median(&meshed[i]),
                median(&metered_figures[i]),
            );
            if !t.is_nan() {
                println!(
                    "{name:<24} {d:>12.1} {m:>12.1} {t:>12.1} {:>8.3}x {:>10.2}x",
                    t / m,
                    t / d
                );
            }
        }
        let (off, on) = (median(&cpu_per_call), median(&metered_cpu));
        if !on.is_nan() {
            println!(
                "CPU per sequential call, both nodes: {off:.1} µs off, {on:.1} µs on ({:+.1} µs, {:.3}x)",
                on - off,
                on / off
            );
        }
        if let (Some(metered), Some(collector)) = (&metered, &collector) {
            let (sent, failed) = metered.spans()?;
            println!(
                "spans: {sent} accepted by the collector ({} posts, {:.1} MB), {failed} not sent",
                collector.posts(),
                collector.bytes() as f64 / 1e6
            );
            let ns: u64 = metered
                .pids()
                .into_iter()
                .filter_map(|(_, pid)| pid.map(export_ns_of))
                .sum();
            let ms = ns as f64 / 1e6;
            println!(
                "  sending them took {ms:.0} ms of CPU on the nodes' exporter threads: {:.1} µs per span",
                ms * 1e3 / sent.max(1) as f64
            );
        }
    }
    let mb = |kib: &[u64]| {
        format!(
            "{:.1} MB (alice {:.1} MB, bob {:.1} MB)",
            kib.iter().sum::<u64>() as f64 / 1024.0,
            kib[0] as f64 / 1024.0,
            kib[1] as f64 / 1024.0
        )
    };
    let kib = |v: Vec<(&str, u64)>| v.into_iter().map(|(_, k)| k).collect::<Vec<u64>>();
    let (idle, end) = (kib(idle), kib(mesh.rss_kib("VmRSS:")));
    println!("RSS of the mesh processes (both nodes, servers excluded):");
    println!("  idle, before the first round:           {}", mb(&idle));
    // A peak of zero is a pass this run did not make (`--only`).
    if peak_work.iter().any(|&k| k > 0) {
        println!(
            "  peak over opens, calls, pipelined, results: {}",
            mb(&peak_work)
        );
    }
    if peak_requests.iter().any(|&k| k > 0) {
        println!(
            "  peak over 8 MiB requests (run after):   {}",
            mb(&peak_requests)
        );
    }
    println!("  at the end (what the nodes kept):       {}", mb(&end));
    // Most of a node's RSS is the binary's code, mapped from one file that both nodes (and
    // every `mcpmesh` process) share; the anonymous part is each node's own memory.
    let (idle_anon, end_anon) = (kib(idle_anon), kib(mesh.rss_kib("RssAnon:")));
    println!("  of which anonymous (the rest is the binary's code, one file both map):");
    println!("    idle {}", mb(&idle_anon));
    println!("    at the end {}", mb(&end_anon));
    if let Some(path) = &args.json {
        let floor = floor_of;
        // NaN (a figure this run did not measure) becomes null.
        let summary = json!({
            "rounds": args.rounds,
            "calls": args.calls,
            "open_ms": { "direct": median(&direct[0]), "mesh": median(&meshed[0]) },
            "open_after_idle_ms": {
                "direct": median(&direct[IDLE_OPEN]), "mesh": median(&meshed[IDLE_OPEN]),
            },
            "call_p50_us": {
                "direct": median(&direct[1]), "mesh": median(&meshed[1]),
                "hub": median(&hubbed[1]), "relayed": median(&relayed_p50),
                "floor": floor(|f| f.p50), "hub_bridged": median(&bridged_p50),
                "relayed_once": median(&once_p50), "composed": composed.p50,
            },
            "x16_per_s": {
                "direct": median(&direct[4]), "mesh": median(&meshed[4]),
                "hub": median(&hubbed[4]), "relayed": median(&relayed_x16),
                "floor": floor(|f| f.pipelined), "hub_bridged": median(&bridged_x16),
                "relayed_once": median(&once_x16), "composed": composed.x16,
            },
            "floor_x16_after_8mib": {
                "per_s": floor(|f| f.after_bulk), "ratio": floor(Floor::after_bulk_ratio),
            },
            "cpu_per_call_us": {
                "mesh": median(&cpu_per_call), "floor": floor(|f| f.cpu),
                "relayed_once": median(&once_cpu), "composed": composed.cpu,
            },
            "request_8mib_mbs": { "direct": median(&direct[7]), "mesh": median(&meshed[7]) },
            "rss_peak_mb": peak_work.iter().sum::<u64>() as f64 / 1024.0,
            "rss_anon_mb": {
                "idle": idle_anon.iter().sum::<u64>() as f64 / 1024.0,
                "end": end_anon.iter().sum::<u64>() as f64 / 1024.0,
            },
        });
        std::fs::write(path, format!("{summary}\n"))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    drop(mesh);
    drop(metered);
    Ok(())
}

/// The config of the metered pair: metrics on a port each node picks, traces to `collector`.
fn telemetry_on(collector: &Collector) -> String {
    format!(
        "[telemetry]\nmetrics = \"127.0.0.1:0\"\notlp = \"http://{}\"\n",
        collector.addr
    )
}

/// An OTLP/HTTP collector that accepts every post and counts it, on loopback (its own thread
/// and runtime): what a local collector costs the nodes, without a real collector's own work.
struct Collector {
    addr: std::net::SocketAddr,
    posts: std::sync::Arc<std::sync::atomic::AtomicU64>,
    bytes: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl Collector {
    fn start() -> anyhow::Result<Self> {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicU64, Ordering};
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let (posts, bytes) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let counts = (posts.clone(), bytes.clone());
        let app = axum::Router::new().route(
            "/v1/traces",
            axum::routing::post(move |body: axum::body::Bytes| async move {
                counts.0.fetch_add(1, Ordering::Relaxed);
                counts.1.fetch_add(body.len() as u64, Ordering::Relaxed);
                [("content-type", "application/x-protobuf")]
            }),
        );
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        std::thread::spawn(move || {
            runtime.block_on(async move {
                if let Ok(listener) = tokio::net::TcpListener::from_std(listener) {
                    let _ = axum::serve(listener, app).await;
                }
            })
        });
        Ok(Collector { addr, posts, bytes })
    }

    fn posts(&self) -> u64 {
        self.posts.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn bytes(&self) -> u64 {
        self.bytes.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// One pass through the metered pair, its figures added to `figures` and `cpu`, then a scrape.
fn metered_pass(
    metered: &Mesh,
    phases: &[&str],
    calls: usize,
    figures: &mut [Vec<f64>],
    cpu: &mut Vec<f64>,
) -> anyhow::Result<()> {
    let m = measure(
        &metered.connect_cmd(),
        phases,
        calls,
        Some(metered),
        "",
        false,
    )?;
    for (slot, v) in figures.iter_mut().zip(m.figures) {
        if !v.is_nan() {
            slot.push(v);
        }
    }
    cpu.extend(m.cpu_per_call);
    metered.check_scrape()
}

fn median(v: &[f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1e6
}

/// What one pass measured (NaN for a figure of a phase it did not run).
struct Measured {
    figures: Vec<f64>,
    /// With a mesh to watch: the CPU time its processes spent per sequential call (µs).
    cpu_per_call: Option<f64>,
    /// With a mesh to watch: the same per call with 16 in flight (µs).
    cpu_per_x16: Option<f64>,
    /// With a mesh to watch: each node's peak RSS over the pass.
    peak: Vec<(&'static str, u64)>,
    /// The CPU time the process the client started spent per sequential call (µs): the
    /// server itself, or the first relay (whose own child is not counted).
    spawned_cpu_per_call: Option<f64>,
}

impl Measured {
    /// Adds the pass's call p50 and 16 in flight to `p50` and `x16`, where it measured them.
    fn keep_call_figures(&self, p50: &mut Vec<f64>, x16: &mut Vec<f64>) {
        p50.extend(Some(self.figures[1]).filter(|v| !v.is_nan()));
        x16.extend(Some(self.figures[4]).filter(|v| !v.is_nan()));
    }
}

/// One pass over `phases` against the server `cmd` starts.
fn measure(
    cmd: &[String],
    phases: &[&str],
    calls: usize,
    watch: Option<&Mesh>,
    prefix: &str,
    stateless: bool,
) -> anyhow::Result<Measured> {
    let runs = |phase: &str| phases.contains(&phase);
    watch.map(Mesh::reset_peaks);
    let mut figures = vec![f64::NAN; 9];
    if runs("open") {
        let open = || -> anyhow::Result<f64> {
            let t = Instant::now();
            let mut c = Client::start(cmd, prefix, stateless)?;
            c.initialize()?;
            let took = t.elapsed().as_secs_f64() * 1e3;
            c.close();
            Ok(took)
        };
        let opens = (0..5).map(|_| open()).collect::<anyhow::Result<Vec<_>>>()?;
        figures[0] = median(&opens);
        // A pooled connection silent for a while is probed before a session is trusted to it:
        // what the first open after a pause costs.
        let mut idle_opens = Vec::new();
        for _ in 0..3 {
            std::thread::sleep(IDLE_BEFORE_OPEN);
            idle_opens.push(open()?);
        }
        figures[IDLE_OPEN] = median(&idle_opens);
    }
    let mut c = Client::start(cmd, prefix, stateless)?;
    c.initialize()?;
    let text = "x".repeat(130);
    for _ in 0..200 {
        c.call_echo(&text)?;
    }
    let (mut cpu, mut cpu_x16, mut spawned_cpu) = (None, None, None);
    let cpu_since = |before: Option<u64>| {
        watch.zip(before).map(|(m, before)| {
            let ns = m.cpu_ns().saturating_sub(before) as f64;
            ns / 1e3 / calls as f64
        })
    };
    if runs("calls") {
        let mut rtts = Vec::with_capacity(calls);
        let cpu_before = watch.map(Mesh::cpu_ns);
        let spawned_before = bench::cpu_ns_of(c.child.id());
        for _ in 0..calls {
            let t = Instant::now();
            c.call_echo(&text)?;
            rtts.push(t.elapsed());
        }
        cpu = cpu_since(cpu_before);
        let spawned_ns = bench::cpu_ns_of(c.child.id()).saturating_sub(spawned_before);
        spawned_cpu = Some(spawned_ns as f64 / 1e3 / calls as f64);
        rtts.sort();
        for (slot, p) in [(1, 0.50), (2, 0.90), (3, 0.99)] {
            figures[slot] = percentile(&rtts, p);
        }
    }
    if runs("pipelined") {
        let cpu_before = watch.map(Mesh::cpu_ns);
        figures[4] = c.pipelined(&text, calls)?;
        cpu_x16 = cpu_since(cpu_before);
    }
    if runs("results") {
        for (slot, bytes) in [(5, MIB), (6, BIG)] {
            figures[slot] = c.throughput(
                c.stamped(json!({ "name": c.tool("blob"), "arguments": { "bytes": bytes } })),
                bytes,
            )?;
        }
    }
    if runs("requests") {
        figures[7] = c.throughput(
            c.stamped(json!({ "name": c.tool("size"), "arguments": { "text": "y".repeat(BIG) } })),
            BIG,
        )?;
    }
    c.close();
    if let Some(m) = watch {
        // `connect` hands its pipes to bob's node and exits: the session ends in the nodes
        // a moment after the client closed it.
        m.wait_idle()?;
    }
    let peak = watch.map(|m| m.rss_kib("VmHWM:")).unwrap_or_default();
    Ok(Measured {
        figures,
        cpu_per_call: cpu,
        cpu_per_x16: cpu_x16,
        peak,
        spawned_cpu_per_call: spawned_cpu,
    })
}

/// The CPU time of `pid`'s threads that send spans, in nanoseconds: the node's own sender
/// (`mcpmesh-traces`) and its HTTP client's runtime, or in builds before it the SDK's batch
/// processor.
fn export_ns_of(pid: u32) -> u64 {
    bench::threads_cpu_ns_of(pid, |c| {
        c.starts_with("mcpmesh-traces")
            || c.starts_with("OpenTelemetry")
            || c.starts_with("reqwest-")
    })
}

struct Client {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    next_id: u64,
    line: Vec<u8>,
    /// What the server's tool names are prefixed with (the hub's `peer__service__`).
    prefix: String,
    /// Speaks the 2026-07-28 revision: `server/discover`, and the envelope on each request.
    stateless: bool,
}

impl Client {
    fn tool(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }

    /// `params` as this client sends them: with the 2026-07-28 envelope when it speaks it.
    fn stamped(&self, mut params: Value) -> Value {
        if self.stateless {
            params["_meta"] = json!({
                "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientInfo": { "name": "mcpmesh-bench", "version": "0" },
                "io.modelcontextprotocol/clientCapabilities": {},
            });
        }
        params
    }

    fn start(cmd: &[String], prefix: &str, stateless: bool) -> anyhow::Result<Self> {
        let mut child = Command::new(&cmd[0])
            .args(&cmd[1..])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {}", cmd[0]))?;
        let stdin = child.stdin.take().context("stdin")?;
        let stdout = BufReader::with_capacity(1 << 20, child.stdout.take().context("stdout")?);
        Ok(Client {
            child,
            stdin,
            stdout,
            next_id: 0,
            line: Vec::with_capacity(1 << 16),
            prefix: prefix.to_owned(),
            stateless,
        })
    }

    fn send(&mut self, method: &str, params: &Value) -> anyhow::Result<u64> {
        self.next_id += 1;
        let mut msg = serde_json::to_vec(
            &json!({ "jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params }),
        )?;
        msg.push(b'\n');
        self.stdin.write_all(&msg)?;
        Ok(self.next_id)
    }

    /// Reads one answer line and returns the id it answers.
    fn recv_any(&mut self) -> anyhow::Result<u64> {
        self.line.clear();
        if self.stdout.read_until(b'\n', &mut self.line)? == 0 {
            bail!("the server closed its output");
        }
        let head = &self.line[..self.line.len().min(64)];
        let at = head
            .windows(5)
            .position(|w| w == b"\"id\":")
            .context("an answer without an id")?;
        let digits: String = head[at + 5..]
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .map(|&b| b as char)
            .collect();
        digits
            .parse()
            .context("an answer with an id that is not a number")
    }

    /// Reads one line; checks only that it answers `id` (both modes do the same work).
    fn recv(&mut self, id: u64) -> anyhow::Result<usize> {
        self.line.clear();
        let n = self.stdout.read_until(b'\n', &mut self.line)?;
        if n == 0 {
            bail!("the server closed its output");
        }
        let head = &self.line[..self.line.len().min(64)];
        let needle = format!("\"id\":{id},");
        if !head.windows(needle.len()).any(|w| w == needle.as_bytes()) {
            bail!(
                "unexpected answer: {}",
                String::from_utf8_lossy(&self.line[..self.line.len().min(300)])
            );
        }
        Ok(n)
    }

    fn initialize(&mut self) -> anyhow::Result<()> {
        if self.stateless {
            let id = self.send("server/discover", &self.stamped(json!({})))?;
            self.recv(id)?;
            return Ok(());
        }
        let id = self.send(
            "initialize",
            &json!({ "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": { "name": "mcpmesh-bench", "version": "0" } }),
        )?;
        self.recv(id)?;
        self.stdin
            .write_all(b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}\n")?;
        Ok(())
    }

    fn call_echo(&mut self, text: &str) -> anyhow::Result<()> {
        let params =
            self.stamped(json!({ "name": self.tool("echo"), "arguments": { "text": text } }));
        let id = self.send("tools/call", &params)?;
        self.recv(id)?;
        Ok(())
    }

    /// Calls per second with `PIPELINE` requests kept in flight.
    fn pipelined(&mut self, text: &str, calls: usize) -> anyhow::Result<f64> {
        let first = self.next_id + 1;
        let lines: Vec<Vec<u8>> = (0..calls as u64)
            .map(|i| {
                let params = self
                    .stamped(json!({ "name": self.tool("echo"), "arguments": { "text": text } }));
                let mut l = serde_json::to_vec(
                    &json!({ "jsonrpc": "2.0", "id": first + i, "method": "tools/call",
                    "params": params }),
                )
                .unwrap_or_default();
                l.push(b'\n');
                l
            })
            .collect();
        self.next_id += calls as u64;
        let (credit_tx, credit_rx) = sync_channel::<()>(PIPELINE);
        for _ in 0..PIPELINE {
            credit_tx.send(())?;
        }
        let mut stdin = clone_stdin(&self.stdin)?;
        let t = Instant::now();
        let writer = std::thread::spawn(move || -> std::io::Result<()> {
            for l in lines {
                if credit_rx.recv().is_err() {
                    break;
                }
                stdin.write_all(&l)?;
            }
            Ok(())
        });
        // Answers may come in any order (the hub's do): each is checked to answer one of the
        // requests sent, and all of them are counted.
        let mut seen = vec![false; calls];
        for _ in 0..calls {
            let id = self.recv_any()?;
            match id.checked_sub(first).map(|i| i as usize) {
                Some(i) if i < calls && !seen[i] => seen[i] = true,
                _ => bail!("an answer to {id}, which was not asked or answered twice"),
            }
            let _ = credit_tx.try_send(());
        }
        let elapsed = t.elapsed();
        writer
            .join()
            .map_err(|_| anyhow::anyhow!("writer panicked"))??;
        Ok(calls as f64 / elapsed.as_secs_f64())
    }

    /// MB/s for one call moving `bytes` (median of five).
    fn throughput(&mut self, params: Value, bytes: usize) -> anyhow::Result<f64> {
        let mut rates = Vec::new();
        for _ in 0..5 {
            let t = Instant::now();
            let id = self.send("tools/call", &params)?;
            self.recv(id)?;
            rates.push(bytes as f64 / t.elapsed().as_secs_f64() / 1e6);
        }
        Ok(median(&rates))
    }

    fn close(mut self) {
        drop(self.stdin);
        let _ = self.child.wait();
    }
}

/// A second handle on the child's stdin, for the pipelined writer thread.
fn clone_stdin(stdin: &ChildStdin) -> std::io::Result<ChildStdin> {
    use std::os::fd::AsFd;
    Ok(ChildStdin::from(stdin.as_fd().try_clone_to_owned()?))
}

/// Two hermetic nodes in temporary profiles; alice serves the stub as `bench` to bob.
struct Mesh {
    _dir: tempfile::TempDir,
    mcpmesh: PathBuf,
    alice: PathBuf,
    bob: PathBuf,
}

impl Mesh {
    /// The pair; `extra` is added to both nodes' config; with `rules`, bob may call only the
    /// tools the bench calls.
    fn start(mcpmesh: &Path, stub: &Path, extra: &str, rules: bool) -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("mcpmesh-bench-")
            .tempdir()?;
        let (alice, bob) = (dir.path().join("alice"), dir.path().join("bob"));
        let mesh = Mesh {
            mcpmesh: mcpmesh.to_path_buf(),
            alice: alice.clone(),
            bob: bob.clone(),
            _dir: dir,
        };
        let mut ids = Vec::new();
        for home in [&alice, &bob] {
            std::fs::create_dir_all(home)?;
            std::fs::write(
                home.join("config.toml"),
                format!(
                    "[network]\nrelay_mode = \"disabled\"\nbind = \"127.0.0.1:0\"\n\n[limits]\nrate_limit_per_min = 1000000\n\n{extra}"
                ),
            )?;
            ids.push(mesh.cli(home, &["--json", "id"])?);
        }
        let (a, b) = (&ids[0], &ids[1]);
        mesh.cli(
            &alice,
            &[
                "peers",
                "add",
                "bob",
                s(&b["id"]),
                "--addr",
                s(&b["addrs"][0]),
            ],
        )?;
        mesh.cli(
            &bob,
            &[
                "peers",
                "add",
                "alice",
                s(&a["id"]),
                "--addr",
                s(&a["addrs"][0]),
            ],
        )?;
        mesh.cli(
            &alice,
            &[
                "serve",
                "bench",
                "--allow",
                "bob",
                "--max-sessions",
                "64",
                "--",
                &stub.display().to_string(),
            ],
        )?;
        if rules {
            mesh.cli(
                &alice,
                &["grant", "bob", "bench", "--tools", "echo,blob,size"],
            )?;
        }
        Ok(mesh)
    }

    /// `mcpmesh connect alice/bench` as bob.
    fn connect_cmd(&self) -> Vec<String> {
        vec![
            self.mcpmesh.display().to_string(),
            "--home".into(),
            self.bob.display().to_string(),
            "connect".into(),
            "alice/bench".into(),
        ]
    }

    /// Scrapes both nodes' metrics (as Prometheus would after a pass) and checks that they
    /// counted the calls.
    fn check_scrape(&self) -> anyhow::Result<()> {
        use std::io::Read;
        for (home, series) in [
            (&self.alice, "mcp_server_operation_duration_seconds_count"),
            (&self.bob, "mcp_client_operation_duration_seconds_count"),
        ] {
            let status = self.cli(home, &["--json", "status"])?;
            let url = s(&status["metrics"]["url"]);
            let addr = url
                .strip_prefix("http://")
                .and_then(|rest| rest.strip_suffix("/metrics"))
                .with_context(|| format!("metrics are not on: {status}"))?;
            let mut stream = std::net::TcpStream::connect(addr)?;
            write!(
                stream,
                "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
            )?;
            let mut page = String::new();
            stream.read_to_string(&mut page)?;
            if !page
                .lines()
                .any(|l| l.starts_with(series) && l.contains("gen_ai_tool_name=\"echo\""))
            {
                bail!("the scrape shows no echo call in {series}");
            }
        }
        Ok(())
    }

    /// Spans both nodes' exporters had accepted and could not send, as `status` tells.
    fn spans(&self) -> anyhow::Result<(u64, u64)> {
        let (mut sent, mut failed) = (0, 0);
        for home in [&self.alice, &self.bob] {
            let status = self.cli(home, &["--json", "status"])?;
            sent += status["traces"]["sent"].as_u64().unwrap_or(0);
            failed += status["traces"]["failed"].as_u64().unwrap_or(0);
        }
        Ok((sent, failed))
    }

    /// Both daemons' CPU time, in nanoseconds.
    fn cpu_ns(&self) -> u64 {
        [&self.alice, &self.bob]
            .iter()
            .filter_map(|h| bench::daemon_pid(h))
            .map(bench::cpu_ns_of)
            .sum()
    }

    fn pids(&self) -> Vec<(&'static str, Option<u32>)> {
        vec![
            ("alice", bench::daemon_pid(&self.alice)),
            ("bob", bench::daemon_pid(&self.bob)),
        ]
    }

    /// A `/proc/PID/status` memory figure (`VmRSS:`, `VmHWM:`) of each daemon, in KiB.
    fn rss_kib(&self, key: &str) -> Vec<(&'static str, u64)> {
        [("alice", &self.alice), ("bob", &self.bob)]
            .into_iter()
            .map(|(who, h)| {
                (
                    who,
                    bench::daemon_pid(h).map_or(0, |pid| bench::status_kib(pid, key)),
                )
            })
            .collect()
    }

    /// Waits until neither node has a session left.
    fn wait_idle(&self) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(10);
        for home in [&self.alice, &self.bob] {
            while self.cli(home, &["--json", "status"])?["sessions"]
                .as_array()
                .is_some_and(|s| !s.is_empty())
            {
                if Instant::now() > deadline {
                    bail!("the nodes' sessions did not end");
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        Ok(())
    }

    /// Starts each daemon's peak RSS (VmHWM) over from its current RSS (`clear_refs` 5).
    fn reset_peaks(&self) {
        for h in [&self.alice, &self.bob] {
            if let Some(pid) = bench::daemon_pid(h) {
                let _ = std::fs::write(format!("/proc/{pid}/clear_refs"), "5");
            }
        }
    }

    fn cli(&self, home: &Path, args: &[&str]) -> anyhow::Result<Value> {
        let out = Command::new(&self.mcpmesh)
            .arg("--home")
            .arg(home)
            .args(args)
            .output()?;
        if !out.status.success() {
            bail!("mcpmesh {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(serde_json::from_slice(&out.stdout).unwrap_or(Value::Null))
    }
}

fn s(v: &Value) -> &str {
    v.as_str().unwrap_or_default()
}

impl Drop for Mesh {
    fn drop(&mut self) {
        for home in [&self.alice, &self.bob] {
            let _ = Command::new(&self.mcpmesh)
                .arg("--home")
                .arg(home)
                .arg("down")
                .output();
        }
    }
}

/// The transport's own floor on this machine: two iroh endpoints built as the nodes build
/// theirs, echoing 200-byte lines over one stream, either each on its own thread with its own
/// runtime (as two nodes are two processes) or both on one thread.
fn iroh_floor(calls: usize, one_thread: bool) -> anyhow::Result<Floor> {
    let runtime = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    };
    let (addr_tx, addr_rx) = tokio::sync::oneshot::channel();
    if one_thread {
        return runtime()?.block_on(async move {
            let server = tokio::spawn(echo_server(addr_tx));
            let result = echo_client(addr_rx.await?, calls).await;
            server.abort();
            result
        });
    }
    let server = std::thread::spawn(move || -> anyhow::Result<()> {
        runtime()?.block_on(echo_server(addr_tx))
    });
    let result = runtime()?.block_on(async move { echo_client(addr_rx.await?, calls).await });
    let _ = server.join();
    result
}

const ECHO_ALPN: &[u8] = b"mcpmesh-bench/echo";

/// Accepts one connection and echoes the lines of its first stream.
async fn echo_server(
    addr_tx: tokio::sync::oneshot::Sender<iroh::EndpointAddr>,
) -> anyhow::Result<()> {
    let book = iroh::address_lookup::MemoryLookup::new();
    let key = iroh::SecretKey::generate();
    let ep = mcpmesh_net::endpoint::bind(
        key,
        &mcpmesh_net::endpoint::NetworkConfig::loopback(),
        vec![ECHO_ALPN.to_vec()],
        book,
    )
    .await?;
    let _ = addr_tx.send(ep.addr());
    let conn = ep.accept().await.context("no connection")?.await?;
    let (mut send, recv) = conn.accept_bi().await?;
    let mut reader = mcpmesh_net::transport::FrameReader::new(recv, 1 << 20);
    while let Some(mcpmesh_net::transport::Batch::Lines(run)) = reader.next_batch().await? {
        if run == BULK_ASK {
            send.write_all(&[vec![b'y'; BIG], b"\n".to_vec()].concat())
                .await?;
            continue;
        }
        send.write_all(&run).await?;
    }
    Ok(())
}

/// Asked alone, the echo server answers it with an 8 MiB line.
const BULK_ASK: &[u8] = b"bulk\n";

/// `calls` round trips of `line` with `PIPELINE` in flight, a new one sent as each echo comes
/// back; calls per second.
async fn echo_pipelined(
    send: &mut iroh::endpoint::SendStream,
    reader: &mut mcpmesh_net::transport::FrameReader<iroh::endpoint::RecvStream>,
    line: &[u8],
    calls: usize,
) -> anyhow::Result<f64> {
    let t = Instant::now();
    for _ in 0..PIPELINE {
        send.write_all(line).await?;
    }
    for i in 0..calls {
        reader.next_line().await?.context("the echo ended")?;
        if i + PIPELINE < calls {
            send.write_all(line).await?;
        }
    }
    Ok(calls as f64 / t.elapsed().as_secs_f64())
}

/// `calls` sequential 200-byte round trips after a warm-up, then `calls` with `PIPELINE` in
/// flight, then an 8 MiB answer and `calls` with `PIPELINE` in flight again.
async fn echo_client(addr: iroh::EndpointAddr, calls: usize) -> anyhow::Result<Floor> {
    let book = iroh::address_lookup::MemoryLookup::new();
    book.add_endpoint_info(addr.clone());
    let ep = mcpmesh_net::endpoint::bind(
        iroh::SecretKey::generate(),
        &mcpmesh_net::endpoint::NetworkConfig::loopback(),
        vec![],
        book,
    )
    .await?;
    let conn = ep.connect(addr, ECHO_ALPN).await?;
    let (mut send, recv) = conn.open_bi().await?;
    let mut reader = mcpmesh_net::transport::FrameReader::new(recv, BIG + 1);
    let line = [&[b'x'; 199][..], b"\n"].concat();
    let mut rtts = Vec::with_capacity(calls);
    let mut cpu_before = 0;
    for i in 0..calls + 200 {
        if i == 200 {
            cpu_before = bench::cpu_ns_of(std::process::id());
        }
        let t = Instant::now();
        send.write_all(&line).await?;
        reader.next_line().await?.context("the echo ended")?;
        if i >= 200 {
            rtts.push(t.elapsed());
        }
    }
    let cpu_ns = bench::cpu_ns_of(std::process::id()).saturating_sub(cpu_before) as f64;
    let pipelined = echo_pipelined(&mut send, &mut reader, &line, calls).await?;
    // A large answer leaves the side that took it with a congestion window of a few packets
    // (it loses some of its own to the burst): what 16 in flight do right after one.
    send.write_all(BULK_ASK).await?;
    reader.next_line().await?.context("the echo ended")?;
    let after_bulk = echo_pipelined(&mut send, &mut reader, &line, calls).await?;
    send.finish()?;
    rtts.sort();
    Ok(Floor {
        p50: percentile(&rtts, 0.5),
        cpu: cpu_ns / 1e3 / calls as f64,
        pipelined,
        after_bulk,
    })
}

/// The mesh's path built from this run's parts, each measured on its own: a client, one
/// process that only copies bytes, the server (relayed once), where that process hands a
/// request on at once, and bob's and alice's nodes hand it on over a QUIC round trip (the
/// floor on two threads). The mesh adds its own work to that: the scan, the limits, the audit.
struct Composed {
    /// Relayed once plus the floor's round trip, µs.
    p50: f64,
    /// With 16 in flight on a machine both parts keep busy, their times per call add up:
    /// `1 / (1 / relayed once + 1 / floor)`, calls/s.
    x16: f64,
    /// The relay's CPU per sequential call plus the floor's, µs: what the two nodes do that
    /// is not their own work.
    cpu: f64,
}

impl Composed {
    /// From relayed once and the floor, each as (p50 µs, x16 calls/s, CPU µs).
    fn of(once: (f64, f64, f64), floor: (f64, f64, f64)) -> Self {
        Composed {
            p50: once.0 + floor.0,
            x16: 1.0 / (1.0 / once.1 + 1.0 / floor.1),
            cpu: once.2 + floor.2,
        }
    }
}

/// What the bare transport does on this machine.
struct Floor {
    /// Sequential round trip p50, µs.
    p50: f64,
    /// CPU per sequential round trip, both endpoints, µs.
    cpu: f64,
    /// Round trips per second with `PIPELINE` in flight.
    pipelined: f64,
    /// The same, right after an 8 MiB answer on the same connection.
    after_bulk: f64,
}

impl Floor {
    /// 16 in flight right after an 8 MiB answer against before it.
    fn after_bulk_ratio(&self) -> f64 {
        self.after_bulk / self.pipelined
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn the_flags_bench_check_passes_parse_and_counts_are_raised_to_their_floor() {
        let args = Args::try_parse_from([
            "bench",
            "--rounds",
            "3",
            "--calls",
            "2000",
            "--json",
            "out.json",
            "--telemetry",
            "--rules",
            "--no-hub",
        ])
        .unwrap();
        assert_eq!((args.rounds, args.calls), (3, 2000));
        assert_eq!(args.json.as_deref(), Some(Path::new("out.json")));
        assert!(args.telemetry && args.rules && args.no_hub && args.only.is_none());
        let args = Args::try_parse_from([
            "bench", "--rounds", "0", "--calls", "5", "--only", "results",
        ])
        .unwrap();
        assert_eq!((args.rounds, args.calls), (1, 100));
        assert_eq!(args.phases(&PHASES), ["results"]);
        let args = Args::try_parse_from(["bench"]).unwrap();
        assert_eq!((args.rounds, args.calls, args.telemetry), (3, 2000, false));
        assert!(Args::try_parse_from(["bench", "--only", "nope"]).is_err());
        assert!(Args::try_parse_from(["bench", "--calls", "x"]).is_err());
    }

    #[test]
    fn the_composed_path_adds_the_relays_and_the_floors_times_per_call() {
        // Relayed once: 50 µs, 100,000/s, 20 µs of CPU; the floor: 30 µs, 150,000/s, 40 µs.
        let c = Composed::of((50.0, 100_000.0, 20.0), (30.0, 150_000.0, 40.0));
        assert_eq!((c.p50, c.cpu), (80.0, 60.0));
        // 10 µs + 6.67 µs a call with 16 in flight: 60,000/s.
        assert!((c.x16 - 60_000.0).abs() < 1e-6, "{}", c.x16);
        // A part this run did not measure leaves the composed figure unmeasured.
        let c = Composed::of((f64::NAN, f64::NAN, f64::NAN), (30.0, 150_000.0, 40.0));
        assert!(c.p50.is_nan() && c.x16.is_nan() && c.cpu.is_nan());
    }
}
