//! Serving HTTP/1 the way every listening program of the fleet does (the gateway, the Slack
//! bridge): at most so many connections at once (one more is closed as soon as it is accepted),
//! a client that does not send its request's headers (or finish its TLS handshake) in time
//! disconnected, plain or TLS, and on shutdown the requests in progress answered first.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// How a listener is served.
#[derive(Clone)]
pub struct Serving {
    /// Connections open at once.
    pub max_connections: usize,
    /// How long a connection may take to send a request's headers (and its TLS handshake).
    pub header_timeout: Duration,
    /// HTTPS with this configuration; plain HTTP without.
    pub tls: Option<Arc<rustls::ServerConfig>>,
}

/// Serves `app` on `listener` until `shutdown`, as [`Serving`] says; `refused` is called for
/// each connection closed because `max_connections` were open.
pub async fn serve(
    listener: tokio::net::TcpListener,
    app: axum::Router,
    serving: &Serving,
    shutdown: CancellationToken,
    refused: impl Fn(),
) {
    let slots = Arc::new(tokio::sync::Semaphore::new(serving.max_connections.max(1)));
    let tls = serving.tls.clone().map(tokio_rustls::TlsAcceptor::from);
    let header_timeout = serving.header_timeout;
    let connections = TaskTracker::new();
    loop {
        let (stream, _peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors and the like: wait a little rather than spin.
                    tracing::warn!(error = %crate::Chain(&e), "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = shutdown.cancelled() => break,
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            refused();
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let app = app.clone();
        let shutdown = shutdown.clone();
        let tls = tls.clone();
        connections.spawn(async move {
            // The slot is held from the accept on: through the handshake, then the connection.
            let _slot = slot;
            let Some(acceptor) = tls else {
                serve_connection(stream, app, header_timeout, shutdown).await;
                return;
            };
            // A client that never finishes its handshake is dropped when the header timeout
            // passes, like one that never sends its headers; a failed handshake (a plain-HTTP
            // client on the TLS port, an untrusted certificate) just closes the connection.
            let handshake = tokio::select! {
                done = tokio::time::timeout(header_timeout, acceptor.accept(stream)) => done,
                () = shutdown.cancelled() => return,
            };
            match handshake {
                Ok(Ok(tls_stream)) => {
                    serve_connection(tls_stream, app, header_timeout, shutdown).await;
                }
                Ok(Err(e)) => tracing::debug!(error = %e, "TLS handshake failed"),
                Err(_) => tracing::debug!("TLS handshake not finished within the header timeout"),
            }
        });
    }
    connections.close();
    let _ = tokio::time::timeout(Duration::from_secs(5), connections.wait()).await;
}

/// Serves HTTP/1 on one connection (plain or TLS) until it closes, or, on shutdown, until the
/// request it is in is answered.
async fn serve_connection<I>(
    io: I,
    app: axum::Router,
    header_timeout: Duration,
    shutdown: CancellationToken,
) where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    use hyper_util::rt::{TokioIo, TokioTimer};
    use hyper_util::service::TowerToHyperService;

    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout)
        .serve_connection(TokioIo::new(io), TowerToHyperService::new(app));
    tokio::pin!(conn);
    tokio::select! {
        _ = conn.as_mut() => {}
        () = shutdown.cancelled() => {
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
        }
    }
}
