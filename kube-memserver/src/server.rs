//! The TLS listener: accepts connections, negotiates HTTP/2 or HTTP/1.1 (ALPN), and serves each
//! request with the handlers. Everything stops when the cancellation token fires; an outage
//! (`faults.rs`) ends every connection and refuses new ones until it is over.

use std::convert::Infallible;
use std::sync::Arc;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use super::handlers;
use super::state::State;

pub async fn serve(
    listener: TcpListener,
    tls: TlsAcceptor,
    st: Arc<State>,
    cancel: CancellationToken,
) {
    let server_address = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    loop {
        let accepted = tokio::select! {
            _ = cancel.cancelled() => return,
            a = listener.accept() => a,
        };
        let (tcp, peer) = match accepted {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                continue;
            }
        };
        if st.faults.in_outage() {
            // Unreachable: the connection ends before TLS, as a reset would end it.
            drop(tcp);
            continue;
        }
        let _ = tcp.set_nodelay(true);
        let tls = tls.clone();
        let st = st.clone();
        let cancel = cancel.clone();
        let server_address = server_address.clone();
        tokio::spawn(async move {
            let stream = tokio::select! {
                _ = cancel.cancelled() => return,
                s = tls.accept(tcp) => match s {
                    Ok(s) => s,
                    Err(e) => {
                        tracing::debug!(%peer, error = %e, "TLS handshake failed");
                        return;
                    }
                },
            };
            let conn_cancel = cancel.clone();
            let faults = st.clone();
            let svc = service_fn(move |req| {
                let st = st.clone();
                let cancel = conn_cancel.clone();
                let addr = server_address.clone();
                async move { Ok::<_, Infallible>(handlers::handle(st, req, cancel, addr).await) }
            });
            let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            let conn = builder.serve_connection_with_upgrades(TokioIo::new(stream), svc);
            tokio::pin!(conn);
            tokio::select! {
                r = conn.as_mut() => {
                    if let Err(e) = r {
                        tracing::debug!(%peer, error = %e, "connection ended with an error");
                    }
                }
                _ = cancel.cancelled() => {}
                // An outage ends every connection, open watches included.
                _ = faults.faults.outage_started() => {}
            }
        });
    }
}
