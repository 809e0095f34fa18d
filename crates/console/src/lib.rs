//! The web console: pages for people who would rather look than read, served by the gateway
//! process on an address of its own (`tessera gateway --console-listen`, `tessera up` by
//! default), over the same smart client the gateway uses.
//!
//! Log in with S3 credentials (the root's, or a scoped key's: the console does only what that
//! key may). A session is a random id in an `HttpOnly`, `SameSite=Strict` cookie that expires;
//! every change (a form POST, an upload) carries the session's CSRF token and must come from
//! the console's own origin. Pages are rendered on the server (maud escapes every value);
//! the only script is the console's own upload script, from its own origin, under a strict
//! Content-Security-Policy. Names travel in query parameters, never as paths.
//!
//! Main types: [`Console`], [`ConsoleConfig`].

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use access::{Action, KeyStore};
use bytes::Bytes;
use http_body_util::BodyExt as _;
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};

mod pages;
mod session;
mod traffic;

pub use traffic::{Traffic, TrafficSource};

use session::{Session, Sessions, Who};

/// Connections served at once; more wait in the listen backlog.
pub const CONNECTIONS_MAX: usize = 256;
/// Time a browser has to finish its TLS handshake (a real one takes milliseconds).
const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Time a browser has to send a request's headers.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// Largest form body (login, create bucket, delete).
const FORM_BYTES_MAX: usize = 16 << 10;
/// Rows of one object listing page (folders and objects).
pub const PAGE_ROWS: usize = 500;
/// Listings one page of the object browser makes at most (each skips past a folder or reads
/// up to [`PAGE_ROWS`] keys).
const LISTINGS_PER_PAGE_MAX: usize = 100;
/// Objects a bucket's count and size are summed over on the buckets page (one listing); past
/// it the page says "at least".
pub const BUCKET_COUNT_MAX: usize = 1_000;
/// Buckets whose objects the buckets page counts; the others show no count.
const BUCKETS_COUNTED_MAX: usize = 20;
/// Time a browser has to send a whole form, and the longest pause inside an upload's body.
const BODY_IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// Key lookups in the cluster (logins, session checks) at once; more wait.
const KEY_LOOKUPS_MAX: usize = 8;
/// How long a scoped key's session lives on when its key cannot be checked (the cluster does
/// not answer); past it the session ends, so a revocation is never missed for longer.
const KEY_CHECK_GRACE: Duration = Duration::from_secs(30);
/// Bytes a download reads from the cluster at a time (memory per download).
const DOWNLOAD_WINDOW: usize = 4 << 20;
/// Pause after a failed login (slows guessing; the secret space makes guessing hopeless anyway).
const LOGIN_FAILURE_PAUSE: Duration = Duration::from_millis(250);
/// Name of the session cookie.
const COOKIE: &str = "tessera_console";
/// Every answer's Content-Security-Policy: the console's own script and style only, no frames.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; \
                   form-action 'self'; frame-ancestors 'none'; base-uri 'none'";
/// Session lifetime unless configured.
pub const SESSION_TTL_DEFAULT: Duration = Duration::from_secs(8 * 3600);

const CONSOLE_CSS: &str = include_str!("../assets/console.css");
const CONSOLE_JS: &str = include_str!("../assets/console.js");
/// uPlot, vendored from npm at a pinned version (scripts/vendor-console-assets.sh).
const UPLOT_JS: &str = include_str!("../assets/vendor/uplot/uPlot.iife.min.js");
const UPLOT_CSS: &str = include_str!("../assets/vendor/uplot/uPlot.min.css");

/// What a console serves and whom it lets in.
#[derive(Clone)]
pub struct ConsoleConfig {
    pub listen: SocketAddr,
    /// The gateway's root credentials (also valid here).
    pub root_access_key: String,
    pub root_secret_key: String,
    /// How long a login lasts.
    pub session_ttl: Duration,
    /// The gateway's request totals, for the cluster page's live charts (none: no charts).
    pub traffic: Option<TrafficSource>,
    /// Serve HTTPS with this configuration (the gateway's certificate); session cookies are
    /// then `Secure`.
    pub tls: Option<Arc<rustls::ServerConfig>>,
}

impl std::fmt::Debug for ConsoleConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsoleConfig")
            .field("listen", &self.listen)
            .field("root_access_key", &self.root_access_key)
            .field("session_ttl", &self.session_ttl)
            .finish_non_exhaustive()
    }
}

/// Why a console could not start.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("listen for the console on {addr}: {source}")]
    Bind { addr: SocketAddr, source: std::io::Error },
}

/// A bound console, ready to serve.
pub struct Console {
    listener: tokio::net::TcpListener,
    state: Arc<State>,
    tls: Option<tokio_rustls::TlsAcceptor>,
}

impl std::fmt::Debug for Console {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Console").field("listener", &self.listener).finish_non_exhaustive()
    }
}

struct State {
    client: client::Client,
    keys: KeyStore,
    key_lookups: tokio::sync::Semaphore,
    /// Host names the console answers to (DNS rebinding): empty means any.
    hosts: Vec<String>,
    sessions: Sessions,
    root_access_key: String,
    root_secret_key: String,
    /// The last cluster status asked of the nodes and when: every open cluster page reloads
    /// every few seconds, and all of them share one round of requests per
    /// [`CLUSTER_STATUS_MAX_AGE`] (the lock is held while it is asked anew).
    cluster_status: tokio::sync::Mutex<Option<(std::time::Instant, Arc<client::ClusterStatus>)>>,
    /// The gateway's traffic, sampled (only when the console was given a source).
    traffic: Option<Arc<traffic::Samples>>,
    /// Served over HTTPS: cookies are `Secure`.
    secure: bool,
}

/// How long one round of status requests to every node serves the cluster pages.
const CLUSTER_STATUS_MAX_AGE: Duration = Duration::from_secs(2);

