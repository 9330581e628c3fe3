//! Plaintext gRPC over unix sockets, as DMI uses them: edgecore serves `dmi.sock`, each mapper
//! serves its own socket, and each side dials the other's path.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::{UnixListener, UnixStream};
use tonic::body::Body;
use tonic::transport::{Channel, Endpoint, Server};

/// edgecore's DMI socket (KubeEdge's default `modules.deviceTwin.dmiSockPath` + `dmi.sock`).
pub const DEFAULT_DMI_SOCKET: &str = "/etc/kubeedge/dmi.sock";

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum UdsError {
    #[error("prepare socket path {path}: {source}")]
    Prepare { path: PathBuf, source: io::Error },
    #[error("bind {path}: {source}")]
    Bind { path: PathBuf, source: io::Error },
    #[error("set mode 0600 on {path}: {source}")]
    Permissions { path: PathBuf, source: io::Error },
    #[error("serve gRPC: {0}")]
    Serve(#[source] tonic::transport::Error),
    #[error("connect to {path}: {}", chain(source))]
    Connect {
        path: PathBuf,
        source: tonic::transport::Error,
    },
}

/// An error with its causes: tonic's transport error alone says only "transport error".
fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut last = text.clone();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        // io errors wrapped by hyper repeat their message one level down.
        if cause_text != last {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        last = cause_text;
        source = cause.source();
    }
    text
}

/// Binds a unix socket for a gRPC server: creates the parent directory, removes a stale socket
/// file left by an earlier run, and restricts the socket to its owner (mode 0600).
pub fn bind_uds(path: impl AsRef<Path>) -> Result<UnixListener, UdsError> {
    let path = path.as_ref();
    let prepare = |source| UdsError::Prepare {
        path: path.to_path_buf(),
        source,
    };
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(prepare)?;
    }
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(prepare(e)),
    }
    let listener = UnixListener::bind(path).map_err(|source| UdsError::Bind {
        path: path.to_path_buf(),
        source,
    })?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(|source| {
        UdsError::Permissions {
            path: path.to_path_buf(),
            source,
        }
    })?;
    Ok(listener)
}

/// Serves one generated gRPC service (e.g. `DeviceManagerServiceServer::new(x)`) on a bound
/// listener until `shutdown` completes.
pub async fn serve_listener<S>(
    listener: UnixListener,
    service: S,
    shutdown: impl Future<Output = ()>,
) -> Result<(), UdsError>
where
    S: tower::Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    Server::builder()
        .serve_with_incoming_shutdown(
            service,
            tokio_stream::wrappers::UnixListenerStream::new(listener),
            shutdown,
        )
        .await
        .map_err(UdsError::Serve)
}

/// [`bind_uds`] then [`serve_listener`]. Bind first yourself when a caller must know the socket
/// accepts connections before the server future is polled (a mapper registers only then).
pub async fn serve_uds<S>(
    path: impl AsRef<Path>,
    service: S,
    shutdown: impl Future<Output = ()>,
) -> Result<(), UdsError>
where
    S: tower::Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    let listener = bind_uds(path)?;
    serve_listener(listener, service, shutdown).await
}

/// A channel to the gRPC server on a unix socket, connected now (fails if nobody listens).
/// After a broken connection the channel reconnects on the next call.
pub async fn connect_uds(path: impl AsRef<Path>) -> Result<Channel, UdsError> {
    let path = path.as_ref().to_path_buf();
    endpoint()
        .connect_with_connector(connector(path.clone()))
        .await
        .map_err(|source| UdsError::Connect { path, source })
}

/// A channel to the gRPC server on a unix socket that connects on first use (each call fails
/// with UNAVAILABLE while nobody listens).
pub fn connect_uds_lazy(path: impl AsRef<Path>) -> Channel {
    endpoint().connect_with_connector_lazy(connector(path.as_ref().to_path_buf()))
}

fn endpoint() -> Endpoint {
    // The URI only fills the HTTP/2 :authority; the connector ignores it.
    Endpoint::from_static("http://localhost").connect_timeout(CONNECT_TIMEOUT)
}

fn connector(
    path: PathBuf,
) -> impl tower::Service<
    http::Uri,
    Response = TokioIo<UnixStream>,
    Error = io::Error,
    Future = impl Future<Output = io::Result<TokioIo<UnixStream>>> + Send,
> + Send
+ Clone
+ 'static {
    tower::service_fn(move |_: http::Uri| {
        let path = path.clone();
        async move { UnixStream::connect(path).await.map(TokioIo::new) }
    })
}
