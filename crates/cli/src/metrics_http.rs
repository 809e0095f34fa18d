//! `/metrics` over HTTP on an address of its own (`--metrics-listen`), for a node or a
//! gateway: the Prometheus text format (OpenMetrics) its `render` gives, on every GET. Apart
//! from the S3 port, so that a scraper needs no S3 credentials and S3 clients never see it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use http_body_util::Full;
use hyper_util::rt::{TokioIo, TokioTimer};

/// Scrapes served at once; more wait in the listen backlog.
const SCRAPES_IN_FLIGHT_MAX: usize = 16;
/// Time a scraper has to send its request headers.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// OpenMetrics text, which Prometheus negotiates and reads.
const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// What renders the metrics on each scrape.
pub(crate) type Render = Arc<dyn Fn() -> String + Send + Sync>;

/// Binds `addr`; errors name the address.
pub(crate) async fn bind(addr: SocketAddr) -> anyhow::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr).await.with_context(|| format!("listen for metrics on {addr}"))
}

/// Serves scrapes forever.
pub(crate) async fn serve(listener: tokio::net::TcpListener, render: Render) {
    let permits = Arc::new(tokio::sync::Semaphore::new(SCRAPES_IN_FLIGHT_MAX));
    loop {
        let permit = Arc::clone(&permits).acquire_owned().await.expect("the semaphore is never closed");
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::warn!("accept a metrics connection: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let render = Arc::clone(&render);
        let service = hyper::service::service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
            let render = Arc::clone(&render);
            async move { Ok::<_, std::convert::Infallible>(answer(&request, &render)) }
        });
        tokio::spawn(async move {
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service);
            if let Err(e) = connection.await {
                tracing::debug!("metrics connection from {peer}: {e}");
            }
            drop(permit);
        });
    }
}

fn answer<B>(request: &hyper::Request<B>, render: &Render) -> hyper::Response<Full<bytes::Bytes>> {
    let (status, content_type, body) = match (request.method(), request.uri().path()) {
        (&hyper::Method::GET, "/metrics") => (hyper::StatusCode::OK, CONTENT_TYPE, render()),
        (&hyper::Method::GET, _) => {
            (hyper::StatusCode::NOT_FOUND, "text/plain", "only /metrics is served here\n".into())
        }
        _ => (hyper::StatusCode::METHOD_NOT_ALLOWED, "text/plain", "only GET is served here\n".into()),
    };
    let mut response = hyper::Response::new(Full::new(bytes::Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static(content_type));
    response
}

/// Serves a node's metrics from a thread of its own (the node serves from plain threads).
pub(crate) fn serve_in_thread(addr: SocketAddr, render: Render) -> anyhow::Result<SocketAddr> {
    let runtime =
        tokio::runtime::Builder::new_current_thread().enable_all().build().context("start the metrics runtime")?;
    let listener = runtime.block_on(bind(addr))?;
    let local = listener.local_addr().context("read the metrics address")?;
    std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || runtime.block_on(serve(listener, render)))
        .context("start the metrics thread")?;
    Ok(local)
}