impl Console {
    pub async fn bind(client: client::Client, config: ConsoleConfig) -> Result<Self, Error> {
        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .map_err(|source| Error::Bind { addr: config.listen, source })?;
        let local = listener.local_addr().map_err(|source| Error::Bind { addr: config.listen, source })?;
        let state = State {
            keys: KeyStore::new(client.clone()),
            key_lookups: tokio::sync::Semaphore::new(KEY_LOOKUPS_MAX),
            hosts: allowed_hosts(local),
            client,
            sessions: Sessions::new(config.session_ttl),
            root_access_key: config.root_access_key,
            root_secret_key: config.root_secret_key,
            cluster_status: tokio::sync::Mutex::new(None),
            traffic: config.traffic.as_ref().map(|_| Arc::new(traffic::Samples::default())),
            secure: config.tls.is_some(),
        };
        if let (Some(samples), Some(source)) = (&state.traffic, config.traffic) {
            tokio::spawn(traffic::sample(Arc::downgrade(samples), source));
        }
        let tls = config.tls.map(tokio_rustls::TlsAcceptor::from);
        Ok(Self { listener, state: Arc::new(state), tls })
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves until `shutdown` completes.
    pub async fn serve(self, shutdown: impl std::future::Future<Output = ()>) {
        let permits = Arc::new(tokio::sync::Semaphore::new(CONNECTIONS_MAX));
        tokio::pin!(shutdown);
        loop {
            let permit = tokio::select! {
                () = &mut shutdown => return,
                permit = Arc::clone(&permits).acquire_owned() => permit.expect("the semaphore is never closed"),
            };
            let (stream, peer) = tokio::select! {
                () = &mut shutdown => return,
                accepted = self.listener.accept() => match accepted {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        tracing::warn!("accept a console connection: {e}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
            };
            let state = Arc::clone(&self.state);
            let service = hyper::service::service_fn(move |request: Request<hyper::body::Incoming>| {
                let state = Arc::clone(&state);
                async move { Ok::<_, std::convert::Infallible>(with_security_headers(route(&state, request).await)) }
            });
            let tls = self.tls.clone();
            tokio::spawn(async move {
                let mut http = hyper::server::conn::http1::Builder::new();
                http.timer(TokioTimer::new()).header_read_timeout(HEADER_READ_TIMEOUT);
                let served = match tls {
                    None => http.serve_connection(TokioIo::new(stream), service).await.map_err(|e| e.to_string()),
                    // The handshake runs in the connection's task under its own bound, never in
                    // the accept loop.
                    Some(acceptor) => {
                        match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                            Ok(Ok(stream)) => {
                                http.serve_connection(TokioIo::new(stream), service).await.map_err(|e| e.to_string())
                            }
                            Ok(Err(e)) => Err(format!("TLS handshake: {e}")),
                            Err(_) => Err(format!("TLS handshake not done within {TLS_HANDSHAKE_TIMEOUT:?}")),
                        }
                    }
                };
                if let Err(e) = served {
                    tracing::debug!("console connection from {peer}: {e}");
                }
                drop(permit);
            });
        }
    }
}

/// The host names a console on `local` answers to: on a loopback address only loopback names
/// (a page of another site whose name was rebound to 127.0.0.1 is refused); elsewhere any.
fn allowed_hosts(local: SocketAddr) -> Vec<String> {
    if !local.ip().is_loopback() {
        return Vec::new();
    }
    let ip = match local.ip() {
        std::net::IpAddr::V4(ip) => ip.to_string(),
        std::net::IpAddr::V6(ip) => format!("[{ip}]"),
    };
    let mut hosts: Vec<String> = vec!["localhost".into(), "127.0.0.1".into(), "[::1]".into(), ip];
    hosts.dedup();
    hosts.into_iter().map(|host| format!("{host}:{}", local.port())).collect()
}

type Body = http_body_util::combinators::BoxBody<Bytes, std::io::Error>;

fn full(bytes: impl Into<Bytes>) -> Body {
    http_body_util::Full::new(bytes.into()).map_err(|never| match never {}).boxed()
}

fn respond(status: StatusCode, content_type: &'static str, body: Body) -> Response<Body> {
    let mut response = Response::new(body);
    *response.status_mut() = status;
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

fn page(status: StatusCode, markup: maud::Markup) -> Response<Body> {
    respond(status, "text/html; charset=utf-8", full(markup.into_string()))
}

fn redirect(to: &str) -> Response<Body> {
    let mut response = respond(StatusCode::SEE_OTHER, "text/plain; charset=utf-8", full(""));
    let location = HeaderValue::from_str(to).unwrap_or_else(|_| HeaderValue::from_static("/"));
    response.headers_mut().insert(header::LOCATION, location);
    response
}

fn with_security_headers(mut response: Response<Body>) -> Response<Body> {
    let headers = response.headers_mut();
    headers.insert("content-security-policy", HeaderValue::from_static(CSP));
    headers.insert("x-content-type-options", HeaderValue::from_static("nosniff"));
    // Not `no-referrer`: under it browsers send `Origin: null` on the console's own form posts,
    // which the same-origin check must refuse. `same-origin` keeps URLs (bucket and key names)
    // from other sites and still names the console's origin to itself.
    headers.insert("referrer-policy", HeaderValue::from_static("same-origin"));
    headers.insert("x-frame-options", HeaderValue::from_static("DENY"));
    if !headers.contains_key(header::CACHE_CONTROL) {
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    response
}

/// A request's query parameter.
fn param(request: &Request<hyper::body::Incoming>, name: &str) -> Option<String> {
    let query = request.uri().query()?;
    form_urlencoded::parse(query.as_bytes()).find(|(n, _)| n == name).map(|(_, v)| v.into_owned())
}

/// A query string (`?a=1&b=2`) of these pairs, URL-encoded.
pub(crate) fn query(pairs: &[(&str, &str)]) -> String {
    let mut out = form_urlencoded::Serializer::for_suffix(String::from("?"), 1);
    for (name, value) in pairs {
        out.append_pair(name, value);
    }
    out.finish()
}

/// The session id in the request's cookie. Several session cookies (another site on this host
/// can set one for a narrower path: cookies are not scoped by port) mean no session.
fn cookie_session(request: &Request<hyper::body::Incoming>) -> Option<String> {
    let mut ids = request
        .headers()
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .filter(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value.to_owned());
    let id = ids.next()?;
    ids.next().is_none().then_some(id)
}

/// Whether the request names a host the console answers to ([`allowed_hosts`]).
fn host_allowed(state: &State, request: &Request<hyper::body::Incoming>) -> bool {
    let host = request.headers().get(header::HOST).and_then(|v| v.to_str().ok());
    state.hosts.is_empty() || host.is_some_and(|host| state.hosts.iter().any(|h| h.eq_ignore_ascii_case(host)))
}

/// Whether a state-changing request comes from the console's own pages: browsers send
/// `Origin` on POST and on script requests; its host must be the request's `Host`. Without
/// `Origin` it is no browser's cross-site request, and the CSRF token still has to match,
/// unless `origin_required` (the login, which has no token yet).
fn same_origin(request: &Request<hyper::body::Incoming>, origin_required: bool) -> bool {
    let host = request.headers().get(header::HOST).and_then(|v| v.to_str().ok());
    let origin = request.headers().get(header::ORIGIN).and_then(|v| v.to_str().ok());
    match (host, origin) {
        (Some(host), Some(origin)) => {
            let origin_host = origin.strip_prefix("http://").or_else(|| origin.strip_prefix("https://"));
            origin_host == Some(host)
        }
        (Some(_), None) => !origin_required,
        (None, _) => false,
    }
}

/// Reads a urlencoded form body of at most [`FORM_BYTES_MAX`].
async fn form(request: Request<hyper::body::Incoming>) -> Result<Vec<(String, String)>, Response<Body>> {
    let limited = http_body_util::Limited::new(request.into_body(), FORM_BYTES_MAX);
    let bytes = match tokio::time::timeout(BODY_IDLE_TIMEOUT, limited.collect()).await {
        Ok(Ok(collected)) => collected.to_bytes(),
        Ok(Err(_)) => return Err(error_page(StatusCode::PAYLOAD_TOO_LARGE, "The form is too large.")),
        Err(_) => return Err(error_page(StatusCode::REQUEST_TIMEOUT, "The form took too long to arrive.")),
    };
    Ok(form_urlencoded::parse(&bytes).into_owned().collect())
}

fn field<'a>(form: &'a [(String, String)], name: &str) -> &'a str {
    form.iter().find(|(n, _)| n == name).map_or("", |(_, v)| v.as_str())
}

fn error_page(status: StatusCode, message: &str) -> Response<Body> {
    page(status, pages::error(status, message))
}

/// The live session of the request, with its id; a scoped key's is checked against the
/// cluster every [`session::KEY_RECHECK`] (a revoked key's session ends).
async fn session_of(state: &State, request: &Request<hyper::body::Incoming>) -> Option<(String, Session)> {
    let id = cookie_session(request)?;
    let session = state.sessions.get(&id)?;
    if let Who::Scoped(key) = &session.who
        && session.checked.elapsed() >= session::KEY_RECHECK
    {
        let _permit = state.key_lookups.acquire().await.expect("the semaphore is never closed");
        match state.keys.find(&key.id).await {
            Ok(Some(_)) => state.sessions.checked(&id),
            Ok(None) | Err(access::Error::Unsealable { .. } | access::Error::BadRecord { .. }) => {
                state.sessions.remove(&id);
                return None;
            }
            // The cluster cannot say now: the session lives on for a grace period only.
            Err(e) if session.checked.elapsed() < KEY_CHECK_GRACE => {
                tracing::warn!("console: cannot check access key {}: {e}", key.id);
            }
            Err(e) => {
                tracing::warn!(
                    "console: ending a session of access key {}: no check for {KEY_CHECK_GRACE:?}: {e}",
                    key.id
                );
                state.sessions.remove(&id);
                return None;
            }
        }
    }
    Some((id, session))
}

async fn route(state: &State, request: Request<hyper::body::Incoming>) -> Response<Body> {
    if !host_allowed(state, &request) {
        return error_page(StatusCode::MISDIRECTED_REQUEST, "This console answers to its own address only.");
    }
    let path = request.uri().path().to_owned();
    let method = request.method().clone();
    match (&method, path.as_str()) {
        (&Method::GET, "/assets/console.css") => {
            cached(respond(StatusCode::OK, "text/css; charset=utf-8", full(CONSOLE_CSS)))
        }
        (&Method::GET, "/assets/console.js") => {
            cached(respond(StatusCode::OK, "text/javascript; charset=utf-8", full(CONSOLE_JS)))
        }
        (&Method::GET, "/assets/uPlot.iife.min.js") => {
            cached(respond(StatusCode::OK, "text/javascript; charset=utf-8", full(UPLOT_JS)))
        }
        (&Method::GET, "/assets/uPlot.min.css") => {
            cached(respond(StatusCode::OK, "text/css; charset=utf-8", full(UPLOT_CSS)))
        }
        (&Method::GET, "/login") => page(StatusCode::OK, pages::login(None)),
        (&Method::POST, "/login") => login(state, request).await,
        _ => {
            let Some((id, session)) = session_of(state, &request).await else {
                return match method {
                    Method::GET => redirect("/login"),
                    _ => error_page(StatusCode::UNAUTHORIZED, "Your session has ended: log in again."),
                };
            };
            if method != Method::GET && !same_origin(&request, false) {
                return error_page(
                    StatusCode::FORBIDDEN,
                    "Refused: the request did not come from the console's pages.",
                );
            }
            authenticated(state, request, &id, &session, &method, &path).await
        }
    }
}

fn cached(mut response: Response<Body>) -> Response<Body> {
    response.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("max-age=300"));
    response
}

async fn authenticated(
    state: &State,
    request: Request<hyper::body::Incoming>,
    id: &str,
    session: &Session,
    method: &Method,
    path: &str,
) -> Response<Body> {
    let view = pages::View { who: &session.who, csrf: &session.csrf };
    match (method, path) {
        (&Method::GET, "/") => redirect("/buckets"),
        (&Method::GET, "/buckets") => buckets(state, &view).await,
        (&Method::GET, "/objects") => {
            let bucket = param(&request, "bucket").unwrap_or_default();
            let prefix = param(&request, "prefix").unwrap_or_default();
            let after = param(&request, "after").unwrap_or_default();
            objects(state, &view, &bucket, &prefix, &after).await
        }
        (&Method::GET, "/object") => {
            let bucket = param(&request, "bucket").unwrap_or_default();
            let key = param(&request, "key").unwrap_or_default();
            object(state, &view, &bucket, &key).await
        }
        (&Method::GET, "/download") => {
            let bucket = param(&request, "bucket").unwrap_or_default();
            let key = param(&request, "key").unwrap_or_default();
            download(state, &session.who, &bucket, &key).await
        }
        (&Method::GET, "/keys") => keys(state, &view).await,
        (&Method::GET, "/cluster") => cluster(state, &view).await,
        (&Method::GET, "/cluster/traffic") => traffic(state, &session.who),
        (&Method::PUT, "/upload") => upload(state, session, request).await,
        (&Method::POST, "/upload/start") => upload_start(state, session, request).await,
        (&Method::PUT, "/upload/part") => upload_part(state, session, request).await,
        (&Method::POST, "/upload/complete") => upload_complete(state, session, request).await,
        (&Method::POST, "/upload/abort") => upload_abort(state, session, request).await,
        (&Method::POST, _) => {
            let form = match form(request).await {
                Ok(form) => form,
                Err(response) => return response,
            };
            if !session::same(field(&form, "csrf"), &session.csrf) {
                return error_page(
                    StatusCode::FORBIDDEN,
                    "Refused: the form's token is not this session's. Reload the page.",
                );
            }
            match path {
                "/logout" => {
                    state.sessions.remove(id);
                    let mut response = redirect("/login");
                    set_cookie(&mut response, "", Duration::ZERO, state.secure);
                    response
                }
                "/buckets/create" => create_bucket(state, &session.who, field(&form, "bucket")).await,
                "/buckets/delete" => {
                    delete_bucket(state, &session.who, field(&form, "bucket"), field(&form, "confirm")).await
                }
                "/object/delete" => {
                    delete_object(state, &session.who, field(&form, "bucket"), field(&form, "key")).await
                }
                "/keys/create" => create_key(state, &view, &form).await,
                "/keys/revoke" => revoke_key(state, &session.who, field(&form, "id")).await,
                _ => error_page(StatusCode::NOT_FOUND, "No such page."),
            }
        }
        _ => error_page(StatusCode::NOT_FOUND, "No such page."),
    }
}

fn set_cookie(response: &mut Response<Body>, value: &str, max_age: Duration, secure: bool) {
    let secure = if secure { "; Secure" } else { "" };
    let cookie = format!("{COOKIE}={value}; Path=/; HttpOnly; SameSite=Strict; Max-Age={}{secure}", max_age.as_secs());
    let value = HeaderValue::from_str(&cookie).expect("hex ids make a valid cookie");
    response.headers_mut().insert(header::SET_COOKIE, value);
}

async fn login(state: &State, request: Request<hyper::body::Incoming>) -> Response<Body> {
    if !same_origin(&request, true) {
        return error_page(StatusCode::FORBIDDEN, "Refused: the request did not come from the console's pages.");
    }
    let previous = cookie_session(&request);
    let form = match form(request).await {
        Ok(form) => form,
        Err(response) => return response,
    };
    let (access_key, secret_key) = (field(&form, "access_key").trim(), field(&form, "secret_key"));
    let who = if session::same(access_key, &state.root_access_key) {
        session::same(secret_key, &state.root_secret_key).then(|| Who::Root { access_key: access_key.to_owned() })
    } else {
        let _permit = state.key_lookups.acquire().await.expect("the semaphore is never closed");
        match state.keys.find(access_key).await {
            Ok(Some((key, secret))) if session::same(secret_key, secret.expose()) => Some(Who::Scoped(Arc::new(key))),
            Ok(_) => None,
            Err(access::Error::Cluster(e)) => {
                tracing::warn!("console login: cannot look up an access key: {e}");
                return page(
                    StatusCode::SERVICE_UNAVAILABLE,
                    pages::login(Some("The cluster cannot be read now; retry later.")),
                );
            }
            Err(e) => {
                tracing::error!("console login: refusing access key {access_key}: {e}");
                None
            }
        }
    };
    let Some(who) = who else {
        // The typed id only when it is one of ours: a secret pasted in the wrong field stays out.
        let shown = if access::is_key_id(access_key) { access_key } else { "(not a key id)" };
        tracing::info!("console: failed login for access key {shown}");
        tokio::time::sleep(LOGIN_FAILURE_PAUSE).await;
        return page(StatusCode::UNAUTHORIZED, pages::login(Some("Wrong access key or secret key.")));
    };
    tracing::info!("console: {} logged in", who.access_key());
    if let Some(previous) = previous {
        state.sessions.remove(&previous); // a new login never keeps the old session
    }
    let id = state.sessions.create(who);
    let mut response = redirect("/buckets");
    set_cookie(&mut response, &id, state.sessions.ttl(), state.secure);
    response
}

/// A client error as a page: names the user's mistakes, hides the cluster's internals.
fn client_error(error: &client::Error) -> Response<Body> {
    let (status, message) = describe(error);
    error_page(status, &message)
}

/// The status and the message a person may see for a failed client call (logged here).
fn describe(error: &client::Error) -> (StatusCode, String) {
    use client::Error as E;
    match error {
        E::NoSuchBucket { .. } | E::NotFound { .. } | E::NoSuchUpload { .. } => {
            (StatusCode::NOT_FOUND, error.to_string())
        }
        E::InvalidName(_)
        | E::BucketNotEmpty { .. }
        | E::ObjectTooLarge { .. }
        | E::InvalidPart { .. }
        | E::InvalidPartOrder
        | E::EntityTooSmall { .. } => (StatusCode::BAD_REQUEST, error.to_string()),
        E::DiskFull { .. } => (StatusCode::INSUFFICIENT_STORAGE, "The cluster is out of space.".to_owned()),
        // An upload whose body broke off (or paused too long): nothing was stored.
        E::Source(e) => {
            tracing::debug!("console: an upload ended early: {e}");
            (StatusCode::BAD_REQUEST, "The upload ended early; nothing was stored.".to_owned())
        }
        _ => {
            tracing::warn!("console: {error}");
            (StatusCode::SERVICE_UNAVAILABLE, "The cluster could not serve this now; retry later.".to_owned())
        }
    }
}

fn forbidden(who: &Who, what: &str) -> Response<Body> {
    error_page(StatusCode::FORBIDDEN, &format!("Access key {} may not {what}.", who.access_key()))
}

async fn buckets(state: &State, view: &pages::View<'_>) -> Response<Body> {
    let mut all = match state.client.buckets().await {
        Ok(all) => all,
        Err(e) => return client_error(&e),
    };
    all.retain(|b| !b.name.starts_with('.') && view.who.allows(Some(&b.name), Action::Read));
    all.sort_by(|a, b| a.name.cmp(&b.name));
    let mut rows = Vec::with_capacity(all.len());
    for (i, bucket) in all.into_iter().enumerate() {
        let usage = if i < BUCKETS_COUNTED_MAX { bucket_usage(&state.client, &bucket.name).await } else { None };
        rows.push(pages::BucketRow { name: bucket.name, created_ms: bucket.created_ms, usage });
    }
    page(StatusCode::OK, pages::buckets(view, &rows))
}

/// Nodes, drives, erasure sets and repair, as `tessera status` shows them (root only: node
/// addresses and drive paths are the operator's business). The page refreshes itself.
async fn cluster(state: &State, view: &pages::View<'_>) -> Response<Body> {
    if !matches!(view.who, Who::Root { .. }) {
        return forbidden(view.who, "see the cluster's nodes");
    }
    let status = {
        let mut last = state.cluster_status.lock().await;
        match last.as_ref() {
            Some((at, status)) if at.elapsed() < CLUSTER_STATUS_MAX_AGE => Arc::clone(status),
            _ => {
                let status = Arc::new(state.client.cluster_status().await);
                *last = Some((std::time::Instant::now(), Arc::clone(&status)));
                status
            }
        }
    };
    page(StatusCode::OK, pages::cluster(view, &status, state.traffic.is_some()))
}

/// `GET /cluster/traffic` (root only): the gateway's sampled traffic as per-interval rates,
/// JSON, for the cluster page's charts.
fn traffic(state: &State, who: &Who) -> Response<Body> {
    if !matches!(who, Who::Root { .. }) {
        return forbidden(who, "see the gateway's traffic");
    }
    let Some(samples) = &state.traffic else {
        return error_page(StatusCode::NOT_FOUND, "This gateway keeps no traffic samples.");
    };
    let json = serde_json::to_string(&samples.series()).expect("numbers and vectors serialize");
    respond(StatusCode::OK, "application/json", full(json))
}

/// Only the root manages access keys (as only `tessera key`, with the cluster secret, can).
fn may_manage_keys(who: &Who) -> bool {
    matches!(who, Who::Root { .. })
}

async fn keys(state: &State, view: &pages::View<'_>) -> Response<Body> {
    if !may_manage_keys(view.who) {
        return forbidden(view.who, "manage access keys");
    }
    match state.keys.list().await {
        Ok(listed) => page(StatusCode::OK, pages::keys(view, &listed)),
        Err(e) => key_error(&e),
    }
}

/// The buckets a key form names: `all` checked, or names separated by commas or white space.
fn form_buckets(all: bool, names: &str) -> Result<access::Buckets, String> {
    let names: Vec<String> =
        names.split(|c: char| c == ',' || c.is_whitespace()).filter(|n| !n.is_empty()).map(str::to_owned).collect();
    match (all, names.is_empty()) {
        (true, true) => Ok(access::Buckets::All),
        (true, false) => Err("Name some buckets or check \"all buckets\", not both.".to_owned()),
        (false, true) => Err("Name at least one bucket, or check \"all buckets\".".to_owned()),
        (false, false) => Ok(access::Buckets::Only(names)),
    }
}

async fn create_key(state: &State, view: &pages::View<'_>, form: &[(String, String)]) -> Response<Body> {
    if !may_manage_keys(view.who) {
        return forbidden(view.who, "manage access keys");
    }
    let buckets = match form_buckets(field(form, "all_buckets") == "on", field(form, "buckets")) {
        Ok(buckets) => buckets,
        Err(message) => return error_page(StatusCode::BAD_REQUEST, &message),
    };
    let permission = match field(form, "permission") {
        "read-only" => access::Permission::ReadOnly,
        "read-write" => access::Permission::ReadWrite,
        _ => return error_page(StatusCode::BAD_REQUEST, "Choose read-only or read-write."),
    };
    match state.keys.create(buckets, permission, field(form, "description").trim()).await {
        Ok((key, secret)) => {
            tracing::info!(
                "console: {} created access key {} ({} on {})",
                view.who.access_key(),
                key.id,
                key.permission,
                key.buckets
            );
            let mut response = page(StatusCode::OK, pages::key_created(view, &key, secret.expose()));
            // The secret is on this page only: no cache keeps it.
            response.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
            response
        }
        Err(e) => key_error(&e),
    }
}

async fn revoke_key(state: &State, who: &Who, id: &str) -> Response<Body> {
    if !may_manage_keys(who) {
        return forbidden(who, "manage access keys");
    }
    match state.keys.revoke(id).await {
        Ok(()) => {
            tracing::info!("console: {} revoked access key {id}", who.access_key());
            // This console's sessions of the key end now; other consoles' at their next check.
            state.sessions.end_key(id);
            redirect("/keys")
        }
        Err(e) => key_error(&e),
    }
}

/// A failed key operation as a page: the user's mistakes named, the cluster's failures hidden.
fn key_error(error: &access::Error) -> Response<Body> {
    match error {
        access::Error::Cluster(e) => client_error(e),
        access::Error::NoSuchKey(_) => error_page(StatusCode::NOT_FOUND, &error.to_string()),
        access::Error::InvalidScope(_) | access::Error::TooManyKeys(_) => {
            error_page(StatusCode::BAD_REQUEST, &error.to_string())
        }
        access::Error::Unsealable { .. } | access::Error::BadRecord { .. } => {
            tracing::error!("console: {error}");
            error_page(StatusCode::INTERNAL_SERVER_ERROR, &error.to_string())
        }
    }
}

/// Objects and bytes of `bucket`, summed over at most [`BUCKET_COUNT_MAX`] objects (the flag
/// says whether there are more).
async fn bucket_usage(client: &client::Client, bucket: &str) -> Option<pages::Usage> {
    let listed = client.list(bucket, "", "", u32::try_from(BUCKET_COUNT_MAX).expect("small")).await.ok()?;
    Some(pages::Usage {
        objects: listed.entries.len(),
        bytes: listed.entries.iter().map(|e| e.size).sum(),
        more: listed.next_start_after.is_some(),
    })
}

async fn create_bucket(state: &State, who: &Who, bucket: &str) -> Response<Body> {
    if !who.allows(Some(bucket), Action::Admin) {
        return forbidden(who, "create buckets");
    }
    match state.client.make_bucket(bucket).await {
        Ok(()) => redirect(&format!("/objects{}", query(&[("bucket", bucket)]))),
        Err(e) => client_error(&e),
    }
}

async fn delete_bucket(state: &State, who: &Who, bucket: &str, confirm: &str) -> Response<Body> {
    if !who.allows(Some(bucket), Action::Admin) {
        return forbidden(who, "delete buckets");
    }
    if confirm != bucket {
        return error_page(StatusCode::BAD_REQUEST, "Type the bucket's name to confirm its deletion.");
    }
    match state.client.remove_bucket(bucket).await {
        Ok(()) => redirect("/buckets"),
        Err(e) => client_error(&e),
    }
}

/// The next path segment of `key` after `prefix`, with its `/`: a folder row.
fn folder_of<'k>(key: &'k str, prefix: &str) -> Option<&'k str> {
    let rest = key.strip_prefix(prefix)?;
    let at = rest.find('/')?;
    Some(&key[..prefix.len() + at + 1])
}

