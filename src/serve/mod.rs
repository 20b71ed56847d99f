//! `hob serve`: an OpenAI-compatible HTTP server over one model at batch 1.
//!
//! The HTTP side (axum on a small tokio runtime: [`routes`]) checks requests ([`api`]) and puts
//! them in a bounded FIFO queue; one generation thread ([`worker`]) owns the model and takes them
//! in order, streaming each answer's text back over a channel. The KV cache keeps the previous
//! request's tokens, so a multi-turn chat prefills only what is new.

pub mod api;
mod metrics;
mod routes;
pub mod tools;
pub mod worker;

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::serve::ListenerExt;

pub use worker::Loaded;

use crate::Error;

/// What the server needs besides the model.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub host: String,
    pub port: u16,
    /// Requests must send `Authorization: Bearer KEY` (all routes but `/health` and `/`).
    pub api_key: Option<String>,
    /// The model's name in /v1/models and in requests.
    pub model_name: String,
    /// Requests that may wait for the model; one more is refused with 429.
    pub queue: usize,
    /// The largest request body, in bytes (413 beyond).
    pub max_body: usize,
}

/// Runs `load` on the generation thread; it builds the model and hands it to the callback,
/// which serves requests until the server stops.
pub type LoadFn<'l> = dyn FnOnce(&mut dyn FnMut(Loaded<'_>)) -> crate::Result<()> + Send + 'l;

/// Listen on the configured address, load the model (requests get 503 until it is ready) and
/// serve until SIGINT or SIGTERM; in-flight requests end within a token.
pub fn run(cfg: ServerConfig, load: Box<LoadFn<'_>>) -> crate::Result<()> {
    let server = Server::bind(cfg)?;
    // Handlers in place before anything is served: a signal during the load stops the server
    // instead of killing it.
    let stop = server.rt.block_on(async { stop_signal() })?;
    server.serve(load, stop)
}

/// A bound server, before it serves.
pub struct Server {
    rt: tokio::runtime::Runtime,
    listener: tokio::net::TcpListener,
    /// The address it listens on (the port the OS picked for port 0).
    pub addr: SocketAddr,
    cfg: ServerConfig,
}

impl Server {
    pub fn bind(cfg: ServerConfig) -> crate::Result<Server> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("hob-http")
            .enable_all()
            .build()
            .map_err(|e| Error::Invalid(format!("cannot start the HTTP runtime: {e}")))?;
        let want = format!("{}:{}", cfg.host, cfg.port);
        let cannot = |e: std::io::Error| Error::Invalid(format!("cannot listen on {want}: {e}"));
        let listener = rt
            .block_on(tokio::net::TcpListener::bind(&want))
            .map_err(cannot)?;
        let addr = listener.local_addr().map_err(cannot)?;
        Ok(Server {
            rt,
            listener,
            addr,
            cfg,
        })
    }

    /// Load the model with `load` on the generation thread and serve until `stop` completes
    /// (or the load fails: its error is returned).
    pub fn serve(
        self,
        load: Box<LoadFn<'_>>,
        stop: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> crate::Result<()> {
        let Server {
            rt,
            listener,
            addr,
            cfg,
        } = self;
        let (tx, rx) = crossbeam_channel::bounded(cfg.queue);
        let metrics = Arc::new(metrics::Metrics::default());
        let state = Arc::new(routes::AppState::new(cfg, tx, metrics.clone()));
        eprintln!("hob serve: listening on http://{addr} (the model is loading)");
        let failed = Arc::new(tokio::sync::Notify::new());
        std::thread::scope(|scope| {
            let gen = std::thread::Builder::new()
                .name("hob-generate".into())
                .spawn_scoped(scope, {
                    let (state, failed) = (state.clone(), failed.clone());
                    move || {
                        let r = load(&mut |loaded| {
                            state.ready.store(true, Ordering::SeqCst);
                            eprintln!("hob serve: ready on http://{addr}");
                            worker::serve_jobs(loaded, rx.clone(), &metrics);
                        });
                        if r.is_err() {
                            failed.notify_one();
                        }
                        r
                    }
                })
                .map_err(|e| Error::Invalid(format!("cannot start the generation thread: {e}")))?;
            let app = routes::router(state.clone());
            let shutdown = {
                let state = state.clone();
                async move {
                    tokio::select! {
                        _ = stop => eprintln!("hob serve: stopping"),
                        _ = failed.notified() => {}
                    }
                    state.stop();
                }
            };
            let served = rt.block_on(async {
                // Each SSE chunk goes out when written, not held for the last one's ACK.
                let listener = listener.tap_io(|tcp| {
                    if let Err(e) = tcp.set_nodelay(true) {
                        log::debug!("TCP_NODELAY on an accepted connection: {e}");
                    }
                });
                axum::serve(listener, app)
                    .with_graceful_shutdown(shutdown)
                    .await
            });
            state.stop();
            let loaded = gen
                .join()
                .map_err(|_| Error::Invalid("the generation thread panicked".into()))?;
            loaded?;
            served.map_err(|e| Error::Invalid(format!("the HTTP server failed: {e}")))
        })
    }
}

/// A future that completes at SIGINT or SIGTERM; the handlers are installed when this returns.
fn stop_signal() -> crate::Result<impl std::future::Future<Output = ()> + Send + 'static> {
    use tokio::signal::unix::{signal, SignalKind};
    let handler = |kind: SignalKind, name: &str| {
        signal(kind).map_err(|e| Error::Invalid(format!("cannot install the {name} handler: {e}")))
    };
    let mut int = handler(SignalKind::interrupt(), "SIGINT")?;
    let mut term = handler(SignalKind::terminate(), "SIGTERM")?;
    Ok(async move {
        tokio::select! {
            _ = int.recv() => {}
            _ = term.recv() => {}
        }
    })
}