/// A key after every key that starts with `folder` (so a listing skips the folder's contents).
fn past_folder(folder: &str) -> String {
    format!("{folder}{}", char::MAX)
}

async fn objects(state: &State, view: &pages::View<'_>, bucket: &str, prefix: &str, after: &str) -> Response<Body> {
    if !view.who.allows(Some(bucket), Action::Read) {
        return forbidden(view.who, &format!("read bucket {bucket:?}"));
    }
    let mut rows: Vec<pages::Row> = Vec::new();
    // Where the next listing starts: the last key shown, or past the last folder shown.
    let mut next = after.to_owned();
    let mut more = false;
    for listing in 0.. {
        if listing == LISTINGS_PER_PAGE_MAX {
            more = true; // a page of few rows over many keys: the rest on the next page
            break;
        }
        // One key more than a page holds: a full page then knows there is more without a
        // second listing (each costs a round trip to every drive of the bucket's sets).
        let limit = u32::try_from(PAGE_ROWS + 1).expect("small");
        let listed = match state.client.list(bucket, prefix, &next, limit).await {
            Ok(listed) => listed,
            Err(e) => return client_error(&e),
        };
        let listed_any = !listed.entries.is_empty();
        for entry in listed.entries {
            if let Some(pages::Row::Folder(folder)) = rows.last()
                && entry.key.starts_with(folder.as_str())
            {
                continue; // inside the folder just shown
            }
            if rows.len() == PAGE_ROWS {
                more = true;
                break;
            }
            match folder_of(&entry.key, prefix) {
                Some(folder) => {
                    next = past_folder(folder);
                    rows.push(pages::Row::Folder(folder.to_owned()));
                }
                None => {
                    next.clone_from(&entry.key);
                    rows.push(pages::Row::Object(entry));
                }
            }
        }
        if more {
            break;
        }
        match listed.next_start_after {
            // Past a folder whose keys fill the rest of the page, `next` is already further.
            Some(resume) if resume > next || listed_any => next = next.max(resume),
            _ => break,
        }
    }
    page(StatusCode::OK, pages::objects(view, bucket, prefix, &rows, more.then_some(next.as_str())))
}

async fn object(state: &State, view: &pages::View<'_>, bucket: &str, key: &str) -> Response<Body> {
    if !view.who.allows(Some(bucket), Action::Read) {
        return forbidden(view.who, &format!("read bucket {bucket:?}"));
    }
    match state.client.head(bucket, key).await {
        Ok(info) => page(StatusCode::OK, pages::object(view, &info)),
        Err(e) => client_error(&e),
    }
}

/// `filename*=UTF-8''...` of RFC 6266 for the last segment of `key`.
fn attachment(key: &str) -> String {
    let name = key.rsplit('/').next().filter(|n| !n.is_empty()).unwrap_or("download");
    let encoded: String = form_urlencoded::byte_serialize(name.as_bytes()).collect::<String>().replace('+', "%20");
    format!("attachment; filename*=UTF-8''{encoded}")
}

async fn download(state: &State, who: &Who, bucket: &str, key: &str) -> Response<Body> {
    if !who.allows(Some(bucket), Action::Read) {
        return forbidden(who, &format!("read bucket {bucket:?}"));
    }
    let info = match state.client.head(bucket, key).await {
        Ok(info) => info,
        Err(e) => return client_error(&e),
    };
    let size = info.meta.size;
    let client = state.client.clone();
    let stream = futures_util::stream::try_unfold((client, info, 0u64), move |(client, info, offset)| async move {
        if offset >= size {
            return Ok(None);
        }
        let len = usize::try_from((size - offset).min(DOWNLOAD_WINDOW as u64)).expect("bounded by the window");
        let mut buf = vec![0u8; len];
        let read = client.read_at(&info, offset, &mut buf).await.map_err(std::io::Error::other)?;
        if read == 0 {
            return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "the object ended early"));
        }
        buf.truncate(read);
        let frame = hyper::body::Frame::data(Bytes::from(buf));
        Ok(Some((frame, (client, info, offset + read as u64))))
    });
    let body = http_body_util::StreamBody::new(stream).boxed();
    let mut response = respond(StatusCode::OK, "application/octet-stream", body);
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(size));
    if let Ok(value) = HeaderValue::from_str(&attachment(key)) {
        headers.insert(header::CONTENT_DISPOSITION, value);
    }
    response
}

async fn delete_object(state: &State, who: &Who, bucket: &str, key: &str) -> Response<Body> {
    if !who.allows(Some(bucket), Action::Write) {
        return forbidden(who, &format!("delete objects in bucket {bucket:?}"));
    }
    let folder = key.rsplit_once('/').map_or("", |(folder, _)| folder);
    let prefix = if folder.is_empty() { String::new() } else { format!("{folder}/") };
    match state.client.delete(bucket, key).await {
        Ok(()) => redirect(&format!("/objects{}", query(&[("bucket", bucket), ("prefix", &prefix)]))),
        Err(e) => client_error(&e),
    }
}

/// Largest part a browser upload sends (S3's part limit); a larger `Content-Length` is refused
/// before any byte is read.
pub const PART_BYTES_MAX: u64 = 5 << 30;
/// Largest body of `/upload/complete`: one "number etag" line per part, 10,000 parts.
const COMPLETE_BYTES_MAX: usize = 1 << 20;

/// A text answer of the upload endpoints (the script shows it as it is).
fn text(status: StatusCode, message: String) -> Response<Body> {
    respond(status, "text/plain; charset=utf-8", full(message))
}

/// Checks an upload request's CSRF token (header `x-csrf-token`) and that the session may write
/// in its bucket; returns the bucket and key, or the refusal.
fn upload_target(
    session: &Session,
    request: &Request<hyper::body::Incoming>,
) -> Result<(String, String), Box<Response<Body>>> {
    let token = request.headers().get("x-csrf-token").and_then(|v| v.to_str().ok()).unwrap_or("");
    if !session::same(token, &session.csrf) {
        return Err(Box::new(text(
            StatusCode::FORBIDDEN,
            "refused: the upload's token is not this session's; reload the page".into(),
        )));
    }
    let bucket = param(request, "bucket").unwrap_or_default();
    let key = param(request, "key").unwrap_or_default();
    if !session.who.allows(Some(&bucket), Action::Write) {
        let who = session.who.access_key();
        return Err(Box::new(text(
            StatusCode::FORBIDDEN,
            format!("access key {who} may not write in bucket {bucket:?}"),
        )));
    }
    Ok((bucket, key))
}

/// The request's body as a reader; each frame must come within [`BODY_IDLE_TIMEOUT`], so a
/// stalled upload gives its slot back, and past `bytes_max` bytes the reader fails (the
/// upload stores nothing).
fn body_reader(request: Request<hyper::body::Incoming>, bytes_max: u64) -> impl tokio::io::AsyncRead + Unpin + Send {
    let frames = http_body_util::BodyStream::new(request.into_body());
    let frames = futures_util::stream::unfold(frames, |mut frames| async move {
        match tokio::time::timeout(BODY_IDLE_TIMEOUT, futures_util::StreamExt::next(&mut frames)).await {
            Ok(Some(frame)) => Some((frame.map_err(std::io::Error::other), frames)),
            Ok(None) => None,
            Err(_) => Some((Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "the upload stalled")), frames)),
        }
    });
    let data = futures_util::StreamExt::filter_map(frames, |frame| async move {
        match frame {
            Ok(frame) => frame.into_data().ok().map(Ok),
            Err(e) => Some(Err(e)),
        }
    });
    let data = futures_util::StreamExt::scan(data, 0u64, move |seen, chunk: std::io::Result<Bytes>| {
        let chunk = chunk.and_then(|chunk| {
            *seen += chunk.len() as u64;
            if *seen > bytes_max {
                return Err(std::io::Error::other(format!("the body is larger than {bytes_max} bytes")));
            }
            Ok(chunk)
        });
        std::future::ready(Some(chunk))
    });
    tokio_util::io::StreamReader::new(Box::pin(data))
}

fn content_type(request: &Request<hyper::body::Incoming>) -> Option<String> {
    request.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).map(str::to_owned)
}

fn failed(error: &client::Error) -> Response<Body> {
    let (status, message) = describe(error);
    text(status, message)
}

/// `PUT /upload?bucket=B&key=K` with the file as the body and the CSRF token in
/// `x-csrf-token` (the console's script sends it, with progress); streamed into the cluster
/// with bounded memory. Answers plain text: `ok` or the error. Files larger than one part
/// go through `/upload/start`, `/upload/part` and `/upload/complete` instead.
async fn upload(state: &State, session: &Session, request: Request<hyper::body::Incoming>) -> Response<Body> {
    let (bucket, key) = match upload_target(session, &request) {
        Ok(target) => target,
        Err(refused) => return *refused,
    };
    let options = client::PutOptions { content_type: content_type(&request), ..Default::default() };
    // One piece holds what it holds: `Client::put` refuses the rest (ObjectTooLarge).
    let mut reader = body_reader(request, u64::MAX);
    match state.client.put(&bucket, &key, &mut reader, &options).await {
        Ok(info) => {
            tracing::info!("console: {} uploaded {bucket}/{key} ({} bytes)", session.who.access_key(), info.meta.size);
            text(StatusCode::OK, "ok".into())
        }
        Err(e) => failed(&e),
    }
}

/// `POST /upload/start?bucket=B&key=K` (the file's type in `Content-Type`, no body): starts a
/// multipart upload and answers its id.
async fn upload_start(state: &State, session: &Session, request: Request<hyper::body::Incoming>) -> Response<Body> {
    let (bucket, key) = match upload_target(session, &request) {
        Ok(target) => target,
        Err(refused) => return *refused,
    };
    let options = client::PutOptions { content_type: content_type(&request), ..Default::default() };
    match state.client.create_multipart(&bucket, &key, &options).await {
        Ok(upload_id) => text(StatusCode::OK, upload_id),
        Err(e) => failed(&e),
    }
}

/// `PUT /upload/part?bucket=B&key=K&upload=U&part=N` with the part as the body (at most
/// [`PART_BYTES_MAX`], by its `Content-Length`): answers the part's ETag.
async fn upload_part(state: &State, session: &Session, request: Request<hyper::body::Incoming>) -> Response<Body> {
    let (bucket, key) = match upload_target(session, &request) {
        Ok(target) => target,
        Err(refused) => return *refused,
    };
    let upload_id = param(&request, "upload").unwrap_or_default();
    let Some(number) = param(&request, "part").and_then(|n| n.parse::<u32>().ok()) else {
        return text(StatusCode::BAD_REQUEST, "the part number is missing or not a number".into());
    };
    let length = request.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    match length {
        None => return text(StatusCode::LENGTH_REQUIRED, "a part must say its length (Content-Length)".into()),
        Some(length) if length > PART_BYTES_MAX => {
            return text(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("part {number} has {length} bytes; a part may have at most {PART_BYTES_MAX}"),
            );
        }
        Some(_) => {}
    }
    // hyper reads no more than the Content-Length; counted again here all the same.
    let mut reader = body_reader(request, PART_BYTES_MAX);
    match state.client.put_part(&bucket, &key, &upload_id, number, &mut reader).await {
        Ok(part) => text(StatusCode::OK, part.etag),
        Err(e) => failed(&e),
    }
}

/// `POST /upload/complete?bucket=B&key=K&upload=U` with one `number etag` line per part,
/// ascending: makes the object.
async fn upload_complete(state: &State, session: &Session, request: Request<hyper::body::Incoming>) -> Response<Body> {
    let (bucket, key) = match upload_target(session, &request) {
        Ok(target) => target,
        Err(refused) => return *refused,
    };
    let upload_id = param(&request, "upload").unwrap_or_default();
    let limited = http_body_util::Limited::new(request.into_body(), COMPLETE_BYTES_MAX);
    let body = match tokio::time::timeout(BODY_IDLE_TIMEOUT, limited.collect()).await {
        Ok(Ok(body)) => body.to_bytes(),
        _ => return text(StatusCode::BAD_REQUEST, "the list of parts did not arrive whole".into()),
    };
    let mut parts = Vec::new();
    for line in String::from_utf8_lossy(&body).lines().filter(|line| !line.trim().is_empty()) {
        let Some((number, etag)) = line.trim().split_once(' ').and_then(|(n, e)| Some((n.parse::<u32>().ok()?, e)))
        else {
            return text(StatusCode::BAD_REQUEST, format!("not a part line (\"number etag\"): {line:?}"));
        };
        parts.push((number, etag.to_owned()));
    }
    if parts.is_empty() {
        return text(StatusCode::BAD_REQUEST, "no parts listed".into());
    }
    match state.client.complete_multipart(&bucket, &key, &upload_id, &parts).await {
        Ok(info) => {
            tracing::info!(
                "console: {} uploaded {bucket}/{key} ({} bytes, {} parts)",
                session.who.access_key(),
                info.meta.size,
                parts.len()
            );
            text(StatusCode::OK, "ok".into())
        }
        Err(e) => failed(&e),
    }
}

/// `POST /upload/abort?bucket=B&key=K&upload=U`: drops a failed upload's parts.
async fn upload_abort(state: &State, session: &Session, request: Request<hyper::body::Incoming>) -> Response<Body> {
    let (bucket, key) = match upload_target(session, &request) {
        Ok(target) => target,
        Err(refused) => return *refused,
    };
    let upload_id = param(&request, "upload").unwrap_or_default();
    match state.client.abort_multipart(&bucket, &key, &upload_id).await {
        Ok(()) => text(StatusCode::OK, "ok".into()),
        Err(e) => failed(&e),
    }
}

#[cfg(test)]
mod tests;
